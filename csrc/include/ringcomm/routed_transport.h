// RoutedTransport: a transport that reaches each peer through the transport given for it, so
// that every link of a ring, or every pair of point-to-point links, runs over what its two ends
// share (shared memory between ranks of one host, sockets between hosts). Nothing is forwarded
// in place and nothing is published: a mixed ring runs the plain ring schedule.
#pragma once

#include <memory>
#include <vector>

#include "ringcomm/transport.h"

namespace ringcomm {

class RoutedTransport : public Transport {
 public:
  // byPeer[p]: the transport that reaches rank p (null for this rank and for ranks it never
  // talks to).
  RoutedTransport(int rank, std::vector<std::shared_ptr<Transport>> byPeer);

  size_t maxMessageBytes() const override { return maxMessageBytes_; }
  size_t columnsPerWave() const override { return columnsPerWave_; }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;
  void begin(uintptr_t stream, const CallName& call) override;
  void end() override;

  TrafficStats traffic() const override;
  void resetTraffic() override;

 private:
  Transport& to(int peer) const;

  int rank_;
  std::vector<std::shared_ptr<Transport>> byPeer_;
  std::vector<Transport*> distinct_;  // each transport once
  size_t maxMessageBytes_ = 0, columnsPerWave_ = 1;
};

}  // namespace ringcomm
