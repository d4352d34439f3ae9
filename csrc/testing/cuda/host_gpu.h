// Test-only: a host implementation of GpuApi (csrc/nccl/gpu_api.h) with CUDA's and NCCL's
// semantics, so the CPU tests drive the real NcclTransport, ranks as threads of one process:
//   streams    a worker thread each, running its work in order (handle 0: the calling thread's
//              own default stream, as with per-thread default streams), and graph capture;
//   events     a record completes when its stream reaches it; a wait holds the waiting stream
//              until the event's latest record (at the time of the wait call) completes;
//   memory     "device" memory is host memory;
//   NCCL       communicators keyed by unique id; groups enqueue their operations as one piece of
//              stream work that posts them and ends when all of them matched and moved (the
//              k-th send from a to b meets the k-th receive at b from a; sizes must agree); the
//              first exchange with a peer connects to it, which waits for that peer's own first
//              exchange with this rank; non-blocking communicators return ncclInProgress and do
//              that waiting on a thread per group, as NCCL does; abort fails what is pending and
//              frees the communicator.
// It also checks how it is used: a call on a communicator while another thread is inside one,
// a call other than ncclCommGetAsyncError while a non-blocking call is in progress, and a call
// on a freed communicator are recorded as violations.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nccl/gpu_api.h"

namespace ringcomm::hostgpu {

const GpuApi& api();

// Host work on `stream` in its order (what a kernel launch is on a GPU).
void launch(cudaStream_t stream, std::function<void()> work);

// Stream capture: work and events on `stream`, and on every stream that waits on an event it
// recorded, go into a graph until endCapture, which returns it; launchGraph runs it on a
// stream (every launch on streams of its own, joined back into that one). Events recorded or
// waited on with cudaEventRecordExternal / cudaEventWaitExternal inside it are recorded and
// waited on at each launch.
void beginCapture(cudaStream_t stream);
uintptr_t endCapture(cudaStream_t stream);
void launchGraph(uintptr_t graph, cudaStream_t stream);
// The caller's cudaGraphDestroy (and of every executable graph made from it): the user objects
// it retained lose their reference, and those with none left run their destructors.
void destroyGraph(uintptr_t graph);

// CUDA's error state, kept as the runtime keeps it (host_cuda.cc): the calling thread's last
// error without clearing it; a sticky error every later cudaGetLastError returns (cudaSuccess
// clears it: a test's own reset).
cudaError_t peekLastError();
void setStickyError(cudaError_t status);
// Every cudaStreamSynchronize returns `status` (after waiting), as the thread's last error, until
// set back to cudaSuccess.
void setSynchronizeFailure(cudaError_t status);

// A fresh ncclUniqueId's bytes.
std::string uniqueId();

// How many times each GpuApi function was called since reset().
std::map<std::string, uint64_t> callCounts();
// Misuse seen since reset(), one line each.
std::vector<std::string> violations();
void reset();

// Stream work sleeps up to this long before it runs (0: never), to shake out missing waits.
void setJitterMicroseconds(int microseconds);
// Rank `rank` of every communicator created from now on stops after `groups` NCCL groups: its
// later groups are accepted but never move anything, as if its process had died (-1: never).
void setStall(int rank, int groups);
// ncclSend/ncclRecv inside a group on a non-blocking communicator return ncclInProgress (as
// NCCL's do while the communicator's state is in progress) instead of ncclSuccess.
void setPostsInProgress(bool inProgress);

}  // namespace ringcomm::hostgpu
