// GraphHolds: the graphs of the caller's own captures that still hold NcclTransport's
// resources (its NCCL communicator, streams, events and slots, which their captured
// collectives use at every launch). Each captured collective adds a CUDA user object to the
// graph being captured, as NCCL ties its own resources to graphs (cudaGraphRetainUserObject);
// CUDA destroys it with the last graph or executable graph that holds it. close() frees the
// resources at once when no graph holds them, else that last destruction does, on a thread of
// its own: a user object's destructor must not call CUDA.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace ringcomm {

class GraphHolds {
 public:
  // One more graph reference (a user object about to be retained by a graph).
  void hold() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++live_;
  }

  bool held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_ > 0;
  }

  // Runs `free` now when no graph holds the resources, else once the last one is destroyed.
  void freeWhenUnheld(std::function<void()> free) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (live_ > 0) {
        free_ = std::move(free);
        return;
      }
    }
    free();
  }

  // The user object's destructor; `data` is a new'd std::shared_ptr<GraphHolds>.
  static void released(void* data) {
    auto* holds = static_cast<std::shared_ptr<GraphHolds>*>(data);
    std::function<void()> free;
    {
      std::lock_guard<std::mutex> lock((*holds)->mutex_);
      if (--(*holds)->live_ == 0) free = std::move((*holds)->free_);
    }
    delete holds;
    if (free) std::thread(std::move(free)).detach();
  }

 private:
  std::mutex mutex_;
  int live_ = 0;
  std::function<void()> free_;  // set by close() while graphs hold the resources
};

}  // namespace ringcomm
