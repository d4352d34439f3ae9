#include "shm/shm_wait.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <fstream>
#include <string>

namespace ringcomm {

bool YieldGate::mayYield() {
  if (!off_.load(std::memory_order_relaxed)) return true;
  Clock::rep due = nextProbe_.load(std::memory_order_relaxed);
  const auto now = Clock::now();
  if (now.time_since_epoch().count() < due) return false;
  // One waiter wins the probe; the others keep sleeping.
  const Clock::rep next = now.time_since_epoch().count() +
                          probePeriod_.load(std::memory_order_relaxed);
  return nextProbe_.compare_exchange_strong(due, next, std::memory_order_relaxed);
}

void YieldGate::turnOff() {
  const Clock::rep first = Clock::duration(kFirstProbe).count();
  quietProbes_.store(0, std::memory_order_relaxed);
  probePeriod_.store(first, std::memory_order_relaxed);
  nextProbe_.store(Clock::now().time_since_epoch().count() + first, std::memory_order_relaxed);
  off_.store(true, std::memory_order_relaxed);
}

bool YieldGate::noteYield(Clock::duration took) {
  const bool slowYield = took > kSlowYield;
  if (off_.load(std::memory_order_relaxed)) {  // a probe
    if (slowYield) {
      quietProbes_.store(0, std::memory_order_relaxed);
      const Clock::rep period = std::min<Clock::rep>(
          2 * probePeriod_.load(std::memory_order_relaxed), Clock::duration(kLastProbe).count());
      probePeriod_.store(period, std::memory_order_relaxed);
      nextProbe_.store(Clock::now().time_since_epoch().count() + period,
                       std::memory_order_relaxed);
      return true;
    }
    if (quietProbes_.fetch_add(1, std::memory_order_relaxed) + 1 < kQuietProbes) return true;
    yieldsInWindow_.store(0, std::memory_order_relaxed);
    slowInWindow_.store(0, std::memory_order_relaxed);
    off_.store(false, std::memory_order_relaxed);
    return false;
  }
  const uint32_t slow = slowYield ? slowInWindow_.fetch_add(1, std::memory_order_relaxed) + 1
                                  : slowInWindow_.load(std::memory_order_relaxed);
  const bool windowDone = yieldsInWindow_.fetch_add(1, std::memory_order_relaxed) + 1 >= kWindow;
  const bool turnOffNow = slow >= kSlowInWindow;
  if (turnOffNow) turnOff();
  if (windowDone || turnOffNow) {
    yieldsInWindow_.store(0, std::memory_order_relaxed);
    slowInWindow_.store(0, std::memory_order_relaxed);
  }
  return turnOffNow;
}

YieldGate& processYieldGate() {
  static YieldGate gate;
  return gate;
}

void futexWait(std::atomic<uint32_t>& word, uint32_t stale, int millis) {
  timespec timeout{millis / 1000, (millis % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, stale, &timeout, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

// A process that exited is gone (ESRCH) or a zombie its parent has not reaped yet.
bool processAlive(pid_t pid) {
  if (pid <= 0) return true;  // not known yet
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

std::string WaitTarget::description() const {
  if (publication == nullptr) return what;
  return detail::concat("publish phase ", phase, " of ", describeCollective(*publication));
}

void checkAlive(const WaitTarget& target) {
  const Peer& awaited = target.awaited;
  if (!processAlive(awaited.pid))
    RC_THROW_AS(PeerError, "rank ", awaited.rank, " (process ", awaited.pid,
                ") died while this rank was waiting for it to ", target.description());
  if (target.watched == nullptr) return;
  for (const Peer& other : *target.watched)
    if (!processAlive(other.pid))
      RC_THROW_AS(PeerError, "rank ", other.rank, " (process ", other.pid,
                  ") died while this rank was waiting for rank ", awaited.rank, " to ",
                  target.description());
}

void throwWaitTimeout(const WaitPolicy& policy, const WaitTarget& target) {
  RC_THROW_AS(TimeoutError, "timed out after ", policy.timeoutSeconds, " s waiting for rank ",
              target.awaited.rank, " to ", target.description());
}

void throwInterrupted(const WaitTarget& target) {
  RC_THROW_AS(InterruptedError, "interrupted by a signal while waiting for rank ",
              target.awaited.rank, " to ", target.description());
}

}  // namespace ringcomm
