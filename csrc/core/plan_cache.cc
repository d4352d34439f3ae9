#include "ringcomm/plan_cache.h"

namespace ringcomm {
namespace {

bool same(const PlanRequest& a, const PlanRequest& b) {
  return a.collective == b.collective && a.rank == b.rank && a.worldSize == b.worldSize &&
         a.count == b.count && a.root == b.root && a.alignElems == b.alignElems &&
         a.algorithm == b.algorithm;
}

}  // namespace

const Plan& PlanCache::get(const PlanRequest& request) {
  for (const auto& plan : plans_)
    if (plan && same(plan->request, request)) return *plan;
  auto& slot = plans_[next_];
  next_ = (next_ + 1) % kPlans;
  slot = std::make_unique<const Plan>(makePlan(request));
  return *slot;
}

}  // namespace ringcomm
