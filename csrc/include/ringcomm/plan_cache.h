// PlanCache: the plans a communicator ran lately, by request. A training loop repeats a few
// collectives; building a plan anew (its chunks and steps, each a growing vector) cost a small
// call about a tenth of its time in the core.
#pragma once

#include <array>
#include <cstddef>
#include <memory>

#include "ringcomm/schedule.h"

namespace ringcomm {

class PlanCache {
 public:
  // The plan of `request`, made on first use. Valid until `kPlans` other requests were planned
  // after it: callers use it within one call. Not thread-safe (the thread that runs collectives
  // owns it).
  const Plan& get(const PlanRequest& request);

  static constexpr size_t kPlans = 16;

 private:
  std::array<std::unique_ptr<const Plan>, kPlans> plans_;
  size_t next_ = 0;  // the slot the next new plan replaces (round robin)
};

}  // namespace ringcomm
