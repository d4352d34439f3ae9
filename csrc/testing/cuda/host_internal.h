// Test-only: what the host implementation's parts (host_cuda.cc: streams, events, memory;
// host_graphs.cc: capture and graphs; host_nccl.cc: communicators and groups; host_gpu.cc: the
// table and the bookkeeping) share. See host_gpu.h.
#pragma once

#include <functional>
#include <string>

#include "nccl/gpu_api.h"

namespace ringcomm::hostgpu {

// Counts a call of `name` (callCounts) and records misuse (violations).
void count(const char* name);
void violation(const std::string& what);

// Work in `stream`'s order, or into the graph it captures; whether it is capturing.
void submit(cudaStream_t stream, std::function<void()> work);
bool capturing(cudaStream_t stream);

// Fill the CUDA and the NCCL functions of the table.
void fillCuda(GpuApi& api);
void fillNccl(GpuApi& api);

}  // namespace ringcomm::hostgpu
