#include "ringcomm/flight_recorder.h"

#include <chrono>
#include <cstring>
#include <sstream>

namespace ringcomm {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* stateName(CallState state) {
  switch (state) {
    case CallState::Started: return "running";
    case CallState::Completed: return "completed";
    default: return "failed";
  }
}

}  // namespace

void FlightRecorder::resize(size_t capacity) {
  entries_ = std::vector<Entry>(capacity);
  calls_ = 0;
}

FlightRecorder::Entry* FlightRecorder::begin(const CallName& call) {
  if (entries_.empty()) return nullptr;
  const uint64_t id = calls_.load(std::memory_order_relaxed);
  Entry& e = entries_[id % entries_.size()];
  e.state.store(static_cast<int32_t>(CallState::Started), std::memory_order_relaxed);
  e.name = call.name, e.sequence = call.sequence, e.numbered = call.numbered;
  e.step.store(-1, std::memory_order_relaxed);
  e.steps = 0, e.started = now(), e.failure[0] = '\0';
  e.ended.store(0, std::memory_order_relaxed);
  e.id.store(id + 1, std::memory_order_release);  // 0: never written
  calls_.store(id + 1, std::memory_order_release);
  return &e;
}

void FlightRecorder::plan(Entry* entry, size_t steps) {
  if (entry) entry->steps = static_cast<int32_t>(steps);
}

void FlightRecorder::step(Entry* entry, size_t index) {
  if (entry) entry->step.store(static_cast<int32_t>(index), std::memory_order_relaxed);
}

void FlightRecorder::end(Entry* entry, bool ok, const std::string& failure) {
  if (!entry) return;
  if (!ok) {
    std::strncpy(entry->failure, failure.c_str(), sizeof(entry->failure) - 1);
    entry->failure[sizeof(entry->failure) - 1] = '\0';
  }
  entry->ended.store(now(), std::memory_order_relaxed);
  entry->state.store(static_cast<int32_t>(ok ? CallState::Completed : CallState::Failed),
                     std::memory_order_release);
}

std::vector<CallRecord> FlightRecorder::snapshot() const {
  std::vector<CallRecord> records;
  const uint64_t calls = calls_.load(std::memory_order_acquire);
  const uint64_t first = calls > entries_.size() ? calls - entries_.size() : 0;
  for (uint64_t id = first; id < calls; ++id) {
    const Entry& e = entries_[id % entries_.size()];
    if (e.id.load(std::memory_order_acquire) != id + 1) continue;  // overwritten meanwhile
    CallRecord r;
    r.id = id, r.name = e.name, r.sequence = e.sequence, r.numbered = e.numbered;
    r.state = static_cast<CallState>(e.state.load(std::memory_order_acquire));
    r.step = e.step.load(std::memory_order_relaxed), r.steps = e.steps;
    r.started = e.started, r.ended = e.ended.load(std::memory_order_relaxed);
    r.failure = e.failure;
    records.push_back(std::move(r));
  }
  return records;
}

std::string FlightRecorder::recent(size_t count) const {
  std::vector<CallRecord> records = snapshot();
  const size_t first = records.size() > count ? records.size() - count : 0;
  std::ostringstream out;
  for (size_t i = first; i < records.size(); ++i) {
    const CallRecord& r = records[i];
    out << "\n  call " << r.id << ": " << r.name;
    if (r.numbered) out << " #" << r.sequence;
    out << " " << stateName(r.state);
    if (r.steps > 0) out << " at step " << (r.step < 0 ? 0 : r.step) << " of " << r.steps;
  }
  return out.str();
}

}  // namespace ringcomm
