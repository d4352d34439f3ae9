// The host implementation's CUDA runtime: streams, events, graph capture and memory (see
// host_gpu.h).
#include "testing/cuda/host_internal.h"
#include "testing/cuda/host_gpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

namespace ringcomm::hostgpu {
namespace {

std::atomic<int> jitterMicros{0};

// CUDA's error state: a call that fails also leaves its error as the calling thread's last
// error (a query's cudaErrorNotReady included), which cudaGetLastError returns and clears; a
// sticky error (the context is broken) is returned by every later call of every thread.
thread_local cudaError_t lastError = cudaSuccess;
std::atomic<cudaError_t> stickyError{cudaSuccess};

cudaError_t failed(cudaError_t status) {
  lastError = status;
  return status;
}


struct Capture;

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
      if (const int jitter = jitterMicros.load())
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

struct Graph {
  std::vector<std::vector<Node>> lanes;
  size_t records = 0;
};

struct Capture {
  Graph graph;
  std::vector<Stream*> members;
  std::vector<Event*> events;  // recorded inside it
};

Capture* const kEndedCapture = reinterpret_cast<Capture*>(1);  // recorded in a finished capture

void add(Stream* st, Node node) { st->capture->graph.lanes[st->lane].push_back(std::move(node)); }

// Work in stream order, or into the graph the stream captures.
void submitTo(Stream* st, std::function<void()> work) {
  if (st->capture != nullptr)
    add(st, Node{Node::Work, std::move(work)});
  else
    st->push(std::move(work));
}

Stream* stream(cudaStream_t s) {
  if (s != nullptr) return reinterpret_cast<Stream*>(s);
  thread_local std::unique_ptr<Stream> perThread;  // handle 0: this thread's default stream
  if (!perThread) perThread = std::make_unique<Stream>();
  return perThread.get();
}

Event* event(cudaEvent_t e) { return reinterpret_cast<Event*>(e); }

thread_local int currentDevice = 0;

cudaError_t getDevice(int* device) {
  count("cudaGetDevice");
  *device = currentDevice;
  return cudaSuccess;
}

cudaError_t setDevice(int device) {
  count("cudaSetDevice");
  if (device < 0) return failed(cudaErrorInvalidDevice);
  currentDevice = device;
  return cudaSuccess;
}

cudaError_t streamCreate(cudaStream_t* s, unsigned int) {
  count("cudaStreamCreateWithFlags");
  *s = reinterpret_cast<cudaStream_t>(new Stream());
  return cudaSuccess;
}

cudaError_t streamDestroy(cudaStream_t s) {
  count("cudaStreamDestroy");
  delete stream(s);
  return cudaSuccess;
}

cudaError_t streamSynchronize(cudaStream_t s) {
  count("cudaStreamSynchronize");
  stream(s)->synchronize();
  return cudaSuccess;
}

cudaError_t streamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  count("cudaStreamIsCapturing");
  *status = stream(s)->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

void waitFor(Stream* st, Event* ev, uint64_t target) {
  st->push([ev, target] {
    std::unique_lock<std::mutex> lock(ev->mutex);
    ev->done.wait(lock, [&] { return ev->completed >= target; });
  });
}

cudaError_t streamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  count("cudaStreamWaitEvent");
  Stream* st = stream(s);
  Event* ev = event(e);
  uint64_t target;
  Capture* owner;
  size_t node;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    target = ev->recorded;  // the latest record at the time of this call
    owner = ev->capturedIn;
    node = ev->node;
  }
  if (flags & cudaEventWaitExternal) {
    if (st->capture == nullptr) return failed(cudaErrorInvalidValue);  // only inside a capture
    add(st, Node{Node::WaitExternal, nullptr, 0, ev});
    return cudaSuccess;
  }
  if (owner == kEndedCapture) {
    violation("cudaStreamWaitEvent on an event last recorded inside a capture that has ended");
    return failed(cudaErrorStreamCaptureIsolation);
  }
  if (owner != nullptr) {  // recorded inside a capture: this stream joins it
    if (st->capture == nullptr) {
      st->capture = owner;
      st->lane = owner->graph.lanes.size();
      owner->graph.lanes.emplace_back();
      owner->members.push_back(st);
    } else if (st->capture != owner) {
      return failed(cudaErrorStreamCaptureIsolation);
    }
    add(st, Node{Node::Wait, nullptr, node});
    return cudaSuccess;
  }
  // An event recorded outside: inside a capture only as an external wait.
  if (st->capture != nullptr) return failed(cudaErrorStreamCaptureIsolation);
  if (target > 0) waitFor(st, ev, target);  // never recorded: nothing to wait for
  return cudaSuccess;
}

cudaError_t eventCreate(cudaEvent_t* e, unsigned int) {
  count("cudaEventCreateWithFlags");
  *e = reinterpret_cast<cudaEvent_t>(new Event());
  return cudaSuccess;
}

cudaError_t eventDestroy(cudaEvent_t e) {
  count("cudaEventDestroy");
  delete event(e);
  return cudaSuccess;
}

void complete(Event* ev, uint64_t generation) {
  std::lock_guard<std::mutex> lock(ev->mutex);
  ev->completed = std::max(ev->completed, generation);
  ev->done.notify_all();
}

cudaError_t record(cudaEvent_t e, cudaStream_t s, bool external) {
  Stream* st = stream(s);
  Event* ev = event(e);
  if (st->capture != nullptr) {
    if (external) {
      add(st, Node{Node::RecordExternal, nullptr, 0, ev});
    } else {
      std::lock_guard<std::mutex> lock(ev->mutex);
      ev->capturedIn = st->capture;
      ev->node = st->capture->graph.records++;
      st->capture->events.push_back(ev);
      add(st, Node{Node::Record, nullptr, ev->node});
    }
    return cudaSuccess;
  }
  if (external) return failed(cudaErrorInvalidValue);  // only inside a capture
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    generation = ++ev->recorded;
    ev->capturedIn = nullptr;
  }
  st->push([ev, generation] { complete(ev, generation); });
  return cudaSuccess;
}

cudaError_t eventRecord(cudaEvent_t e, cudaStream_t s) {
  count("cudaEventRecord");
  return record(e, s, false);
}

cudaError_t eventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  count("cudaEventRecordWithFlags");
  return record(e, s, (flags & cudaEventRecordExternal) != 0);
}

cudaError_t eventQuery(cudaEvent_t e) {
  count("cudaEventQuery");
  Event* ev = event(e);
  std::lock_guard<std::mutex> lock(ev->mutex);
  if (ev->capturedIn != nullptr && ev->capturedIn != kEndedCapture)
    return failed(cudaErrorStreamCaptureUnsupported);
  return ev->completed >= ev->recorded ? cudaSuccess : failed(cudaErrorNotReady);
}

cudaError_t deviceMalloc(void** p, size_t bytes) {
  count("cudaMalloc");
  *p = std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
  if (*p == nullptr) return failed(cudaErrorMemoryAllocation);
  std::memset(*p, 0, bytes);
  return cudaSuccess;
}

cudaError_t deviceFree(void* p) {
  count("cudaFree");
  std::free(p);
  return cudaSuccess;
}

cudaError_t getLastError() {
  count("cudaGetLastError");
  if (const cudaError_t sticky = stickyError.load(); sticky != cudaSuccess) return sticky;
  return std::exchange(lastError, cudaSuccess);
}

const char* errorName(cudaError_t status) {
  switch (status) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    default: return "cudaError (host implementation)";
  }
}

const char* errorString(cudaError_t status) { return errorName(status); }

cudaError_t exchangeCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

}  // namespace

cudaError_t peekLastError() { return stickyError.load() != cudaSuccess ? stickyError.load() : lastError; }
void setStickyError(cudaError_t status) { stickyError = status; }

namespace {

// The runtime's capture and graph calls over the test entry points below: an instantiated graph
// is the captured one (host graphs stay for the process, as endCapture's do).
cudaError_t streamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  count("cudaStreamBeginCapture");
  if (capturing(s)) return failed(cudaErrorIllegalState);
  beginCapture(s);
  return cudaSuccess;
}

cudaError_t streamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  count("cudaStreamEndCapture");
  const uintptr_t handle = endCapture(s);
  if (handle == 0) return failed(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(handle);
  return cudaSuccess;
}

cudaError_t graphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  count("cudaGraphInstantiate");
  *exec = reinterpret_cast<cudaGraphExec_t>(graph);
  return cudaSuccess;
}

cudaError_t graphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  count("cudaGraphLaunch");
  launchGraph(reinterpret_cast<uintptr_t>(exec), s);
  return cudaSuccess;
}

cudaError_t graphExecDestroy(cudaGraphExec_t) {
  count("cudaGraphExecDestroy");
  return cudaSuccess;
}

cudaError_t graphDestroy(cudaGraph_t) {
  count("cudaGraphDestroy");
  return cudaSuccess;
}

}  // namespace

void submit(cudaStream_t s, std::function<void()> work) { submitTo(stream(s), std::move(work)); }

bool capturing(cudaStream_t s) { return stream(s)->capture != nullptr; }

void fillCuda(GpuApi& a) {
  a.cudaGetDevice = getDevice;
  a.cudaSetDevice = setDevice;
  a.cudaStreamCreateWithFlags = streamCreate;
  a.cudaStreamDestroy = streamDestroy;
  a.cudaStreamSynchronize = streamSynchronize;
  a.cudaStreamIsCapturing = streamIsCapturing;
  a.cudaStreamWaitEvent = streamWaitEvent;
  a.cudaEventCreateWithFlags = eventCreate;
  a.cudaEventDestroy = eventDestroy;
  a.cudaEventRecord = eventRecord;
  a.cudaEventRecordWithFlags = eventRecordWithFlags;
  a.cudaEventQuery = eventQuery;
  a.cudaMalloc = deviceMalloc;
  a.cudaFree = deviceFree;
  a.cudaGetLastError = getLastError;
  a.cudaGetErrorName = errorName;
  a.cudaGetErrorString = errorString;
  a.cudaThreadExchangeStreamCaptureMode = exchangeCaptureMode;
  a.cudaStreamBeginCapture = streamBeginCapture;
  a.cudaStreamEndCapture = streamEndCapture;
  a.cudaGraphInstantiate = graphInstantiate;
  a.cudaGraphLaunch = graphLaunch;
  a.cudaGraphExecDestroy = graphExecDestroy;
  a.cudaGraphDestroy = graphDestroy;
}

void launch(cudaStream_t s, std::function<void()> work) {
  count("launch");
  submitTo(stream(s), std::move(work));
}

void beginCapture(cudaStream_t s) {
  Stream* st = stream(s);
  st->capture = new Capture();
  st->lane = 0;
  st->capture->graph.lanes.emplace_back();
  st->capture->members.push_back(st);
}

uintptr_t endCapture(cudaStream_t s) {
  Stream* st = stream(s);
  Capture* capture = st->capture;
  if (capture == nullptr || st->lane != 0) return 0;
  for (Stream* member : capture->members) member->capture = nullptr;
  for (Event* ev : capture->events) {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (ev->capturedIn == capture) ev->capturedIn = kEndedCapture;
  }
  auto* graph = new Graph(std::move(capture->graph));  // kept for the process (tests)
  delete capture;
  return reinterpret_cast<uintptr_t>(graph);
}

void launchGraph(uintptr_t handle, cudaStream_t s) {
  const Graph& graph = *reinterpret_cast<const Graph*>(handle);
  Stream* origin = stream(s);
  // This launch's events: one per record inside the graph, and a start the other lanes wait on.
  auto events = std::make_shared<std::vector<Event>>(graph.records + 1);
  Event* start = &events->back();
  start->recorded = 1;
  origin->push([start] { complete(start, 1); });
  // External waits take the latest record before this launch; its own external records follow.
  std::vector<std::vector<uint64_t>> targets(graph.lanes.size());
  for (size_t lane = 0; lane < graph.lanes.size(); ++lane)
    for (const Node& node : graph.lanes[lane]) {
      if (node.kind != Node::WaitExternal) continue;
      std::lock_guard<std::mutex> lock(node.event->mutex);
      targets[lane].push_back(node.event->recorded);
    }
  std::vector<Stream*> lanes{origin};
  for (size_t lane = 1; lane < graph.lanes.size(); ++lane) lanes.push_back(new Stream());
  for (size_t lane = 0; lane < graph.lanes.size(); ++lane) {
    Stream* st = lanes[lane];
    if (lane > 0) waitFor(st, start, 1);
    size_t external = 0;
    for (const Node& node : graph.lanes[lane]) {
      Event* ev = nullptr;
      switch (node.kind) {
        case Node::Work:
          st->push(node.work);
          break;
        case Node::Record:
          ev = &(*events)[node.record];
          st->push([events, ev] { complete(ev, 1); });
          break;
        case Node::Wait:
          waitFor(st, &(*events)[node.record], 1);
          break;
        case Node::RecordExternal: {
          uint64_t generation;
          {
            std::lock_guard<std::mutex> lock(node.event->mutex);
            generation = ++node.event->recorded;
          }
          Event* target = node.event;
          st->push([target, generation] { complete(target, generation); });
          break;
        }
        case Node::WaitExternal:
          if (const uint64_t target = targets[lane][external++]) waitFor(st, node.event, target);
          break;
      }
    }
  }
  // The capture joined every lane back into the origin, which frees the others once done.
  std::vector<Stream*> others(lanes.begin() + 1, lanes.end());
  origin->push([others, events] {
    for (Stream* st : others) delete st;
  });
}

void setJitterMicroseconds(int microseconds) { jitterMicros = microseconds; }

}  // namespace ringcomm::hostgpu
