// Test-only: the host implementation's NCCL communicators and the worlds they pair their
// operations in (host_nccl.cc: the NCCL calls; host_nccl_world.cc: pairing, connecting, group
// work). See host_gpu.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nccl/gpu_api.h"

namespace ringcomm::hostgpu {

struct Comm;

struct Operation {
  Comm* comm = nullptr;
  bool send = false;
  int peer = -1;
  void* data = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  // Posted inside a stream capture (runs at each graph launch). NCCL requires both sides of a
  // send/receive pair to be captured or both eager (its user guide, "Using NCCL with CUDA
  // Graphs"): inside a capture it registers the buffers of the capturing side only.
  bool captured = false;
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

// Pairs the heads of (a, b)'s queues while both have one, recording a pair whose sides differ
// in capture as a violation; world mutex held.
void match(World& w, std::pair<int, int> key);
// One group's stream work: post fresh copies of its operations (a graph runs it again at every
// launch), wait until all completed or the communicator was aborted.
void runGroup(Comm* c, const std::vector<std::shared_ptr<Operation>>& posted, bool stalled,
              bool counted);
// Connects to every peer of `ops` not yet connected: asks for all of them at once (as NCCL's
// setup does, so peers asked in different orders cannot wait on each other in a cycle), then
// waits for each to ask for this rank too. False when the communicator was aborted meanwhile.
bool connect(Comm* c, const std::vector<std::shared_ptr<Operation>>& ops, bool stalled);
// A group's operations as work of their stream (`stalled`: posted, never moving anything).
void enqueue(Comm* c, std::vector<std::shared_ptr<Operation>> ops, bool stalled);

}  // namespace ringcomm::hostgpu
