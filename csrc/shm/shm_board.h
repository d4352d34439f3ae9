// A rank's publication board in POSIX shared memory (Transport's publications, transport.h):
// per phase (0, 1) and round parity one area of publishBytes behind a header that holds the
// publication's round and Envelope, and per phase a count of the rounds published, the futex
// word sleeping readers wait on. The owner writes; every rank maps the board and reads the areas
// in place.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ringcomm/transport.h"
#include "shm/shm_segment.h"
#include "shm/shm_wait.h"

namespace ringcomm {

struct alignas(64) BoardControl {
  SegmentHeader header;
  uint64_t publishBytes;
  alignas(64) std::atomic<uint32_t> published[2];  // rounds published, per phase
  std::atomic<uint32_t> sleepers[2];               // readers asleep on published[phase]
  alignas(64) std::atomic<uint32_t> aborted;
  char abortReason[512];
};

// One cache line: readers poll the round, so a wait ends with the envelope already here (a
// small publication then costs its reader two line transfers, this one and the data's).
struct alignas(64) PublicationHeader {
  std::atomic<uint32_t> round;  // of the publication this area holds
  Envelope envelope;
};
static_assert(sizeof(PublicationHeader) == 64, "a publication's header is one cache line");

class ShmBoard {
 public:
  static constexpr int kPhases = 2;

  static ShmBoard create(size_t publishBytes, int ownerRank);
  static ShmBoard attach(const std::string& name);

  const std::string& name() const { return segment_.name(); }
  void unlinkName() { segment_.unlinkName(); }
  bool valid() const { return control_ != nullptr; }
  Peer owner() const { return Peer{control_->header.ownerRank, control_->header.ownerPid}; }

  // Owner: where round `round`'s publication of `phase` goes, then publishing it.
  void* area(int phase, uint32_t round) const;
  void publish(int phase, uint32_t round, const Envelope& envelope);
  // Any rank: the owner's publication of `phase` in `round`, once published (waits with
  // `policy`; `watch` may raise while the wait is slow), checked against `expected`.
  const void* read(int phase, uint32_t round, const Envelope& expected, const WaitPolicy& policy,
                   const std::function<void()>& watch) const;

  void abort(const std::string& why);

 private:
  PublicationHeader* header(int phase, uint32_t round) const;
  void throwIfAborted() const;

  ControlledSegment<BoardControl> segment_;
  BoardControl* control_ = nullptr;  // segment_'s
};

}  // namespace ringcomm
