// Executor: walks a plan through a Transport and a Reducer, in waves of slice columns (ring
// plans) or one publication round per column (one-hop plans).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringcomm/flight_recorder.h"
#include "ringcomm/reducer.h"
#include "ringcomm/schedule.h"
#include "ringcomm/transport.h"

namespace ringcomm {

// A buffer holding the logical elements [first, first + count) of a plan's buffer. Steps that
// read or write outside it are a plan/buffer mismatch and raise instead of touching memory.
struct BufferView {
  char* base = nullptr;
  size_t first = 0;
  size_t count = 0;
};

struct PlannedCollective {
  const Plan* plan = nullptr;  // the communicator's PlanCache's
  ReduceSpec spec;
  uint64_t sequence = 0;
  BufferView input;   // read by steps that send or reduce from the buffer
  BufferView output;  // written by steps that store
  FlightRecorder::Entry* progress = nullptr;  // where the executor marks the step it reached
};

class Executor {
 public:
  // Vectors a call fills and the next reuses (their owner keeps them: allocating them anew
  // cost a small call about a tenth of its time).
  struct Scratch {
    std::vector<Range> pieces;
    std::vector<size_t> bytes;
  };

  Executor(Transport& transport, Reducer& reducer, size_t sliceBytes, Scratch& scratch);
  void run(const PlannedCollective& collective);

 private:
  void runStep(const PlannedCollective& c, const Step& step, const Range& slice,
               const Envelope& envelope);
  // A step over several chunks (Step::span): one message of scratch_.pieces, packed.
  void runPackedStep(const PlannedCollective& c, const Step& step, const Envelope& envelope);
  // A step of a one-hop plan in publication round `column` (schedule.h); `firstReadOfPhase`:
  // no earlier step of the plan reads the phase this one reads.
  void runOneHopStep(const PlannedCollective& c, const Step& step, size_t column, size_t sliceElems,
                     const Envelope& header, bool firstReadOfPhase);
  // At the first read of `phase` in a round: every rank's publication size of that phase, for
  // the transport (Transport::expectPublished).
  void declarePublications(const PlannedCollective& c, int phase, size_t column, size_t sliceElems,
                           const Envelope& header);
  // The envelope of a publication of `chunk` (-1: every chunk) in round `column`, as its writer
  // and every reader compute it; scratch's `pieces` receives its packed layout.
  Envelope publication(const PlannedCollective& c, const Envelope& header, int chunk, size_t column,
                       size_t sliceElems) const;

  Transport& transport_;
  Reducer& reducer_;
  size_t sliceBytes_;
  Scratch& scratch_;
};

}  // namespace ringcomm
