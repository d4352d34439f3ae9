// Test-only: the grid runner and the runtime behind kernels_on_host.h (the CUDA kernels executed
// on the CPU). Plain C++: code that sets the runtime up includes this, not kernels_on_host.h,
// whose macros rename CUDA's runtime functions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

namespace ringcomm {
class Reducer;
}

namespace ringcomm::hostkern {

// -- the kernel's view of the grid ----------------------------------------------------------------
struct GridPosition {
  uint3 thread{0, 0, 0};
  uint3 block{0, 0, 0};
  dim3 blockSize{1, 1, 1};
  dim3 gridSize{1, 1, 1};
};
const GridPosition& position();

// -- the device and the runtime -------------------------------------------------------------------
struct DeviceProperties {
  int sms = 132;            // an H200's
  int residentBlocks = 3;   // what the occupancy query answers for every kernel
};
DeviceProperties& deviceProperties();

// Where launches and copies go, and the runtime state the kernels' host side reads.
struct Runtime {
  // Runs `work` in `stream`'s order (default: at once, on the calling thread).
  std::function<void(cudaStream_t, std::function<void()>)> enqueue;
  std::function<cudaError_t()> getLastError;  // default: this thread's own last error
  std::function<cudaError_t(int*)> getDevice;
  std::function<cudaError_t(int)> setDevice;
  std::function<cudaError_t(cudaStreamCaptureMode*)> exchangeCaptureMode;
};
Runtime& runtime();  // set before any launch; not thread-safe to change while kernels run
void resetRuntime();  // the defaults

// Shuffled thread order: each launch draws its permutation from this seed and a launch counter.
void setShuffleSeed(uint64_t seed);

struct GridStats {
  uint64_t launches = 0;
  unsigned maxBlocks = 0;  // the largest grid launched
  uint64_t threadsRun = 0;
};
GridStats gridStats();
void resetGridStats();
// True while a grid's threads run on this thread (for tests that watch the kernels' accesses).
bool inKernel();

// One launch: every (block, thread) of blocks x threads runs `body` with its position set.
void runGrid(unsigned blocks, unsigned threads, cudaStream_t stream, std::function<void()> body);

template <typename P>
void launch(void (*kernel)(P), unsigned blocks, unsigned threads, cudaStream_t stream,
            const P& params) {
  runGrid(blocks, threads, stream, [kernel, params] { kernel(params); });
}

cudaError_t getDevice(int* device);
cudaError_t setDevice(int device);
cudaError_t getLastError();
cudaError_t deviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t occupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* kernel, int threads,
                                                      size_t sharedBytes);
cudaError_t memcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream);
cudaError_t exchangeCaptureMode(cudaStreamCaptureMode* mode);
const char* errorName(cudaError_t status);
const char* errorString(cudaError_t status);

// The CudaReducer of the host build (kernel_reducer_on_host.cc): the kernels that ship, run
// through this runtime.
std::shared_ptr<Reducer> makeCudaReducer(int device, cudaStream_t stream, int smsForNccl);

}  // namespace ringcomm::hostkern
