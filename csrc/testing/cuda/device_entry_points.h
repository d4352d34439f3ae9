// Test-only: the CUDA part's kernels and an NCCL transport's publications driven straight from
// Python (ringcomm._testing), for the GPU tests and benchmarks. Device pointers and a
// cudaStream_t are integers; work is enqueued on the current device, asynchronously.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/cuda_backend.h"
#include "ringcomm/types.h"

namespace ringcomm::testing {

// The reduction kernel.
// `wireType` is the type of message and b (float16/bfloat16 under float32 data; else `type`).
void reduceOnDevice(uintptr_t result, uintptr_t message, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize,
                    uintptr_t stream, DataType wireType, int smsForNccl);
// result (float32) and message (wireType) from src, which is in wireType when srcIsWire.
void convertOnDevice(uintptr_t result, uintptr_t message, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream, int smsForNccl);
void copyOnDevice(uintptr_t result, uintptr_t message, uintptr_t src, size_t bytes,
                  uintptr_t stream);

// One round of publications straight through the handle's transport, as a one-hop plan runs
// it: per phase, publish bytesPerRank[rank] bytes from sources[phase] (device
// memory) and copy every rank r's publication of that phase (bytesPerRank[r] bytes, declared
// when they differ) into outputs[phase][r], stream-ordered after `stream`. Every rank calls it
// together with the same sizes; a failure aborts the transport.
void publicationRound(CudaTransportAndReducer& handle, int rank, uintptr_t stream,
                      const std::vector<uintptr_t>& sources,
                      const std::vector<size_t>& bytesPerRank,
                      const std::vector<std::vector<uintptr_t>>& outputs);

}  // namespace ringcomm::testing
