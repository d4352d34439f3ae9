#include "shm/shm_channel.h"

#include <unistd.h>

#include <cstring>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

constexpr uint64_t kMagic = 0x72696e67636f6d6dULL;  // "ringcomm"

size_t slotStride(size_t slotBytes) { return sizeof(SlotHeader) + ((slotBytes + 63) / 64) * 64; }

// Twice as many messages as slots: forwarding steps send messages while slots are held.
uint32_t messageCount(uint32_t slotCount) { return 2 * slotCount; }

size_t segmentBytes(size_t slotBytes, uint32_t slotCount) {
  return sizeof(ChannelControl) + sizeof(Message) * messageCount(slotCount) +
         slotStride(slotBytes) * slotCount;
}

}  // namespace

ShmChannel ShmChannel::create(size_t slotBytes, uint32_t slotCount, int ownerRank) {
  RC_CHECK(slotCount >= 2, "a shared-memory channel needs at least 2 slots");
  ShmChannel channel;
  channel.segment_ = ControlledSegment<ChannelControl>::create(
      segmentBytes(slotBytes, slotCount), ownerRank, kMagic, [&](ChannelControl& control) {
        control.slotBytes = slotBytes;
        control.slotCount = slotCount;
        control.messageCount = messageCount(slotCount);
      });
  channel.control_ = channel.segment_.control();
  return channel;
}

ShmChannel ShmChannel::attach(const std::string& name) {
  ShmChannel channel;
  channel.segment_ = ControlledSegment<ChannelControl>::attach(
      name, "shared-memory channel", kMagic, [](const ChannelControl& control) {
        return segmentBytes(control.slotBytes, control.slotCount);
      });
  channel.control_ = channel.segment_.control();
  return channel;
}

void ShmChannel::claimReceiver() { control_->receiverPid.store(getpid()); }

ShmChannel& ShmChannel::operator=(ShmChannel&& other) noexcept {
  std::swap(segment_, other.segment_);
  std::swap(control_, other.control_);
  std::swap(cursor_, other.cursor_);
  std::swap(slotCursor_, other.slotCursor_);
  return *this;
}

Message* ShmChannel::message(uint32_t index) const {
  auto* first = reinterpret_cast<Message*>(reinterpret_cast<char*>(control_) +
                                           sizeof(ChannelControl));
  return first + index % control_->messageCount;
}

SlotHeader* ShmChannel::slot(uint32_t index) const {
  char* first = reinterpret_cast<char*>(control_) + sizeof(ChannelControl) +
                sizeof(Message) * control_->messageCount;
  return reinterpret_cast<SlotHeader*>(first + slotStride(control_->slotBytes) *
                                                   (index % control_->slotCount));
}

void ShmChannel::throwIfAborted() const {
  if (control_->aborted.load(std::memory_order_acquire))
    RC_THROW_AS(PeerError, "the ring was aborted: ", control_->abortReason);
}

template <typename Ready>
void ShmChannel::wait(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                      const WaitPolicy& policy, const WaitTarget& target) const {
  waitUntil(ready, word, sleepers, policy, target, [this] { throwIfAborted(); }, [] {});
}

void ShmChannel::acquireForward(const WaitPolicy& policy, int peerRank) {
  throwIfAborted();
  const uint32_t full = cursor_ - control_->messageCount;
  auto room = [this, full] { return control_->consumed.load(std::memory_order_acquire) != full; };
  if (!room())
    wait(room, control_->released, control_->senderSleeping, policy,
         {Peer{peerRank, control_->receiverPid.load()}, nullptr,
          "read a message (all messages are unread)"});
}

void* ShmChannel::acquireSend(const WaitPolicy& policy, int peerRank,
                              const std::vector<Peer>& holders) {
  acquireForward(policy, peerRank);  // a payload's message needs room too
  const SlotHeader* next = slot(slotCursor_);
  auto free = [next] { return next->holds.load(std::memory_order_acquire) == 0; };
  if (!free())
    wait(free, control_->released, control_->senderSleeping, policy,
         {Peer{peerRank, control_->receiverPid.load()}, &holders,
          "free a slot (it or a rank it forwarded them to holds them all)"});
  return slot(slotCursor_) + 1;
}

void ShmChannel::commitSend(const Envelope& envelope) {
  SlotHeader* header = slot(slotCursor_);
  header->envelope = envelope;
  header->holds.store(1, std::memory_order_relaxed);  // the receiver's; published with head
  commitForward(envelope, control_->header.ownerRank, slotCursor_++);
}

void ShmChannel::commitForward(const Envelope& envelope, int originRank, uint32_t payloadIndex) {
  Message* next = message(cursor_);
  next->envelope = envelope;
  next->originRank = originRank;
  next->payloadIndex = payloadIndex;
  ++cursor_;
  control_->head.store(cursor_, std::memory_order_seq_cst);
  wakeSleepers(control_->head, control_->receiverSleeping, /*moveWord=*/false);
}

const Message& ShmChannel::acquireRecv(const Envelope& expected, const WaitPolicy& policy,
                                       int peerRank) {
  throwIfAborted();
  auto arrived = [this] { return control_->head.load(std::memory_order_acquire) != cursor_; };
  if (!arrived())
    wait(arrived, control_->head, control_->receiverSleeping, policy,
         {Peer{peerRank, control_->header.ownerPid}, nullptr, "send a message"});
  const Message& got = *message(cursor_);
  checkEnvelope(peerRank, got.envelope, expected);
  return got;
}

const Message* ShmChannel::peek() const {
  return control_->head.load(std::memory_order_acquire) != cursor_ ? message(cursor_) : nullptr;
}

void ShmChannel::releaseRecv() {
  control_->consumed.store(++cursor_, std::memory_order_seq_cst);
  wakeSender();
}

void ShmChannel::hold(uint32_t index) { slot(index)->holds.fetch_add(1, std::memory_order_relaxed); }

void ShmChannel::letGo(uint32_t index) {
  if (slot(index)->holds.fetch_sub(1, std::memory_order_seq_cst) == 1) wakeSender();
}

void ShmChannel::wakeSender() {
  // Only a sleeping sender needs the word to move: it counted itself before its last look.
  wakeSleepers(control_->released, control_->senderSleeping, /*moveWord=*/true);
}

void ShmChannel::abort(const std::string& why) {
  if (control_ == nullptr) return;
  if (!control_->aborted.load()) {
    std::strncpy(control_->abortReason, why.c_str(), sizeof(control_->abortReason) - 1);
    control_->aborted.store(1, std::memory_order_seq_cst);
  }
  futexWakeAll(control_->head);
  futexWakeAll(control_->released);
}

}  // namespace ringcomm
