// Lane: a thread that runs numbered steps in order as they are posted, so that one level of a
// two-level collective can run beside the other (csrc/core/two_level.cc, two_level_uneven.cc).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ringcomm {

// Runs `step(k)` for k = 0, 1, ... in order on a thread of its own, as each is posted; `stop`
// makes a running step fail (the level's abort) when the caller gives up early.
class Lane {
 public:
  Lane(std::function<void(size_t)> step, std::function<void()> stop)
      : step_(std::move(step)), stop_(std::move(stop)), thread_([this] { loop(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_ < posted_ && !error_) stop_();  // the caller failed: end the running step
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void post(size_t k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      posted_ = k + 1;
    }
    changed_.notify_all();
  }
  // Waits until step k has run; rethrows what a step raised.
  void waitFor(size_t k) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ > k || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return closing_ || done_ < posted_; });
      if (done_ >= posted_ || error_) return;
      const size_t k = done_;
      lock.unlock();
      std::exception_ptr failed;
      try {
        step_(k);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed) error_ = failed;
      else ++done_;
      changed_.notify_all();
      if (failed) return;
    }
  }

  std::function<void(size_t)> step_;
  std::function<void()> stop_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t posted_ = 0, done_ = 0;
  bool closing_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace ringcomm
