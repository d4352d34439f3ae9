// How a rank waits on a word in shared memory that another process moves: spin for a few tens of
// microseconds (the peer runs on another core and answers within them; a long spin yields now
// and then, in case the peer waits for this core), then yield (the peer may
// need this core: with more ranks than cores that is the common case), then sleep on the futex in
// short slices, checking the deadline, an abort flag, whether the awaited process still exists
// and whether this process was asked to stop (ringcomm/interrupt.h: Ctrl-C). A yield that hands
// the core to another process for a scheduler slice (a busy machine: milliseconds) turns yielding
// off for this process for a while: then waiters sleep at once, which lets the kernel run them
// as soon as they are woken (docs/benchmarks.md). Used by ring channels and publication boards
// alike.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ringcomm/error.h"
#include "ringcomm/interrupt.h"
#include "ringcomm/traffic_counters.h"
#include "ringcomm/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RC_CPU_RELAX() _mm_pause()
#else
#define RC_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace ringcomm {

// A rank and its process, to check on while waiting.
struct Peer {
  int rank;
  pid_t pid;
};

// The first three are CommOptions' timeout, spin_us and yield_us, set by the caller.
struct WaitPolicy {
  double timeoutSeconds = 0;
  int spinMicros = 0;       // busy polls first, for this long
  int yieldMicros = 0;      // then sched_yield polls for this long, unless yields are slow here
  int sleepMillis = 20;     // then futex slices
  WaitStats* stats = nullptr;  // where to count the waits (the transport's), if anywhere
};

// What is awaited, for the error messages: "waiting for rank 3 to <what>".
struct WaitTarget {
  Peer awaited;
  const std::vector<Peer>* watched = nullptr;  // other processes whose death ends the wait too
  const char* what = "";
  // Or a publication of `phase` matching this envelope: described only when an error names it
  // (formatting it costs a small call more than the wait).
  const Envelope* publication = nullptr;
  int phase = 0;

  std::string description() const;
};

bool processAlive(pid_t pid);
void futexWait(std::atomic<uint32_t>& word, uint32_t stale, int millis);
void futexWakeAll(std::atomic<uint32_t>& word);
// Raises PeerError if the awaited or a watched process has died.
void checkAlive(const WaitTarget& target);
[[noreturn]] void throwWaitTimeout(const WaitPolicy& policy, const WaitTarget& target);
[[noreturn]] void throwInterrupted(const WaitTarget& target);

// Whether waiters may yield, judged from what yields cost now. A yield to a peer rank returns
// once that rank waits again (microseconds); one that returns much later gave the core to a
// process that ran out its scheduler slice: a busy machine, where waiters should sleep instead.
// Yields are counted in windows of kWindow; kSlowInWindow slow ones in a window turn yielding
// off. While off, one waiter per probe period may yield as a probe, and kQuietProbes fast
// probes in a row turn it on again: after a short burst of other work the mode ends within a
// few tenths of a second. Each slow probe doubles the period (kFirstProbe to kLastProbe), so on a
// machine that stays busy probes come once per kLastProbe. Counts are approximate
// across threads.
class YieldGate {
 public:
  using Clock = std::chrono::steady_clock;
  // Quiet, 4 ranks on 2 cores: 1 yield in 5000 took this long; beside 2 busy processes, 45%.
  static constexpr auto kSlowYield = std::chrono::microseconds(500);
  static constexpr uint32_t kWindow = 16, kSlowInWindow = 4;
  static constexpr auto kFirstProbe = std::chrono::milliseconds(50);
  static constexpr auto kLastProbe = std::chrono::milliseconds(200);
  // A busy machine answers 3 probes fast in a row about 1 time in 6 (45% slow yields): then
  // the window turns yielding off again after a few slow yields.
  static constexpr uint32_t kQuietProbes = 3;

  // Whether this waiter may yield now: yielding is on, or it is off and a probe is due (then
  // this caller is the probe, and must report the yield with noteYield).
  bool mayYield();
  bool yieldingIsOff() const { return off_.load(std::memory_order_relaxed); }
  Clock::duration probePeriod() const {
    return Clock::duration(probePeriod_.load(std::memory_order_relaxed));
  }
  // How long one yield took; returns whether yielding is off after it.
  bool noteYield(Clock::duration took);

 private:
  void turnOff();

  std::atomic<bool> off_{false};
  std::atomic<uint32_t> yieldsInWindow_{0}, slowInWindow_{0}, quietProbes_{0};
  std::atomic<Clock::rep> nextProbe_{0};  // Clock ticks since its epoch
  std::atomic<Clock::rep> probePeriod_{0};  // Clock ticks
};

// The gate every wait of this process consults.
YieldGate& processYieldGate();

// After making a waiter's condition true (a sequentially consistent store): wakes the waiters
// that announced a sleep on `word`, moving `word` first when it is not the store's own word.
// Costs one load when nobody sleeps.
inline void wakeSleepers(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                         bool moveWord) {
  if (sleepers.load(std::memory_order_seq_cst) == 0) return;
  if (moveWord) word.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(word);
}

// Waits until ready(). `word` changes whenever ready() may have become true (see wakeSleepers);
// `sleepers` counts the processes asleep on it. `checkAbort` raises when the transport was
// aborted; `watch` (called after every futex slice) may raise too. Every futex slice
// (sleepMillis, or sooner when a signal lands on this thread) asks interruptRequested().
template <typename Ready, typename CheckAbort, typename Watch>
void waitUntil(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
               const WaitPolicy& policy, const WaitTarget& target, CheckAbort checkAbort,
               Watch watch) {
  if (ready()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto stopSpinning = start + std::chrono::microseconds(policy.spinMicros);
  const auto deadline = start + std::chrono::duration<double>(policy.timeoutSeconds);
  auto finished = [&](WaitStats::Phase phase) {
    if (policy.stats != nullptr) policy.stats->note(phase, Clock::now() - start);
  };
  for (int i = 0; policy.spinMicros > 0; ++i) {
    if (ready()) return finished(WaitStats::kSpinning);
    RC_CPU_RELAX();
    if ((i & 63) == 63) {  // every ~2 us
      const auto now = Clock::now();
      if (now > stopSpinning) break;
      // Every ~8 us: the peer may be waiting for this very core (the scheduler put both ranks
      // on one), and then spinning only delays it. A yield costs a system call when nothing
      // else wants the core; the gate stops it on a busy machine, where a yield loses the core
      // for long. Waits shorter than that, the common case, never pay for it.
      if ((i & 255) == 255 && policy.yieldMicros > 0 && processYieldGate().mayYield()) {
        sched_yield();
        processYieldGate().noteYield(Clock::now() - now);
      }
    }
  }
  if (policy.yieldMicros > 0 && processYieldGate().mayYield()) {
    const auto stopYielding = Clock::now() + std::chrono::microseconds(policy.yieldMicros);
    for (int round = 0; !ready(); ++round) {
      if ((round & 63) == 0) checkAbort();
      const auto before = Clock::now();
      sched_yield();
      const auto after = Clock::now();
      if (processYieldGate().noteYield(after - before) || after > stopYielding) break;
    }
    if (ready()) return finished(WaitStats::kYielding);
  }
  for (;;) {
    // Read the word, then announce the sleep, then look once more. Whoever makes us ready does
    // so, then reads the count and, if set, moves the word and wakes us (all sequentially
    // consistent): either we see it ready, or it sees the count, and then the futex either sees
    // the moved word or gets the wake.
    const uint32_t stale = word.load(std::memory_order_seq_cst);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    bool done = ready();
    if (!done) {
      futexWait(word, stale, policy.sleepMillis);
      done = ready();
    }
    sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (done) return finished(WaitStats::kSleeping);
    checkAbort();
    if (interruptRequested()) throwInterrupted(target);
    // Every slice (a system call per ~20 ms asleep): a killed peer is noticed within one.
    checkAlive(target);
    watch();
    if (Clock::now() > deadline) throwWaitTimeout(policy, target);
  }
}

}  // namespace ringcomm
