#include "ringcomm/flight_recorder.h"

#include <algorithm>
#include <ctime>
#include <cstring>
#include <sstream>

namespace ringcomm {
namespace {

// The coarse clock (a few ms of resolution, ~6 ns a read against ~30 for the precise one):
// twice per call, it was ~7% of a small collective; a record says when, not how long.
double now() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME_COARSE, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

constexpr int32_t as_int(CallState state) { return static_cast<int32_t>(state); }

void copyFailure(FlightRecorder::Entry& e, const std::string& failure) {
  std::strncpy(e.failure, failure.c_str(), sizeof(e.failure) - 1);
  e.failure[sizeof(e.failure) - 1] = '\0';
}

// A device's call ends once: from Enqueued only (a reused entry holds another call).
void endOnDevice(FlightRecorder::Entry& e, CallState to, const std::string& failure = "") {
  int32_t enqueued = as_int(CallState::Enqueued);
  if (!e.state.compare_exchange_strong(enqueued, as_int(CallState::Running))) return;
  if (to == CallState::Failed) copyFailure(e, failure);
  e.ended.store(now(), std::memory_order_relaxed);
  e.state.store(as_int(to), std::memory_order_release);
}

}  // namespace

const char* callStateName(CallState state) {
  switch (state) {
    case CallState::Running: return "running";
    case CallState::Completed: return "completed";
    case CallState::Enqueued: return "enqueued";
    default: return "failed";
  }
}

void FlightRecorder::resize(size_t capacity) {
  entries_ = std::vector<Entry>(capacity);
  calls_ = 0, deviceDone_ = 0;
}

FlightRecorder::Entry* FlightRecorder::begin(const CallName& call) {
  if (entries_.empty()) return nullptr;
  const uint64_t id = calls_.load(std::memory_order_relaxed);
  Entry& e = entries_[id % entries_.size()];
  e.id.store(0, std::memory_order_relaxed);  // a snapshot skips it while it is rewritten
  e.state.store(as_int(CallState::Running), std::memory_order_relaxed);
  e.name = call.name, e.sequence = call.sequence, e.numbered = call.numbered;
  e.dtype = call.dtype, e.op = call.op, e.algorithm = call.algorithm;
  e.count = call.count, e.peer = call.peer;
  e.step.store(-1, std::memory_order_relaxed);
  e.steps = 0, e.started = now(), e.failure[0] = '\0';
  e.ended.store(0, std::memory_order_relaxed);
  e.id.store(id + 1, std::memory_order_release);
  calls_.store(id + 1, std::memory_order_release);
  return &e;
}

void FlightRecorder::plan(Entry* entry, size_t steps) {
  if (entry) entry->steps = static_cast<int32_t>(steps);
}

void FlightRecorder::step(Entry* entry, size_t index) {
  if (entry) entry->step.store(static_cast<int32_t>(index), std::memory_order_relaxed);
}

void FlightRecorder::end(Entry* entry, bool ok, const std::string& failure, bool onDevice) {
  if (!entry) return;
  if (!ok) copyFailure(*entry, failure);
  if (ok && onDevice) {
    // deviceDone may have run already: it moves the mark first, then completes what it finds.
    entry->state.store(as_int(CallState::Enqueued));
    if (entry->id.load(std::memory_order_relaxed) <= deviceDone_.load())
      endOnDevice(*entry, CallState::Completed);
    return;
  }
  entry->ended.store(now(), std::memory_order_relaxed);
  entry->state.store(as_int(ok ? CallState::Completed : CallState::Failed),
                     std::memory_order_release);
}

void FlightRecorder::deviceDone(uint64_t record) {
  uint64_t done = deviceDone_.load();
  while (done < record + 1 && !deviceDone_.compare_exchange_weak(done, record + 1)) {
  }
  if (done >= record + 1 || entries_.empty()) return;
  const uint64_t first = record + 1 - done > entries_.size() ? record + 1 - entries_.size() : done;
  for (uint64_t id = first; id <= record; ++id) {
    Entry& e = entries_[id % entries_.size()];
    if (e.id.load(std::memory_order_acquire) == id + 1) endOnDevice(e, CallState::Completed);
  }
}

void FlightRecorder::deviceFailed(uint64_t record, const std::string& failure) {
  if (entries_.empty()) return;
  Entry& e = entries_[record % entries_.size()];
  if (e.id.load(std::memory_order_acquire) == record + 1)
    endOnDevice(e, CallState::Failed, failure);
}

std::vector<CallRecord> FlightRecorder::snapshot(size_t newest) const {
  std::vector<CallRecord> records;
  const uint64_t calls = calls_.load(std::memory_order_acquire);
  const uint64_t kept = std::min<uint64_t>(entries_.size(), newest);
  const uint64_t first = calls > kept ? calls - kept : 0;
  for (uint64_t id = first; id < calls; ++id) {
    const Entry& e = entries_[id % entries_.size()];
    if (e.id.load(std::memory_order_acquire) != id + 1) continue;  // overwritten meanwhile
    CallRecord r;
    r.id = id, r.name = e.name, r.sequence = e.sequence, r.numbered = e.numbered;
    r.dtype = e.dtype ? e.dtype : "", r.op = e.op ? e.op : "";
    r.algorithm = e.algorithm ? e.algorithm : "";
    r.count = e.count, r.peer = e.peer;
    r.state = static_cast<CallState>(e.state.load(std::memory_order_acquire));
    r.step = e.step.load(std::memory_order_relaxed), r.steps = e.steps;
    r.started = e.started, r.ended = e.ended.load(std::memory_order_relaxed);
    r.failure = e.failure;
    records.push_back(std::move(r));
  }
  return records;
}

std::string FlightRecorder::recent(size_t count) const {
  std::ostringstream out;
  for (const CallRecord& r : snapshot(count)) {
    out << "\n  call " << r.id << ": " << r.name;
    if (r.numbered) out << " #" << r.sequence;
    if (!r.dtype.empty()) out << " " << r.dtype << " x" << r.count;
    if (!r.op.empty()) out << " " << r.op;
    if (!r.algorithm.empty()) out << " " << r.algorithm;
    if (r.peer >= 0) out << (r.numbered ? " root " : " peer ") << r.peer;
    out << ": " << callStateName(r.state);
    if (r.steps > 0) out << " at step " << (r.step < 0 ? 0 : r.step) << " of " << r.steps;
  }
  return out.str();
}

}  // namespace ringcomm
