// The CUDA part of ringcomm as seen by the rest of the project: plain C++, no CUDA or NCCL
// headers, so bindings and core code compile the same with or without a toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/reduce_kernels.h"
#include "nccl/transport_options.h"
#include "ringcomm/types.h"

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


// The CUDA half of a ringcomm communicator on one GPU: an NCCL transport (non-blocking NCCL
// communicator, watchdog) and a CUDA reducer on its compute stream. The core Communicator runs
// them (ringcomm/transport/cuda.py builds one); this handle adds the host-side waits.
class CudaTransportAndReducer {
 public:
  explicit CudaTransportAndReducer(const CudaTransportOptions& options);
  ~CudaTransportAndReducer();

  std::shared_ptr<Transport> transport() const;
  std::shared_ptr<Reducer> reducer() const;
  // Whether every collective enqueued outside graph capture has finished (raises on errors).
  bool query();
  // Host wait for them; aborts and raises TimeoutError past the deadline (<= 0: the timeout).
  void synchronize(double timeoutSeconds);
  void abort(const std::string& why);
  // Drops this handle's references (the communicator keeps the transport and reducer alive
  // until it closes).
  void release();

 private:
  std::shared_ptr<NcclTransport> transport_;
  std::shared_ptr<CudaReducer> reducer_;
};

}  // namespace ringcomm
