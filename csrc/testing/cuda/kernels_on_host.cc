// Test-only: the grid runner and the runtime of kernels_on_host.h (see kernel_runtime.h).
#include "testing/cuda/kernel_runtime.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace ringcomm::hostkern {
namespace {

thread_local GridPosition current;
thread_local bool running = false;
thread_local cudaError_t lastError = cudaSuccess;
thread_local int device = 0;

std::atomic<uint64_t> shuffleSeed{0x5eed};
std::atomic<uint64_t> launchCount{0};
std::mutex statsMutex;
GridStats stats;

Runtime defaults() {
  Runtime r;
  r.enqueue = [](cudaStream_t, std::function<void()> work) { work(); };
  r.getLastError = [] { return std::exchange(lastError, cudaSuccess); };
  r.getDevice = [](int* d) {
    *d = device;
    return cudaSuccess;
  };
  r.setDevice = [](int d) {
    if (d < 0) return lastError = cudaErrorInvalidDevice;
    device = d;
    return cudaSuccess;
  };
  r.exchangeCaptureMode = [](cudaStreamCaptureMode* mode) {
    thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
    std::swap(current, *mode);
    return cudaSuccess;
  };
  return r;
}

Runtime& table() {
  static Runtime r = defaults();
  return r;
}

}  // namespace

const GridPosition& position() { return current; }
DeviceProperties& deviceProperties() {
  static DeviceProperties properties;
  return properties;
}
Runtime& runtime() { return table(); }
void resetRuntime() { table() = defaults(); }
void setShuffleSeed(uint64_t seed) { shuffleSeed = seed; }
bool inKernel() { return running; }

GridStats gridStats() {
  std::lock_guard<std::mutex> lock(statsMutex);
  return stats;
}
void resetGridStats() {
  std::lock_guard<std::mutex> lock(statsMutex);
  stats = {};
}

void runGrid(unsigned blocks, unsigned threads, cudaStream_t stream, std::function<void()> body) {
  const uint64_t draw = shuffleSeed.load() + 0x9e3779b97f4a7c15ull * ++launchCount;
  {
    std::lock_guard<std::mutex> lock(statsMutex);
    ++stats.launches;
    stats.maxBlocks = std::max(stats.maxBlocks, blocks);
    stats.threadsRun += static_cast<uint64_t>(blocks) * threads;
  }
  runtime().enqueue(stream, [blocks, threads, draw, body = std::move(body)] {
    std::vector<uint32_t> order(static_cast<size_t>(blocks) * threads);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(draw));
    const GridPosition outer = current;
    const bool wasRunning = running;
    current.blockSize = dim3(threads, 1, 1);
    current.gridSize = dim3(blocks, 1, 1);
    running = true;
    for (const uint32_t k : order) {
      current.block = uint3{k / threads, 0, 0};
      current.thread = uint3{k % threads, 0, 0};
      body();
    }
    running = wasRunning;
    current = outer;
  });
}

cudaError_t getDevice(int* d) { return runtime().getDevice(d); }
cudaError_t setDevice(int d) { return runtime().setDevice(d); }
cudaError_t getLastError() { return runtime().getLastError(); }
cudaError_t exchangeCaptureMode(cudaStreamCaptureMode* mode) {
  return runtime().exchangeCaptureMode(mode);
}

cudaError_t deviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  if (attribute != cudaDevAttrMultiProcessorCount) return lastError = cudaErrorInvalidValue;
  *value = deviceProperties().sms;
  return cudaSuccess;
}

cudaError_t occupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* kernel, int threads,
                                                      size_t) {
  if (kernel == nullptr || threads <= 0 || threads > 1024) return lastError = cudaErrorInvalidValue;
  *blocks = deviceProperties().residentBlocks;
  return cudaSuccess;
}

cudaError_t memcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return lastError = cudaErrorInvalidValue;
  runtime().enqueue(s, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

const char* errorName(cudaError_t status) {
  switch (status) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaError";
  }
}

const char* errorString(cudaError_t status) {
  switch (status) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}

}  // namespace ringcomm::hostkern
