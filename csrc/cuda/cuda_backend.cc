// Device queries and the CUDA transport and reducer behind cuda_backend.h; the only place that
// wires the NCCL transport, the CUDA reducer and the core communicator together.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_reducer.h"
#include "cuda/reduce_kernels.h"
#include "nccl/gpu_api.h"
#include "nccl/nccl_transport.h"
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

CudaTransportAndReducer::CudaTransportAndReducer(const CudaTransportOptions& options) {
  RC_CHECK(options.device >= 0 && options.device < cudaDeviceCount(), "CUDA device ",
           options.device, " does not exist (this process sees ", cudaDeviceCount(), ")");
  transport_ = std::make_shared<NcclTransport>(options);
  reducer_ = std::make_shared<CudaReducer>(options.device, transport_->computeStream(),
                                           options.smsForNccl);
}

CudaTransportAndReducer::~CudaTransportAndReducer() = default;

std::shared_ptr<Transport> CudaTransportAndReducer::transport() const { return transport_; }
std::shared_ptr<Reducer> CudaTransportAndReducer::reducer() const { return reducer_; }

bool CudaTransportAndReducer::query() {
  RC_CHECK(transport_ != nullptr, "this CUDA transport and reducer were released");
  return transport_->query();
}

void CudaTransportAndReducer::synchronize(double timeoutSeconds) {
  RC_CHECK(transport_ != nullptr, "this CUDA transport and reducer were released");
  transport_->synchronize(timeoutSeconds);
}

void CudaTransportAndReducer::abort(const std::string& why) {
  if (transport_) transport_->abort(why);
}

void CudaTransportAndReducer::release() {
  reducer_.reset();
  transport_.reset();
}

}  // namespace ringcomm
