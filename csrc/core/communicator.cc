// The communicator's collectives: a request's plan made, the caller's buffers mapped onto the
// plan's logical buffer (per collective: mapBuffers) and the plan run, or a recorded run
// replayed. A request is checked in collective_checks.cc; every call is bracketed and recorded
// in call_bracket.cc; failure, abort, close and traffic are in communicator_state.cc.
#include "ringcomm/communicator.h"

#include <functional>

#include "ringcomm/error.h"

namespace ringcomm {

Communicator::Communicator(int rank, int worldSize, std::shared_ptr<Transport> transport,
                           std::shared_ptr<Reducer> reducer, CommunicatorOptions options)
    : rank_(rank),
      worldSize_(worldSize),
      transport_(std::move(transport)),
      reducer_(std::move(reducer)),
      options_(options) {
  RC_CHECK(worldSize >= 1 && rank >= 0 && rank < worldSize, "rank ", rank,
           " is outside the world of ", worldSize, " ranks");
  RC_CHECK(transport_ && reducer_, "a communicator needs a transport and a reducer");
  setSliceBytes(options.sliceBytes);
}

void Communicator::setSliceBytes(size_t bytes) {
  RC_CHECK(bytes >= 8, "slice size must be at least 8 bytes, got ", bytes);
  options_.sliceBytes = bytes;
}

void Communicator::prepare(PlannedCollective& c, RedOp op, DataType type, DataType wireType,
                           int avgDivisor) {
  std::string why;
  RC_CHECK(opSupported(op, type, &why), why);
  checkWireType(type, wireType);
  c.spec = ReduceSpec{type, op, avgDivisor > 0 ? avgDivisor : worldSize_, wireType};
  c.sequence = sequence_++;
}

void Communicator::execute(const PlannedCollective& c) {
  if (worldSize_ == 1) {
    // No step combines anything, yet logical ops still turn values into 0/1 (op(x, x) does).
    if (c.spec.op == RedOp::LAnd || c.spec.op == RedOp::LOr)
      reducer_->reduce(c.output.base, nullptr, c.output.base, c.output.base, c.output.count,
                       c.spec, true);
    return;
  }
  FlightRecorder::plan(c.progress, c.plan->steps.size());
  Executor(*transport_, *reducer_, options_.sliceBytes, executorScratch_).run(c);
}

namespace {

BufferView view(const void* base, size_t first, size_t count) {
  return BufferView{static_cast<char*>(const_cast<void*>(base)), first, count};
}

// Which part of the plan's logical buffer the caller's buffers hold (every rank's blocks or the
// tensor, this rank's block), and the local copy of this rank's own block an out-of-place
// collective needs before the plan runs (no step moves it).
struct LocalCopy {
  void* to = nullptr;
  const void* from = nullptr;
  size_t bytes = 0;
};

LocalCopy mapBuffers(const CollectiveRequest& r, int rank, int worldSize, PlannedCollective& c) {
  const size_t block = r.count, all = r.count * worldSize;
  const size_t bytes = r.count * dataTypeSize(r.type);
  const bool root = rank == r.root;
  auto own = [&](const void* base) {  // this rank's block of a whole buffer
    return static_cast<char*>(const_cast<void*>(base)) + rank * bytes;
  };
  switch (r.collective) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce:
      c.input = c.output = view(r.output, 0, block);
      return {};
    case Collective::ReduceScatter:
      c.input = view(r.input, 0, all);
      c.output = view(r.output, block * rank, block);
      // One rank: no step runs, so nothing reduces the input into the output.
      return worldSize == 1 ? LocalCopy{r.output, r.input, bytes} : LocalCopy{};
    case Collective::AllGather:
      c.input = c.output = view(r.output, 0, all);
      return {own(r.output), r.input, bytes};
    case Collective::Gather:
      if (!root) {
        c.input = view(r.input, block * rank, block);
        return {};
      }
      c.input = c.output = view(r.output, 0, all);
      return {own(r.output), r.input, bytes};
    case Collective::Scatter:
      c.output = view(r.output, block * rank, block);
      if (!root) return {};
      c.input = view(r.input, 0, all);
      return {r.output, own(r.input), bytes};
    default:
      RC_THROW(collectiveName(r.collective), " has no buffer mapping");
  }
}

}  // namespace

void Communicator::run(const CollectiveRequest& request) {
  checkUsable();
  checkRequest(request);
  if (runsInTwoLevels(request)) {
    if (request.collective == Collective::AllReduce) return allReduceInTwoLevels(request);
    if (request.collective == Collective::ReduceScatter) return reduceScatterInTwoLevels(request);
    return allGatherInTwoLevels(request);
  }
  CollectiveRequest r = request;
  r.algorithm = flatAlgorithm(request.algorithm);
  const DataType wireType = r.wireType.value_or(r.type);
  const bool inPlace = collectiveInfo(r.collective).layout == Layout::InPlace;
  const size_t bytes = r.count * (inPlace ? 1 : worldSize_) * dataTypeSize(r.type);
  Algorithm algorithm = resolveAlgorithm(r.algorithm, r.collective, bytes);
  // On a 16-bit wire each side of a recursive_doubling exchange would add the other's rounded
  // value to its own exact one, and ranks would end apart: auto takes the ring there
  // (checkRequest refuses asking for it).
  if (algorithm == Algorithm::RecursiveDoubling && wireType != r.type) algorithm = Algorithm::Ring;
  PlannedCollective c;
  c.plan = &plans_.get({r.collective, rank_, worldSize_, r.count, r.root,
                     chunkAlignment(r.type, wireType), algorithm});
  const LocalCopy copy = mapBuffers(r, rank_, worldSize_, c);
  // Recursive halving reduces other ranks' blocks on the way: in a copy of the input (this
  // communicator runs no two levels, whose blocks scratch_ holds otherwise), this rank's block
  // copied out at the end.
  const size_t blockBytes = r.count * dataTypeSize(r.type);
  const bool halving = algorithm == Algorithm::RecursiveDoubling &&
                       r.collective == Collective::ReduceScatter && worldSize_ > 1;
  if (halving) {
    if (scratch_.size() < worldSize_ * blockBytes) scratch_.resize(worldSize_ * blockBytes);
    c.input = c.output = view(scratch_.data(), 0, r.count * worldSize_);
  }
  prepare(c, r.op, r.type, wireType, r.avgDivisor);
  CallName call = describe(r, c.sequence, algorithmName(c.plan->request.algorithm));
  // A ring plan's device work depends on the request and the slice size alone: a device
  // transport may record a tagged one and replay it (the one-hop plans keep per-round state).
  ReplayKey key{static_cast<int>(r.collective), static_cast<int>(r.type), static_cast<int>(r.op),
                r.root, static_cast<int>(c.plan->request.algorithm), static_cast<int>(wireType),
                r.count, sliceBytes(), r.replayTag, r.output, r.input};
  if (r.replayTag >= 0 && c.plan->request.algorithm == Algorithm::Ring && worldSize_ > 1) {
    call.replay = &key;
    recorder_->name(call);  // a replay is recorded as it was launched
    try {
      if (transport_->replay(r.stream, call)) {
        recorder_->end(recorder_->begin(call), true, "", transport_->completesOnDevice());
        return;
      }
    } catch (const Error& e) {
      failed(e.what());
      reportFailure();
      throw;
    }
  }
  auto body = [&] {
    if (copy.bytes > 0 && copy.to != copy.from)
      reducer_->copy(copy.to, nullptr, copy.from, copy.bytes);
    if (halving && blockBytes > 0)
      reducer_->copy(scratch_.data(), nullptr, r.input, worldSize_ * blockBytes);
    c.progress = current_;  // the executor marks its steps in this call's record
    execute(c);
    if (halving && blockBytes > 0)
      reducer_->copy(r.output, nullptr, scratch_.data() + rank_ * blockBytes, blockBytes);
  };
  collective(r.stream, call, std::ref(body));  // by reference: a std::function copy allocates
}

}  // namespace ringcomm
