// The host implementation's NCCL calls: communicators keyed by unique id, groups, non-blocking
// calls and abort (see host_gpu.h); their pairing and connecting are host_nccl_world.cc's.
#include "testing/cuda/host_internal.h"
#include "testing/cuda/host_gpu.h"
#include "testing/cuda/host_nccl_world.h"

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
