// Transport between local processes over shared memory: each rank owns the channel to its ring
// successor and maps every other rank's, so that a message passed on round the ring (allgather,
// broadcast) is forwarded by reference and read where it was first written. Each rank also owns
// a publication board (shm_board.h) every rank maps: the one-hop algorithms read every rank's
// publications there. Set up in three calls around a name exchange:
//   ShmTransport t(rank, size, options);  publish t.channelName();
//   t.connect(everyRanksName);  barrier;  t.unlinkNames();
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "ringcomm/transport.h"
#include "shm/shm_board.h"
#include "shm/shm_channel.h"
#include "ringcomm/traffic_counters.h"

namespace ringcomm {

// Every field is set by the caller: the Python layer passes CommOptions' resolved values
// (ringcomm/options.py holds the defaults).
struct ShmOptions {
  size_t slotBytes = 0;
  uint32_t slotCount = 0;
  size_t publishBytes = 0;  // per rank, phase and round (the board holds 4 of them)
  WaitPolicy wait;
};

class ShmTransport : public Transport {
 public:
  ShmTransport(int rank, int worldSize, ShmOptions options);

  // Names of this rank's outgoing channel and board, as one string ("" for a single rank).
  std::string channelName() const;
  // Maps every rank's channel and board; names[r] is rank r's channelName().
  void connect(const std::vector<std::string>& names);
  // Removes the names from /dev/shm once every rank has connected: from then on nothing of ours
  // is left there, whatever happens to any process.
  void unlinkNames();

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  size_t columnsPerWave() const override { return std::max<size_t>(1, options_.slotCount / 2); }
  bool forwardsInPlace() const override { return true; }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void forward(int from, int to, const Envelope& envelope) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;

  size_t publishBytes() const override { return options_.publishBytes; }
  void* acquirePublish(int phase, size_t bytes) override;
  void commitPublish(int phase, const Envelope& envelope) override;
  const void* acquirePublished(int peer, int phase, const Envelope& expected) override;

  TrafficStats traffic() const override { return traffic_.snapshot(); }
  void resetTraffic() override { traffic_.reset(); }

 private:
  void checkPeer(int peer, int expected, const char* role) const;
  void checkPhase(int phase) const;
  ShmChannel& outgoing() { return channels_[rank_]; }
  ShmChannel& incoming() { return channels_[prev_]; }

  int rank_, worldSize_, next_, prev_;
  ShmOptions options_;
  TrafficCounters traffic_;
  std::vector<ShmChannel> channels_;  // by owner rank: channels_[r] carries r -> r + 1
  std::vector<ShmBoard> boards_;      // by owner rank
  uint32_t round_ = 0;                // publication rounds this rank has started
  std::vector<Peer> others_;          // every other rank: any may hold a forwarded slot
  // Where the payload of the message acquireRecv returned lives.
  int heldRank_ = -1;
  uint32_t heldIndex_ = 0;
};

}  // namespace ringcomm
