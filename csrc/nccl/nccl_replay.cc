// NcclTransport's recorded collectives (see nccl_transport.h, recordGraphs): a ring collective
// the caller tagged is captured as a CUDA graph when its key comes the second time, then
// replayed by one launch per call. Keys hold no addresses and only tagged calls count, so every
// rank records and replays the same calls: NCCL requires both sides of each send/receive to be
// captured alike.
#include "nccl/nccl_transport.h"

#include "ringcomm/error.h"

namespace ringcomm {

#define RC_GPU(call) check(api_->call, #call)

bool NcclTransport::shouldRecord(const ReplayKey& key) {
  // Capped alike on every rank: every rank counts the same keys.
  if (!options_.recordGraphs || recordings_.size() >= kMaxRecordings) return false;
  if (seenOnce_.erase(key) > 0) return true;
  if (seenOnce_.size() >= kMaxSeen) seenOnce_.clear();
  seenOnce_.insert(key);
  return false;
}

void NcclTransport::finishRecording() {
  recording_ = false;
  caller_ = recordingFor_;
  Recording r;
  RC_GPU(cudaStreamEndCapture(recordStream_, &r.graph));
  const cudaError_t made = api_->cudaGraphInstantiate(&r.exec, r.graph, 0);
  if (made != cudaSuccess) {
    api_->cudaGraphDestroy(r.graph);
    failCuda(made, "cudaGraphInstantiate");
  }
  recordings_[recordingKey_] = r;
  RC_GPU(cudaGraphLaunch(r.exec, caller_));
  noteInflight(caller_);
}

bool NcclTransport::replay(uintptr_t stream, const CallName& call) {
  if (call.replay == nullptr || recordings_.empty()) return false;
  const auto it = recordings_.find(*call.replay);
  if (it == recordings_.end()) return false;
  checkUsable();
  const ReplayKey& recorded = it->first;
  if (recorded.output != call.replay->output || recorded.input != call.replay->input)
    RC_THROW("replay tag ", recorded.tag, " was recorded on other buffers (output ",
             recorded.output, ", input ", recorded.input, "; now ", call.replay->output, ", ",
             call.replay->input, "): a tag promises the same buffers on every call from its "
             "second on", where());
  const auto caller = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RC_GPU(cudaStreamIsCapturing(caller, &status));
  if (status == cudaStreamCaptureStatusActive) return false;  // the caller's capture: run it
  call_ = call, watched_ = false;
  int previous = -1;
  RC_GPU(cudaGetDevice(&previous));
  if (previous != options_.device) RC_GPU(cudaSetDevice(options_.device));
  RC_GPU(cudaGraphLaunch(it->second.exec, caller));
  noteInflight(caller);
  if (previous != options_.device) RC_GPU(cudaSetDevice(previous));
  return true;
}

// A recording cut short by a failure: this thread's capture ends, its graph is dropped.
void NcclTransport::endRecording() noexcept {
  if (!recording_) return;
  recording_ = false;
  cudaGraph_t partial = nullptr;
  if (api_->cudaStreamEndCapture(recordStream_, &partial) == cudaSuccess && partial)
    api_->cudaGraphDestroy(partial);
  (void)api_->cudaGetLastError();
}

// Before NCCL is finalized: its captured operations hold resources until their graph goes.
void NcclTransport::dropRecordings() noexcept {
  endRecording();
  for (auto& [key, r] : recordings_) {
    api_->cudaGraphExecDestroy(r.exec);
    api_->cudaGraphDestroy(r.graph);
  }
  recordings_.clear();
}

}  // namespace ringcomm
