// The counters behind Transport::traffic() for the host transports (shared memory, TCP).
// Each per-peer counter has one writer (the thread sending to, or receiving from, that peer),
// so it is a relaxed atomic bumped with a plain load and store: no locked instruction on the
// hot path, and readable from any thread. reset() is meant for moments when no collective runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "ringcomm/transport.h"

namespace ringcomm {

// Where the waits that were not over at once went: how many, how long, and the phase each
// ended in. Relaxed atomics: a transport's sends and receives may wait on different threads.
struct WaitStats {
  enum Phase { kSpinning, kYielding, kSleeping };
  std::atomic<uint64_t> waits{0}, nanos{0}, sleepingNanos{0};
  std::atomic<uint64_t> ended[3] = {{0}, {0}, {0}};

  void note(Phase phase, std::chrono::steady_clock::duration took) {
    const auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
    waits.fetch_add(1, std::memory_order_relaxed);
    nanos.fetch_add(ns, std::memory_order_relaxed);
    ended[phase].fetch_add(1, std::memory_order_relaxed);
    if (phase == kSleeping) sleepingNanos.fetch_add(ns, std::memory_order_relaxed);
  }
};

class TrafficCounters {
 public:
  explicit TrafficCounters(int worldSize)
      : bytesSent_(worldSize), bytesReceived_(worldSize), messagesSent_(worldSize),
        messagesReceived_(worldSize) {}

  void sent(int peer, uint64_t bytes) {
    bump(bytesSent_[peer], bytes);
    bump(messagesSent_[peer], 1);
  }
  void received(int peer, uint64_t bytes) {
    bump(bytesReceived_[peer], bytes);
    bump(messagesReceived_[peer], 1);
  }
  void published(uint64_t bytes) {
    bump(bytesPublished_, bytes);
    bump(publications_, 1);
  }
  // For WaitPolicy::stats.
  WaitStats* waits() { return &waits_; }

  TrafficStats snapshot() const;
  void reset();

 private:
  using Counter = std::atomic<uint64_t>;
  static void bump(Counter& counter, uint64_t by) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  std::vector<Counter> bytesSent_, bytesReceived_, messagesSent_, messagesReceived_;
  Counter bytesPublished_{0}, publications_{0};
  WaitStats waits_;
};

}  // namespace ringcomm
