#include "testing/core_round_trip.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

bool bindTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

}  // namespace

double coreRoundTripNanos(int cpuA, int cpuB, int rounds, int samples) {
  RC_CHECK(rounds > 0 && samples > 0, "rounds and samples must be positive");
  // The counter has a cache line of its own; odd values are the ping, even ones the pong.
  alignas(64) std::atomic<uint32_t> counter{0};
  std::atomic<bool> bound{true};
  const uint32_t total = static_cast<uint32_t>(rounds) * (samples + 1);  // +1: a warm-up
  std::thread pong([&] {
    if (!bindTo(cpuB)) bound = false;
    for (uint32_t i = 0; i < total && bound; ++i) {
      while (counter.load(std::memory_order_acquire) != 2 * i + 1)
        if (!bound.load(std::memory_order_relaxed)) return;
      counter.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::vector<double> nanos;
  std::thread ping([&] {
    if (!bindTo(cpuA)) bound = false;
    for (int s = 0; s <= samples && bound; ++s) {
      const auto start = std::chrono::steady_clock::now();
      for (int r = 0; r < rounds && bound; ++r) {
        const uint32_t i = static_cast<uint32_t>(s) * rounds + r;
        counter.store(2 * i + 1, std::memory_order_release);
        while (counter.load(std::memory_order_acquire) != 2 * i + 2)
          if (!bound.load(std::memory_order_relaxed)) return;
      }
      const std::chrono::duration<double, std::nano> took =
          std::chrono::steady_clock::now() - start;
      if (s > 0) nanos.push_back(took.count() / rounds);
    }
  });
  ping.join();
  pong.join();
  RC_CHECK(bound, "cannot bind a thread to CPU ", cpuA, " or ", cpuB,
           " (not among this process's CPUs?)");
  std::sort(nanos.begin(), nanos.end());
  return nanos[nanos.size() / 2];
}

}  // namespace ringcomm
