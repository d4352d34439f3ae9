// One POSIX shared-memory segment, mapped: created under a unique name by its owner, attached by
// name by the other ranks. The owner unlinks the name when it goes away (or earlier, once every
// rank has it mapped); the mapping lasts as long as the object.
#pragma once

#include <cstddef>
#include <string>

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

}  // namespace ringcomm
