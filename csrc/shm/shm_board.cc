#include "shm/shm_board.h"

#include <cstring>

#include "ringcomm/error.h"
#include "ringcomm/types.h"

namespace ringcomm {
namespace {

constexpr uint64_t kBoardMagic = 0x72696e67626f6172ULL;  // "ringboar"

size_t areaStride(size_t publishBytes) {
  return sizeof(PublicationHeader) + ((publishBytes + 63) / 64) * 64;
}

// Per phase, one area per round parity: a round's publications stay readable while the next
// round's are written (see Transport's publications).
size_t boardBytes(size_t publishBytes) {
  return sizeof(BoardControl) + areaStride(publishBytes) * ShmBoard::kPhases * 2;
}

// Whether `count` rounds published include round `round` (wraps after 2^32 rounds).
bool reached(uint32_t count, uint32_t round) { return static_cast<int32_t>(count - round) >= 0; }

}  // namespace

ShmBoard ShmBoard::create(size_t publishBytes, int ownerRank) {
  ShmBoard board;
  board.segment_ = ControlledSegment<BoardControl>::create(
      boardBytes(publishBytes), ownerRank, kBoardMagic,
      [&](BoardControl& control) { control.publishBytes = publishBytes; });
  board.control_ = board.segment_.control();
  return board;
}

ShmBoard ShmBoard::attach(const std::string& name) {
  ShmBoard board;
  board.segment_ = ControlledSegment<BoardControl>::attach(
      name, "publication board", kBoardMagic,
      [](const BoardControl& control) { return boardBytes(control.publishBytes); });
  board.control_ = board.segment_.control();
  return board;
}

PublicationHeader* ShmBoard::header(int phase, uint32_t round) const {
  char* first = reinterpret_cast<char*>(control_) + sizeof(BoardControl);
  const size_t index = static_cast<size_t>(phase) * 2 + (round & 1);
  return reinterpret_cast<PublicationHeader*>(first + areaStride(control_->publishBytes) * index);
}

void* ShmBoard::area(int phase, uint32_t round) const { return header(phase, round) + 1; }

void ShmBoard::publish(int phase, uint32_t round, const Envelope& envelope) {
  PublicationHeader* got = header(phase, round);
  got->envelope = envelope;
  got->round.store(round, std::memory_order_release);
  control_->published[phase].store(round, std::memory_order_seq_cst);
  wakeSleepers(control_->published[phase], control_->sleepers[phase], /*moveWord=*/false);
}

const void* ShmBoard::read(int phase, uint32_t round, const Envelope& expected,
                           const WaitPolicy& policy, const std::function<void()>& watch) const {
  throwIfAborted();
  const PublicationHeader* got = header(phase, round);
  auto ready = [&] { return reached(got->round.load(std::memory_order_acquire), round); };
  if (!ready()) {
    // `watch` may find a peer already running the next collective; that peer has read this
    // publication, so it is visible once its message is: looked at again after the watch, it
    // was only this rank's wake that came late (not a mismatch).
    auto watchUnlessReady = [&] {
      try {
        watch();
      } catch (const MismatchError&) {
        if (!ready()) throw;
      }
    };
    const WaitTarget target{owner(), nullptr, "", &expected, phase};
    waitUntil(ready, control_->published[phase], control_->sleepers[phase], policy, target,
              [this] { throwIfAborted(); }, watchUnlessReady);
  }
  checkEnvelope(control_->header.ownerRank, got->envelope, expected, EnvelopeFrom::Publication);
  return got + 1;
}

void ShmBoard::throwIfAborted() const {
  if (control_->aborted.load(std::memory_order_acquire))
    RC_THROW_AS(PeerError, "the communicator was aborted: ", control_->abortReason);
}

void ShmBoard::abort(const std::string& why) {
  if (control_ == nullptr) return;
  if (!control_->aborted.load()) {
    std::strncpy(control_->abortReason, why.c_str(), sizeof(control_->abortReason) - 1);
    control_->aborted.store(1, std::memory_order_seq_cst);
  }
  for (auto& word : control_->published) futexWakeAll(word);
}

}  // namespace ringcomm
