// The executor: for every slice column, every step of the plan, in order. Each step is one of
// send / recv / recvSend with an optional reduction, done in one pass over the transport's slots.
#include "ringcomm/executor.h"

#include <algorithm>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

char* locate(const BufferView& view, const Range& range, size_t elemSize, const char* what) {
  RC_CHECK(view.base != nullptr || range.count == 0, "plan step ", what,
           "s a buffer this rank does not have");
  RC_CHECK(range.offset >= view.first && range.offset + range.count <= view.first + view.count,
           "plan step ", what, "s elements [", range.offset, ", ", range.offset + range.count,
           ") outside the buffer's [", view.first, ", ", view.first + view.count, ")");
  return view.base + (range.offset - view.first) * elemSize;
}

}  // namespace

Executor::Executor(Transport& transport, Reducer& reducer, size_t sliceBytes)
    : transport_(transport), reducer_(reducer), sliceBytes_(sliceBytes) {}

void Executor::run(const Collective& c) {
  const size_t elemSize = dataTypeSize(c.spec.type);
  size_t sliceBytes = std::min(sliceBytes_, transport_.maxMessageBytes());
  const size_t sliceElems = std::max<size_t>(1, sliceBytes / elemSize);
  RC_CHECK(sliceElems * elemSize <= transport_.maxMessageBytes(), "a ", elemSize,
           "-byte element does not fit the transport's messages");

  Envelope envelope;
  envelope.sequence = c.sequence;
  envelope.primitive = static_cast<int32_t>(c.plan.request.primitive);
  envelope.dataType = static_cast<int32_t>(c.spec.type);
  envelope.op = static_cast<int32_t>(c.spec.op);
  envelope.root = c.plan.request.root;
  envelope.count = c.plan.request.count;

  const size_t columns = columnCount(c.plan, sliceElems);
  for (size_t column = 0; column < columns; ++column) {
    for (size_t i = 0; i < c.plan.steps.size(); ++i) {
      const Step& step = c.plan.steps[i];
      Range slice = sliceOf(step.range, column, sliceElems);
      envelope.bytes = slice.count * elemSize;
      try {
        runStep(c, step, slice, envelope);
      } catch (const Error& e) {
        // Name the collective and the step: the transport only knows the peer.
        std::string where = detail::concat(primitiveName(c.plan.request.primitive), " #",
                                           c.sequence, " (step ", i, " of ", c.plan.steps.size(),
                                           ", slice ", column, " of ", columns, "): ");
        rethrowWithPrefix(e, where);
      }
    }
  }
}

void Executor::runStep(const Collective& c, const Step& step, const Range& slice,
                       const Envelope& envelope) {
  const size_t elemSize = dataTypeSize(c.spec.type);
  const size_t bytes = slice.count * elemSize;
  char* stored = step.store ? locate(c.output, slice, elemSize, "write") : nullptr;
  void* outgoing = step.sendTo >= 0 ? transport_.acquireSend(step.sendTo, bytes) : nullptr;

  if (step.recvFrom < 0) {
    RC_CHECK(!step.reduce && !step.store, "a step without a receive can only send");
    reducer_.copy(outgoing, nullptr, locate(c.input, slice, elemSize, "read"), bytes);
  } else {
    const void* incoming = transport_.acquireRecv(step.recvFrom, envelope);
    if (step.reduce)
      reducer_.reduce(stored, outgoing, locate(c.input, slice, elemSize, "read"), incoming,
                      slice.count, c.spec, step.finalize);
    else
      reducer_.copy(stored, outgoing, incoming, bytes);
    transport_.releaseRecv(step.recvFrom);
  }
  if (step.sendTo >= 0) transport_.commitSend(step.sendTo, envelope);
}

}  // namespace ringcomm
