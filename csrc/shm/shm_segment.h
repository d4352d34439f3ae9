// One POSIX shared-memory segment, mapped: created under a unique name by its owner, attached by
// name by the other ranks. The owner unlinks the name when it goes away (or earlier, once every
// rank has it mapped); the mapping lasts as long as the object.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

#include "ringcomm/error.h"

namespace ringcomm {

class ShmSegment {
 public:
  // A new zero-filled segment of `bytes` under a unique name ("/ringcomm-<pid>-r<rank>-...").
  static ShmSegment create(size_t bytes, int ownerRank);
  // Maps the segment another rank created; `what` names it in errors.
  static ShmSegment attach(const std::string& name, const char* what);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();

  void* data() const { return memory_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Removes the name from /dev/shm if still there (ENOENT when a peer already did: fine).
  void unlinkName() const;

  // Unlinks ringcomm's names in `folder` whose creating process is gone and which are older
  // than `minAgeSeconds`: what a process killed during set-up (before every rank had mapped its
  // segments) left behind. Returns how many it removed. create() runs it once per process.
  static size_t removeStale(const std::string& folder = "/dev/shm", double minAgeSeconds = 60);

 private:
  std::string name_;
  void* memory_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
};

// The first member of every ringcomm segment's control block: what kind of segment it is (its
// magic) and who created it.
struct SegmentHeader {
  uint64_t magic;
  int32_t ownerRank;
  int32_t ownerPid;
};

// A segment that begins with a `Control` block whose first member is `SegmentHeader header`:
// created with its header stamped, attached only once the header says it is one.
template <typename Control>
class ControlledSegment {
 public:
  // A new segment of `bytes`; `fill(control)` sets up the new Control before the header is
  // stamped with `magic`, `ownerRank` and this process.
  template <typename Fill>
  static ControlledSegment create(size_t bytes, int ownerRank, uint64_t magic, Fill fill) {
    ControlledSegment made;
    made.segment_ = ShmSegment::create(bytes, ownerRank);
    made.control_ = new (made.segment_.data()) Control();
    fill(*made.control_);
    made.control_->header.ownerRank = ownerRank;
    made.control_->header.ownerPid = getpid();
    made.control_->header.magic = magic;
    return made;
  }

  // Maps the segment another rank created (a `what` in errors); raises unless its header has
  // `magic` and it is `bytesFor(control)` bytes long.
  template <typename BytesFor>
  static ControlledSegment attach(const std::string& name, const char* what, uint64_t magic,
                                  BytesFor bytesFor) {
    ControlledSegment found;
    found.segment_ = ShmSegment::attach(name, what);
    const size_t bytes = found.segment_.size();
    auto* control = static_cast<Control*>(found.segment_.data());
    RC_CHECK(bytes >= sizeof(Control) && control->header.magic == magic &&
                 bytesFor(*control) == bytes,
             "shared memory ", name, " is not a ringcomm ", what);
    found.control_ = control;
    return found;
  }

  Control* control() const { return control_; }
  const std::string& name() const { return segment_.name(); }
  void unlinkName() const { segment_.unlinkName(); }

 private:
  ShmSegment segment_;
  Control* control_ = nullptr;
};

}  // namespace ringcomm
