// GpuApi: every CUDA runtime and NCCL function NcclTransport calls, declared once (the lists
// below) and called through one table. In production the table holds the CUDA runtime's own
// functions and NCCL's, loaded at run time with dlopen, so one build works next to whichever
// NCCL PyTorch brought and a machine without NCCL still imports ringcomm. The CPU tests hand the
// transport a host implementation of the same table (csrc/testing/cuda/host_gpu.h), so they drive
// the transport that ships. nccl.h is used for its types only.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

// X(return type, name, parameters)
#define RC_CUDA_FUNCTIONS(X)                                                  \
  X(cudaError_t, cudaGetDevice, (int*))                                       \
  X(cudaError_t, cudaSetDevice, (int))                                        \
  X(cudaError_t, cudaStreamCreateWithFlags, (cudaStream_t*, unsigned int))    \
  X(cudaError_t, cudaStreamDestroy, (cudaStream_t))                           \
  X(cudaError_t, cudaStreamSynchronize, (cudaStream_t))                       \
  X(cudaError_t, cudaStreamIsCapturing, (cudaStream_t, cudaStreamCaptureStatus*)) \
  X(cudaError_t, cudaStreamWaitEvent, (cudaStream_t, cudaEvent_t, unsigned int)) \
  X(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t*, unsigned int))      \
  X(cudaError_t, cudaEventDestroy, (cudaEvent_t))                             \
  X(cudaError_t, cudaEventRecord, (cudaEvent_t, cudaStream_t))                \
  X(cudaError_t, cudaEventRecordWithFlags, (cudaEvent_t, cudaStream_t, unsigned int)) \
  X(cudaError_t, cudaEventQuery, (cudaEvent_t))                               \
  X(cudaError_t, cudaMalloc, (void**, size_t))                                \
  X(cudaError_t, cudaFree, (void*))                                           \
  X(cudaError_t, cudaGetLastError, ())                                        \
  X(const char*, cudaGetErrorName, (cudaError_t))                             \
  X(const char*, cudaGetErrorString, (cudaError_t))                           \
  X(cudaError_t, cudaThreadExchangeStreamCaptureMode, (cudaStreamCaptureMode*))      \
  X(cudaError_t, cudaStreamBeginCapture, (cudaStream_t, cudaStreamCaptureMode))     \
  X(cudaError_t, cudaStreamEndCapture, (cudaStream_t, cudaGraph_t*))                \
  X(cudaError_t, cudaGraphInstantiate, (cudaGraphExec_t*, cudaGraph_t, unsigned long long)) \
  X(cudaError_t, cudaGraphLaunch, (cudaGraphExec_t, cudaStream_t))                  \
  X(cudaError_t, cudaGraphExecDestroy, (cudaGraphExec_t))                           \
  X(cudaError_t, cudaGraphDestroy, (cudaGraph_t))                                   \
  X(cudaError_t, cudaStreamGetCaptureInfo, (cudaStream_t, cudaStreamCaptureStatus*,  \
    unsigned long long*, cudaGraph_t*, const cudaGraphNode_t**, const cudaGraphEdgeData**, \
    size_t*))                                                                       \
  X(cudaError_t, cudaUserObjectCreate, (cudaUserObject_t*, void*, cudaHostFn_t,      \
    unsigned int, unsigned int))                                                    \
  X(cudaError_t, cudaGraphRetainUserObject, (cudaGraph_t, cudaUserObject_t, unsigned int, \
    unsigned int))

// X(required, return type, name, parameters). ncclCommInitRankConfig (NCCL 2.14) is required:
// ringcomm's communicators are non-blocking (see nccl_transport.h).
#define RC_NCCL_FUNCTIONS(X)                                                                   \
  X(true, ncclResult_t, ncclGetVersion, (int*))                                                \
  X(true, ncclResult_t, ncclGetUniqueId, (ncclUniqueId*))                                      \
  X(true, ncclResult_t, ncclCommInitRankConfig,                                                \
    (ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*))                                      \
  X(true, ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*))                    \
  X(true, ncclResult_t, ncclCommFinalize, (ncclComm_t))                                        \
  X(true, ncclResult_t, ncclCommDestroy, (ncclComm_t))                                         \
  X(true, ncclResult_t, ncclCommAbort, (ncclComm_t))                                           \
  X(true, ncclResult_t, ncclGroupStart, ())                                                    \
  X(true, ncclResult_t, ncclGroupEnd, ())                                                      \
  X(true, ncclResult_t, ncclSend, (const void*, size_t, ncclDataType_t, int, ncclComm_t,       \
                                   cudaStream_t))                                              \
  X(true, ncclResult_t, ncclRecv, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)) \
  X(true, const char*, ncclGetErrorString, (ncclResult_t))                                     \
  X(false, const char*, ncclGetLastError, (ncclComm_t))

namespace ringcomm {

struct GpuApi {
#define RC_DECLARE_CUDA(ret, name, params) ret(*name) params = nullptr;
#define RC_DECLARE_NCCL(required, ret, name, params) ret(*name) params = nullptr;
  RC_CUDA_FUNCTIONS(RC_DECLARE_CUDA)
  RC_NCCL_FUNCTIONS(RC_DECLARE_NCCL)
#undef RC_DECLARE_CUDA
#undef RC_DECLARE_NCCL

  std::string ncclPath;  // where NCCL was found (for build_info and error messages)
  int ncclVersion = 0;   // ncclGetVersion's code, e.g. 23203

  // "unhandled cuda error (ncclResult_t 1): <NCCL's last error>".
  std::string describe(ncclResult_t result, ncclComm_t comm = nullptr) const;
  // "cudaErrorNotReady (device not ready)".
  std::string describe(cudaError_t status) const;
};

// NCCL and where to look for it: `library` (a file, or a folder holding libnccl.so.2; the
// nccl_library option), when set, is the only place; else a libnccl.so.2 already loaded in this
// process (the one torch uses), "libnccl.so.2" through the normal library search, then `hint`
// (Python passes the nvidia-nccl-cu13 wheel's lib folder).
struct NcclSearch {
  std::string library;
  std::string hint;
};

// The CUDA runtime and NCCL, loaded once per process (the first successful search wins). Raises
// ringcomm::Error listing every place tried when NCCL is not found. Thread-safe.
const GpuApi& loadGpuApi(const NcclSearch& search = {});

}  // namespace ringcomm
