// The CUDA part of ringcomm as seen by the rest of the project: plain C++, no CUDA or NCCL
// headers, so bindings and core code compile the same with or without a toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_options.h"
#include "cuda/reduce_kernels.h"
#include "ringcomm/types.h"

namespace pybind11 {
class module_;
}

namespace ringcomm {

class NcclTransport;
inline namespace RC_KERNEL_BUILD {  // kernel_build.h (through reduce_kernels.h)
class CudaReducer;
}
class Reducer;
class Transport;

// Whether a CUDA device is usable; any cudaGetDeviceCount error (no driver, a driver older than
// the runtime) means "no", and cudaUnavailableReason names it ("" when a device is usable).
bool cudaAvailable();
int cudaDeviceCount();
std::string cudaUnavailableReason();

// Loads NCCL (`library`: the nccl_library option, else the search of gpu_api.h, `hint` last) and
// returns its path and version code.
std::string ncclLibraryPath(const std::string& library, const std::string& hint);
int ncclRuntimeVersion(const std::string& library, const std::string& hint);
// A fresh ncclUniqueId as 128 raw bytes (rank 0 makes it; the Store shares it).
std::string makeNcclUniqueId(const std::string& library, const std::string& hint);

// Kernel entry points for tests and benchmarks: device pointers and a cudaStream_t as
// integers; enqueued on the current device, asynchronous.
// `wireType` is the type of out1 and b (float16/bfloat16 under float32 data; else `type`).
void reduceOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize,
                    uintptr_t stream, DataType wireType, int smsForNccl);
// out0 (float32) and out1 (wireType) from src, which is in wireType when srcIsWire.
void convertOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream, int smsForNccl);
void copyOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, size_t bytes, uintptr_t stream);

// The CUDA half of a ringcomm communicator on one GPU: an NCCL transport (non-blocking NCCL
// communicator, watchdog) and a CUDA reducer on its compute stream. The core Communicator runs
// them (ringcomm/cuda_backend.py builds one); this handle adds the host-side waits.
class CudaRing {
 public:
  explicit CudaRing(const CudaTransportOptions& options);
  ~CudaRing();

  std::shared_ptr<Transport> transport() const;
  std::shared_ptr<Reducer> reducer() const;
  // Whether every collective enqueued outside graph capture has finished (raises on errors).
  bool query();
  // Host wait for them; aborts and raises TimeoutError past the deadline (<= 0: the timeout).
  void synchronize(double timeoutSeconds);
  void abort(const std::string& why);
  // Drops this handle's references (the communicator keeps the ring alive until it closes).
  void release();

 private:
  std::shared_ptr<NcclTransport> transport_;
  std::shared_ptr<CudaReducer> reducer_;
};

// Test entry point: one round of publications straight through the ring's transport, as a
// one-hop plan runs it: per phase, publish bytesPerRank[rank] bytes from sources[phase] (device
// memory) and copy every rank r's publication of that phase (bytesPerRank[r] bytes, declared
// when they differ) into outputs[phase][r], stream-ordered after `stream`. Every rank calls it
// together with the same sizes; a failure aborts the transport.
void publicationRound(CudaRing& ring, int rank, uintptr_t stream,
                      const std::vector<uintptr_t>& sources,
                      const std::vector<size_t>& bytesPerRank,
                      const std::vector<std::vector<uintptr_t>>& outputs);

// Adds the CUDA functions and classes to the extension module (csrc/bindings_cuda.cc).
void bindCuda(pybind11::module_& m);

}  // namespace ringcomm
