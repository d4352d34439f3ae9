// One direction of a ring link in POSIX shared memory: a ring of messages, read by the receiver
// in order, and a ring of payload slots. A message names the payload it carries: one of this
// channel's slots, or (a message forwarded by reference) a slot of another rank's channel. A
// slot is read by every rank the payload is forwarded to and is free again once the last of
// them lets go; a message is free once its receiver has read it. Forwarded payloads are held
// for several steps, so messages have their own ring: a rank can keep forwarding while its
// slots are held. Counters are 32-bit so waiters can sleep on them with futex (shm_wait.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringcomm/transport.h"
#include "shm/shm_segment.h"
#include "shm/shm_wait.h"

namespace ringcomm {

struct alignas(64) ChannelControl {
  SegmentHeader header;  // the owner is the sender
  uint64_t slotBytes;
  uint32_t slotCount;
  uint32_t messageCount;
  std::atomic<int32_t> receiverPid;
  alignas(64) std::atomic<uint32_t> head;  // messages published by the sender
  std::atomic<uint32_t> receiverSleeping;  // receivers asleep on head
  alignas(64) std::atomic<uint32_t> consumed;  // messages read by the receiver
  std::atomic<uint32_t> released;  // moved when a message is read or a slot freed while the
                                   // sender sleeps: its futex word
  std::atomic<uint32_t> senderSleeping;  // senders asleep on released
  alignas(64) std::atomic<uint32_t> aborted;
  char abortReason[512];
};

struct alignas(64) Message {
  Envelope envelope;
  int32_t originRank;     // whose channel holds the payload (the sender's, unless forwarded)
  uint32_t payloadIndex;  // payload number in that channel
};

struct alignas(64) SlotHeader {
  Envelope envelope;            // of the message that first carried the payload
  std::atomic<uint32_t> holds;  // readers that have not let go of this slot yet
};

class ShmChannel {
 public:
  // Creates a new segment (the sending side) under a unique name.
  static ShmChannel create(size_t slotBytes, uint32_t slotCount, int ownerRank);
  // Maps the segment another rank created; its name stays until unlinkName().
  static ShmChannel attach(const std::string& name);
  // The receiving side records its process, for the sender's liveness checks.
  void claimReceiver();
  pid_t senderPid() const { return control_->header.ownerPid; }

  ShmChannel() = default;
  ShmChannel(ShmChannel&& other) noexcept { *this = std::move(other); }
  ShmChannel& operator=(ShmChannel&& other) noexcept;

  const std::string& name() const { return segment_.name(); }
  size_t slotBytes() const { return control_->slotBytes; }
  bool valid() const { return control_ != nullptr; }

  // Sender side: room for a payload, then its message; or a message that forwards a payload
  // held in a channel (originRank's) by reference.
  // A slot can be held by any rank its payload was forwarded to: `holders` are checked on too.
  void* acquireSend(const WaitPolicy& policy, int peerRank, const std::vector<Peer>& holders);
  void commitSend(const Envelope& envelope);
  void acquireForward(const WaitPolicy& policy, int peerRank);
  void commitForward(const Envelope& envelope, int originRank, uint32_t payloadIndex);
  // Receiver side: the next message (checked against `expected`), then done with it (its
  // payload stays held until let go).
  const Message& acquireRecv(const Envelope& expected, const WaitPolicy& policy, int peerRank);
  void releaseRecv();
  // Receiver side: the next message if one has arrived, without waiting or taking it.
  const Message* peek() const;
  // Any rank that maps the channel: a payload, its header, and its reader count.
  void* payload(uint32_t index) const { return slot(index) + 1; }
  const SlotHeader& slotHeader(uint32_t index) const { return *slot(index); }
  void hold(uint32_t index);
  void letGo(uint32_t index);

  void abort(const std::string& why);
  // Removes the name from /dev/shm if still there (once every rank has it mapped, and the
  // creator's clean-up).
  void unlinkName() { segment_.unlinkName(); }

 private:
  Message* message(uint32_t index) const;
  SlotHeader* slot(uint32_t index) const;
  // After a message is read or a slot freed: wakes the sender if it sleeps.
  void wakeSender();
  // Waits until ready() (shm_wait.h); sleeps on `word`, which changes whenever ready() may have
  // become true (sender: released; receiver: head).
  template <typename Ready>
  void wait(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
            const WaitPolicy& policy, const WaitTarget& target) const;
  void throwIfAborted() const;

  ControlledSegment<ChannelControl> segment_;
  ChannelControl* control_ = nullptr;  // segment_'s
  uint32_t cursor_ = 0;         // next message this side writes (sender) or reads (receiver)
  uint32_t slotCursor_ = 0;     // next payload slot the sender fills
};

}  // namespace ringcomm
