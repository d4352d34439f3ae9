// The ring schedule as pure data: what each rank sends, receives and combines, step by step.
//
// A plan works on a logical buffer of `chunkCount * worldSize`-ish elements cut into worldSize
// chunks (or, for broadcast and reduce, one range: the whole buffer). Every step is one of NCCL's
// ring step kinds (send, recv, recvReduceSend, ...), described by
// flags:
//   value = recvFrom >= 0 ? (reduce ? op(buf[range], received) : received) : buf[range]
//   if finalize: value = postOp(value)        (AVG's division, applied once per element)
//   if store:    buf[range] = value
//   if sendTo >= 0: send value to sendTo
// The executor runs the whole plan once per slice column, so a chunk larger than one slice is
// pipelined: step k of column c+1 can start while the next rank still works on column c.
//
// One-hop plans (one_shot, two_shot: kAlgorithms) exchange publications instead of ring
// messages (Transport's publications): a step may read a rank's publication of a phase instead
// of receiving (`readFrom`, any rank, itself included), and publish its value instead of sending
// (`publishPhase`). A reading step that reduces combines with what the output already holds
// (the steps accumulate where they store), not with the input. Each slice column is one
// publication round: a publication of a range carries, for each chunk the range covers, that
// chunk's slice of the column, packed in chunk order (columnPieces). Plans for rank r:
//   one_shot all_reduce: publish the input; read every rank's in rank order 0..N-1 (its own
//     too: every rank combines the same bytes in the same order), accumulating.
//   two_shot all_reduce: publish the input (phase 0); reduce chunk r from every rank's phase 0
//     in rank order, keep it and publish it (phase 1); copy every other rank's chunk (phase 1).
//   one_shot reduce_scatter: two_shot's first half. one_shot all_gather: publish block r, copy
//     every other rank's.
#pragma once

#include <cstddef>
#include <vector>

#include "ringcomm/algorithms.h"
#include "ringcomm/types.h"

namespace ringcomm {

struct Range {
  size_t offset = 0;  // in elements of the logical buffer
  size_t count = 0;
};

// What a step does, named as NCCL names its ring steps; decoded once from the flags below
// when the plan is made (stepKind), so the executor dispatches on a name, not on flag mixes.
enum class StepKind {
  Send,                // send a slice of the input on
  Recv,                // receive into the output (copied, or converted from the wire)
  RecvReduceCopy,      // receive, reduce with the input, keep: reduce-scatter's last step
  RecvReduceSend,      // receive, reduce with the input, send the result on (not kept)
  RecvReduceCopySend,  // both: allreduce's turn from reduce-scatter to allgather
  RecvCopySend,        // receive and pass on unchanged, keeping it or not (allgather, chains)
  Ack,                 // the empty message that closes a chain into a ring
  Publish,             // one-hop: publish local data
  Read,                // one-hop: read a publication (copy or reduce; keep and/or publish)
};
const char* stepKindName(StepKind kind);

struct Step {
  StepKind kind = StepKind::Send;  // set by makePlan from the fields below
  int recvFrom = -1;  // rank received from, or -1
  int sendTo = -1;    // rank sent to, or -1
  int readFrom = -1;  // rank whose publication of readPhase is read, or -1
  int readPhase = 0;
  int publishedChunk = -1;  // for a read: the chunk that publication covers, or -1: all of them
  int publishPhase = -1;  // phase the value is published in, or -1
  int chunk = -1;     // chunk index of `range`, or -1 for a chain over the whole buffer
  // Point-to-point steps over chunks [chunk, chunk + span) (log-step reduce_scatter and
  // all_gather): each slice column's message packs every one of those chunks' slices in chunk
  // order, so a step reads what earlier steps wrote in the same column.
  int span = 1;
  Range range;
  bool reduce = false;
  bool store = false;
  bool finalize = false;
  // An empty message that closes a chain into a ring (broadcast, reduce, gather, scatter), so
  // that every rank receives at least once per collective and so checks that its peers run the
  // same one. Sent in the last slice column only, to keep the chain pipelined.
  bool ack = false;
};

struct PlanRequest {
  Collective collective = Collective::AllReduce;
  int rank = 0;
  int worldSize = 1;
  // Elements per rank's contribution: the whole tensor for all_reduce, broadcast and reduce;
  // one rank's block (output for reduce_scatter and scatter, input for all_gather and gather).
  size_t count = 0;
  int root = 0;  // broadcast src, reduce/gather dst, scatter src
  // Balanced chunks (all_reduce) start at multiples of this many elements, so that a chunk's
  // first element in the caller's buffer and in a transport slot has the same 16-byte
  // alignment and kernels take their vector path; see chunkAlignment().
  size_t alignElems = 1;
  // Ring, OneShot or TwoShot (kAlgorithms says which collectives each plans); not Auto.
  Algorithm algorithm = Algorithm::Ring;
};

struct Plan {
  PlanRequest request;
  size_t bufferCount = 0;  // elements of the logical buffer the ranges index
  std::vector<Range> chunks;
  std::vector<Step> steps;
  // The most chunks a message packs (Step::span) on any rank's plan: every rank slices its
  // chunks by it, so sender and receiver agree on each message.
  size_t packedChunks = 1;
};

Plan makePlan(const PlanRequest& request);
// The kind a step's fields describe (makePlan sets every step's kind with it).
StepKind stepKind(const Step& step);

// Range of `range` that slice column `column` covers when slices hold `sliceElems` elements.
Range sliceOf(const Range& range, size_t column, size_t sliceElems);
// Number of slice columns every rank runs (at least one, so even empty collectives exchange a
// message that carries the mismatch-check header).
size_t columnCount(const Plan& plan, size_t sliceElems);
// Whether the plan's steps read or write publications (a one-hop algorithm's plan).
bool usesPublications(const Plan& plan);
// What a publication of chunk `chunk` (-1: every chunk) holds in column `column`: the chunk's
// slice, or every chunk's slice in chunk order, packed; into `pieces` (its memory reused).
void columnPieces(const Plan& plan, int chunk, size_t column, size_t sliceElems,
                  std::vector<Range>& pieces);
// The most chunks one publication of the plan covers (its slices must fit one publication).
size_t chunksPerPublication(const Plan& plan);

// Bytes every balanced chunk boundary (and every slice boundary inside it) is a multiple of.
constexpr size_t kChunkAlignBytes = 16;
// alignElems for a collective on `type` data travelling as `wireType`: 16 bytes of the
// narrower of the two, so boundaries are 16-byte aligned in both (e.g. 4 for float32, 8 for
// float32 on a bfloat16 wire, 16 for int8).
size_t chunkAlignment(DataType type, DataType wireType);

// Split of `count` elements into `parts` contiguous chunks whose starts are multiples of
// `align`: whole groups of `align` elements are spread evenly (the first ones get one group
// more) and the last chunk also takes the count % align elements left over.
Range balancedChunk(size_t count, int parts, int index, size_t align = 1);

}  // namespace ringcomm
