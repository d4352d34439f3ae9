// Transport between local processes over shared memory: each rank owns the channel to its ring
// successor and maps its predecessor's. Set up in two calls around a name exchange:
//   ShmTransport t(rank, size, options);  publish t.channelName();  t.connect(predecessorsName);
#pragma once

#include <algorithm>
#include <string>

#include "cpu/shm_channel.h"
#include "ringcomm/transport.h"

namespace ringcomm {

struct ShmOptions {
  size_t slotBytes = 256 * 1024;
  uint32_t slotCount = 4;
  WaitPolicy wait;
};

class ShmTransport : public Transport {
 public:
  ShmTransport(int rank, int worldSize, ShmOptions options);

  // Name of this rank's outgoing channel ("" for a single rank).
  std::string channelName() const { return outgoing_.valid() ? outgoing_.name() : ""; }
  void connect(const std::string& predecessorChannel);

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  size_t columnsPerWave() const override { return std::max<size_t>(1, options_.slotCount / 2); }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;

 private:
  void checkPeer(int peer, int expected, const char* role) const;

  int rank_, worldSize_, next_, prev_;
  ShmOptions options_;
  ShmChannel outgoing_, incoming_;
};

}  // namespace ringcomm
