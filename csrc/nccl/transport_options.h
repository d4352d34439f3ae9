// What one rank's CUDA transport (NcclTransport) and reducer (CudaReducer) are built with. Plain
// C++: the bindings fill it without CUDA headers. Every option is set by the caller: the Python
// layer passes CommOptions' resolved values (ringcomm/options.py holds the defaults). It lives
// beside the transport, which takes it whole; the CUDA backend (csrc/cuda/cuda_backend.cc) hands
// the reducer its device and smsForNccl, so the NCCL folder needs nothing of the CUDA folder.
#pragma once

#include <cstddef>
#include <string>

namespace ringcomm {

struct GpuApi;

struct CudaTransportOptions {
  int rank = 0;
  int worldSize = 1;
  int device = 0;
  std::string uniqueId;     // ncclUniqueId's 128 bytes, shared by rank 0
  size_t slotBytes = 0;     // the largest staged message: the slice (cuda_slice_bytes)
  int slots = 0;            // staging slots per direction (cuda_slot_count); slots/2 per wave
  // Largest publication of the one-hop algorithms per rank and phase (0: none, they are not
  // offered); costs (2 x worldSize + 2) x publishBytes of device memory, allocated once.
  size_t publishBytes = 0;
  double timeoutSeconds = 0;  // init, each NCCL call, each collective (timeout)
  int smsForNccl = 0;         // SMs the reduction kernels leave to NCCL's (nccl_sms)
  // A ring collective requested again on the same buffers is recorded as a CUDA graph, which
  // later calls launch: one launch instead of every step's NCCL group and kernel (cuda_graphs).
  bool recordGraphs = false;
  std::string library;        // NCCL's library, as the nccl_library option names it
  std::string libraryHint;    // where to look for NCCL last
  const GpuApi* api = nullptr;  // the CUDA and NCCL functions (null: loadGpuApi finds NCCL)
};

}  // namespace ringcomm
