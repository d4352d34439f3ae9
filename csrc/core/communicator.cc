// The communicator's collectives: a request checked, its plan made, the caller's buffers mapped
// onto the plan's logical buffer (per collective: mapBuffers) and the plan run; and its state:
// failure, abort, close, what its transports moved.
#include "ringcomm/communicator.h"

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

BufferView view(const void* base, size_t first, size_t count) {
  return BufferView{static_cast<char*>(const_cast<void*>(base)), first, count};
}

}  // namespace

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

void Communicator::setTraceBuffer(size_t calls) {
  recorder_->resize(calls);
  for (Transport* t : {transport_.get(), links_.get()})
    if (t) t->reportCompletionTo(recorder_);
}

void Communicator::checkUsable() const {
  RC_CHECK(!closed_, "this ringcomm communicator is closed");
  if (aborted_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(abortMutex_);
    RC_THROW_AS(PeerError, "this ringcomm communicator was aborted and cannot be used again (",
                abortReason_, "); create a new one");
  }
  if (!failure_.empty())
    RC_THROW_AS(PeerError, "this ringcomm communicator failed earlier and cannot be used again (",
                failure_, "); create a new one");
}

void Communicator::prepare(PlannedCollective& c, RedOp op, DataType type, DataType wireType,
                           int avgDivisor) {
  std::string why;
  RC_CHECK(opSupported(op, type, &why), why);
  checkWireType(type, wireType);
  c.spec = ReduceSpec{type, op, avgDivisor > 0 ? avgDivisor : worldSize_, wireType};
  c.sequence = sequence_++;
}

void Communicator::collective(uintptr_t stream, const CallName& call,
                              const std::function<void()>& body) {
  bracket(*transport_, stream, call, body);
}

void Communicator::bracket(Transport& transport, uintptr_t stream, const CallName& name,
                           const std::function<void()>& body) {
  CallName call = name;
  recorder_->name(call);
  FlightRecorder::Entry* entry = current_ = recorder_->begin(call);
  // A failure ends the entry, tells the failure hook (which may write the record out) and
  // names this rank's last calls.
  auto fail = [&](const Error& e, bool refused) {
    recorder_->end(entry, false, e.what());
    if (!refused) failed(e.what());
    reportFailure();
    if (recorder_->capacity() == 0) throw;
    rethrowWithMessage(e, e.what() + ("\nthis rank's last calls:" + recorder_->recent(4)));
  };
  try {
    transport.begin(stream, call);
  } catch (const RefusedError& e) {
    fail(e, true);  // begin() refused before starting anything: the communicator stays usable
  } catch (const Error& e) {
    fail(e, false);
  }
  try {
    body();
    transport.end();
    recorder_->end(entry, true, "", transport.completesOnDevice());
  } catch (const Error& e) {
    fail(e, false);
  }
}

void Communicator::reportFailure() noexcept {
  if (!onFailure_) return;
  try {
    onFailure_();
  } catch (...) {  // a report must not hide the failure it reports
  }
}

void Communicator::execute(const PlannedCollective& c) {
  if (worldSize_ == 1) {
    // No step combines anything, yet logical ops still turn values into 0/1 (op(x, x) does).
    if (c.spec.op == RedOp::LAnd || c.spec.op == RedOp::LOr)
      reducer_->reduce(c.output.base, nullptr, c.output.base, c.output.base, c.output.count,
                       c.spec, true);
    return;
  }
  FlightRecorder::plan(c.progress, c.plan.steps.size());
  Executor(*transport_, *reducer_, options_.sliceBytes).run(c);
}

Algorithm Communicator::resolveAlgorithm(Algorithm requested, Collective collective,
                                         size_t bytes) const {
  RC_CHECK(algorithmPlans(requested, collective), "algorithm ", algorithmName(requested),
           " does not run ", collectiveName(collective));
  if (worldSize_ == 1) return Algorithm::Ring;  // nothing to exchange either way
  if (requested == Algorithm::Auto)
    return chooseAlgorithm(collective, bytes, worldSize_, transport_->publishBytes() > 0,
                           options_.thresholds);
  RC_CHECK(!isOneHop(requested) || transport_->publishBytes() > 0, algorithmName(requested),
           " ", collectiveName(collective),
           " needs a transport with publications (CPU shared memory); this device's has none: "
           "use ring or auto");
  return requested;
}

void Communicator::checkRequest(const CollectiveRequest& r) const {
  const CollectiveInfo& info = collectiveInfo(r.collective);
  RC_CHECK(info.planned, info.name, " is not a collective request: it runs over peer links");
  if (info.root != nullptr) {
    RC_CHECK(r.root >= 0 && r.root < worldSize_, info.root, "=", r.root,
             " is not a rank of this ", worldSize_, "-rank communicator");
  } else {
    RC_CHECK(r.root == 0, info.name, " has no root: leave root at 0, not ", r.root);
  }
  RC_CHECK(info.reduces || r.op == RedOp::Sum, info.name, " does not reduce: leave op at sum, not ",
           redOpName(r.op));
  RC_CHECK(info.wire || !r.wireType || *r.wireType == r.type, info.name,
           " takes no wire dtype (its messages are its data type, ", dataTypeName(r.type), ")");
  RC_CHECK(info.layout != Layout::InPlace || r.input == nullptr || r.input == r.output, info.name,
           " runs in place on its output: leave input unset or the same");
  // What this rank touches: the in-place tensor; its own block (the output of reduce_scatter and
  // scatter, the input of all_gather and gather); every rank's blocks, unless only the root
  // has them (gather's output, scatter's input).
  const bool whole = info.root == nullptr || r.root == rank_;
  const bool needsOutput = info.layout != Layout::InputBlock || whole;
  const bool needsInput =
      info.layout == Layout::InputBlock || (info.layout == Layout::OutputBlock && whole);
  RC_CHECK(r.count == 0 || !needsOutput || r.output != nullptr, info.name,
           " needs an output on rank ", rank_);
  RC_CHECK(r.count == 0 || !needsInput || r.input != nullptr, info.name, " needs an input on rank ",
           rank_);
}

namespace {

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

void Communicator::run(const CollectiveRequest& r) {
  checkUsable();
  checkRequest(r);
  if (runsInTwoLevels(r)) {
    if (r.collective == Collective::AllReduce) return allReduceInTwoLevels(r);
    if (r.collective == Collective::ReduceScatter) return reduceScatterInTwoLevels(r);
    return allGatherInTwoLevels(r);
  }
  const DataType wireType = r.wireType.value_or(r.type);
  const bool inPlace = collectiveInfo(r.collective).layout == Layout::InPlace;
  const size_t bytes = r.count * (inPlace ? 1 : worldSize_) * dataTypeSize(r.type);
  PlannedCollective c;
  c.plan = makePlan({r.collective, rank_, worldSize_, r.count, r.root,
                     chunkAlignment(r.type, wireType),
                     resolveAlgorithm(r.algorithm, r.collective, bytes)});
  const LocalCopy copy = mapBuffers(r, rank_, worldSize_, c);
  prepare(c, r.op, r.type, wireType, r.avgDivisor);
  CallName call = describe(r, c.sequence, algorithmName(c.plan.request.algorithm));
  // A ring plan's device work depends on the request alone: a device transport may record it
  // and replay it for the same request (the one-hop plans keep per-round host state).
  ReplayKey key{static_cast<int>(r.collective), static_cast<int>(r.type), static_cast<int>(r.op),
                r.root, static_cast<int>(c.plan.request.algorithm), static_cast<int>(wireType),
                r.output, r.input, r.count};
  if (c.plan.request.algorithm == Algorithm::Ring && worldSize_ > 1) {
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
  collective(r.stream, call, [&] {
    if (copy.bytes > 0 && copy.to != copy.from)
      reducer_->copy(copy.to, nullptr, copy.from, copy.bytes);
    c.progress = current_;  // the executor marks its steps in this call's record
    execute(c);
  });
}

CallName Communicator::describe(const CollectiveRequest& r, uint64_t sequence,
                               const char* algorithm) const {
  const CollectiveInfo& info = collectiveInfo(r.collective);
  CallName call{info.name, sequence, true};
  call.dtype = dataTypeName(r.type), call.count = r.count, call.algorithm = algorithm;
  if (info.reduces) call.op = redOpName(r.op);
  if (info.root != nullptr) call.peer = r.root;
  return call;
}

void Communicator::failed(const std::string& why) {
  failure_ = why;
  if (links_) links_->abort(failure_);
  if (transport_) transport_->abort(failure_);
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->abort(failure_);
}

std::string Communicator::failure() const {
  if (!failure_.empty() || !aborted_.load()) return failure_;
  std::lock_guard<std::mutex> lock(abortMutex_);
  return abortReason_;
}

void Communicator::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abortMutex_);
  if (!aborted_.exchange(true)) abortReason_ = why;
  // Transports' aborts are safe beside their data path: shared memory sets flags peers and
  // this rank's waits check, NCCL's takes its own mutex.
  if (links_) links_->abort(why);
  if (transport_) transport_->abort(why);
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->abort(why);
}

void Communicator::close() {
  std::lock_guard<std::mutex> lock(abortMutex_);
  closed_ = true;
  for (Level* level : {&local_, &cross_})
    if (level->comm) level->comm->close(), level->comm.reset();
  transport_.reset();  // unmaps shared memory, destroys NCCL communicators
  links_.reset();
  reducer_.reset();
}

TrafficStats Communicator::traffic() const {
  TrafficStats total(worldSize_);
  if (transport_) total += transport_->traffic();
  if (links_) total += links_->traffic();
  for (const Level* level : {&local_, &cross_}) {
    if (!level->comm) continue;
    // The level counts by its own ranks: name them by this communicator's.
    TrafficStats theirs = level->comm->traffic(), ours(worldSize_);
    for (size_t p = 0; p < level->ranks.size() && p < theirs.bytesSent.size(); ++p) {
      const int r = level->ranks[p];
      ours.bytesSent[r] = theirs.bytesSent[p], ours.bytesReceived[r] = theirs.bytesReceived[p];
      ours.messagesSent[r] = theirs.messagesSent[p];
      ours.messagesReceived[r] = theirs.messagesReceived[p];
    }
    theirs.bytesSent = ours.bytesSent, theirs.bytesReceived = ours.bytesReceived;
    theirs.messagesSent = ours.messagesSent, theirs.messagesReceived = ours.messagesReceived;
    total += theirs;
  }
  return total;
}

void Communicator::resetTraffic() {
  if (transport_) transport_->resetTraffic();
  if (links_) links_->resetTraffic();
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->resetTraffic();
}

}  // namespace ringcomm
