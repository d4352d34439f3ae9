// One direction of a ring link in POSIX shared memory: a ring of message slots written by the
// sender and released by the receiver. Counters are 32-bit so waiters can sleep on them with
// futex; waits spin briefly, then sleep in short slices, checking the deadline, an abort flag
// and whether the peer process still exists.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ringcomm/transport.h"

namespace ringcomm {

struct alignas(64) ChannelControl {
  uint64_t magic;
  uint64_t slotBytes;
  uint32_t slotCount;
  int32_t senderPid;
  std::atomic<int32_t> receiverPid;
  alignas(64) std::atomic<uint32_t> head;  // messages published by the sender
  std::atomic<uint32_t> receiverSleeping;
  alignas(64) std::atomic<uint32_t> tail;  // messages released by the receiver
  std::atomic<uint32_t> senderSleeping;
  alignas(64) std::atomic<uint32_t> aborted;
  char abortReason[512];
};

struct alignas(64) SlotHeader {
  Envelope envelope;
};

// How a rank waits for its neighbour: spin (the peer runs on another core), then yield (the
// peer may need this core: with more ranks than cores that is the common case), then sleep on
// the futex in short slices, checking the deadline, the abort flag and the peer's process.
struct WaitPolicy {
  double timeoutSeconds = 1800;
  int spins = 200;             // busy polls first
  int yieldMicros = 2000;      // then sched_yield polls for this long
  int sleepMillis = 20;        // then futex slices
};

class ShmChannel {
 public:
  // Creates a new segment (the sending side) under a unique name.
  static ShmChannel create(size_t slotBytes, uint32_t slotCount, int ownerRank);
  // Maps the segment a peer created (the receiving side) and unlinks its name: once both ends
  // have it mapped, nothing is left in /dev/shm even if a process is killed.
  static ShmChannel attach(const std::string& name);

  ShmChannel() = default;
  ShmChannel(ShmChannel&& other) noexcept;
  ShmChannel& operator=(ShmChannel&& other) noexcept;
  ~ShmChannel();

  const std::string& name() const { return name_; }
  size_t slotBytes() const { return control_->slotBytes; }
  bool valid() const { return control_ != nullptr; }

  // Sender side.
  void* acquireSend(const WaitPolicy& policy, int peerRank);
  void commitSend(const Envelope& envelope);
  // Receiver side.
  const void* acquireRecv(const Envelope& expected, const WaitPolicy& policy, int peerRank);
  void releaseRecv();

  void abort(const std::string& why);
  // Removes the name from /dev/shm if still there (creator's clean-up).
  void unlinkName();

 private:
  SlotHeader* slot(uint32_t index) const;
  // Waits until word != stale (sender: tail moved; receiver: head moved).
  void waitChange(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleeping,
                  uint32_t stale, const WaitPolicy& policy, int peerRank, pid_t peerPid,
                  const char* what) const;
  void throwIfAborted() const;

  std::string name_;
  ChannelControl* control_ = nullptr;
  size_t mappedBytes_ = 0;
  bool owner_ = false;
  uint32_t cursor_ = 0;  // next message this side writes (sender) or reads (receiver)
};

}  // namespace ringcomm
