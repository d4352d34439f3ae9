#include "cpu/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "ringcomm/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RC_CPU_RELAX() _mm_pause()
#else
#define RC_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

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

std::string uniqueName(int ownerRank) {
  static std::atomic<uint32_t> counter{0};
  std::random_device random;
  return detail::concat("/ringcomm-", getpid(), "-r", ownerRank, "-", counter++, "-",
                        std::hex, random());
}

void futexWait(std::atomic<uint32_t>& word, uint32_t stale, int millis) {
  timespec timeout{millis / 1000, (millis % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, stale, &timeout, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

// A process that exited is gone (ESRCH) or a zombie its parent has not reaped yet.
bool processAlive(pid_t pid) {
  if (pid <= 0) return true;  // not known yet
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

}  // namespace

ShmChannel ShmChannel::create(size_t slotBytes, uint32_t slotCount, int ownerRank) {
  RC_CHECK(slotCount >= 2, "a shared-memory channel needs at least 2 slots");
  ShmChannel channel;
  channel.name_ = uniqueName(ownerRank);
  channel.owner_ = true;
  channel.mappedBytes_ = segmentBytes(slotBytes, slotCount);
  int fd = shm_open(channel.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  RC_CHECK(fd >= 0, "cannot create shared memory ", channel.name_, ": ", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(channel.mappedBytes_)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(channel.name_.c_str());
    RC_THROW("cannot size shared memory ", channel.name_, " to ", channel.mappedBytes_,
             " bytes: ", std::strerror(err), " (is /dev/shm full?)");
  }
  void* memory = mmap(nullptr, channel.mappedBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (memory == MAP_FAILED) {
    shm_unlink(channel.name_.c_str());
    RC_THROW("cannot map shared memory ", channel.name_, ": ", std::strerror(err));
  }
  auto* control = new (memory) ChannelControl();
  control->slotBytes = slotBytes;
  control->slotCount = slotCount;
  control->messageCount = messageCount(slotCount);
  control->ownerRank = ownerRank;
  control->senderPid = getpid();
  control->magic = kMagic;
  channel.control_ = control;
  return channel;
}

ShmChannel ShmChannel::attach(const std::string& name) {
  ShmChannel channel;
  channel.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  RC_CHECK(fd >= 0, "cannot open shared memory ", name, " of another rank: ",
           std::strerror(errno), " (ranks must run on one host)");
  struct stat info {};
  fstat(fd, &info);
  channel.mappedBytes_ = static_cast<size_t>(info.st_size);
  void* memory = channel.mappedBytes_ >= sizeof(ChannelControl)
                     ? mmap(nullptr, channel.mappedBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  close(fd);
  RC_CHECK(memory != MAP_FAILED, "cannot map shared memory ", name, " of another rank");
  channel.control_ = static_cast<ChannelControl*>(memory);
  RC_CHECK(channel.control_->magic == kMagic &&
               segmentBytes(channel.control_->slotBytes, channel.control_->slotCount) ==
                   channel.mappedBytes_,
           "shared memory ", name, " is not a ringcomm channel");
  return channel;
}

void ShmChannel::claimReceiver() { control_->receiverPid.store(getpid()); }

ShmChannel::ShmChannel(ShmChannel&& other) noexcept { *this = std::move(other); }

ShmChannel& ShmChannel::operator=(ShmChannel&& other) noexcept {
  std::swap(name_, other.name_);
  std::swap(control_, other.control_);
  std::swap(mappedBytes_, other.mappedBytes_);
  std::swap(owner_, other.owner_);
  std::swap(cursor_, other.cursor_);
  std::swap(slotCursor_, other.slotCursor_);
  return *this;
}

ShmChannel::~ShmChannel() {
  if (owner_) unlinkName();
  if (control_ != nullptr) munmap(control_, mappedBytes_);
}

void ShmChannel::unlinkName() {
  if (!name_.empty()) shm_unlink(name_.c_str());  // ENOENT once the peer unlinked it: fine
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
void ShmChannel::waitUntil(Ready ready, std::atomic<uint32_t>& word,
                           std::atomic<uint32_t>& sleeping, const WaitPolicy& policy,
                           Peer awaited, const std::vector<Peer>& watched,
                           const char* what) const {
  for (int i = 0; i < policy.spins; ++i) {
    if (ready()) return;
    RC_CPU_RELAX();
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto stopYielding = start + std::chrono::microseconds(policy.yieldMicros);
  const auto deadline = start + std::chrono::duration<double>(policy.timeoutSeconds);
  for (int round = 0; !ready(); ++round) {
    if ((round & 63) == 0) throwIfAborted();
    sched_yield();
    if ((round & 15) == 15 && Clock::now() > stopYielding) break;
  }
  for (int round = 0;; ++round) {
    // Read the word, then announce the sleep, then look once more. Whoever makes us ready
    // does so, then checks the flag and, if set, moves the word and wakes us (all sequentially
    // consistent): either we see it ready, or it sees the flag, and then the futex either sees
    // the moved word or gets the wake.
    const uint32_t stale = word.load(std::memory_order_seq_cst);
    sleeping.store(1, std::memory_order_seq_cst);
    if (ready()) break;
    throwIfAborted();
    futexWait(word, stale, policy.sleepMillis);
    if (ready()) break;
    throwIfAborted();
    if ((round & 3) == 3) {
      if (!processAlive(awaited.pid))
        RC_THROW_AS(PeerError, "rank ", awaited.rank, " (process ", awaited.pid,
                    ") died while this rank was waiting for it to ", what);
      for (const Peer& other : watched)
        if (!processAlive(other.pid))
          RC_THROW_AS(PeerError, "rank ", other.rank, " (process ", other.pid,
                      ") died while this rank was waiting for rank ", awaited.rank, " to ", what);
    }
    if (Clock::now() > deadline)
      RC_THROW_AS(TimeoutError, "timed out after ", policy.timeoutSeconds,
                  " s waiting for rank ", awaited.rank, " to ", what);
  }
  sleeping.store(0, std::memory_order_relaxed);
}

void ShmChannel::acquireForward(const WaitPolicy& policy, int peerRank) {
  throwIfAborted();
  const uint32_t full = cursor_ - control_->messageCount;
  auto room = [this, full] { return control_->consumed.load(std::memory_order_acquire) != full; };
  if (!room())
    waitUntil(room, control_->released, control_->senderSleeping, policy,
              Peer{peerRank, control_->receiverPid.load()}, {},
              "read a message (all messages are unread)");
}

void* ShmChannel::acquireSend(const WaitPolicy& policy, int peerRank,
                              const std::vector<Peer>& holders) {
  acquireForward(policy, peerRank);  // a payload's message needs room too
  const SlotHeader* next = slot(slotCursor_);
  auto free = [next] { return next->holds.load(std::memory_order_acquire) == 0; };
  if (!free())
    waitUntil(free, control_->released, control_->senderSleeping, policy,
              Peer{peerRank, control_->receiverPid.load()}, holders,
              "free a slot (it or a rank it forwarded them to holds them all)");
  return slot(slotCursor_) + 1;
}

void ShmChannel::commitSend(const Envelope& envelope) {
  SlotHeader* header = slot(slotCursor_);
  header->envelope = envelope;
  header->holds.store(1, std::memory_order_relaxed);  // the receiver's; published with head
  commitForward(envelope, control_->ownerRank, slotCursor_++);
}

void ShmChannel::commitForward(const Envelope& envelope, int originRank, uint32_t payloadIndex) {
  Message* next = message(cursor_);
  next->envelope = envelope;
  next->originRank = originRank;
  next->payloadIndex = payloadIndex;
  ++cursor_;
  control_->head.store(cursor_, std::memory_order_seq_cst);
  if (control_->receiverSleeping.load(std::memory_order_seq_cst)) {
    control_->receiverSleeping.store(0, std::memory_order_relaxed);
    futexWakeAll(control_->head);
  }
}

const Message& ShmChannel::acquireRecv(const Envelope& expected, const WaitPolicy& policy,
                                       int peerRank) {
  throwIfAborted();
  auto arrived = [this] { return control_->head.load(std::memory_order_acquire) != cursor_; };
  if (!arrived())
    waitUntil(arrived, control_->head, control_->receiverSleeping, policy,
              Peer{peerRank, control_->senderPid}, {}, "send a message");
  const Message& got = *message(cursor_);
  if (got.envelope == expected) return got;
  RC_THROW_AS(MismatchError, "collective mismatch: rank ", peerRank, " sent ",
              describeEnvelope(got.envelope), " but this rank is running ",
              describeEnvelope(expected));
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
  // Only a sleeping sender needs the word to move: it set the flag before its last look.
  if (control_->senderSleeping.load(std::memory_order_seq_cst)) {
    control_->senderSleeping.store(0, std::memory_order_relaxed);
    control_->released.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(control_->released);
  }
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
