// NCCL loaded at run time with dlopen, so one build works next to whichever NCCL PyTorch
// brought, and a machine without NCCL still imports ringcomm. nccl.h is used for types only.
#pragma once

#include <nccl.h>

#include <string>

namespace ringcomm {

struct NcclApi {
  std::string path;  // where the library was found (for build_info and error messages)
  int version = 0;   // ncclGetVersion's code, e.g. 23203

  ncclResult_t (*getUniqueId)(::ncclUniqueId*) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ::ncclUniqueId, int) = nullptr;
  // Optional (NCCL >= 2.14): communicators created with a config (ringcomm asks for blocking).
  ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ::ncclUniqueId, int,
                                     ncclConfig_t*) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commFinalize)(ncclComm_t) = nullptr;  // optional
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) =
      nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  ncclResult_t (*getVersion)(int*) = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;  // optional

  // "unhandled cuda error (run with NCCL_DEBUG=INFO for details): <last error>".
  std::string describe(ncclResult_t result, ncclComm_t comm = nullptr) const;
};

// Loads NCCL once per process and returns its function table. Search order:
//   1. $RINGCOMM_NCCL_LIBRARY (a file, or a folder holding libnccl.so.2);
//   2. a libnccl.so.2 already loaded in this process (the one torch uses);
//   3. "libnccl.so.2" through the normal library search;
//   4. `hint` (a file or folder; Python passes the nvidia-nccl-cu13 wheel's lib folder).
// Raises ringcomm::Error listing every place tried when none works. Thread-safe.
const NcclApi& loadNccl(const std::string& hint = "");

}  // namespace ringcomm
