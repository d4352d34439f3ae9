// Shared by reduce_kernels.cu and wire_kernels.cu: 16-bit conversions, the reduction ops (from
// ringcomm/op_math.h), the grid-stride walk over an aligned range, and the host-side launch
// sizing. CUDA only; host code outside csrc/cuda uses reduce_kernels.h.
//
// Arithmetic matches csrc/cpu/cpu_reducer.cc bit for bit: the ops are the same code
// (op_math.h); float16/bfloat16 are computed in float32 and rounded once (round to nearest even;
// NaN converts as csrc/cpu/half.h converts it); integer AVG truncates like C++ division.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"
#include "ringcomm/op_math.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // see reduce_kernels.h
namespace kernels {

constexpr int kThreads = 256;
constexpr int kMaxDevices = 64;

// The ops and their arithmetic are ringcomm/op_math.h's, shared with the CPU reducer.
using opmath::apply;
using opmath::withOp;

// -- element conversions: storage <-> the type arithmetic happens in ----------------------------
template <typename T>
struct Plain {
  using Storage = T;
  using Acc = T;
  static __device__ __forceinline__ Acc load(Storage s) { return s; }
  static __device__ __forceinline__ Storage store(Acc v) { return v; }
};
// The hardware conversions round to nearest even like csrc/cpu/half.h; only NaN differs (the
// hardware writes a canonical NaN), so NaN takes the CPU's path and the bits agree everywhere.
struct Fp16 {
  using Storage = uint16_t;  // bits, so vectors can be a plain union
  using Acc = float;
  static __device__ __forceinline__ float load(uint16_t s) {
    if ((s & 0x7fffu) > 0x7c00u)  // NaN: keep sign and payload
      return __uint_as_float((static_cast<uint32_t>(s & 0x8000u) << 16) | 0x7f800000u |
                             (static_cast<uint32_t>(s & 0x3ffu) << 13));
    return __half2float(__ushort_as_half(s));
  }
  static __device__ __forceinline__ uint16_t store(float v) {
    const uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: sign and the quiet bit
      return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(v));
  }
};
struct Bf16 {
  using Storage = uint16_t;
  using Acc = float;
  static __device__ __forceinline__ float load(uint16_t s) {
    return __uint_as_float(static_cast<uint32_t>(s) << 16);
  }
  static __device__ __forceinline__ uint16_t store(float v) {
    const uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: truncated payload, made quiet
      return static_cast<uint16_t>((bits >> 16) | 0x40u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

// -- ops ----------------------------------------------------------------------------------------
// AVG's divide, applied to the op's result in the accumulation type.
template <typename A>
struct Epilogue {
  A divisor;
  bool divide;

  static Epilogue from(const ReduceLaunch& launch) {
    return {static_cast<A>(launch.divisor),
            launch.finalize && launch.op == RedOp::Avg && launch.divisor != 1};
  }
  __device__ __forceinline__ A operator()(A r) const {
    if (divide) r = static_cast<A>(r / divisor);
    return r;
  }
};

// -- vectors and the grid-stride walk -------------------------------------------------------------
// n elements: `head` scalars until every pointer is 16-byte aligned, `vecs` vectors, then a
// scalar tail. Kernel parameter structs derive from it.
struct Range {
  size_t n;
  size_t head;
  size_t vecs;
};

// 16-byte view of p after the head; null stays null so an unused output costs one branch.
struct Views {
  const uint4* a;
  const uint4* b;
  uint4* result;
  uint4* message;
};
template <typename T>
__device__ __forceinline__ const uint4* vecIn(const T* p, size_t head) {
  return reinterpret_cast<const uint4*>(p + head);
}
template <typename T>
__device__ __forceinline__ uint4* vecOut(T* p, size_t head) {
  return p ? reinterpret_cast<uint4*>(p + head) : nullptr;
}

// The head and tail go through scalar(i); vectors through load(v, x, y, i) then
// compute(v, x, y, i), v = views() made after the head (as the hand-written loops did: ptxas
// register counts depend on it). All kUnroll loads of a thread are issued before any
// arithmetic, so each keeps several 16-byte requests in flight.
template <int kPerVec, int kUnroll, typename X, typename Y, typename R, typename Scalar,
          typename MakeViews, typename Load, typename Compute>
__device__ __forceinline__ void walk(const R& r, Scalar scalar, MakeViews views, Load load,
                                     Compute compute) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = gridDim.x * static_cast<size_t>(blockDim.x);

  for (size_t i = tid; i < r.head; i += stride) scalar(i);

  const auto v = views();

  for (size_t base = tid; base < r.vecs; base += stride * kUnroll) {
    X x[kUnroll];
    Y y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < r.vecs) load(v, x[u], y[u], i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < r.vecs) compute(v, x[u], y[u], i);
    }
  }

  for (size_t i = r.head + r.vecs * kPerVec + tid; i < r.n; i += stride) scalar(i);
}

// -- host side: launch sizing ---------------------------------------------------------------------
// inline, so both kernel files share one cache.
inline int currentDevice() {
  int device = 0;
  RC_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// The first launch of a kernel may come inside a CUDA graph capture: its sizing queries are
// set-up, not captured work, so this thread asks them in relaxed capture mode.
class RelaxedCapture {
 public:
  RelaxedCapture() { RC_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// `device` is the current one when known (the launch's caller knows it: no query per step).
inline int smCount(int device) {
  static int cache[kMaxDevices] = {};  // benign race: every writer stores the same value
  if (device < 0) device = currentDevice();
  int& sms = cache[device < kMaxDevices ? device : 0];
  if (sms == 0) {
    RelaxedCapture relaxed;
    int value = 0;
    RC_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
    sms = value > 0 ? value : 1;
  }
  return sms;
}

// The most blocks of `blocksPerSm` resident blocks each that leave `reserved` SMs free (at
// least one SM's worth): one wave, so no block waits for another to finish.
inline size_t gridLimit(int sms, int blocksPerSm, int reserved) {
  const int usable = sms - reserved > 0 ? sms - reserved : 1;
  return static_cast<size_t>(usable) * static_cast<size_t>(blocksPerSm > 0 ? blocksPerSm : 1);
}

// Resident blocks per SM of `kernel` at kThreads threads (registers decide: ~60-80 registers
// fit 3-4 blocks of 256), asked once per kernel and device.
inline int residentBlocks(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  if (device < 0) device = currentDevice();
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = cache.try_emplace({kernel, device}, 1);
  if (fresh) {
    RelaxedCapture relaxed;
    int value = 0;
    cudaError_t status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&value, kernel, kThreads, 0);
    if (status != cudaSuccess) cache.erase(it);
    RC_CUDA_CHECK(status);
    it->second = value > 0 ? value : 1;
  }
  return it->second;
}

struct Operand {
  const void* ptr;  // null: not used
  size_t size;      // bytes per element
};

// Elements to peel (fewer than one vector of `perVec`) so that every pointer is 16-byte aligned
// after them, or SIZE_MAX when no count does (then the whole range takes the scalar path).
inline size_t alignedHead(std::initializer_list<Operand> operands, size_t perVec) {
  for (size_t k = 0; k < perVec; ++k) {
    bool aligned = true;
    for (const Operand& o : operands)
      if (o.ptr != nullptr && (reinterpret_cast<uintptr_t>(o.ptr) + k * o.size) % 16 != 0)
        aligned = false;
    if (aligned) return k;
  }
  return SIZE_MAX;
}

// Splits n elements into p's Range, sizes the grid (one thread per vector, at most one wave of
// resident blocks on the SMs the kernel leaves to NCCL) and launches kernel(p) on the stream.
template <typename P>
void launchOver(void (*kernel)(P), P& p, size_t n, size_t head, size_t perVec, int smsForNccl,
                int device, cudaStream_t stream) {
  p.n = n;
  p.head = head == SIZE_MAX ? n : (head < n ? head : n);
  p.vecs = (n - p.head) / perVec;
  const size_t work = p.vecs > 0 ? p.vecs : n;
  const size_t wanted = (work + kThreads - 1) / kThreads;
  const size_t limit = gridLimit(
      smCount(device), residentBlocks(reinterpret_cast<const void*>(kernel), device), smsForNccl);
  const auto blocks = static_cast<unsigned>(wanted < limit ? (wanted > 0 ? wanted : 1) : limit);
  // The one launch point. The CPU tests compile these sources for the host, where
  // RC_LAUNCH_ON_HOST runs every block and thread of this grid (testing/cuda/kernels_on_host.h).
#ifdef RC_LAUNCH_ON_HOST
  RC_LAUNCH_ON_HOST(kernel, blocks, kThreads, stream, p);
#else
  kernel<<<blocks, kThreads, 0, stream>>>(p);
#endif
  RC_CUDA_CHECK(cudaGetLastError());
}

// float32 data on a 16-bit wire; op is SUM/PROD/MIN/MAX (wire_kernels.cu).
void launchWireReduce(RedOp op, const ReduceLaunch& launch, cudaStream_t stream);

}  // namespace kernels
}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
