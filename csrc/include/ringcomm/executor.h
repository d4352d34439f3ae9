// Executor: walks a plan through a Transport and a Reducer, in waves of slice columns.
#pragma once

#include <cstddef>
#include <cstdint>

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

struct Collective {
  Plan plan;
  ReduceSpec spec;
  uint64_t sequence = 0;
  BufferView input;   // read by steps that send or reduce from the buffer
  BufferView output;  // written by steps that store
};

class Executor {
 public:
  Executor(Transport& transport, Reducer& reducer, size_t sliceBytes);
  void run(const Collective& collective);

 private:
  void runStep(const Collective& c, const Step& step, const Range& slice,
               const Envelope& envelope);

  Transport& transport_;
  Reducer& reducer_;
  size_t sliceBytes_;
};

}  // namespace ringcomm
