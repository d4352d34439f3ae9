// Reduction kernels. One kernel per (storage type, op): the op is a template parameter so the
// inner loop is branch-free; AVG is SUM plus a runtime divide, bool reuses uint8's bitwise
// kernels, so there are 4x4 float + 4x9 integer instantiations and no more (compile time).
//
// Arithmetic matches csrc/cpu/cpu_reducer.cc bit for bit: float16/bfloat16 are computed in
// float32 and rounded once (round to nearest even); signed integers wrap; min/max return NaN
// when either side is NaN; integer AVG truncates like C++ division.
#include "cuda/reduce_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.h"

namespace ringcomm {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;   // ~60-80 registers: 2-4 blocks resident, the rest queue
constexpr int kUnroll = 4;        // 16-byte vectors per thread per iteration
constexpr int kMaxDevices = 64;

enum class KOp : int { Sum, Prod, Min, Max, BAnd, BOr, BXor, LAnd, LOr };

// How a stored element becomes the value arithmetic happens in, and back.
template <typename T>
struct Plain {
  using Storage = T;
  using Acc = T;
  static __device__ __forceinline__ Acc load(Storage s) { return s; }
  static __device__ __forceinline__ Storage store(Acc v) { return v; }
};
struct Fp16 {
  using Storage = uint16_t;  // bits, so vectors can be a plain union
  using Acc = float;
  static __device__ __forceinline__ float load(uint16_t s) {
    return __half2float(__ushort_as_half(s));
  }
  static __device__ __forceinline__ uint16_t store(float v) {
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
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

template <typename A>
__device__ __forceinline__ A wrapAdd(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>)
    return static_cast<A>(static_cast<std::make_unsigned_t<A>>(x) +
                          static_cast<std::make_unsigned_t<A>>(y));
  else
    return x + y;
}
template <typename A>
__device__ __forceinline__ A wrapMul(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>)
    return static_cast<A>(static_cast<std::make_unsigned_t<A>>(x) *
                          static_cast<std::make_unsigned_t<A>>(y));
  else
    return static_cast<A>(x * y);
}

template <KOp Op, typename A>
__device__ __forceinline__ A apply(A x, A y) {
  constexpr bool kFloat = std::is_floating_point_v<A>;
  if constexpr (Op == KOp::Sum) return wrapAdd(x, y);
  if constexpr (Op == KOp::Prod) return wrapMul(x, y);
  if constexpr (Op == KOp::Min) {
    if constexpr (kFloat)
      if (y != y) return y;  // NaN wins (torch.minimum); x NaN survives the compare below
    return y < x ? y : x;
  }
  if constexpr (Op == KOp::Max) {
    if constexpr (kFloat)
      if (y != y) return y;
    return y > x ? y : x;
  }
  if constexpr (!kFloat) {
    if constexpr (Op == KOp::BAnd) return x & y;
    if constexpr (Op == KOp::BOr) return x | y;
    if constexpr (Op == KOp::BXor) return x ^ y;
    if constexpr (Op == KOp::LAnd) return static_cast<A>((x != 0) && (y != 0));
    if constexpr (Op == KOp::LOr) return static_cast<A>((x != 0) || (y != 0));
  }
  return x;  // unreachable: the host never instantiates other combinations
}

template <typename C>
struct Params {
  using S = typename C::Storage;
  using A = typename C::Acc;
  S* out0;
  S* out1;
  const S* a;
  const S* b;
  size_t n;     // elements in all
  size_t head;  // scalar elements before the first 16-byte-aligned vector
  size_t vecs;  // 16-byte vectors after the head; the rest is a scalar tail
  A divisor;
  bool divide;
  float scale;
  bool scaled;
};

template <typename C, KOp Op>
__device__ __forceinline__ typename C::Storage combine(typename C::Storage x,
                                                       typename C::Storage y,
                                                       const Params<C>& p) {
  using A = typename C::Acc;
  A r = apply<Op>(C::load(x), C::load(y));
  if (p.divide) r = static_cast<A>(r / p.divisor);
  if constexpr (std::is_floating_point_v<A>)
    if (p.scaled) r = r * static_cast<A>(p.scale);
  return C::store(r);
}

template <typename C, KOp Op>
__device__ __forceinline__ void scalarAt(const Params<C>& p, size_t i) {
  const auto v = combine<C, Op>(p.a[i], p.b[i], p);
  if (p.out0) p.out0[i] = v;
  if (p.out1) p.out1[i] = v;
}

template <typename C, KOp Op>
__global__ void __launch_bounds__(kThreads) reduceKernel(const Params<C> p) {
  using S = typename C::Storage;
  constexpr int kPerVec = 16 / sizeof(S);
  union Vec {
    uint4 raw;
    S e[kPerVec];
  };
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = gridDim.x * static_cast<size_t>(blockDim.x);

  for (size_t i = tid; i < p.head; i += stride) scalarAt<C, Op>(p, i);

  // Body: kUnroll independent vector loads per thread before any arithmetic, so each thread
  // keeps several 16-byte requests in flight.
  const uint4* va = reinterpret_cast<const uint4*>(p.a + p.head);
  const uint4* vb = reinterpret_cast<const uint4*>(p.b + p.head);
  uint4* vo0 = p.out0 ? reinterpret_cast<uint4*>(p.out0 + p.head) : nullptr;
  uint4* vo1 = p.out1 ? reinterpret_cast<uint4*>(p.out1 + p.head) : nullptr;
  for (size_t base = tid; base < p.vecs; base += stride * kUnroll) {
    Vec x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
        x[u].raw = va[i];
        y[u].raw = vb[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
#pragma unroll
        for (int k = 0; k < kPerVec; ++k) x[u].e[k] = combine<C, Op>(x[u].e[k], y[u].e[k], p);
        if (vo0) vo0[i] = x[u].raw;
        if (vo1) vo1[i] = x[u].raw;
      }
    }
  }

  for (size_t i = p.head + p.vecs * kPerVec + tid; i < p.n; i += stride) scalarAt<C, Op>(p, i);
}

int smCount() {
  static int cache[kMaxDevices] = {};  // benign race: every writer stores the same value
  int device = 0;
  RC_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (cache[device] == 0) {
    int sms = 0;
    RC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cache[device] = sms > 0 ? sms : 1;
  }
  return cache[device];
}

// Elements to peel so that every pointer is 16-byte aligned after them, or SIZE_MAX when the
// pointers are misaligned differently (then the whole range takes the scalar path).
size_t alignedHead(const ReduceLaunch& l, size_t elemSize) {
  const void* ptrs[] = {l.out0, l.out1, l.a, l.b};
  size_t misalign = SIZE_MAX;
  for (const void* ptr : ptrs) {
    if (ptr == nullptr) continue;
    const size_t m = reinterpret_cast<uintptr_t>(ptr) % 16;
    if (m % elemSize != 0) return SIZE_MAX;
    if (misalign == SIZE_MAX) misalign = m;
    if (m != misalign) return SIZE_MAX;
  }
  return misalign == 0 ? 0 : (16 - misalign) / elemSize;
}

template <typename C, KOp Op>
void launchTyped(const ReduceLaunch& l, cudaStream_t stream) {
  using S = typename C::Storage;
  using A = typename C::Acc;
  constexpr size_t kPerVec = 16 / sizeof(S);
  Params<C> p;
  p.out0 = static_cast<S*>(l.out0);
  p.out1 = static_cast<S*>(l.out1);
  p.a = static_cast<const S*>(l.a);
  p.b = static_cast<const S*>(l.b);
  p.n = l.n;
  const size_t head = alignedHead(l, sizeof(S));
  p.head = head == SIZE_MAX ? l.n : (head < l.n ? head : l.n);
  p.vecs = (l.n - p.head) / kPerVec;
  p.divide = l.finalize && l.op == RedOp::Avg && l.divisor != 1;
  p.divisor = static_cast<A>(l.divisor);
  p.scale = l.scale;
  p.scaled = l.scale != 1.0f;

  const size_t work = p.vecs > 0 ? p.vecs : l.n;  // vector path: one thread per vector
  const size_t wanted = (work + kThreads - 1) / kThreads;
  const size_t limit = static_cast<size_t>(smCount()) * kBlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(wanted < limit ? (wanted > 0 ? wanted : 1) : limit);
  reduceKernel<C, Op><<<blocks, kThreads, 0, stream>>>(p);
  RC_CUDA_CHECK(cudaGetLastError());
}

template <typename C>
void launchFloat(KOp op, const ReduceLaunch& l, cudaStream_t s) {
  switch (op) {
    case KOp::Sum: return launchTyped<C, KOp::Sum>(l, s);
    case KOp::Prod: return launchTyped<C, KOp::Prod>(l, s);
    case KOp::Min: return launchTyped<C, KOp::Min>(l, s);
    case KOp::Max: return launchTyped<C, KOp::Max>(l, s);
    default: break;
  }
  RC_THROW("op '", redOpName(l.op), "' is only defined for integer and bool tensors, not ",
           dataTypeName(l.type));
}

template <typename C>
void launchInt(KOp op, const ReduceLaunch& l, cudaStream_t s) {
  switch (op) {
    case KOp::Sum: return launchTyped<C, KOp::Sum>(l, s);
    case KOp::Prod: return launchTyped<C, KOp::Prod>(l, s);
    case KOp::Min: return launchTyped<C, KOp::Min>(l, s);
    case KOp::Max: return launchTyped<C, KOp::Max>(l, s);
    case KOp::BAnd: return launchTyped<C, KOp::BAnd>(l, s);
    case KOp::BOr: return launchTyped<C, KOp::BOr>(l, s);
    case KOp::BXor: return launchTyped<C, KOp::BXor>(l, s);
    case KOp::LAnd: return launchTyped<C, KOp::LAnd>(l, s);
    case KOp::LOr: return launchTyped<C, KOp::LOr>(l, s);
  }
}

KOp kernelOp(RedOp op) {
  switch (op) {
    case RedOp::Sum: case RedOp::Avg: return KOp::Sum;
    case RedOp::Prod: return KOp::Prod;
    case RedOp::Min: return KOp::Min;
    case RedOp::Max: return KOp::Max;
    case RedOp::BAnd: return KOp::BAnd;
    case RedOp::BOr: return KOp::BOr;
    case RedOp::BXor: return KOp::BXor;
    case RedOp::LAnd: return KOp::LAnd;
    case RedOp::LOr: return KOp::LOr;
  }
  RC_THROW("unknown reduction op ", static_cast<int>(op));
}

// bool holds 0/1 bytes, so its logic is uint8's bitwise arithmetic (sum/max = or,
// prod/min = and), exactly as the CPU reducer does it.
KOp boolOp(RedOp op) {
  switch (op) {
    case RedOp::Sum: case RedOp::Max: case RedOp::BOr: case RedOp::LOr: return KOp::BOr;
    case RedOp::Prod: case RedOp::Min: case RedOp::BAnd: case RedOp::LAnd: return KOp::BAnd;
    case RedOp::BXor: return KOp::BXor;
    default: break;
  }
  RC_THROW("op '", redOpName(op), "' is not defined for bool tensors");
}

}  // namespace

void launchReduce(const ReduceLaunch& l, void* streamPtr) {
  std::string why;
  RC_CHECK(opSupported(l.op, l.type, &why), why);
  RC_CHECK(l.scale == 1.0f || isFloatingPoint(l.type), "a fused scale needs a floating type, not ",
           dataTypeName(l.type));
  RC_CHECK(l.divisor != 0, "AVG divisor must not be zero");
  RC_CHECK(l.n == 0 || (l.a != nullptr && l.b != nullptr), "reduce inputs must not be null");
  if (l.n == 0 || (l.out0 == nullptr && l.out1 == nullptr)) return;
  auto stream = static_cast<cudaStream_t>(streamPtr);
  const KOp op = kernelOp(l.op);
  switch (l.type) {
    case DataType::Float32: return launchFloat<Plain<float>>(op, l, stream);
    case DataType::Float64: return launchFloat<Plain<double>>(op, l, stream);
    case DataType::Float16: return launchFloat<Fp16>(op, l, stream);
    case DataType::BFloat16: return launchFloat<Bf16>(op, l, stream);
    case DataType::Int8: return launchInt<Plain<int8_t>>(op, l, stream);
    case DataType::UInt8: return launchInt<Plain<uint8_t>>(op, l, stream);
    case DataType::Int32: return launchInt<Plain<int32_t>>(op, l, stream);
    case DataType::Int64: return launchInt<Plain<int64_t>>(op, l, stream);
    case DataType::Bool: return launchInt<Plain<uint8_t>>(boolOp(l.op), l, stream);
  }
  RC_THROW("unknown data type ", static_cast<int>(l.type));
}

}  // namespace ringcomm
