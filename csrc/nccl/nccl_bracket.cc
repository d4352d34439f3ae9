// NcclTransport's begin() and end(): a collective ordered after the work on the caller's stream
// and after every earlier call of this communicator (the timeline event), eager or inside a CUDA
// graph capture (the caller's, or a recording of its own: nccl_replay.cc); an eager one is handed
// to the watchdog (noteInflight, nccl_lifecycle.cc).
#include "nccl/nccl_transport.h"

#include <algorithm>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

#define RC_GPU(call) check(api_->call, #call)

void NcclTransport::begin(uintptr_t stream, const CallName& call) {
  checkUsable();
  call_ = call, watched_ = false;
  caller_ = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RC_GPU(cudaStreamIsCapturing(caller_, &status));
  bool capturing = status == cudaStreamCaptureStatusActive;
  // First-time work (connecting to peers through NCCL, which allocates and waits for them)
  // cannot be part of a capture: a collective must have run once outside it.
  if (capturing && eagerCollectives_ == 0)
    RC_THROW_AS(RefusedError, "a CUDA graph capture cannot hold the first collective of a "
                "ringcomm communicator (NCCL connects to its peers then): run the collective "
                "once before capturing, as a warm-up", where());
  RC_GPU(cudaGetDevice(&callerDevice_));
  if (callerDevice_ != options_.device) RC_GPU(cudaSetDevice(options_.device));
  inCollective_ = true;
  if (!capturing && call.replay != nullptr && shouldRecord(*call.replay)) {
    // Recorded on a stream of its own (this thread's capture only); end() launches the graph
    // on the caller's stream, so this call runs as every later one will.
    RC_GPU(cudaStreamBeginCapture(recordStream_, cudaStreamCaptureModeThreadLocal));
    recording_ = true;
    recordingKey_ = *call.replay;
    recordingFor_ = caller_;
    caller_ = recordStream_;
    capturing = true;
  }
  if (capturing || capturing_) {
    // Events recorded inside a capture cannot be waited on outside it, nor the reverse: slot
    // reuse across that boundary is ordered by the timeline event instead.
    std::fill(sendFreePending_.begin(), sendFreePending_.end(), false);
    std::fill(recvFreePending_.begin(), recvFreePending_.end(), false);
  }
  capturing_ = capturing;
  // Collectives of one communicator run one after another in the order they were launched,
  // eager or replayed from a graph on any stream: they share the staging slots, and NCCL pairs
  // operations by their order. A captured collective waits, at each replay, for the timeline's
  // latest record (an external event node).
  if (capturing)
    RC_GPU(cudaStreamWaitEvent(caller_, timeline_, cudaEventWaitExternal));
  RC_GPU(cudaEventRecord(callerReady_, caller_));
  RC_GPU(cudaStreamWaitEvent(compute_, callerReady_, 0));
  RC_GPU(cudaStreamWaitEvent(commStream_, callerReady_, 0));
  if (!capturing) {
    RC_GPU(cudaStreamWaitEvent(compute_, timeline_, 0));
    RC_GPU(cudaStreamWaitEvent(commStream_, timeline_, 0));
  }
  heldRecvSlot_ = -1;
}

void NcclTransport::end() {
  publications_.finishRound();
  flush();
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
  if (capturing_) {
    if (!recording_) holdForCallersGraph();
    // The caller's stream joins the capture's streams back (an event of the capture), then at
    // each replay moves the timeline on (an external record; see begin).
    RC_GPU(cudaEventRecord(done_, compute_));
    RC_GPU(cudaStreamWaitEvent(caller_, done_, 0));
    RC_GPU(cudaEventRecordWithFlags(timeline_, caller_, cudaEventRecordExternal));
    if (recording_) finishRecording();
  } else {
    ++eagerCollectives_;
    RC_GPU(cudaEventRecord(timeline_, compute_));
    RC_GPU(cudaStreamWaitEvent(caller_, timeline_, 0));
    noteInflight(compute_);
  }
  inCollective_ = false;
  if (callerDevice_ != options_.device) RC_GPU(cudaSetDevice(callerDevice_));
}

// NCCL ties its resources to the graphs that use them the same way (cudaGraphRetainUserObject).
void NcclTransport::holdForCallersGraph() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  RC_GPU(cudaStreamGetCaptureInfo(caller_, &status, nullptr, &graph, nullptr, nullptr, nullptr));
  auto* reference = new std::shared_ptr<GraphHolds>(holds_);
  cudaUserObject_t object = nullptr;
  const cudaError_t made = api_->cudaUserObjectCreate(&object, reference, &GraphHolds::released,
                                                      1, cudaUserObjectNoDestructorSync);
  if (made != cudaSuccess) {
    delete reference;
    failCuda(made, "cudaUserObjectCreate");
  }
  holds_->hold();
  RC_GPU(cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove));
}

void NcclTransport::noteInflight(cudaStream_t after) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_ = true;
  if (inflight_.size() < inflightEvents_.size()) {
    // Entries hold consecutive events of the ring, so the one after the newest is free.
    const int event = static_cast<int>(inflightRecorded_++ % inflightEvents_.size());
    RC_GPU(cudaEventRecord(inflightEvents_[event], after));
    inflight_.push_back(Inflight{event, call_, Clock::now()});
  } else {
    // Many collectives queued: the newest entry now stands for this one too.
    RC_GPU(cudaEventRecord(inflightEvents_[inflight_.back().event], after));
    inflight_.back().call = call_;
  }
}

void NcclTransport::reportCompletionTo(std::shared_ptr<FlightRecorder> recorder) {
  std::lock_guard<std::mutex> lock(mutex_);
  completions_ = std::move(recorder);
}

}  // namespace ringcomm
