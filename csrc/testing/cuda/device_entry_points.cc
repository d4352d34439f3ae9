// Test-only entry points of device_entry_points.h: what a collective's plan would make the CUDA
// reducer and the NCCL transport do, one call at a time.
#include "testing/cuda/device_entry_points.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/cuda_reducer.h"
#include "cuda/reduce_kernels.h"
#include "ringcomm/error.h"
#include "ringcomm/reducer.h"
#include "ringcomm/transport.h"

namespace ringcomm::testing {

void reduceOnDevice(uintptr_t result, uintptr_t message, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize,
                    uintptr_t stream, DataType wireType, int smsForNccl) {
  ReduceLaunch launch;
  launch.result = reinterpret_cast<void*>(result);
  launch.message = reinterpret_cast<void*>(message);
  launch.a = reinterpret_cast<const void*>(a);
  launch.b = reinterpret_cast<const void*>(b);
  launch.n = n;
  launch.type = type;
  if (wireType != type) launch.wireType = wireType;
  launch.op = op;
  launch.divisor = divisor;
  launch.finalize = finalize;
  launch.smsForNccl = smsForNccl;
  launchReduce(launch, reinterpret_cast<void*>(stream));
}

void convertOnDevice(uintptr_t result, uintptr_t message, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream, int smsForNccl) {
  ConvertLaunch launch;
  launch.result = reinterpret_cast<void*>(result);
  launch.message = reinterpret_cast<void*>(message);
  launch.src = reinterpret_cast<const void*>(src);
  launch.srcIsWire = srcIsWire;
  launch.n = n;
  launch.wireType = wireType;
  launch.smsForNccl = smsForNccl;
  launchConvert(launch, reinterpret_cast<void*>(stream));
}

void copyOnDevice(uintptr_t result, uintptr_t message, uintptr_t src, size_t bytes,
                  uintptr_t stream) {
  int device = 0;
  RC_CUDA_CHECK(cudaGetDevice(&device));
  CudaReducer reducer(device, reinterpret_cast<cudaStream_t>(stream), 0);  // copies: no kernel
  reducer.copy(reinterpret_cast<void*>(result), reinterpret_cast<void*>(message),
               reinterpret_cast<const void*>(src), bytes);
}

void publicationRound(CudaTransportAndReducer& handle, int rank, uintptr_t stream,
                      const std::vector<uintptr_t>& sources,
                      const std::vector<size_t>& bytesPerRank,
                      const std::vector<std::vector<uintptr_t>>& outputs) {
  RC_CHECK(handle.transport() != nullptr, "this CUDA transport and reducer were released");
  RC_CHECK(sources.size() == outputs.size() && !sources.empty() && sources.size() <= 2,
           "one source and one row of outputs per phase (1 or 2 phases)");
  const size_t world = bytesPerRank.size();
  RC_CHECK(rank >= 0 && static_cast<size_t>(rank) < world, "rank ", rank, " outside ", world);
  for (const auto& row : outputs) RC_CHECK(row.size() == world, "one output per rank");
  Transport& transport = *handle.transport();
  Reducer& reducer = *handle.reducer();
  const bool uneven =
      std::any_of(bytesPerRank.begin(), bytesPerRank.end(),
                  [&](size_t b) { return b != bytesPerRank[rank]; });
  auto envelope = [&](size_t owner) {
    Envelope e;
    e.bytes = bytesPerRank[owner];
    e.offset = owner;
    return e;
  };
  try {
    transport.begin(stream, CallName{"publication round"});
    for (size_t phase = 0; phase < sources.size(); ++phase) {
      const int p = static_cast<int>(phase);
      void* own = transport.acquirePublish(p, bytesPerRank[rank]);
      reducer.copy(own, nullptr, reinterpret_cast<const void*>(sources[phase]),
                   bytesPerRank[rank]);
      transport.commitPublish(p, envelope(rank));
      if (uneven) transport.expectPublished(p, bytesPerRank);
      for (size_t peer = 0; peer < world; ++peer) {
        const void* theirs = transport.acquirePublished(static_cast<int>(peer), p, envelope(peer));
        reducer.copy(reinterpret_cast<void*>(outputs[phase][peer]), nullptr, theirs,
                     bytesPerRank[peer]);
      }
    }
    transport.end();
  } catch (const Error& e) {
    transport.abort(e.what());
    throw;
  }
}

}  // namespace ringcomm::testing
