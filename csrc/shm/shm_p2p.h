// Point-to-point links between any two ranks of one host over shared memory: one ShmChannel per
// ordered pair, created by the sender and attached by the receiver the first time the pair
// talks, so a send/recv between two ranks involves no other rank and an unused pair costs
// nothing. Messages of a pair arrive in the order they were sent. Set up around a name exchange:
//   name = links.createOutgoing(peer);  publish name;      (sender)
//   links.attachIncoming(peer, name);  links.unlinkIncoming(peer);   (receiver)
// A send and a receive on different peers may run on different threads at once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ringcomm/transport.h"
#include "shm/shm_channel.h"
#include "ringcomm/traffic_counters.h"
#include "shm/shm_transport.h"

namespace ringcomm {

class ShmPeerLinks : public Transport {
 public:
  ShmPeerLinks(int rank, int worldSize, ShmOptions options);

  // Creates the channel to `peer` and returns its name (for the receiver to attach).
  std::string createOutgoing(int peer);
  void attachIncoming(int peer, const std::string& name);
  // Removes the incoming channel's name from /dev/shm: both ends have it mapped.
  void unlinkIncoming(int peer);
  bool hasOutgoing(int peer) const;
  bool hasIncoming(int peer) const;
  // The tag of the next send/recv message from `peer`, if it has arrived (nothing is taken):
  // how a receive from any source finds its sender.
  std::optional<int> arrivedTag(int peer) const;

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;

  TrafficStats traffic() const override { return traffic_.snapshot(); }
  void resetTraffic() override { traffic_.reset(); }

 private:
  void checkPeer(int peer) const;

  int rank_, worldSize_;
  ShmOptions options_;
  TrafficCounters traffic_;
  std::vector<ShmChannel> outgoing_, incoming_;  // by peer rank
  std::vector<uint32_t> heldPayload_;            // by peer: payload of the message being read
};

}  // namespace ringcomm
