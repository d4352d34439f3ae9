// NcclTransport: the slot Transport over NCCL point-to-point, with ringcomm's own ncclComm_t.
//
// Slots are device staging buffers, K per direction, allocated once at construction. Work runs
// on two streams the transport owns: `compute` (the reducer's kernels and copies, which fill
// send slots and read receive slots) and `comm` (NCCL groups); events order them. A collective
// is bracketed by begin(callerStream) and end(): both streams start after the work already on
// the caller's stream, and the caller's stream waits for the collective, with no host blocking
// (NCCL's own stream semantics, and capturable in a CUDA graph).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <vector>

#include "cuda/nccl_loader.h"
#include "ringcomm/transport.h"

namespace ringcomm {

struct NcclTransportOptions {
  int rank = 0;
  int worldSize = 1;
  int device = 0;
  std::string uniqueId;              // ncclUniqueId's 128 bytes, shared by rank 0
  size_t slotBytes = 4 << 20;        // largest message; the executor slices to fit
  int slots = 4;                     // staging buffers per direction
  double timeoutSeconds = 600.0;     // init, enqueue and synchronize deadlines
  std::string libraryHint;           // folder or file for loadNccl
};

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const NcclTransportOptions& options);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;

  // Orders this collective's work after what is queued on `caller`.
  void begin(cudaStream_t caller);
  // Issues sends still waiting for a group (a rank whose last step only sends).
  void flush();
  // flush(), then makes the caller's stream wait for everything this collective enqueued.
  void end();
  // Whether the last collective has finished on the GPU; raises on an NCCL error.
  bool query();
  // Host wait for the last collective, with a deadline; aborts and raises TimeoutError on it.
  void synchronize(double timeoutSeconds);

  cudaStream_t computeStream() const { return compute_; }
  int device() const { return options_.device; }
  const NcclApi& api() const { return *api_; }

 private:
  struct PendingSend {
    int peer;
    int slot;
    size_t bytes;
  };

  void create();
  void release() noexcept;
  void checkUsable() const;
  void issueGroup(int recvPeer, void* recvBuffer, size_t recvBytes);
  void waitEnqueued(const std::string& what);
  void checkAsyncError(const std::string& what);
  [[noreturn]] void failNccl(ncclResult_t result, const std::string& what);
  std::string where() const;
  char* sendSlot(int i) const { return buffers_ + static_cast<size_t>(i) * slotStride_; }
  char* recvSlot(int i) const {
    return buffers_ + static_cast<size_t>(options_.slots + i) * slotStride_;
  }

  NcclTransportOptions options_;
  const NcclApi* api_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::string failure_;

  cudaStream_t compute_ = nullptr, comm_stream_ = nullptr;
  cudaStream_t caller_ = nullptr;
  bool capturing_ = false;
  cudaEvent_t callerReady_ = nullptr, computeReady_ = nullptr, groupDone_ = nullptr,
              commDone_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> sendFree_;  // recorded on comm after the group that sent the slot
  std::vector<uint64_t> sendSlotGroup_;  // that group's number (0: never sent)
  uint64_t groupCount_ = 0;              // NCCL groups issued so far
  uint64_t computeWaitedGroup_ = 0;      // compute has waited for every group up to this one

  char* buffers_ = nullptr;
  size_t slotStride_ = 0;
  uint64_t nextSend_ = 0, nextRecv_ = 0;
  int acquiredSend_ = -1;
  std::vector<PendingSend> pending_;
  int heldRecvs_ = 0;

  bool lastIssued_ = false;  // a collective was enqueued and may still run
  std::chrono::steady_clock::time_point lastIssueTime_;
};

}  // namespace ringcomm
