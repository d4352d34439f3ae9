// The executor: for every wave of slice columns, every step of the plan, in order. Each step is
// one of the plan's named kinds (StepKind: send, recv, recvReduceSend, recvCopySend, ...), done
// in one pass over the transport's slots.
#include "ringcomm/executor.h"

#include <algorithm>
#include <array>

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

// Each piece of `input`, one after another into `out`, in the wire's type.
void packPieces(Reducer& reducer, const std::vector<Range>& pieces, const BufferView& input,
                const ReduceSpec& spec, char* out) {
  const size_t elemSize = dataTypeSize(spec.type), wireSize = dataTypeSize(spec.wireType);
  for (const Range& piece : pieces) {
    const char* local = locate(input, piece, elemSize, "read");
    if (spec.type == spec.wireType)
      reducer.copy(out, nullptr, local, piece.count * wireSize);
    else
      reducer.convert(nullptr, out, local, /*srcIsWire=*/false, piece.count, spec);
    out += piece.count * wireSize;
  }
}

}  // namespace

Executor::Executor(Transport& transport, Reducer& reducer, size_t sliceBytes, Scratch& scratch)
    : transport_(transport), reducer_(reducer), sliceBytes_(sliceBytes), scratch_(scratch) {}

void Executor::run(const PlannedCollective& c) {
  const size_t elemSize =
      std::max(dataTypeSize(c.spec.type), dataTypeSize(c.spec.wireType));
  // One-hop plans run one publication round per column, each publication at most
  // publishBytes(); ring plans one message per slice.
  const bool oneHop = usesPublications(*c.plan);
  // A step over several chunks packs a slice of each into one message.
  const size_t pieces = oneHop ? std::max<size_t>(1, chunksPerPublication(*c.plan))
                               : std::max<size_t>(1, c.plan->packedChunks);
  const size_t limit = oneHop ? transport_.publishBytes() : transport_.maxMessageBytes();
  RC_CHECK(!oneHop || limit > 0, algorithmName(c.plan->request.algorithm),
           " needs a transport with publications (shared memory); this one has none: use ring");
  const size_t sliceBytes = oneHop ? limit / pieces : std::min(sliceBytes_, limit) / pieces;
  size_t sliceElems = std::max<size_t>(1, sliceBytes / elemSize);
  // Slices start where chunks do: on 16-byte boundaries, whenever a slice holds that much.
  const size_t align = c.plan->request.alignElems;
  if (sliceElems > align) sliceElems -= sliceElems % align;
  RC_CHECK(sliceElems * elemSize * pieces <= limit, "a ", elemSize,
           "-byte element does not fit the transport's ", oneHop ? "publications" : "messages");
  const size_t wireSize = dataTypeSize(c.spec.wireType);

  Envelope envelope = collectiveHeader(c.plan->request.collective, c.plan->request.count,
                                       c.spec.type, c.spec.op, c.plan->request.root,
                                       c.spec.wireType, c.plan->request.algorithm);
  envelope.sequence = c.sequence;

  const size_t columns = columnCount(*c.plan, sliceElems);
  // Per publication phase, the plan's first step that reads it: each round declares the
  // phase's publication sizes there.
  std::array<const Step*, 2> firstRead{nullptr, nullptr};
  for (const Step& s : c.plan->steps) {
    if (s.kind != StepKind::Read) continue;
    RC_CHECK(s.readPhase == 0 || s.readPhase == 1, "publication phase ", s.readPhase,
             " is not 0 or 1");
    if (firstRead[s.readPhase] == nullptr) firstRead[s.readPhase] = &s;
  }
  auto runColumn = [&](size_t i, size_t column) {
    const Step& step = c.plan->steps[i];
    Range slice = sliceOf(step.range, column, sliceElems);
    if (step.span > 1) {  // every chunk's slice of the column, packed
      scratch_.pieces.clear();
      slice.count = 0;
      for (int k = step.chunk; k < step.chunk + step.span; ++k) {
        scratch_.pieces.push_back(sliceOf(c.plan->chunks.at(k), column, sliceElems));
        slice.count += scratch_.pieces.back().count;
      }
      slice.offset = scratch_.pieces.front().offset;
    }
    envelope.bytes = slice.count * wireSize;
    envelope.offset = slice.offset;
    FlightRecorder::step(c.progress, i);
    try {
      if (step.span > 1)
        runPackedStep(c, step, envelope);
      else if (oneHop)
        runOneHopStep(c, step, column, sliceElems, envelope,
                      step.kind == StepKind::Read && firstRead[step.readPhase] == &step);
      else
        runStep(c, step, slice, envelope);
    } catch (const Error& e) {
      // Name the collective and the step: the transport only knows the peer.
      std::string where = detail::concat(collectiveName(c.plan->request.collective), " #",
                                         c.sequence, " (step ", i, " of ", c.plan->steps.size(),
                                         oneHop ? ", round " : ", slice ", column, " of ",
                                         columns, "): ");
      rethrowWithPrefix(e, where);
    }
  };
  // Publication rounds run one column at a time: each reads every rank's phase 0 before the
  // next may overwrite it (Transport's double buffering).
  const size_t wave = oneHop ? 1 : std::max<size_t>(1, transport_.columnsPerWave());
  for (size_t first = 0; first < columns; first += wave) {
    const size_t end = std::min(columns, first + wave);
    for (size_t i = 0; i < c.plan->steps.size(); ++i) {
      if (c.plan->steps[i].kind == StepKind::Ack) {  // acks close the last column only
        if (end == columns) runColumn(i, columns - 1);
        continue;
      }
      for (size_t column = first; column < end; ++column) runColumn(i, column);
    }
  }
}

Envelope Executor::publication(const PlannedCollective& c, const Envelope& header, int chunk,
                               size_t column, size_t sliceElems) const {
  std::vector<Range>& pieces = scratch_.pieces;
  columnPieces(*c.plan, chunk, column, sliceElems, pieces);
  size_t count = 0;
  for (const Range& piece : pieces) count += piece.count;
  Envelope envelope = header;
  envelope.offset = pieces.front().offset;
  envelope.bytes = count * dataTypeSize(c.spec.wireType);
  return envelope;
}

void Executor::declarePublications(const PlannedCollective& c, int phase, size_t column,
                                   size_t sliceElems, const Envelope& header) {
  std::vector<size_t>& bytes = scratch_.bytes;
  bytes.assign(c.plan->request.worldSize, 0);
  for (const Step& s : c.plan->steps)
    if (s.readFrom >= 0 && s.readPhase == phase)
      bytes[s.readFrom] = publication(c, header, s.publishedChunk, column, sliceElems).bytes;
  transport_.expectPublished(phase, bytes);
}

void Executor::runOneHopStep(const PlannedCollective& c, const Step& step, size_t column,
                             size_t sliceElems, const Envelope& header, bool firstReadOfPhase) {
  const size_t elemSize = dataTypeSize(c.spec.type), wireSize = dataTypeSize(c.spec.wireType);
  const bool sameType = c.spec.type == c.spec.wireType;
  const std::vector<Range>& pieces = scratch_.pieces;  // what publication() laid out last
  if (step.kind != StepKind::Read) {  // publish local data: every piece, packed
    RC_CHECK(step.kind == StepKind::Publish && !step.reduce && !step.store,
             "a one-hop step that reads no publication can only publish");
    const Envelope mine = publication(c, header, step.chunk, column, sliceElems);
    char* out = static_cast<char*>(transport_.acquirePublish(step.publishPhase, mine.bytes));
    packPieces(reducer_, pieces, c.input, c.spec, out);
    transport_.commitPublish(step.publishPhase, mine);
    return;
  }

  const Range slice = sliceOf(step.range, column, sliceElems);
  if (firstReadOfPhase) declarePublications(c, step.readPhase, column, sliceElems, header);
  const Envelope expected =
      publication(c, header, step.publishedChunk, column, sliceElems);
  size_t before = 0;  // elements of the publication packed ahead of this step's chunk
  if (step.publishedChunk < 0 && step.chunk >= 0)
    for (int i = 0; i < step.chunk; ++i) before += pieces.at(i).count;
  const char* incoming =
      static_cast<const char*>(
          transport_.acquirePublished(step.readFrom, step.readPhase, expected)) +
      before * wireSize;

  void* outgoing = nullptr;
  Envelope mine;
  if (step.publishPhase >= 0) {
    mine = publication(c, header, step.chunk, column, sliceElems);
    RC_CHECK(mine.bytes == slice.count * wireSize, "a one-hop step publishes one chunk");
    outgoing = transport_.acquirePublish(step.publishPhase, mine.bytes);
  }
  char* stored = step.store ? locate(c.output, slice, elemSize, "write") : nullptr;
  if (step.reduce)  // accumulates into the output: what the earlier reads stored
    reducer_.reduce(stored, outgoing, locate(c.output, slice, elemSize, "read"), incoming,
                    slice.count, c.spec, step.finalize);
  else if (sameType)
    reducer_.copy(stored, outgoing, incoming, slice.count * wireSize);
  else
    reducer_.convert(stored, outgoing, incoming, /*srcIsWire=*/true, slice.count, c.spec);
  if (step.publishPhase >= 0) transport_.commitPublish(step.publishPhase, mine);
}

void Executor::runPackedStep(const PlannedCollective& c, const Step& step,
                             const Envelope& envelope) {
  const size_t elemSize = dataTypeSize(c.spec.type), wireSize = dataTypeSize(c.spec.wireType);
  const bool sameType = c.spec.type == c.spec.wireType;
  RC_CHECK(step.kind == StepKind::Send || step.kind == StepKind::Recv ||
               step.kind == StepKind::RecvReduceCopy,
           "a step over several chunks sends them or receives them, not both");
  if (step.kind == StepKind::Send) {
    char* out = static_cast<char*>(transport_.acquireSend(step.sendTo, envelope.bytes));
    packPieces(reducer_, scratch_.pieces, c.input, c.spec, out);
    transport_.commitSend(step.sendTo, envelope);
    return;
  }
  const char* in = static_cast<const char*>(transport_.acquireRecv(step.recvFrom, envelope));
  for (const Range& piece : scratch_.pieces) {
    char* stored = locate(c.output, piece, elemSize, "write");
    if (step.reduce)
      reducer_.reduce(stored, nullptr, locate(c.input, piece, elemSize, "read"), in, piece.count,
                      c.spec, step.finalize);
    else if (sameType)
      reducer_.copy(stored, nullptr, in, piece.count * wireSize);
    else
      reducer_.convert(stored, nullptr, in, /*srcIsWire=*/true, piece.count, c.spec);
    in += piece.count * wireSize;
  }
  transport_.releaseRecv(step.recvFrom);
}

void Executor::runStep(const PlannedCollective& c, const Step& step, const Range& slice,
                       const Envelope& envelope) {
  const size_t elemSize = dataTypeSize(c.spec.type);
  const bool sameType = c.spec.type == c.spec.wireType;
  char* stored = step.store ? locate(c.output, slice, elemSize, "write") : nullptr;
  const StepKind kind = step.kind;
  const bool copyOnly =
      kind == StepKind::Send || kind == StepKind::Recv || kind == StepKind::RecvCopySend;
  if (transport_.movesUserBuffers() && sameType && copyOnly) {
    // Copy-only steps move the caller's bytes themselves, with no staging copy: the first send
    // straight from the input, a hop that keeps what it forwards received in place and sent on
    // from there. Forwards that keep nothing (gather, scatter) still go through a slot.
    if (kind == StepKind::Send) {
      RC_CHECK(!step.store, "a step without a receive can only send");
      transport_.sendFrom(step.sendTo, locate(c.input, slice, elemSize, "read"), envelope);
      return;
    }
    if (stored != nullptr) {
      transport_.recvInto(step.recvFrom, stored, envelope);
      if (kind == StepKind::RecvCopySend) transport_.sendFrom(step.sendTo, stored, envelope);
      return;
    }
  }
  if (kind == StepKind::RecvCopySend && sameType && transport_.forwardsInPlace()) {
    // Passed on unchanged (allgather, broadcast): forward first so the next rank can start,
    // then keep a copy.
    const void* incoming = transport_.acquireRecv(step.recvFrom, envelope);
    transport_.forward(step.recvFrom, step.sendTo, envelope);
    if (stored != nullptr) reducer_.copy(stored, nullptr, incoming, envelope.bytes);
    transport_.releaseRecv(step.recvFrom);
    return;
  }
  void* outgoing = step.sendTo >= 0 ? transport_.acquireSend(step.sendTo, envelope.bytes) : nullptr;

  if (step.recvFrom < 0) {  // a send, or the ack that sends
    RC_CHECK(!step.reduce && !step.store, "a step without a receive can only send");
    const char* local = locate(c.input, slice, elemSize, "read");
    if (sameType)
      reducer_.copy(outgoing, nullptr, local, envelope.bytes);
    else
      reducer_.convert(nullptr, outgoing, local, /*srcIsWire=*/false, slice.count, c.spec);
  } else {
    const void* incoming = transport_.acquireRecv(step.recvFrom, envelope);
    if (step.reduce)
      reducer_.reduce(stored, outgoing, locate(c.input, slice, elemSize, "read"), incoming,
                      slice.count, c.spec, step.finalize);
    else if (sameType)
      reducer_.copy(stored, outgoing, incoming, envelope.bytes);
    else
      reducer_.convert(stored, outgoing, incoming, /*srcIsWire=*/true, slice.count, c.spec);
    transport_.releaseRecv(step.recvFrom);
  }
  if (step.sendTo >= 0) transport_.commitSend(step.sendTo, envelope);
}

}  // namespace ringcomm
