#include "ringcomm/interrupt.h"

#include <atomic>

namespace ringcomm {
namespace {
std::atomic<InterruptCheck> installed{nullptr};
}  // namespace

void setInterruptCheck(InterruptCheck check) { installed.store(check); }

bool interruptRequested() {
  const InterruptCheck check = installed.load(std::memory_order_relaxed);
  return check != nullptr && check();
}

}  // namespace ringcomm
