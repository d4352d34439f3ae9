// Reducer for host memory: plain loops the compiler vectorises; 16-bit floats go through float32.
#pragma once

#include "ringcomm/reducer.h"

namespace ringcomm {

class CpuReducer : public Reducer {
 public:
  void reduce(void* result, void* message, const void* a, const void* b, size_t n,
              const ReduceSpec& spec, bool finalize) override;
  void copy(void* result, void* message, const void* src, size_t bytes) override;
  void convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
               const ReduceSpec& spec) override;
};

}  // namespace ringcomm
