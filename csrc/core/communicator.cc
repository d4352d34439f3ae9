// Buffer mapping per primitive: which caller buffer holds which part of the plan's logical
// buffer, and the local copy an out-of-place primitive needs before the ring starts.
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

void Communicator::checkUsable() const {
  RC_CHECK(!closed_, "this ringcomm communicator is closed");
  if (!failure_.empty())
    RC_THROW_AS(PeerError, "this ringcomm communicator failed earlier and cannot be used again (",
                failure_, "); create a new one");
}

void Communicator::checkRoot(int root, const char* name) const {
  RC_CHECK(root >= 0 && root < worldSize_, name, "=", root, " is not a rank of this ",
           worldSize_, "-rank communicator");
}

void Communicator::prepare(Collective& c, RedOp op, DataType type, DataType wireType) {
  std::string why;
  RC_CHECK(opSupported(op, type, &why), why);
  checkWireType(type, wireType);
  c.spec = ReduceSpec{type, op, worldSize_, wireType};
  c.sequence = sequence_++;
}

void Communicator::collective(uintptr_t stream, const std::function<void()>& body) {
  bracket(*transport_, stream, body);
}

void Communicator::bracket(Transport& transport, uintptr_t stream,
                           const std::function<void()>& body) {
  try {
    transport.begin(stream);
    body();
    transport.end();
  } catch (const Error& e) {
    failed(e.what());
    throw;
  }
}

void Communicator::execute(const Collective& c) {
  if (worldSize_ == 1) {
    // No step combines anything, yet logical ops still turn values into 0/1 (op(x, x) does).
    if (c.spec.op == RedOp::LAnd || c.spec.op == RedOp::LOr)
      reducer_->reduce(c.output.base, nullptr, c.output.base, c.output.base, c.output.count,
                       c.spec, true);
    return;
  }
  Executor(*transport_, *reducer_, options_.sliceBytes).run(c);
}

Algorithm Communicator::resolveAlgorithm(Algorithm requested, Primitive primitive,
                                         size_t bytes) const {
  RC_CHECK(algorithmPlans(requested, primitive), "algorithm ", algorithmName(requested),
           " does not run ", primitiveName(primitive));
  if (worldSize_ == 1) return Algorithm::Ring;  // nothing to exchange either way
  if (requested == Algorithm::Auto)
    return chooseAlgorithm(primitive, bytes, worldSize_, transport_->publishBytes() > 0,
                           options_.thresholds);
  RC_CHECK(!isOneHop(requested) || transport_->publishBytes() > 0, algorithmName(requested),
           " ", primitiveName(primitive),
           " needs a transport with publications (CPU shared memory); this device's has none: "
           "use ring or auto");
  return requested;
}

void Communicator::allReduce(void* data, size_t count, DataType type, RedOp op,
                             DataType wireType, uintptr_t stream, Algorithm algorithm) {
  checkUsable();
  algorithm = resolveAlgorithm(algorithm, Primitive::AllReduce, count * dataTypeSize(type));
  Collective c;
  c.plan = makePlan({Primitive::AllReduce, rank_, worldSize_, count, 0,
                     chunkAlignment(type, wireType), algorithm});
  c.input = c.output = view(data, 0, count);
  prepare(c, op, type, wireType);
  collective(stream, [&] { execute(c); });
}

void Communicator::reduceScatter(void* output, const void* input, size_t outputCount,
                                 DataType type, RedOp op, uintptr_t stream,
                                 Algorithm algorithm) {
  checkUsable();
  algorithm = resolveAlgorithm(algorithm, Primitive::ReduceScatter,
                               outputCount * worldSize_ * dataTypeSize(type));
  Collective c;
  c.plan = makePlan({Primitive::ReduceScatter, rank_, worldSize_, outputCount, 0, 1, algorithm});
  c.input = view(input, 0, outputCount * worldSize_);
  c.output = view(output, outputCount * rank_, outputCount);
  prepare(c, op, type, type);
  collective(stream, [&] {
    if (worldSize_ == 1) reducer_->copy(output, nullptr, input, outputCount * dataTypeSize(type));
    execute(c);
  });
}

void Communicator::allGather(void* output, const void* input, size_t inputCount, DataType type,
                             uintptr_t stream, Algorithm algorithm) {
  checkUsable();
  algorithm = resolveAlgorithm(algorithm, Primitive::AllGather,
                               inputCount * worldSize_ * dataTypeSize(type));
  Collective c;
  c.plan = makePlan({Primitive::AllGather, rank_, worldSize_, inputCount, 0, 1, algorithm});
  c.input = c.output = view(output, 0, inputCount * worldSize_);
  prepare(c, RedOp::Sum, type, type);
  collective(stream, [&] {
    const size_t bytes = inputCount * dataTypeSize(type);
    char* own = static_cast<char*>(output) + rank_ * bytes;
    if (own != input) reducer_->copy(own, nullptr, input, bytes);
    execute(c);
  });
}

void Communicator::broadcast(void* data, size_t count, DataType type, int src,
                             uintptr_t stream) {
  checkUsable();
  checkRoot(src, "src");
  Collective c;
  c.plan = makePlan({Primitive::Broadcast, rank_, worldSize_, count, src});
  c.input = c.output = view(data, 0, count);
  prepare(c, RedOp::Sum, type, type);
  collective(stream, [&] { execute(c); });
}

void Communicator::reduce(void* data, size_t count, DataType type, RedOp op, int dst,
                          uintptr_t stream) {
  checkUsable();
  checkRoot(dst, "dst");
  Collective c;
  c.plan = makePlan({Primitive::Reduce, rank_, worldSize_, count, dst});
  c.input = c.output = view(data, 0, count);
  prepare(c, op, type, type);
  collective(stream, [&] { execute(c); });
}

void Communicator::gather(void* output, const void* input, size_t inputCount, DataType type,
                          int dst, uintptr_t stream) {
  checkUsable();
  checkRoot(dst, "dst");
  Collective c;
  c.plan = makePlan({Primitive::Gather, rank_, worldSize_, inputCount, dst});
  const size_t bytes = inputCount * dataTypeSize(type);
  if (rank_ == dst) {
    RC_CHECK(output != nullptr || inputCount == 0, "gather needs an output on dst rank ", dst);
    c.input = c.output = view(output, 0, inputCount * worldSize_);
  } else {
    c.input = view(input, inputCount * rank_, inputCount);
  }
  prepare(c, RedOp::Sum, type, type);
  collective(stream, [&] {
    char* own = rank_ == dst ? static_cast<char*>(output) + rank_ * bytes : nullptr;
    if (own != nullptr && own != input) reducer_->copy(own, nullptr, input, bytes);
    execute(c);
  });
}

void Communicator::scatter(void* output, const void* input, size_t outputCount, DataType type,
                           int src, uintptr_t stream) {
  checkUsable();
  checkRoot(src, "src");
  Collective c;
  c.plan = makePlan({Primitive::Scatter, rank_, worldSize_, outputCount, src});
  c.output = view(output, outputCount * rank_, outputCount);
  const size_t bytes = outputCount * dataTypeSize(type);
  if (rank_ == src) {
    RC_CHECK(input != nullptr || outputCount == 0, "scatter needs an input on src rank ", src);
    c.input = view(input, 0, outputCount * worldSize_);
  }
  prepare(c, RedOp::Sum, type, type);
  collective(stream, [&] {
    const char* own = rank_ == src ? static_cast<const char*>(input) + rank_ * bytes : nullptr;
    if (own != nullptr && own != output) reducer_->copy(output, nullptr, own, bytes);
    execute(c);
  });
}

void Communicator::close() {
  closed_ = true;
  transport_.reset();  // unmaps shared memory, destroys NCCL communicators
  links_.reset();
  reducer_.reset();
}

}  // namespace ringcomm
