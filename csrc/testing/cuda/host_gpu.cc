// The host implementation of GpuApi described in host_gpu.h.
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

namespace ringcomm::hostgpu {
namespace {

// -- bookkeeping --------------------------------------------------------------------------------

std::mutex statsMutex;
std::map<std::string, uint64_t> counts;
std::vector<std::string> misuse;
std::atomic<int> jitterMicros{0};
std::atomic<int> stallRank{-1}, stallGroups{-1};

void count(const char* name) {
  std::lock_guard<std::mutex> lock(statsMutex);
  ++counts[name];
}

void violation(const std::string& what) {
  std::lock_guard<std::mutex> lock(statsMutex);
  misuse.push_back(what);
}

// -- streams and events ---------------------------------------------------------------------------

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
void submit(Stream* st, std::function<void()> work) {
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
  if (device < 0) return cudaErrorInvalidDevice;
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
    if (st->capture == nullptr) return cudaErrorInvalidValue;  // only inside a capture
    add(st, Node{Node::WaitExternal, nullptr, 0, ev});
    return cudaSuccess;
  }
  if (owner == kEndedCapture) {
    violation("cudaStreamWaitEvent on an event last recorded inside a capture that has ended");
    return cudaErrorStreamCaptureIsolation;
  }
  if (owner != nullptr) {  // recorded inside a capture: this stream joins it
    if (st->capture == nullptr) {
      st->capture = owner;
      st->lane = owner->graph.lanes.size();
      owner->graph.lanes.emplace_back();
      owner->members.push_back(st);
    } else if (st->capture != owner) {
      return cudaErrorStreamCaptureIsolation;
    }
    add(st, Node{Node::Wait, nullptr, node});
    return cudaSuccess;
  }
  // An event recorded outside: inside a capture only as an external wait.
  if (st->capture != nullptr) return cudaErrorStreamCaptureIsolation;
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
  if (external) return cudaErrorInvalidValue;  // only inside a capture
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
    return cudaErrorStreamCaptureUnsupported;
  return ev->completed >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t deviceMalloc(void** p, size_t bytes) {
  count("cudaMalloc");
  *p = std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
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
  return cudaSuccess;
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

// -- NCCL -----------------------------------------------------------------------------------------

struct Comm;

struct Operation {
  Comm* comm = nullptr;
  bool send = false;
  int peer = -1;
  void* data = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  bool done = false;
};

struct World {
  explicit World(int size) : size(size), comms(size, nullptr), wants(size, std::vector<bool>(size)) {}
  const int size;
  std::mutex mutex;  // everything below, and every Comm's `aborted`, `groups` and `pending`
  std::condition_variable changed;
  std::vector<Comm*> comms;  // joined ranks
  std::vector<std::vector<bool>> wants;  // wants[a][b]: rank a has asked to connect to b
  // (sender, receiver) -> operations posted and not yet matched, in order
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Operation>>> sends, receives;
};

struct Comm {
  std::shared_ptr<World> world;
  int rank = 0;
  bool blocking = true;
  std::atomic<ncclResult_t> state{ncclSuccess};  // ncclCommGetAsyncError's answer
  std::atomic<int> callers{0};
  std::atomic<bool> freed{false};
  bool aborted = false;
  std::set<int> connected;
  int groups = 0;
  int pending = 0;  // stream work of this communicator not yet finished
  int stallAfter = -1;
  std::thread job;  // the non-blocking call in progress
  std::string lastError;
};

std::mutex worldsMutex;
std::map<std::string, std::shared_ptr<World>> worlds;
std::vector<std::unique_ptr<Comm>> allComms;  // freed ones stay, so misuse is seen, not a crash
std::atomic<uint64_t> idCounter{0};

Comm* comm(ncclComm_t c) { return reinterpret_cast<Comm*>(c); }

// Marks a call on `c`: only one thread at a time, never after it was freed, and (unless
// `asyncQuery`) never while a non-blocking call is still in progress.
class Entered {
 public:
  Entered(Comm* c, const char* name, bool asyncQuery = false) : c_(c) {
    if (c_->freed) violation(std::string(name) + " on a freed communicator");
    if (c_->callers.fetch_add(1) != 0)
      violation(std::string(name) + " while another thread was inside the same communicator");
    if (!asyncQuery && c_->state.load() == ncclInProgress)
      violation(std::string(name) + " while a non-blocking call was still in progress");
  }
  ~Entered() { c_->callers.fetch_sub(1); }

 private:
  Comm* c_;
};

// Pairs the heads of (a, b)'s queues while both have one; world mutex held.
void match(World& w, std::pair<int, int> key) {
  auto& sends = w.sends[key];
  auto& receives = w.receives[key];
  while (!sends.empty() && !receives.empty()) {
    std::shared_ptr<Operation> s = sends.front(), r = receives.front();
    sends.pop_front();
    receives.pop_front();
    if (s->bytes != r->bytes) {
      const std::string why = "message truncated: rank " + std::to_string(key.first) + " sent " +
                              std::to_string(s->bytes) + " bytes to rank " +
                              std::to_string(key.second) + ", which expected " +
                              std::to_string(r->bytes);
      for (Comm* c : {s->comm, r->comm}) {
        c->lastError = why;
        c->state = ncclInvalidUsage;
      }
      continue;  // neither completes: the transports' timeouts and async-error polls see it
    }
    if (s->bytes > 0) std::memcpy(r->data, s->data, s->bytes);
    s->done = r->done = true;
  }
}

// One group's stream work: post fresh copies of its operations (a graph runs it again at every
// launch), wait until all completed or the communicator was aborted.
void runGroup(Comm* c, const std::vector<std::shared_ptr<Operation>>& posted, bool stalled,
              bool counted) {
  std::vector<std::shared_ptr<Operation>> ops;
  for (auto& op : posted) ops.push_back(std::make_shared<Operation>(*op));
  World& w = *c->world;
  std::unique_lock<std::mutex> lock(w.mutex);
  if (!stalled && !c->aborted) {
    for (auto& op : ops) {
      const auto key = op->send ? std::make_pair(c->rank, op->peer) : std::make_pair(op->peer, c->rank);
      (op->send ? w.sends : w.receives)[key].push_back(op);
      match(w, key);
    }
    w.changed.notify_all();
  }
  w.changed.wait(lock, [&] {
    return c->aborted || std::all_of(ops.begin(), ops.end(), [](auto& op) { return op->done; });
  });
  if (counted) --c->pending;
  w.changed.notify_all();
}

// Connects to every peer of `ops` not yet connected: asks for all of them at once (as NCCL's
// setup does, so peers asked in different orders cannot wait on each other in a cycle), then
// waits for each to ask for this rank too. False when the communicator was aborted meanwhile.
bool connect(Comm* c, const std::vector<std::shared_ptr<Operation>>& ops, bool stalled) {
  World& w = *c->world;
  std::unique_lock<std::mutex> lock(w.mutex);
  if (stalled) {  // a dead rank connects to nobody new
    w.changed.wait(lock, [&] {
      return c->aborted || std::all_of(ops.begin(), ops.end(),
                                       [&](auto& op) { return c->connected.count(op->peer) > 0; });
    });
    return !c->aborted;
  }
  for (auto& op : ops) w.wants[c->rank][op->peer] = true;
  w.changed.notify_all();
  for (auto& op : ops) {
    w.changed.wait(lock, [&] { return c->aborted || w.wants[op->peer][c->rank]; });
    if (c->aborted) return false;
    c->connected.insert(op->peer);
  }
  return true;
}

void enqueue(Comm* c, std::vector<std::shared_ptr<Operation>> ops, bool stalled) {
  Stream* st = stream(ops.front()->stream);
  const bool counted = st->capture == nullptr;  // finalize waits for eager work only
  if (counted) {
    std::lock_guard<std::mutex> lock(c->world->mutex);
    ++c->pending;
  }
  submit(st, [c, ops, stalled, counted] { runGroup(c, ops, stalled, counted); });
}

// Runs `work` as the communicator's non-blocking call in progress.
ncclResult_t inBackground(Comm* c, std::function<ncclResult_t()> work) {
  if (c->job.joinable()) c->job.join();
  const ncclResult_t now = c->state;
  if (now != ncclSuccess && now != ncclInProgress) return now;  // a failed communicator stays so
  c->state = ncclInProgress;
  c->job = std::thread([c, work] {
    const ncclResult_t rc = work();
    ncclResult_t expected = ncclInProgress;  // an error seen meanwhile stays
    c->state.compare_exchange_strong(expected, rc);
  });
  return ncclInProgress;
}

thread_local int groupDepth = 0;
thread_local std::vector<std::shared_ptr<Operation>> grouped;

ncclResult_t getVersion(int* version) {
  count("ncclGetVersion");
  *version = 23203;
  return ncclSuccess;
}

ncclResult_t getUniqueId(ncclUniqueId* id) {
  count("ncclGetUniqueId");
  std::memset(id->internal, 0, sizeof(id->internal));
  const std::string text = "hostgpu-" + std::to_string(++idCounter) + "-" +
                           std::to_string(std::random_device{}());
  std::memcpy(id->internal, text.data(), std::min(text.size(), sizeof(id->internal)));
  return ncclSuccess;
}

ncclResult_t commInitRankConfig(ncclComm_t* out, int size, ncclUniqueId id, int rank,
                                ncclConfig_t* config) {
  count("ncclCommInitRankConfig");
  if (size < 1 || rank < 0 || rank >= size) return ncclInvalidArgument;
  std::shared_ptr<World> world;
  {
    std::lock_guard<std::mutex> lock(worldsMutex);
    auto& slot = worlds[std::string(id.internal, sizeof(id.internal))];
    if (!slot) slot = std::make_shared<World>(size);
    world = slot;
    allComms.push_back(std::make_unique<Comm>());
    Comm* c = allComms.back().get();
    c->world = world;
    c->rank = rank;
    c->blocking = config == nullptr || config->blocking != 0;
    if (stallRank.load() == rank) c->stallAfter = stallGroups.load();
    *out = reinterpret_cast<ncclComm_t>(c);
  }
  Comm* c = comm(*out);
  if (world->size != size) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(world->mutex);
    if (world->comms[rank] != nullptr) return ncclInvalidUsage;
    world->comms[rank] = c;
    world->changed.notify_all();
  }
  auto joinAll = [c] {
    World& w = *c->world;
    std::unique_lock<std::mutex> lock(w.mutex);
    w.changed.wait(lock, [&] {
      return c->aborted || std::all_of(w.comms.begin(), w.comms.end(), [](Comm* x) { return x; });
    });
    return c->aborted ? ncclSystemError : ncclSuccess;
  };
  if (c->blocking) return joinAll();
  return inBackground(c, joinAll);
}

ncclResult_t commGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  count("ncclCommGetAsyncError");
  Entered entered(comm(c), "ncclCommGetAsyncError", /*asyncQuery=*/true);
  *state = comm(c)->state.load();
  return ncclSuccess;
}

ncclResult_t groupStart() {
  count("ncclGroupStart");
  ++groupDepth;
  return ncclSuccess;
}

ncclResult_t groupEnd() {
  count("ncclGroupEnd");
  if (groupDepth == 0) return ncclInvalidUsage;
  if (--groupDepth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<Operation>> ops;
  ops.swap(grouped);
  if (ops.empty()) return ncclSuccess;
  Comm* c = ops.front()->comm;
  Entered entered(c, "ncclGroupEnd");
  for (auto& op : ops)
    if (op->comm != c || op->stream != ops.front()->stream) return ncclInvalidUsage;
  bool stalled;
  {
    std::lock_guard<std::mutex> lock(c->world->mutex);
    stalled = c->stallAfter >= 0 && c->groups >= c->stallAfter;
    ++c->groups;
  }
  auto work = [c, ops, stalled] {
    if (!connect(c, ops, stalled)) return ncclSystemError;
    enqueue(c, ops, stalled);
    return ncclSuccess;
  };
  if (c->blocking) return work();
  return inBackground(c, work);
}

ncclResult_t post(bool send, const void* data, size_t count, ncclDataType_t type, int peer,
                  ncclComm_t c, cudaStream_t s) {
  if (type != ncclInt8 && type != ncclUint8) return ncclInvalidArgument;  // ringcomm sends bytes
  if (peer < 0 || peer >= comm(c)->world->size) return ncclInvalidArgument;
  {
    Entered entered(comm(c), send ? "ncclSend" : "ncclRecv");
  }
  auto op = std::make_shared<Operation>();
  op->comm = comm(c);
  op->send = send;
  op->peer = peer;
  op->data = const_cast<void*>(data);
  op->bytes = count;
  op->stream = s;
  grouped.push_back(op);
  return groupDepth > 0 ? ncclSuccess : (++groupDepth, groupEnd());
}

ncclResult_t send(const void* data, size_t n, ncclDataType_t type, int peer, ncclComm_t c,
                  cudaStream_t s) {
  count("ncclSend");
  return post(true, data, n, type, peer, c, s);
}

ncclResult_t recv(void* data, size_t n, ncclDataType_t type, int peer, ncclComm_t c,
                  cudaStream_t s) {
  count("ncclRecv");
  return post(false, data, n, type, peer, c, s);
}

ncclResult_t commFinalize(ncclComm_t handle) {
  count("ncclCommFinalize");
  Comm* c = comm(handle);
  Entered entered(c, "ncclCommFinalize");
  auto drain = [c] {
    World& w = *c->world;
    std::unique_lock<std::mutex> lock(w.mutex);
    w.changed.wait(lock, [&] { return c->aborted || c->pending == 0; });
    return c->aborted ? ncclSystemError : ncclSuccess;
  };
  if (c->blocking) return drain();
  return inBackground(c, drain);
}

void release(Comm* c, bool abort) {
  {
    std::lock_guard<std::mutex> lock(c->world->mutex);
    if (abort) {
      c->aborted = true;
      // Operations it posted and nobody matched are gone with it.
      for (auto* table : {&c->world->sends, &c->world->receives})
        for (auto& [key, queue] : *table)
          queue.erase(std::remove_if(queue.begin(), queue.end(),
                                     [c](auto& op) { return op->comm == c; }),
                      queue.end());
    }
    c->world->changed.notify_all();
  }
  if (c->job.joinable()) c->job.join();
  c->freed = true;
}

ncclResult_t commDestroy(ncclComm_t c) {
  count("ncclCommDestroy");
  {
    Entered entered(comm(c), "ncclCommDestroy");
  }
  release(comm(c), /*abort=*/false);
  return ncclSuccess;
}

ncclResult_t commAbort(ncclComm_t c) {
  count("ncclCommAbort");
  {
    Entered entered(comm(c), "ncclCommAbort", /*asyncQuery=*/true);
  }
  release(comm(c), /*abort=*/true);
  return ncclSuccess;
}

const char* errorText(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "NCCL error (host implementation)";
  }
}

const char* lastError(ncclComm_t c) {
  return c == nullptr ? "" : comm(c)->lastError.c_str();
}

GpuApi makeApi() {
  GpuApi a;
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
  a.ncclGetVersion = getVersion;
  a.ncclGetUniqueId = getUniqueId;
  a.ncclCommInitRankConfig = commInitRankConfig;
  a.ncclCommGetAsyncError = commGetAsyncError;
  a.ncclCommFinalize = commFinalize;
  a.ncclCommDestroy = commDestroy;
  a.ncclCommAbort = commAbort;
  a.ncclGroupStart = groupStart;
  a.ncclGroupEnd = groupEnd;
  a.ncclSend = send;
  a.ncclRecv = recv;
  a.ncclGetErrorString = errorText;
  a.ncclGetLastError = lastError;
  a.ncclPath = "host implementation (tests)";
  a.ncclVersion = 23203;
  return a;
}

}  // namespace

void launch(cudaStream_t s, std::function<void()> work) {
  count("launch");
  submit(stream(s), std::move(work));
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

const GpuApi& api() {
  static const GpuApi table = makeApi();
  return table;
}

std::string uniqueId() {
  ncclUniqueId id;
  getUniqueId(&id);
  return std::string(id.internal, sizeof(id.internal));
}

std::map<std::string, uint64_t> callCounts() {
  std::lock_guard<std::mutex> lock(statsMutex);
  return counts;
}

std::vector<std::string> violations() {
  std::lock_guard<std::mutex> lock(statsMutex);
  return misuse;
}

void reset() {
  std::lock_guard<std::mutex> lock(statsMutex);
  counts.clear();
  misuse.clear();
}

void setJitterMicroseconds(int microseconds) { jitterMicros = microseconds; }

void setStall(int rank, int groups) {
  stallRank = rank;
  stallGroups = groups;
}

}  // namespace ringcomm::hostgpu
