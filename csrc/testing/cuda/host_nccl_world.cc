// The host implementation's NCCL worlds: pairing a send with its receive, connecting to peers,
// and a group's work on its stream (host_nccl_world.h).
#include "testing/cuda/host_nccl_world.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "testing/cuda/host_internal.h"

namespace ringcomm::hostgpu {

void match(World& w, std::pair<int, int> key) {
  auto& sends = w.sends[key];
  auto& receives = w.receives[key];
  while (!sends.empty() && !receives.empty()) {
    std::shared_ptr<Operation> s = sends.front(), r = receives.front();
    sends.pop_front();
    receives.pop_front();
    if (s->captured != r->captured)
      violation("a send/receive pair captured on one side only: rank " +
                std::to_string(key.first) + "'s send to rank " + std::to_string(key.second) +
                (s->captured ? " was" : " was not") + " graph-captured, rank " +
                std::to_string(key.second) + "'s receive " + (r->captured ? "was" : "was not"));
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

void runGroup(Comm* c, const std::vector<std::shared_ptr<Operation>>& posted, bool stalled,
              bool counted) {
  std::vector<std::shared_ptr<Operation>> ops;
  for (auto& op : posted) ops.push_back(std::make_shared<Operation>(*op));
  World& w = *c->world;
  std::unique_lock<std::mutex> lock(w.mutex);
  if (!stalled && !c->aborted) {
    for (auto& op : ops) {
      const auto key =
          op->send ? std::make_pair(c->rank, op->peer) : std::make_pair(op->peer, c->rank);
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
  for (auto& op : ops) op->captured = !counted;
  if (counted) {
    std::lock_guard<std::mutex> lock(c->world->mutex);
    ++c->pending;
  }
  submit(s, [c, ops, stalled, counted] { runGroup(c, ops, stalled, counted); });
}

}  // namespace ringcomm::hostgpu
