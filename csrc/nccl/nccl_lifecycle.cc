// NcclTransport's life cycle: creating the non-blocking NCCL communicator (freeing it is
// nccl_release.cc's), the owner's waits on it, the watchdog thread for collectives still running
// on the GPU past the timeout, and the host's view of completion (query, synchronize, abort).
// The data path is in nccl_transport.cc, nccl_groups.cc and nccl_bracket.cc.
#include "nccl/nccl_transport.h"

#include <algorithm>

#include "ringcomm/error.h"
#include "ringcomm/interrupt.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(50);

// "all_reduce #3", "send".
std::string describe(const CallName& call) {
  return call.numbered ? detail::concat(call.name, " #", call.sequence) : call.name;
}

// Waits between polls of a call in progress: a group is usually enqueued within microseconds,
// while creation or a first connection may take seconds.
void backOff(int rounds) {
  if (rounds < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(rounds < 1000 ? 20 : 1000));
}

}  // namespace

#define RC_GPU(call) check(api_->call, #call)

NcclTransport::NcclTransport(const CudaTransportOptions& options)
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
  api_ = options_.api != nullptr ? options_.api : &loadGpuApi({options_.library, options_.libraryHint});
  try {
    create();
  } catch (...) {
    release();
    throw;
  }
  watchdog_ = std::thread([this] { watch(); });
}

NcclTransport::~NcclTransport() { release(); }

void NcclTransport::create() {
  int previous = -1;
  RC_GPU(cudaGetDevice(&previous));
  if (previous != options_.device) RC_GPU(cudaSetDevice(options_.device));
  struct Restore {
    const GpuApi* api;
    int device, previous;
    ~Restore() {
      if (device != previous) api->cudaSetDevice(previous);
    }
  } restore{api_, options_.device, previous};

  RC_GPU(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  RC_GPU(cudaStreamCreateWithFlags(&commStream_, cudaStreamNonBlocking));
  RC_GPU(cudaStreamCreateWithFlags(&recordStream_, cudaStreamNonBlocking));
  auto make = [&](std::vector<cudaEvent_t>& events, size_t n) {
    events.assign(n, nullptr);
    for (cudaEvent_t& e : events) RC_GPU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  };
  for (cudaEvent_t* e : {&callerReady_, &computeAll_, &commAll_, &done_, &timeline_})
    RC_GPU(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  const size_t slots = static_cast<size_t>(options_.slots);
  make(sendReady_, 2 * slots);  // more than ever wait in the queue (group_queue.h)
  make(sendFree_, slots);
  make(recvReady_, slots);
  make(recvFree_, slots);
  make(inflightEvents_, kInflightEvents);
  sendFreePending_.assign(slots, false);
  sendConnected_.assign(options_.worldSize, false);
  recvConnected_.assign(options_.worldSize, false);
  recvFreePending_.assign(slots, false);
  slotStride_ = (options_.slotBytes + 255) / 256 * 256;  // 256-byte aligned: vector kernels
  void* memory = nullptr;
  RC_GPU(cudaMalloc(&memory, slotStride_ * 2 * slots));
  buffers_ = static_cast<char*>(memory);
  if (publications_.stagingBytes() > 0) {
    RC_GPU(cudaMalloc(&memory, publications_.stagingBytes()));
    staging_ = static_cast<char*>(memory);
  }

  ncclUniqueId id;
  std::copy(options_.uniqueId.begin(), options_.uniqueId.end(), id.internal);
  // Non-blocking (see nccl_transport.h). This build's config struct also goes to an older
  // library: NCCL reads the fields it knows (the struct starts with its size).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const ncclResult_t rc = api_->ncclCommInitRankConfig(&comm_, options_.worldSize, id,
                                                         options_.rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      if (comm_ != nullptr) api_->ncclCommAbort(comm_);
      comm_ = nullptr;
      aborted_ = true;
      failure_ = detail::concat("NCCL communicator creation failed", where(), ": ",
                                api_->describe(rc));
      RC_THROW_AS(PeerError, failure_);
    }
  }
  awaitNccl([] { return std::string("creating the NCCL communicator (waiting for every rank)"); },
            options_.timeoutSeconds);
}

std::string NcclTransport::where() const {
  const int n = options_.worldSize;
  return detail::concat(" on rank ", options_.rank, " of ", n, " (device ", options_.device,
                        "; receives from rank ", (options_.rank + n - 1) % n, ", sends to rank ",
                        (options_.rank + 1) % n, ")");
}

// -- waiting on NCCL, aborting ----------------------------------------------------------------

void NcclTransport::awaitNccl(const std::function<std::string()>& what, double limitSeconds) {
  const auto deadline = Clock::now() + seconds(limitSeconds);
  for (int rounds = 0;; ++rounds) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) throwAborted();
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = api_->ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) failNcclLocked(rc, what());
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) failNcclLocked(state, what());
      if (Clock::now() > deadline) {
        timedOut_ = true;
        abortLocked(detail::concat("timed out after ", limitSeconds, " s while ", what(), where(),
                                   ": is every rank alive and calling the same collectives?"));
        RC_THROW_AS(TimeoutError, failure_);
      }
    }
    checkInterrupt(rounds, what);
    backOff(rounds);
  }
}

// In a host wait's sleeping phase, a few times a second: a process asked to stop (Ctrl-C) must
// not wait out the timeout (interrupt.h). The communicator is aborted: its peers are told.
void NcclTransport::checkInterrupt(int rounds, const std::function<std::string()>& what) {
  if (rounds < 64 || rounds % 32 != 0 || !interruptRequested()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  abortLocked(detail::concat("interrupted by a signal while ", what(), where()));
  RC_THROW_AS(InterruptedError, failure_);
}

void NcclTransport::abortLocked(const std::string& why) {
  if (aborted_) return;
  failure_ = why;
  aborted_.store(true, std::memory_order_release);
  // Also stops this rank's kernels still waiting on a peer. Only ever called with mutex_ held,
  // so no other call is inside the communicator it frees.
  if (comm_ != nullptr) {
    api_->ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclTransport::throwAborted() const {
  if (timedOut_) RC_THROW_AS(TimeoutError, failure_);
  RC_THROW_AS(PeerError, "this NCCL transport was aborted (", failure_,
              "); create a new communicator");
}

void NcclTransport::failNcclLocked(ncclResult_t result, const std::string& what) {
  // After an abort the call fails too: its reason is the one to report.
  abortLocked(detail::concat("NCCL failed while ", what, where(), ": ",
                             api_->describe(result, comm_)));
  throwAborted();
}

void NcclTransport::failCuda(cudaError_t status, const char* call) const {
  (void)api_->cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  RC_THROW("CUDA call ", call, " failed", where(), ": ", api_->describe(status));
}

// -- the watchdog: collectives running on the GPU past the timeout ------------------------------

// Pops the collectives that finished; true when none is left running.
bool NcclTransport::pollInflightLocked() {
  while (!inflight_.empty()) {
    cudaError_t status = api_->cudaEventQuery(inflightEvents_[inflight_.front().event]);
    if (status == cudaErrorNotReady) {
      // The runtime also keeps NotReady as this thread's last error: clear it, or the next
      // kernel launch's cudaGetLastError check fails with it (torch's CUDAEvent::query does too).
      (void)api_->cudaGetLastError();
      return false;
    }
    if (status != cudaSuccess) {
      (void)api_->cudaGetLastError();
      abortLocked(detail::concat("a collective failed on the GPU", where(), ": ",
                                 api_->describe(status)));
      return true;
    }
    if (completions_) completions_->deviceDone(inflight_.front().call.record);
    inflight_.pop_front();
    // The next one could only start now: it gets the whole timeout from here.
    if (!inflight_.empty()) inflight_.front().since = Clock::now();
  }
  return true;
}

void NcclTransport::watch() {
  api_->cudaSetDevice(options_.device);  // event queries on this thread
  // Querying events while another thread captures a CUDA graph in global mode would break the
  // capture unless this thread is relaxed.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  api_->cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kWatchdogPeriod);
    if (stopping_ || aborted_ || pollInflightLocked() || aborted_) continue;
    if (Clock::now() > inflight_.front().since + seconds(options_.timeoutSeconds)) {
      timedOut_ = true;
      const std::string why =
          detail::concat(describe(inflight_.front().call), " did not finish within ",
                         options_.timeoutSeconds, " s", where(),
                         ": is every rank calling the same collectives?");
      if (completions_) completions_->deviceFailed(inflight_.front().call.record, why);
      abortLocked(why);
      continue;
    }
    ncclResult_t state = ncclSuccess;
    if (api_->ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress)
      abortLocked(detail::concat("NCCL failed", where(), ": ", api_->describe(state, comm_)));
  }
}

// -- the host's view ----------------------------------------------------------------------------

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
      std::lock_guard<std::mutex> lock(mutex_);
      timedOut_ = true;
      const std::string call = inflight_.empty() ? "a collective" : describe(inflight_.front().call);
      const std::string why = detail::concat(call, " did not finish within ", limit, " s", where(),
                                             ": is every rank calling the same collectives?");
      if (completions_ && !inflight_.empty())
        completions_->deviceFailed(inflight_.front().call.record, why);
      abortLocked(why);
      throwAborted();
    }
    checkInterrupt(rounds, [] { return std::string("waiting for the collectives to finish"); });
    backOff(rounds);  // a host wait: ranks may share cores
  }
}

void NcclTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abortLocked(why);
  }
  endRecording();  // the failure may have come while recording
  // A collective that failed midway leaves the caller on its own device, as end() would.
  if (inCollective_) {
    inCollective_ = false;
    if (callerDevice_ >= 0 && callerDevice_ != options_.device) api_->cudaSetDevice(callerDevice_);
  }
}

}  // namespace ringcomm
