// makePlan: the request checked, the logical buffer cut into chunks and one rank's steps built
// by the family its collective and algorithm name (PlanBuilder: ring_plans.cc, one_hop_plans.cc,
// recursive_doubling_plans.cc, log_step_plans.cc);
// and what the executor asks of a plan: slice columns, publication pieces, step kinds.
#include "ringcomm/schedule.h"

#include <algorithm>

#include "core/plan_builder.h"
#include "ringcomm/error.h"

namespace ringcomm {

size_t chunkAlignment(DataType type, DataType wireType) {
  const size_t narrowest = std::min(dataTypeSize(type), dataTypeSize(wireType));
  return std::max<size_t>(1, kChunkAlignBytes / narrowest);
}

Range balancedChunk(size_t count, int parts, int index, size_t align) {
  RC_CHECK(parts >= 1 && index >= 0 && index < parts, "chunk ", index, " of ", parts);
  RC_CHECK(align >= 1, "chunk alignment must be at least one element");
  const size_t groups = count / align, i = static_cast<size_t>(index);
  const size_t base = groups / parts, extra = groups % parts;
  Range range{(i * base + std::min(i, extra)) * align, (base + (i < extra ? 1 : 0)) * align};
  if (index == parts - 1) range.count += count % align;
  return range;
}

Range sliceOf(const Range& range, size_t column, size_t sliceElems) {
  size_t start = column * sliceElems;
  if (start >= range.count) return Range{range.offset + range.count, 0};
  return Range{range.offset + start, std::min(sliceElems, range.count - start)};
}

size_t columnCount(const Plan& plan, size_t sliceElems) {
  RC_CHECK(sliceElems > 0, "slice size must hold at least one element");
  size_t longest = 0;
  for (const Range& chunk : plan.chunks) longest = std::max(longest, chunk.count);
  return std::max<size_t>(1, (longest + sliceElems - 1) / sliceElems);
}

size_t chunksPerPublication(const Plan& plan) {
  size_t most = 0;
  for (const Step& step : plan.steps)
    if (step.publishPhase >= 0) most = std::max<size_t>(most, step.chunk < 0 ? plan.chunks.size() : 1);
  return most;
}

bool usesPublications(const Plan& plan) {
  for (const Step& step : plan.steps)
    if (step.publishPhase >= 0 || step.readFrom >= 0) return true;
  return false;
}

void columnPieces(const Plan& plan, int chunk, size_t column, size_t sliceElems,
                  std::vector<Range>& pieces) {
  pieces.clear();
  if (chunk >= 0) {
    pieces.push_back(sliceOf(plan.chunks.at(chunk), column, sliceElems));
  } else {
    for (const Range& each : plan.chunks) pieces.push_back(sliceOf(each, column, sliceElems));
  }
}

StepKind stepKind(const Step& step) {
  if (step.ack) return StepKind::Ack;
  if (step.readFrom >= 0) return StepKind::Read;
  if (step.publishPhase >= 0) return StepKind::Publish;
  if (step.recvFrom < 0) return StepKind::Send;
  const bool sends = step.sendTo >= 0;
  if (!step.reduce) return sends ? StepKind::RecvCopySend : StepKind::Recv;
  if (!sends) return StepKind::RecvReduceCopy;
  return step.store ? StepKind::RecvReduceCopySend : StepKind::RecvReduceSend;
}

const char* stepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::Send: return "send";
    case StepKind::Recv: return "recv";
    case StepKind::RecvReduceCopy: return "recvReduceCopy";
    case StepKind::RecvReduceSend: return "recvReduceSend";
    case StepKind::RecvReduceCopySend: return "recvReduceCopySend";
    case StepKind::RecvCopySend: return "recvCopySend";
    case StepKind::Ack: return "ack";
    case StepKind::Publish: return "publish";
    case StepKind::Read: return "read";
  }
  return "?";
}

namespace {
Plan buildPlan(const PlanRequest& request);
}  // namespace

Plan makePlan(const PlanRequest& request) {
  Plan plan = buildPlan(request);
  for (Step& step : plan.steps) step.kind = stepKind(step);  // decoded once, here
  return plan;
}

namespace {

Plan buildPlan(const PlanRequest& request) {
  const int n = request.worldSize;
  RC_CHECK(n >= 1, "world size must be at least 1, got ", n);
  RC_CHECK(request.rank >= 0 && request.rank < n, "rank ", request.rank,
           " is outside the world of ", n, " ranks");
  RC_CHECK(request.root >= 0 && request.root < n, "root rank ", request.root,
           " is outside the world of ", n, " ranks");
  const Algorithm algorithm = request.algorithm;
  RC_CHECK(algorithm != Algorithm::Auto, "choose an algorithm before planning");
  RC_CHECK(algorithmPlans(algorithm, request.collective), algorithmName(algorithm),
           " has no plan for ", collectiveName(request.collective));

  Plan plan;
  plan.request = request;
  const Collective collective = request.collective;
  // One range over the whole buffer (chains, and one_shot all_reduce, which reads everything
  // whole), balanced chunks of one tensor (all_reduce), or one block per rank.
  const bool whole = collective == Collective::Broadcast || collective == Collective::Reduce ||
                     (collective == Collective::AllReduce && (algorithm == Algorithm::OneShot ||
                                                              algorithm == Algorithm::RecursiveDoubling));
  if (whole) {
    plan.bufferCount = request.count;
    plan.chunks.push_back(Range{0, request.count});
  } else if (collective == Collective::AllReduce) {
    plan.bufferCount = request.count;
    for (int i = 0; i < n; ++i)
      plan.chunks.push_back(balancedChunk(request.count, n, i, request.alignElems));
  } else {
    plan.bufferCount = request.count * n;
    for (int i = 0; i < n; ++i) plan.chunks.push_back(Range{request.count * i, request.count});
  }
  if (n == 1) return plan;  // nothing to exchange

  PlanBuilder builder(plan);
  if (algorithm == Algorithm::RecursiveDoubling) {
    if (collective == Collective::AllReduce)
      builder.recursiveDoublingAllReduce();
    else if (collective == Collective::ReduceScatter)
      builder.recursiveHalvingReduceScatter();
    else
      builder.recursiveDoublingAllGather();  // kAlgorithms: these three
    return plan;
  }
  if (algorithm == Algorithm::OneShot || algorithm == Algorithm::TwoShot) {
    if (algorithm == Algorithm::TwoShot)
      builder.twoShotAllReduce();  // kAlgorithms: two_shot plans all_reduce only
    else if (collective == Collective::AllReduce)
      builder.oneShotAllReduce();
    else if (collective == Collective::ReduceScatter)
      builder.oneShotReduceScatter();
    else
      builder.oneShotAllGather();
    return plan;
  }
  switch (collective) {
    case Collective::AllReduce:
      builder.reduceScatter(/*forwardLast=*/true);
      builder.allGather(/*sendOwn=*/false);
      break;
    case Collective::ReduceScatter:
      builder.reduceScatter(/*forwardLast=*/false);
      break;
    case Collective::AllGather:
      builder.allGather(/*sendOwn=*/true);
      break;
    case Collective::Broadcast:
      builder.broadcast();
      break;
    case Collective::Reduce:
      builder.reduce();
      break;
    case Collective::Gather:
      builder.gather();
      break;
    case Collective::Scatter:
      builder.scatter();
      break;
    case Collective::AllToAll:
    case Collective::SendRecv:
      RC_THROW(collectiveName(request.collective), " runs over peer links, not a ring schedule");
  }
  return plan;
}

}  // namespace

}  // namespace ringcomm
