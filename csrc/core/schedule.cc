// Ring plans for every collective. Index arithmetic follows one rule per family:
//   reduce-scatter / scatter: at ring step s rank r sends chunk r-1-s and receives chunk r-2-s,
//   all-gather / gather:      at ring step s rank r sends chunk r-s   and receives chunk r-1-s,
// so that rank r ends owning chunk r. A chunk received at ring step s is the one sent at step
// s+1, which is why one plan step both receives and forwards (NCCL's recvReduceSend).
// One-hop plans (schedule.h) read publications in rank order 0..N-1 wherever they reduce, so
// every rank combines the same values in the same order.
#include "ringcomm/schedule.h"

#include <algorithm>
#include <limits>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

int wrap(int value, int n) { return ((value % n) + n) % n; }

// Stands for "the whole buffer" where a step index would name a chunk (chain collectives).
constexpr int kWhole = std::numeric_limits<int>::min();

class PlanBuilder {
 public:
  explicit PlanBuilder(Plan& plan)
      : plan_(plan),
        rank_(plan.request.rank),
        size_(plan.request.worldSize),
        prev_(wrap(rank_ - 1, size_)),
        next_(wrap(rank_ + 1, size_)) {}

  // Adds a step on chunk `chunk` (taken modulo the world size), or on the whole buffer.
  Step& add(int chunk) {
    Step step;
    step.chunk = chunk == kWhole ? -1 : wrap(chunk, size_);
    step.range = chunk == kWhole ? Range{0, plan_.bufferCount} : plan_.chunks[step.chunk];
    plan_.steps.push_back(step);
    return plan_.steps.back();
  }
  Step& send(int chunk) {
    Step& step = add(chunk);
    step.sendTo = next_;
    return step;
  }
  Step& recv(int chunk, bool reduce, bool store) {
    Step& step = add(chunk);
    step.recvFrom = prev_;
    step.reduce = reduce;
    step.store = store;
    step.finalize = reduce && store;
    return step;
  }
  Step& recvSend(int chunk, bool reduce, bool store) {
    Step& step = recv(chunk, reduce, store);
    step.sendTo = next_;
    return step;
  }

  // The ring-closing acknowledgement: from the chain's last rank to its first.
  void ackSend() {
    Step& step = add(kWhole);
    step.range.count = 0;
    step.sendTo = next_;
    step.ack = true;
  }
  void ackRecv() {
    Step& step = add(kWhole);
    step.range.count = 0;
    step.recvFrom = prev_;
    step.ack = true;
  }

  // Reduce-scatter: rank r ends with chunk r fully reduced; `forwardLast` also sends it on,
  // which is the first all-gather step of an allreduce.
  void reduceScatter(bool forwardLast) {
    send(rank_ - 1);
    for (int s = 1; s <= size_ - 2; ++s) recvSend(rank_ - 1 - s, /*reduce=*/true, /*store=*/false);
    if (forwardLast)
      recvSend(rank_, /*reduce=*/true, /*store=*/true);
    else
      recv(rank_, /*reduce=*/true, /*store=*/true);
  }

  // All-gather after rank r holds chunk r; `sendOwn` is false when reduce-scatter already sent it.
  void allGather(bool sendOwn) {
    if (sendOwn) send(rank_);
    for (int s = 1; s <= size_ - 2; ++s) recvSend(rank_ - s, /*reduce=*/false, /*store=*/true);
    recv(rank_ + 1, /*reduce=*/false, /*store=*/true);
  }

  // One-hop steps: publish a chunk (or kWhole: every chunk) in `phase`; read rank `from`'s
  // publication of `publishedChunk` in `phase`, keeping chunk `chunk` of it.
  Step& publish(int chunk, int phase) {
    Step& step = add(chunk);
    step.publishPhase = phase;
    return step;
  }
  Step& read(int from, int phase, int publishedChunk, int chunk, bool reduce) {
    Step& step = add(chunk);
    step.readFrom = from;
    step.readPhase = phase;
    step.publishedChunk = publishedChunk == kWhole ? -1 : publishedChunk;
    step.reduce = reduce;
    step.store = true;
    return step;
  }

  // Reduces chunk `chunk` (kWhole for the whole buffer) from every rank's phase-0 publication
  // of every chunk, in rank order; returns the last step (it finalizes).
  Step& reduceFromAll(int chunk) {
    for (int q = 0; q < size_ - 1; ++q) read(q, 0, kWhole, chunk, /*reduce=*/q > 0);
    Step& last = read(size_ - 1, 0, kWhole, chunk, /*reduce=*/true);
    last.finalize = true;
    return last;
  }

  void oneShotAllReduce() {
    publish(kWhole, 0);
    reduceFromAll(kWhole);
  }

  void twoShotAllReduce() {
    publish(kWhole, 0);
    reduceFromAll(rank_).publishPhase = 1;
    copyFromOthers(1);
  }

  void oneShotReduceScatter() {
    publish(kWhole, 0);
    reduceFromAll(rank_);
  }

  void oneShotAllGather() {
    publish(rank_, 0);
    copyFromOthers(0);
  }

  // Every other rank's chunk, from its publication of it in `phase`.
  void copyFromOthers(int phase) {
    for (int q = 0; q < size_; ++q)
      if (q != rank_) read(q, phase, q, q, /*reduce=*/false);
  }

  // Position along the ring counted from the root.
  int distanceFromRoot() const { return wrap(rank_ - plan_.request.root, size_); }

  void broadcast() {
    int p = distanceFromRoot();
    if (p == 0) {
      send(kWhole);
      ackRecv();
    } else if (p < size_ - 1) {
      recvSend(kWhole, /*reduce=*/false, /*store=*/true);
    } else {
      recv(kWhole, /*reduce=*/false, /*store=*/true);
      ackSend();
    }
  }

  // The chain runs root+1 -> root+2 -> ... -> root; only the root stores the result.
  void reduce() {
    int p = distanceFromRoot();
    if (p == 1) {
      send(kWhole);
      ackRecv();
    } else if (p > 1) {
      recvSend(kWhole, /*reduce=*/true, /*store=*/false);
    } else {
      recv(kWhole, /*reduce=*/true, /*store=*/true);
      ackSend();
    }
  }

  // All-gather truncated: a rank forwards only what lies between it and the root.
  void gather() {
    int p = distanceFromRoot();
    if (p == 0) {
      for (int s = 0; s <= size_ - 2; ++s) recv(rank_ - 1 - s, /*reduce=*/false, /*store=*/true);
      ackSend();
      return;
    }
    send(rank_);
    for (int s = 1; s <= p - 1; ++s) recvSend(rank_ - s, /*reduce=*/false, /*store=*/false);
    if (p == 1) ackRecv();
  }

  // Reduce-scatter's indices without reduction: the root sends the farthest chunk first.
  void scatter() {
    int p = distanceFromRoot();
    if (p == 0) {
      for (int s = 0; s <= size_ - 2; ++s) send(rank_ - 1 - s);
      ackRecv();
      return;
    }
    for (int s = p - 1; s <= size_ - 3; ++s)
      recvSend(rank_ - 2 - s, /*reduce=*/false, /*store=*/false);
    recv(rank_, /*reduce=*/false, /*store=*/true);
    if (p == size_ - 1) ackSend();
  }

 private:
  Plan& plan_;
  int rank_, size_, prev_, next_;
};

}  // namespace

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

std::vector<Range> columnPieces(const Plan& plan, int chunk, size_t column, size_t sliceElems) {
  std::vector<Range> pieces;
  if (chunk >= 0) {
    pieces.push_back(sliceOf(plan.chunks.at(chunk), column, sliceElems));
  } else {
    for (const Range& each : plan.chunks) pieces.push_back(sliceOf(each, column, sliceElems));
  }
  return pieces;
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
                     (collective == Collective::AllReduce && algorithm == Algorithm::OneShot);
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
