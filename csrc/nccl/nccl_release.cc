// NcclTransport::release() and what it frees, taken out of the transport: freed at once when
// no graph of the caller's holds it, else by the last such graph's destruction, on a thread of
// its own after the transport itself is gone (graph_holds.h), so it needs nothing of the
// transport.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "nccl/nccl_transport.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kFinalizeSeconds = 30.0;  // a vanished peer must not hold up close()
constexpr auto kFinalizeLimit = std::chrono::seconds(30);

}  // namespace

struct NcclTransport::Leftovers {
  const GpuApi* api = nullptr;
  int device = 0;
  ncclComm_t comm = nullptr;  // null when release() already destroyed or aborted it
  cudaStream_t streams[3] = {nullptr, nullptr, nullptr};  // compute, comm, record
  char* memory[2] = {nullptr, nullptr};                   // slots, publications' staging
  std::vector<cudaEvent_t> events;

  void free() {
    int previous = -1;
    const bool switched = api->cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                          api->cudaSetDevice(device) == cudaSuccess;
    finalizeNccl();
    bool waitFailed = false;
    for (cudaStream_t s : {streams[0], streams[1]})
      if (s && api->cudaStreamSynchronize(s) != cudaSuccess) waitFailed = true;
    // A failed wait leaves its error as this thread's last one, which the next communicator's
    // first launch check would report as its own.
    if (waitFailed) (void)api->cudaGetLastError();
    for (char* p : memory)
      if (p) api->cudaFree(p);
    for (cudaEvent_t e : events)
      if (e) api->cudaEventDestroy(e);
    for (cudaStream_t s : streams)
      if (s) api->cudaStreamDestroy(s);
    if (switched) api->cudaSetDevice(previous);
  }

  // Finalize flushes what the communicator still has queued, then destroy; abort past the limit.
  void finalizeNccl() {
    if (comm == nullptr) return;
    ncclResult_t state = api->ncclCommFinalize(comm);
    const auto deadline = std::chrono::steady_clock::now() + kFinalizeLimit;
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (api->ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess)
      api->ncclCommDestroy(comm);
    else
      api->ncclCommAbort(comm);
    comm = nullptr;
  }
};

// Frees everything the constructor made; never throws (it runs while exceptions unwind).
void NcclTransport::release() noexcept {
  if (api_ == nullptr || released_) return;  // nothing was made, or it is freed already
  released_ = true;
  int previous = -1;
  const bool switched = api_->cudaGetDevice(&previous) == cudaSuccess &&
                        previous != options_.device &&
                        api_->cudaSetDevice(options_.device) == cudaSuccess;
  if (!recordings_.empty() || recording_) {
    // Replays still running end first (bounded: a vanished peer must not hold up close()).
    const auto deadline = Clock::now() + std::chrono::duration<double>(
                                             std::min(options_.timeoutSeconds, kFinalizeSeconds));
    try {
      for (int rounds = 0; !aborted_ && !query() && Clock::now() < deadline; ++rounds)
        std::this_thread::sleep_for(std::chrono::microseconds(rounds < 64 ? 0 : 200));
    } catch (const Error&) {
      // query() raised: the communicator was aborted; its graphs go all the same.
    }
    dropRecordings();
  }
  if (holds_->held() && !aborted_) {
    // A graph of the caller's may still launch captured collectives: they use this NCCL
    // communicator, its streams, events and slots, which the last such graph frees when it is
    // destroyed (finalizing now would also wait for replays that may never come).
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    std::shared_ptr<Leftovers> leftovers = takeLeftovers();
    holds_->freeWhenUnheld([leftovers] { leftovers->free(); });
    if (switched) api_->cudaSetDevice(previous);
    return;
  }
  ncclResult_t finalizing = ncclInvalidUsage;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ != nullptr && !aborted_) finalizing = api_->ncclCommFinalize(comm_);
  }
  if (finalizing == ncclSuccess || finalizing == ncclInProgress) {
    // Finalize flushes outstanding work; a peer that vanished must not hold up close().
    try {
      awaitNccl([] { return std::string("finalizing the NCCL communicator"); },
                std::min(options_.timeoutSeconds, kFinalizeSeconds));
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ != nullptr) api_->ncclCommDestroy(comm_);
      comm_ = nullptr;
    } catch (const Error&) {
      // awaitNccl aborted the communicator.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abortLocked("the communicator was closed");  // a no-op once it was destroyed
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  takeLeftovers()->free();  // its NCCL communicator is gone: the CUDA resources
  if (switched) api_->cudaSetDevice(previous);
}

std::shared_ptr<NcclTransport::Leftovers> NcclTransport::takeLeftovers() {
  auto left = std::make_shared<Leftovers>();
  left->api = api_;
  left->device = options_.device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left->comm = aborted_ ? nullptr : comm_;
    comm_ = nullptr;
  }
  left->streams[0] = compute_, left->streams[1] = commStream_, left->streams[2] = recordStream_;
  compute_ = commStream_ = recordStream_ = nullptr;
  left->memory[0] = buffers_, left->memory[1] = staging_;
  buffers_ = staging_ = nullptr;
  for (auto* events : {&sendReady_, &sendFree_, &recvReady_, &recvFree_, &inflightEvents_}) {
    left->events.insert(left->events.end(), events->begin(), events->end());
    events->clear();
  }
  for (cudaEvent_t* e : {&callerReady_, &computeAll_, &commAll_, &done_, &timeline_})
    left->events.push_back(std::exchange(*e, nullptr));
  return left;
}

}  // namespace ringcomm
