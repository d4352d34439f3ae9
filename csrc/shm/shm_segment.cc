#include "shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <utility>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

constexpr char kPrefix[] = "ringcomm-";

// Unique across processes and across segments of one process: a killed process leaves its
// names behind, and O_EXCL must not meet them.
std::string uniqueName(int ownerRank) {
  static std::atomic<uint32_t> counter{0};
  std::random_device random;
  return detail::concat("/", kPrefix, getpid(), "-r", ownerRank, "-", counter++, "-", std::hex,
                        random());
}

// The creator's pid in one of uniqueName's names, with or without the leading '/'; 0 for
// another name.
pid_t creatorOf(const std::string& name) {
  const size_t start = name.compare(0, 1, "/") == 0 ? 1 : 0;
  if (name.compare(start, sizeof(kPrefix) - 1, kPrefix) != 0) return 0;
  char* end = nullptr;
  const long pid = std::strtol(name.c_str() + start + sizeof(kPrefix) - 1, &end, 10);
  return pid > 0 && end != nullptr && *end == '-' ? static_cast<pid_t>(pid) : 0;
}

// What became of a peer's segment that is not there, for the error: its creator removed it
// (closing, or after a failed set-up) or exited. Ranks that see different /dev/shm mounts are
// told so before anything is attached (the Python set-up compares where each rank runs).
std::string whyMissing(const std::string& name) {
  const pid_t pid = creatorOf(name);
  if (pid == 0) return "";
  if (kill(pid, 0) == 0 || errno != ESRCH)
    return detail::concat(" (its creator, process ", pid,
                          ", is running: it removed the segment, closing or giving up set-up)");
  return detail::concat(" (its creator, process ", pid, ", has exited and the segment with it)");
}

}  // namespace

size_t ShmSegment::removeStale(const std::string& folder, double minAgeSeconds) {
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return 0;
  size_t removed = 0;
  const time_t now = time(nullptr);
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0) continue;
    const pid_t pid = creatorOf(name);
    if (pid == 0) continue;                             // not one of uniqueName's
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // its creator lives
    struct stat st {};
    if (stat((folder + "/" + name).c_str(), &st) != 0) continue;
    if (difftime(now, st.st_mtime) < minAgeSeconds) continue;  // maybe another PID namespace's
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

ShmSegment ShmSegment::create(size_t bytes, int ownerRank) {
  static std::once_flag reaped;
  std::call_once(reaped, [] { removeStale(); });
  ShmSegment segment;
  segment.name_ = uniqueName(ownerRank);
  segment.owner_ = true;
  segment.bytes_ = bytes;
  const char* name = segment.name_.c_str();
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  RC_CHECK(fd >= 0, "cannot create shared memory ", name, ": ", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name);
    RC_THROW("cannot size shared memory ", name, " to ", bytes, " bytes: ", std::strerror(err),
             " (is /dev/shm full?)");
  }
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (memory == MAP_FAILED) {
    shm_unlink(name);
    RC_THROW("cannot map shared memory ", name, ": ", std::strerror(err));
  }
  segment.memory_ = memory;
  return segment;
}

ShmSegment ShmSegment::attach(const std::string& name, const char* what) {
  ShmSegment segment;
  segment.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    RC_THROW("cannot open the ", what, " ", name, " of another rank: ", std::strerror(err),
             err == ENOENT ? whyMissing(name) : "");
  }
  struct stat info {};
  fstat(fd, &info);
  segment.bytes_ = static_cast<size_t>(info.st_size);
  void* memory = segment.bytes_ > 0
                     ? mmap(nullptr, segment.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  close(fd);
  RC_CHECK(memory != MAP_FAILED, "cannot map the ", what, " ", name, " of another rank");
  segment.memory_ = memory;
  return segment;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  std::swap(name_, other.name_);
  std::swap(memory_, other.memory_);
  std::swap(bytes_, other.bytes_);
  std::swap(owner_, other.owner_);
  return *this;
}

ShmSegment::~ShmSegment() {
  if (owner_) unlinkName();
  if (memory_ != nullptr) munmap(memory_, bytes_);
}

void ShmSegment::unlinkName() const {
  if (!name_.empty()) shm_unlink(name_.c_str());
}

}  // namespace ringcomm
