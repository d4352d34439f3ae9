// Test-only: the host implementation's streams, events and captured graphs, shared by its CUDA
// runtime (host_cuda.cc) and its graph capture and launch (host_graphs.cc). See host_gpu.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "nccl/gpu_api.h"

namespace ringcomm::hostgpu {

// How long stream work may sleep before it runs (setJitterMicroseconds).
int jitterMicroseconds();
// Records `status` as the calling thread's last error and returns it.
cudaError_t failed(cudaError_t status);

struct Capture;

// A stream: a worker thread running its work in order (with up to the jitter's sleep first).
class Stream {
 public:
  Capture* capture = nullptr;  // the graph this stream's work goes into while it captures
  size_t lane = 0;             // its lane of that graph
  Stream() : worker_([this] { run(); }) {}
  ~Stream() {
    synchronize();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  void push(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    wake_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void run() {
    thread_local std::minstd_rand random(std::random_device{}());
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      if (const int jitter = jitterMicroseconds())
        std::this_thread::sleep_for(std::chrono::microseconds(random() % (jitter + 1)));
      work();
      lock.lock();
      busy_ = false;
      wake_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::thread worker_;
};

// An event: records counted as they are made and as their stream reaches them.
struct Event {
  std::mutex mutex;
  std::condition_variable done;
  uint64_t recorded = 0, completed = 0;
  Capture* capturedIn = nullptr;  // last recorded inside this capture (a node of its graph)
  size_t node = 0;                // that record's number in the graph
};

// A graph: per lane (the capturing stream first, then every stream that joined), its work in
// order; records and waits of events inside the graph are numbered per graph, and external
// ones name the event (at each launch a wait takes the event's latest record, a record adds one).
struct Node {
  enum Kind { Work, Record, Wait, RecordExternal, WaitExternal } kind = Work;
  std::function<void()> work;
  size_t record = 0;      // Record, Wait: the graph's record number
  Event* event = nullptr;  // RecordExternal, WaitExternal
};

// A CUDA user object: its destructor runs when the last reference goes (destroyGraph).
struct UserObject {
  void* data = nullptr;
  cudaHostFn_t destroy = nullptr;
  int references = 0;
};

struct Graph {
  std::vector<std::vector<Node>> lanes;
  size_t records = 0;
  std::vector<UserObject*> userObjects;  // one reference each
};

struct Capture {
  Graph graph;
  std::vector<Stream*> members;
  std::vector<Event*> events;  // recorded inside it
};

// Marks an event last recorded in a capture that has ended.
inline Capture* const kEndedCapture = reinterpret_cast<Capture*>(1);

// The stream behind a handle (0: the calling thread's default stream) and the event.
Stream* stream(cudaStream_t s);
inline Event* event(cudaEvent_t e) { return reinterpret_cast<Event*>(e); }
// A node in the lane of the graph `st` captures.
void add(Stream* st, Node node);
// Work in stream order, or into the graph the stream captures.
void submitTo(Stream* st, std::function<void()> work);
// Holds `st` until `ev` completes its record number `target`.
void waitFor(Stream* st, Event* ev, uint64_t target);
// Completes `ev`'s record number `generation` (and those before it).
void complete(Event* ev, uint64_t generation);
// The same for an event a handle names (cudaEventCreate's): the pending wait or record holds a
// reference, so a cudaEventDestroy before `st` reaches it frees the event only afterwards.
void waitForHandle(Stream* st, Event* ev, uint64_t target);
void completeHandle(Stream* st, Event* ev, uint64_t generation);

// The capture and graph functions of the table (host_graphs.cc).
void fillGraphs(GpuApi& api);

}  // namespace ringcomm::hostgpu
