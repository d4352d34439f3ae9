// The host implementation's CUDA runtime: devices, streams, events, memory and errors (see
// host_gpu.h); graph capture and launch are host_graphs.cc's.
#include "testing/cuda/host_internal.h"
#include "testing/cuda/host_gpu.h"
#include "testing/cuda/host_streams.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace ringcomm::hostgpu {
namespace {

std::atomic<int> jitterMicros{0};

// CUDA's error state: a call that fails also leaves its error as the calling thread's last
// error (a query's cudaErrorNotReady included), which cudaGetLastError returns and clears; a
// sticky error (the context is broken) is returned by every later call of every thread.
thread_local cudaError_t lastError = cudaSuccess;
std::atomic<cudaError_t> stickyError{cudaSuccess};

}  // namespace

int jitterMicroseconds() { return jitterMicros.load(); }

cudaError_t failed(cudaError_t status) {
  lastError = status;
  return status;
}

void add(Stream* st, Node node) { st->capture->graph.lanes[st->lane].push_back(std::move(node)); }

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

void waitFor(Stream* st, Event* ev, uint64_t target) {
  st->push([ev, target] {
    std::unique_lock<std::mutex> lock(ev->mutex);
    ev->done.wait(lock, [&] { return ev->completed >= target; });
  });
}

void complete(Event* ev, uint64_t generation) {
  std::lock_guard<std::mutex> lock(ev->mutex);
  ev->completed = std::max(ev->completed, generation);
  ev->done.notify_all();
}

namespace {

thread_local int currentDevice = 0;

// CUDA lets an event be destroyed while a stream's record or wait still names it (it is freed
// once the device is done with it): a transport's close does so while a caller's stream, which it
// never synchronizes, may not yet have run its wait. Each such pending record or wait holds a
// reference; the handle holds one.
struct CountedEvent : Event {
  std::atomic<int> references{1};
};

Event* hold(Event* ev) {
  static_cast<CountedEvent*>(ev)->references.fetch_add(1);
  return ev;
}

void drop(Event* ev) {
  auto* counted = static_cast<CountedEvent*>(ev);
  if (counted->references.fetch_sub(1) == 1) delete counted;
}

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

std::atomic<cudaError_t> synchronizeFailure{cudaSuccess};

cudaError_t streamSynchronize(cudaStream_t s) {
  count("cudaStreamSynchronize");
  stream(s)->synchronize();
  if (const cudaError_t failure = synchronizeFailure.load(); failure != cudaSuccess)
    return failed(failure);
  return cudaSuccess;
}

cudaError_t streamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  count("cudaStreamIsCapturing");
  *status = stream(s)->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
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
  if (target > 0) waitForHandle(st, ev, target);  // never recorded: nothing to wait for
  return cudaSuccess;
}

cudaError_t eventCreate(cudaEvent_t* e, unsigned int) {
  count("cudaEventCreateWithFlags");
  *e = reinterpret_cast<cudaEvent_t>(static_cast<Event*>(new CountedEvent()));
  return cudaSuccess;
}

cudaError_t eventDestroy(cudaEvent_t e) {
  count("cudaEventDestroy");
  drop(event(e));
  return cudaSuccess;
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
  completeHandle(st, ev, generation);
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

void waitForHandle(Stream* st, Event* ev, uint64_t target) {
  st->push([ev = hold(ev), target] {
    {
      std::unique_lock<std::mutex> lock(ev->mutex);
      ev->done.wait(lock, [&] { return ev->completed >= target; });
    }
    drop(ev);
  });
}

void completeHandle(Stream* st, Event* ev, uint64_t generation) {
  st->push([ev = hold(ev), generation] {
    complete(ev, generation);
    drop(ev);
  });
}

cudaError_t peekLastError() {
  return stickyError.load() != cudaSuccess ? stickyError.load() : lastError;
}
void setStickyError(cudaError_t status) { stickyError = status; }

void setSynchronizeFailure(cudaError_t status) { synchronizeFailure = status; }

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
  fillGraphs(a);
}

void launch(cudaStream_t s, std::function<void()> work) {
  count("launch");
  submitTo(stream(s), std::move(work));
}

void setJitterMicroseconds(int microseconds) { jitterMicros = microseconds; }

}  // namespace ringcomm::hostgpu
