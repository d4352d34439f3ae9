// Factories and entry points behind cuda_backend.h; the only place that wires the NCCL
// transport, the CUDA reducer and the core communicator together.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_reducer.h"
#include "cuda/nccl_loader.h"
#include "cuda/nccl_transport.h"
#include "cuda/reduce_kernels.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {

int cudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver (error 35) or no device: not an error here
    return 0;
  }
  return count;
}

bool cudaAvailable() { return cudaDeviceCount() > 0; }

int ncclHeaderVersion() { return NCCL_VERSION_CODE; }

std::string ncclLibraryPath(const std::string& hint) { return loadNccl(hint).path; }

int ncclRuntimeVersion(const std::string& hint) { return loadNccl(hint).version; }

std::string makeNcclUniqueId(const std::string& hint) {
  const NcclApi& api = loadNccl(hint);
  ::ncclUniqueId id;
  ncclResult_t rc = api.getUniqueId(&id);
  RC_CHECK(rc == ncclSuccess, "ncclGetUniqueId failed: ", api.describe(rc));
  return std::string(id.internal, sizeof(id.internal));
}

void reduceOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize, float scale,
                    uintptr_t stream, DataType wireType) {
  ReduceLaunch l;
  l.out0 = reinterpret_cast<void*>(out0);
  l.out1 = reinterpret_cast<void*>(out1);
  l.a = reinterpret_cast<const void*>(a);
  l.b = reinterpret_cast<const void*>(b);
  l.n = n;
  l.type = type;
  if (wireType != type) l.wireType = wireType;
  l.op = op;
  l.divisor = divisor;
  l.finalize = finalize;
  l.scale = scale;
  launchReduce(l, reinterpret_cast<void*>(stream));
}

void convertOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream) {
  ConvertLaunch l;
  l.out0 = reinterpret_cast<void*>(out0);
  l.out1 = reinterpret_cast<void*>(out1);
  l.src = reinterpret_cast<const void*>(src);
  l.srcIsWire = srcIsWire;
  l.n = n;
  l.wireType = wireType;
  launchConvert(l, reinterpret_cast<void*>(stream));
}

void copyOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, size_t bytes, uintptr_t stream) {
  int device = 0;
  RC_CUDA_CHECK(cudaGetDevice(&device));
  CudaReducer reducer(device);
  reducer.setStream(reinterpret_cast<cudaStream_t>(stream));
  reducer.copy(reinterpret_cast<void*>(out0), reinterpret_cast<void*>(out1),
               reinterpret_cast<const void*>(src), bytes);
}

CudaCommunicator::CudaCommunicator(const CudaCommunicatorOptions& options) : options_(options) {
  RC_CHECK(options.device >= 0 && options.device < cudaDeviceCount(), "CUDA device ",
           options.device, " does not exist (this process sees ", cudaDeviceCount(), ")");
  NcclTransportOptions t;
  t.rank = options.rank;
  t.worldSize = options.worldSize;
  t.device = options.device;
  t.uniqueId = options.uniqueId;
  t.slotBytes = options.sliceBytes;
  t.slots = options.slots;
  t.timeoutSeconds = options.timeoutSeconds;
  t.libraryHint = options.libraryHint;
  transport_ = std::make_shared<NcclTransport>(t);
  reducer_ = std::make_shared<CudaReducer>(options.device);
  reducer_->setStream(transport_->computeStream());
  CommunicatorOptions c;
  c.sliceBytes = options.sliceBytes;
  comm_ = std::make_unique<Communicator>(options.rank, options.worldSize, transport_, reducer_, c);
}

CudaCommunicator::~CudaCommunicator() = default;

int CudaCommunicator::rank() const { return options_.rank; }
int CudaCommunicator::worldSize() const { return options_.worldSize; }
int CudaCommunicator::device() const { return options_.device; }
uint64_t CudaCommunicator::sequence() const { return comm_ ? comm_->sequence() : 0; }

// Brackets one collective: the device made current, the streams ordered after the caller's,
// the caller's stream ordered after the collective.
template <typename Fn>
void CudaCommunicator::run(uintptr_t stream, Fn&& fn) {
  RC_CHECK(comm_ != nullptr, "this ringcomm CUDA communicator is closed");
  CudaDeviceGuard guard(options_.device);
  transport_->begin(reinterpret_cast<cudaStream_t>(stream));
  try {
    fn(*comm_);
    transport_->end();
  } catch (const Error& e) {
    transport_->abort(e.what());  // peers may be mid-step: this communicator is done
    throw;
  }
}

void CudaCommunicator::allReduce(void* data, size_t count, DataType type, RedOp op,
                                 uintptr_t stream, float scale, DataType wireType) {
  RC_CHECK(scale == 1.0f || isFloatingPoint(type), "a scaled all_reduce needs a floating type");
  run(stream, [&](Communicator& c) {
    reducer_->setFinalScale(scale);
    try {
      c.allReduce(data, count, type, op, wireType);
    } catch (...) {
      reducer_->setFinalScale(1.0f);
      throw;
    }
    reducer_->setFinalScale(1.0f);
    // One rank has no finalizing step; scale in place (max(x, x) == x, then * scale).
    if (options_.worldSize == 1 && scale != 1.0f && count > 0) {
      ReduceSpec spec{type, RedOp::Max, 1};
      reducer_->setFinalScale(scale);
      reducer_->reduce(data, nullptr, data, data, count, spec, /*finalize=*/true);
      reducer_->setFinalScale(1.0f);
    }
  });
}

void CudaCommunicator::reduceScatter(void* output, const void* input, size_t outputCount,
                                     DataType type, RedOp op, uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.reduceScatter(output, input, outputCount, type, op); });
}

void CudaCommunicator::allGather(void* output, const void* input, size_t inputCount,
                                 DataType type, uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.allGather(output, input, inputCount, type); });
}

void CudaCommunicator::broadcast(void* data, size_t count, DataType type, int src,
                                 uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.broadcast(data, count, type, src); });
}

void CudaCommunicator::reduce(void* data, size_t count, DataType type, RedOp op, int dst,
                              uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.reduce(data, count, type, op, dst); });
}

void CudaCommunicator::gather(void* output, const void* input, size_t inputCount, DataType type,
                              int dst, uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.gather(output, input, inputCount, type, dst); });
}

void CudaCommunicator::scatter(void* output, const void* input, size_t outputCount,
                               DataType type, int src, uintptr_t stream) {
  run(stream, [&](Communicator& c) { c.scatter(output, input, outputCount, type, src); });
}

bool CudaCommunicator::query() {
  RC_CHECK(transport_ != nullptr, "this ringcomm CUDA communicator is closed");
  return transport_->query();
}

void CudaCommunicator::synchronize(double timeoutSeconds) {
  RC_CHECK(transport_ != nullptr, "this ringcomm CUDA communicator is closed");
  transport_->synchronize(timeoutSeconds);
}

void CudaCommunicator::abort(const std::string& why) {
  if (transport_) transport_->abort(why);
}

void CudaCommunicator::close() {
  comm_.reset();
  reducer_.reset();
  transport_.reset();  // destroys the NCCL communicator (finalize, or abort past a deadline)
}

}  // namespace ringcomm
