// The CUDA part of ringcomm as seen by the rest of the project: plain C++, no CUDA or NCCL
// headers, so bindings and core code compile the same with or without a toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ringcomm/types.h"

namespace pybind11 {
class module_;
}

namespace ringcomm {

class Communicator;
class NcclTransport;
class CudaReducer;

// Whether a CUDA device is usable; any cudaGetDeviceCount error (no driver) means "no".
bool cudaAvailable();
int cudaDeviceCount();

// NCCL_VERSION_CODE of the nccl.h this was built against, e.g. 23203.
int ncclHeaderVersion();
// Loads NCCL (see nccl_loader.h for the search order) and returns its path and version code.
std::string ncclLibraryPath(const std::string& libraryHint);
int ncclRuntimeVersion(const std::string& libraryHint);
// A fresh ncclUniqueId as 128 raw bytes (rank 0 makes it; the Store shares it).
std::string makeNcclUniqueId(const std::string& libraryHint);

// Kernel entry points for tests and benchmarks: device pointers and a cudaStream_t as
// integers; enqueued on the current device, asynchronous.
// `wireType` is the type of out1 and b (float16/bfloat16 under float32 data; else `type`).
void reduceOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize, float scale,
                    uintptr_t stream, DataType wireType);
// out0 (float32) and out1 (wireType) from src, which is in wireType when srcIsWire.
void convertOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream);
void copyOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, size_t bytes, uintptr_t stream);

struct CudaCommunicatorOptions {
  int rank = 0;
  int worldSize = 1;
  int device = 0;
  std::string uniqueId;          // 128 bytes
  size_t sliceBytes = 4 << 20;   // pipeline slice (also the NCCL staging slot size)
  int slots = 4;                 // staging slots per direction
  double timeoutSeconds = 600.0;
  std::string libraryHint;
};

// A ring communicator on one GPU: the core Communicator over NcclTransport and CudaReducer.
// Every collective takes the caller's stream (a cudaStream_t as an integer): its work is ordered
// after what is queued there, and later work there sees the result; the host does not wait.
class CudaCommunicator {
 public:
  explicit CudaCommunicator(const CudaCommunicatorOptions& options);
  ~CudaCommunicator();

  int rank() const;
  int worldSize() const;
  int device() const;
  uint64_t sequence() const;

  // `scale` multiplies the reduced result (floating types; DDP's pre-divided sums).
  // `wireType` is what travels between ranks: `type`, or float16/bfloat16 under float32 data
  // (half the bytes; every hop still adds in float32 and every rank ends with the same bits).
  void allReduce(void* data, size_t count, DataType type, RedOp op, uintptr_t stream,
                 float scale, DataType wireType);
  void reduceScatter(void* output, const void* input, size_t outputCount, DataType type,
                     RedOp op, uintptr_t stream);
  void allGather(void* output, const void* input, size_t inputCount, DataType type,
                 uintptr_t stream);
  void broadcast(void* data, size_t count, DataType type, int src, uintptr_t stream);
  void reduce(void* data, size_t count, DataType type, RedOp op, int dst, uintptr_t stream);
  void gather(void* output, const void* input, size_t inputCount, DataType type, int dst,
              uintptr_t stream);
  void scatter(void* output, const void* input, size_t outputCount, DataType type, int src,
               uintptr_t stream);

  // Whether the last collective finished on the GPU (raises on NCCL errors).
  bool query();
  // Host wait for the last collective; aborts and raises TimeoutError past the deadline.
  void synchronize(double timeoutSeconds);
  void abort(const std::string& why);
  void close();

 private:
  template <typename Fn>
  void run(uintptr_t stream, Fn&& fn);

  CudaCommunicatorOptions options_;
  std::shared_ptr<NcclTransport> transport_;
  std::shared_ptr<CudaReducer> reducer_;
  std::unique_ptr<Communicator> comm_;
};

// Adds the CUDA functions and classes to the extension module (csrc/bindings_cuda.cc).
void bindCuda(pybind11::module_& m);

}  // namespace ringcomm
