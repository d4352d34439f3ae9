// Reducer for host memory: plain loops the compiler vectorises; 16-bit floats go through float32.
#pragma once

#include "ringcomm/reducer.h"

namespace ringcomm {

class CpuReducer : public Reducer {
 public:
  void reduce(void* out0, void* out1, const void* a, const void* b, size_t n,
              const ReduceSpec& spec, bool finalize) override;
  void copy(void* out0, void* out1, const void* src, size_t bytes) override;
  void convert(void* out0, void* out1, const void* src, bool srcIsWire, size_t n,
               const ReduceSpec& spec) override;
};

}  // namespace ringcomm
