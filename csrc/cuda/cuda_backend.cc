// Factories and entry points behind cuda_backend.h; the only place that wires the NCCL
// transport, the CUDA reducer and the core communicator together.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/cuda_reducer.h"
#include "cuda/gpu_api.h"
#include "cuda/nccl_transport.h"
#include "cuda/reduce_kernels.h"
#include "ringcomm/error.h"

namespace ringcomm {

int cudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver, or one older than the runtime: cudaUnavailableReason
    return 0;
  }
  return count;
}

bool cudaAvailable() { return cudaDeviceCount() > 0; }

std::string cudaUnavailableReason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count > 0 ? "" : "the CUDA runtime sees no device";
  (void)cudaGetLastError();
  // A driver older than this build's CUDA runtime reads like "no GPU" unless the error is named.
  return detail::concat("cudaGetDeviceCount failed: ", cudaGetErrorName(status), " (",
                        cudaGetErrorString(status), "); ringcomm's CUDA runtime is ",
                        CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10);
}

std::string ncclLibraryPath(const std::string& library, const std::string& hint) {
  return loadGpuApi({library, hint}).ncclPath;
}

int ncclRuntimeVersion(const std::string& library, const std::string& hint) {
  return loadGpuApi({library, hint}).ncclVersion;
}

std::string makeNcclUniqueId(const std::string& library, const std::string& hint) {
  const GpuApi& api = loadGpuApi({library, hint});
  ::ncclUniqueId id;
  ncclResult_t rc = api.ncclGetUniqueId(&id);
  RC_CHECK(rc == ncclSuccess, "ncclGetUniqueId failed: ", api.describe(rc));
  return std::string(id.internal, sizeof(id.internal));
}

void reduceOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n,
                    DataType type, RedOp op, int divisor, bool finalize,
                    uintptr_t stream, DataType wireType, int smsForNccl) {
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
  l.smsForNccl = smsForNccl;
  launchReduce(l, reinterpret_cast<void*>(stream));
}

void convertOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, bool srcIsWire, size_t n,
                     DataType wireType, uintptr_t stream, int smsForNccl) {
  ConvertLaunch l;
  l.out0 = reinterpret_cast<void*>(out0);
  l.out1 = reinterpret_cast<void*>(out1);
  l.src = reinterpret_cast<const void*>(src);
  l.srcIsWire = srcIsWire;
  l.n = n;
  l.wireType = wireType;
  l.smsForNccl = smsForNccl;
  launchConvert(l, reinterpret_cast<void*>(stream));
}

void copyOnDevice(uintptr_t out0, uintptr_t out1, uintptr_t src, size_t bytes, uintptr_t stream) {
  int device = 0;
  RC_CUDA_CHECK(cudaGetDevice(&device));
  CudaReducer reducer(device, reinterpret_cast<cudaStream_t>(stream), 0);  // copies: no kernel
  reducer.copy(reinterpret_cast<void*>(out0), reinterpret_cast<void*>(out1),
               reinterpret_cast<const void*>(src), bytes);
}

CudaRing::CudaRing(const CudaTransportOptions& options) {
  RC_CHECK(options.device >= 0 && options.device < cudaDeviceCount(), "CUDA device ",
           options.device, " does not exist (this process sees ", cudaDeviceCount(), ")");
  transport_ = std::make_shared<NcclTransport>(options);
  reducer_ = std::make_shared<CudaReducer>(options.device, transport_->computeStream(),
                                           options.smsForNccl);
}

CudaRing::~CudaRing() = default;

std::shared_ptr<Transport> CudaRing::transport() const { return transport_; }
std::shared_ptr<Reducer> CudaRing::reducer() const { return reducer_; }

bool CudaRing::query() {
  RC_CHECK(transport_ != nullptr, "this CUDA ring was released");
  return transport_->query();
}

void CudaRing::synchronize(double timeoutSeconds) {
  RC_CHECK(transport_ != nullptr, "this CUDA ring was released");
  transport_->synchronize(timeoutSeconds);
}

void CudaRing::abort(const std::string& why) {
  if (transport_) transport_->abort(why);
}

void publicationRound(CudaRing& ring, int rank, uintptr_t stream,
                      const std::vector<uintptr_t>& sources,
                      const std::vector<size_t>& bytesPerRank,
                      const std::vector<std::vector<uintptr_t>>& outputs) {
  RC_CHECK(ring.transport() != nullptr, "this CUDA ring was released");
  RC_CHECK(sources.size() == outputs.size() && !sources.empty() && sources.size() <= 2,
           "one source and one row of outputs per phase (1 or 2 phases)");
  const size_t world = bytesPerRank.size();
  RC_CHECK(rank >= 0 && static_cast<size_t>(rank) < world, "rank ", rank, " outside ", world);
  for (const auto& row : outputs) RC_CHECK(row.size() == world, "one output per rank");
  Transport& transport = *ring.transport();
  Reducer& reducer = *ring.reducer();
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

void CudaRing::release() {
  reducer_.reset();
  transport_.reset();
}

}  // namespace ringcomm
