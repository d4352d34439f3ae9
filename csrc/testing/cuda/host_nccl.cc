// The host implementation's NCCL: communicators keyed by unique id, groups, pairing, connecting,
// non-blocking calls and abort (see host_gpu.h).
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

namespace ringcomm::hostgpu {
namespace {

std::atomic<int> stallRank{-1}, stallGroups{-1};
std::atomic<bool> postsInProgress{false};


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

  // A communicator never destroyed (a process may leave NCCL's to its exit, as a communicator
  // whose collectives a live graph holds does) ends with the process, whatever it was doing.
  ~Comm() {
    if (job.joinable()) job.detach();
  }
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
  const cudaStream_t s = ops.front()->stream;
  const bool counted = !capturing(s);  // finalize waits for eager work only
  if (counted) {
    std::lock_guard<std::mutex> lock(c->world->mutex);
    ++c->pending;
  }
  submit(s, [c, ops, stalled, counted] { runGroup(c, ops, stalled, counted); });
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
  if (groupDepth == 0) return ++groupDepth, groupEnd();
  // NCCL returns a non-blocking communicator's state from each call: it may be in progress.
  return postsInProgress && !comm(c)->blocking ? ncclInProgress : ncclSuccess;
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

}  // namespace

void fillNccl(GpuApi& a) {
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
}

std::string uniqueId() {
  ncclUniqueId id;
  getUniqueId(&id);
  return std::string(id.internal, sizeof(id.internal));
}

void setPostsInProgress(bool inProgress) { postsInProgress = inProgress; }

void setStall(int rank, int groups) {
  stallRank = rank;
  stallGroups = groups;
}

}  // namespace ringcomm::hostgpu
