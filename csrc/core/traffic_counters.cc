#include "ringcomm/traffic_counters.h"

namespace ringcomm {
namespace {

std::vector<uint64_t> read(const std::vector<std::atomic<uint64_t>>& counters) {
  std::vector<uint64_t> values;
  values.reserve(counters.size());
  for (const auto& c : counters) values.push_back(c.load(std::memory_order_relaxed));
  return values;
}

}  // namespace

TrafficStats TrafficCounters::snapshot() const {
  TrafficStats s;
  s.bytesSent = read(bytesSent_);
  s.bytesReceived = read(bytesReceived_);
  s.messagesSent = read(messagesSent_);
  s.messagesReceived = read(messagesReceived_);
  s.bytesPublished = bytesPublished_.load(std::memory_order_relaxed);
  s.publications = publications_.load(std::memory_order_relaxed);
  s.waits = waits_.waits.load(std::memory_order_relaxed);
  s.waitsEndedSpinning = waits_.ended[WaitStats::kSpinning].load(std::memory_order_relaxed);
  s.waitsEndedYielding = waits_.ended[WaitStats::kYielding].load(std::memory_order_relaxed);
  s.waitsEndedSleeping = waits_.ended[WaitStats::kSleeping].load(std::memory_order_relaxed);
  s.waitSeconds = waits_.nanos.load(std::memory_order_relaxed) * 1e-9;
  s.sleepingWaitSeconds = waits_.sleepingNanos.load(std::memory_order_relaxed) * 1e-9;
  return s;
}

void TrafficCounters::reset() {
  for (auto* counters : {&bytesSent_, &bytesReceived_, &messagesSent_, &messagesReceived_})
    for (auto& c : *counters) c.store(0, std::memory_order_relaxed);
  for (Counter* c : {&bytesPublished_, &publications_, &waits_.waits, &waits_.nanos,
                     &waits_.sleepingNanos, &waits_.ended[0], &waits_.ended[1], &waits_.ended[2]})
    c->store(0, std::memory_order_relaxed);
}

}  // namespace ringcomm
