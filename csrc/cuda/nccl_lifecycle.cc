// NcclTransport's life cycle: creating and destroying the NCCL communicator, the watchdog thread
// that aborts it past a deadline (blocking NCCL calls cannot time out by themselves), and the
// host's view of completion (query, synchronize, abort). The data path is in nccl_transport.cc.
#include "cuda/nccl_transport.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(50);
constexpr double kFinalizeSeconds = 30.0;  // a vanished peer must not hold up close()

}  // namespace

NcclTransport::NcclTransport(const NcclTransportOptions& options)
    : options_(options),
      queue_(options.slots),
      publications_(options.rank, options.worldSize, options.publishBytes) {
  RC_CHECK(options_.worldSize >= 1 && options_.rank >= 0 && options_.rank < options_.worldSize,
           "rank ", options_.rank, " is outside the world of ", options_.worldSize, " ranks");
  RC_CHECK(options_.uniqueId.size() == sizeof(ncclUniqueId), "an NCCL unique id has ",
           sizeof(ncclUniqueId), " bytes, got ", options_.uniqueId.size());
  RC_CHECK(options_.slots >= 2, "NcclTransport needs at least 2 slots per direction");
  RC_CHECK(options_.slotBytes >= 16, "NcclTransport slots must hold at least 16 bytes");
  RC_CHECK(options_.timeoutSeconds > 0, "the timeout must be positive");
  api_ = &loadNccl(options_.libraryHint);
  watchdog_ = std::thread([this] { watch(); });
  try {
    create();
  } catch (...) {
    release();
    throw;
  }
}

NcclTransport::~NcclTransport() { release(); }

void NcclTransport::create() {
  CudaDeviceGuard guard(options_.device);
  RC_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  RC_CUDA_CHECK(cudaStreamCreateWithFlags(&commStream_, cudaStreamNonBlocking));
  auto make = [](std::vector<cudaEvent_t>& events, size_t n) {
    events.assign(n, nullptr);
    for (cudaEvent_t& e : events) RC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  };
  for (cudaEvent_t* e : {&callerReady_, &computeAll_, &commAll_, &done_})
    RC_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  const size_t slots = static_cast<size_t>(options_.slots);
  make(sendReady_, 2 * slots);  // more than ever wait in the queue (group_queue.h)
  make(sendFree_, slots);
  make(recvReady_, slots);
  make(recvFree_, slots);
  make(inflightEvents_, kInflightEvents);
  sendFreePending_.assign(slots, false);
  recvFreePending_.assign(slots, false);
  slotStride_ = (options_.slotBytes + 255) / 256 * 256;  // 256-byte aligned: vector kernels
  RC_CUDA_CHECK(cudaMalloc(&buffers_, slotStride_ * 2 * slots));
  if (publications_.stagingBytes() > 0)
    RC_CUDA_CHECK(cudaMalloc(&staging_, publications_.stagingBytes()));

  ncclUniqueId id;
  std::copy(options_.uniqueId.begin(), options_.uniqueId.end(), id.internal);
  ncclComm_t comm = nullptr;
  // Blocking: every later call returns once enqueued, with no helper thread per group (a
  // non-blocking communicator starts one in every ncclGroupEnd). A peer that never joins is
  // the watchdog's: it aborts the communicator, which NCCL publishes before connecting.
  arm("creating the NCCL communicator (waiting for every rank to join)", options_.timeoutSeconds,
      &comm);
  ncclResult_t result;
  // The config struct of this build's nccl.h only goes to a library at least as new; older
  // ones get ncclCommInitRank, blocking unless NCCL_COMM_BLOCKING=0 (refused in issue()).
  if (api_->commInitRankConfig != nullptr && api_->version >= NCCL_VERSION_CODE) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    result = api_->commInitRankConfig(&comm, options_.worldSize, id, options_.rank, &config);
  } else {
    result = api_->commInitRank(&comm, options_.worldSize, id, options_.rank);
  }
  disarm();
  std::lock_guard<std::mutex> lock(mutex_);
  if (result != ncclSuccess || aborted_) {
    if (!aborted_ && comm != nullptr) api_->commAbort(comm);
    const std::string message =
        aborted_ ? failure_
                 : detail::concat("NCCL communicator creation failed", where(), ": ",
                                  api_->describe(result),
                                  result == ncclInProgress
                                      ? " (non-blocking: unset NCCL_COMM_BLOCKING=0)"
                                      : "");
    aborted_ = true;
    if (timedOut_) RC_THROW_AS(TimeoutError, message);
    RC_THROW_AS(PeerError, message);
  }
  comm_ = comm;
}

// Frees everything the constructor made; never throws (it runs while exceptions unwind).
void NcclTransport::release() noexcept {
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != options_.device &&
                        cudaSetDevice(options_.device) == cudaSuccess;
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comm = aborted_ ? nullptr : comm_;
  }
  if (comm != nullptr) {
    // Finalize waits for outstanding work; the watchdog aborts it if a peer vanished.
    ncclResult_t rc = ncclSuccess;
    if (api_->commFinalize != nullptr) {
      arm("finalizing the NCCL communicator", std::min(options_.timeoutSeconds, kFinalizeSeconds));
      rc = api_->commFinalize(comm);
      disarm();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      if (rc == ncclSuccess)
        api_->commDestroy(comm);
      else
        api_->commAbort(comm);
      aborted_ = true;
      failure_ = "the communicator was closed";
      comm_ = nullptr;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (compute_) cudaStreamSynchronize(compute_);
  if (commStream_) cudaStreamSynchronize(commStream_);
  if (buffers_) cudaFree(buffers_);
  if (staging_) cudaFree(staging_);
  buffers_ = staging_ = nullptr;
  for (auto* events : {&sendReady_, &sendFree_, &recvReady_, &recvFree_, &inflightEvents_}) {
    for (cudaEvent_t e : *events)
      if (e) cudaEventDestroy(e);
    events->clear();
  }
  for (cudaEvent_t* e : {&callerReady_, &computeAll_, &commAll_, &done_})
    if (*e) cudaEventDestroy(*e), *e = nullptr;
  if (compute_) cudaStreamDestroy(compute_);
  if (commStream_) cudaStreamDestroy(commStream_);
  compute_ = commStream_ = nullptr;
  if (switched) cudaSetDevice(previous);
}

std::string NcclTransport::where() const {
  const int n = options_.worldSize;
  return detail::concat(" on rank ", options_.rank, " of ", n, " (device ", options_.device,
                        "; receives from rank ", (options_.rank + n - 1) % n, ", sends to rank ",
                        (options_.rank + 1) % n, ")");
}

// -- the watchdog ---------------------------------------------------------------------------------

void NcclTransport::arm(const std::string& what, double limitSeconds, ncclComm_t* initComm) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  armedWhat_ = what;
  armedDeadline_ = Clock::now() + seconds(limitSeconds);
  armedInitComm_ = initComm;
}

void NcclTransport::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  armedInitComm_ = nullptr;
}

void NcclTransport::abortLocked(const std::string& why) {
  if (aborted_) return;
  aborted_ = true;
  failure_ = why;
  // ncclCommAbort also makes a call blocked on this communicator in another thread return, and
  // stops this rank's kernels still waiting on a peer (torch's watchdog relies on the same;
  // NCCL handles an abort from another thread reliably from 2.19 on).
  if (comm_ != nullptr) {
    api_->commAbort(comm_);
    comm_ = nullptr;
  } else if (armedInitComm_ != nullptr && *armedInitComm_ != nullptr) {
    api_->commAbort(*armedInitComm_);  // a blocking init that waits for a missing peer
  }
}

// Pops the collectives that finished; true when none is left running.
bool NcclTransport::pollInflightLocked() {
  while (!inflight_.empty()) {
    cudaError_t status = cudaEventQuery(inflightEvents_[inflight_.front().event]);
    if (status == cudaErrorNotReady) return false;
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      abortLocked(detail::concat("a collective failed on the GPU", where(), ": ",
                                 cudaGetErrorString(status)));
      return true;
    }
    inflight_.pop_front();
    // The next one could only start now: it gets the whole timeout from here.
    if (!inflight_.empty()) inflight_.front().since = Clock::now();
  }
  return true;
}

void NcclTransport::watch() {
  cudaSetDevice(options_.device);  // event queries on this thread
  // Querying events while another thread captures a CUDA graph in global mode would break the
  // capture unless this thread is relaxed.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kWatchdogPeriod);
    if (stopping_ || aborted_) continue;
    const auto now = Clock::now();
    if (armed_ && now > armedDeadline_) {
      timedOut_ = true;
      abortLocked(detail::concat("timed out after ", options_.timeoutSeconds, " s while ",
                                 armedWhat_, where(),
                                 ": is every rank alive and calling the same collectives?"));
      continue;
    }
    // The main thread may be between NCCL calls of a collective it enqueues: abort only while
    // it is blocked inside one (armed) or not using the communicator at all.
    const bool mayAbort = armed_ || !busy_;
    if (pollInflightLocked() || !mayAbort || aborted_) continue;
    if (now > inflight_.front().since + seconds(options_.timeoutSeconds)) {
      timedOut_ = true;
      abortLocked(detail::concat("a collective did not finish within ", options_.timeoutSeconds,
                                 " s", where(), ": is every rank calling the same collectives?"));
      continue;
    }
    ncclResult_t state = ncclSuccess;
    if (comm_ != nullptr && !busy_ && api_->commGetAsyncError(comm_, &state) == ncclSuccess &&
        state != ncclSuccess && state != ncclInProgress)
      abortLocked(detail::concat("NCCL failed", where(), ": ", api_->describe(state)));
  }
}

void NcclTransport::checkUsable() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!aborted_) return;
  if (timedOut_) RC_THROW_AS(TimeoutError, failure_);
  RC_THROW_AS(PeerError, "this NCCL transport was aborted (", failure_,
              "); create a new communicator");
}

void NcclTransport::failNccl(ncclResult_t result, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  // After a watchdog abort the call fails too: its reason is the one to report.
  abortLocked(detail::concat("NCCL failed while ", what, where(), ": ", api_->describe(result)));
  // busy_ stays set: the communicator's abort() that follows restores the caller's device.
  if (timedOut_) RC_THROW_AS(TimeoutError, failure_);
  RC_THROW_AS(PeerError, failure_);
}

bool NcclTransport::query() {
  checkUsable();
  bool finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished = pollInflightLocked();
  }
  checkUsable();  // a failure the poll found
  return finished;
}

void NcclTransport::synchronize(double timeoutSeconds) {
  const double limit = timeoutSeconds > 0 ? timeoutSeconds : options_.timeoutSeconds;
  const auto deadline = Clock::now() + seconds(limit);
  for (int rounds = 0; !query(); ++rounds) {
    if (Clock::now() >= deadline) {
      const std::string message =
          detail::concat("a collective did not finish within ", limit, " s", where(),
                         ": is every rank calling the same collectives?");
      {
        std::lock_guard<std::mutex> lock(mutex_);
        timedOut_ = true;
        abortLocked(message);
      }
      RC_THROW_AS(TimeoutError, message);
    }
    // A host wait, not the data path: yield first, then sleep briefly (ranks may share cores).
    if (rounds < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclTransport::abort(const std::string& why) {
  bool wasBusy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abortLocked(why);
    wasBusy = busy_;
    busy_ = false;
  }
  // A collective that failed midway leaves the caller on its own device, as end() would.
  if (wasBusy && callerDevice_ >= 0 && callerDevice_ != options_.device)
    cudaSetDevice(callerDevice_);
}

}  // namespace ringcomm
