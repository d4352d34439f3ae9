// Reduction kernels. One kernel per (storage type, op): the op is a template parameter so the
// inner loop is branch-free; AVG is SUM plus a runtime divide, bool reuses uint8's bitwise
// kernels, so there are 4x4 float + 4x9 integer instantiations, plus 2x4 for float32 buffers on
// a 16-bit wire and 2x2 conversions, and no more (compile time).
//
// Arithmetic matches csrc/cpu/cpu_reducer.cc bit for bit: float16/bfloat16 are computed in
// float32 and rounded once (round to nearest even; NaN converts as csrc/cpu/half.h converts it);
// signed integers wrap; min/max return NaN when either side is NaN; integer AVG truncates like
// C++ division.
#include "cuda/reduce_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "ringcomm/reducer.h"

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

// -- float32 buffers on a 16-bit wire ---------------------------------------------------------
// a and out0 are float32, b and out1 the wire type W (Fp16 or Bf16). A vector is 8 elements: two
// 16-byte float loads and one 16-byte wire load. When out1 is written, out0 gets the value after
// the round trip through W, so the rank that keeps a result holds the bits the others receive.
constexpr int kWirePerVec = 8;
constexpr int kWireUnroll = 2;  // 48 bytes per vector: 2 in flight ~ the 4x16 of the plain path

union FloatVec {
  uint4 raw[2];
  float e[kWirePerVec];
};
union WireVec {
  uint4 raw;
  uint16_t e[kWirePerVec];
};

struct MixedParams {
  float* out0;
  uint16_t* out1;
  const float* a;
  const uint16_t* b;
  size_t n, head, vecs;  // as in Params
  float divisor;
  bool divide;
  float scale;
  bool scaled;
};

template <typename W, KOp Op>
__device__ __forceinline__ float mixedValue(float x, uint16_t y, const MixedParams& p) {
  float r = apply<Op>(x, W::load(y));
  if (p.divide) r = r / p.divisor;
  if (p.scaled) r = r * p.scale;
  return r;
}

template <typename W, KOp Op>
__device__ __forceinline__ void mixedAt(const MixedParams& p, size_t i) {
  float r = mixedValue<W, Op>(p.a[i], p.b[i], p);
  if (p.out1) {
    const uint16_t w = W::store(r);
    p.out1[i] = w;
    r = W::load(w);
  }
  if (p.out0) p.out0[i] = r;
}

template <typename W, KOp Op>
__global__ void __launch_bounds__(kThreads) mixedReduceKernel(const MixedParams p) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = gridDim.x * static_cast<size_t>(blockDim.x);

  for (size_t i = tid; i < p.head; i += stride) mixedAt<W, Op>(p, i);

  const uint4* va = reinterpret_cast<const uint4*>(p.a + p.head);  // two per vector
  const uint4* vb = reinterpret_cast<const uint4*>(p.b + p.head);
  uint4* vo0 = p.out0 ? reinterpret_cast<uint4*>(p.out0 + p.head) : nullptr;
  uint4* vo1 = p.out1 ? reinterpret_cast<uint4*>(p.out1 + p.head) : nullptr;
  for (size_t base = tid; base < p.vecs; base += stride * kWireUnroll) {
    FloatVec x[kWireUnroll];
    WireVec y[kWireUnroll];
#pragma unroll
    for (int u = 0; u < kWireUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
        x[u].raw[0] = va[2 * i];
        x[u].raw[1] = va[2 * i + 1];
        y[u].raw = vb[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kWireUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
#pragma unroll
        for (int k = 0; k < kWirePerVec; ++k) {
          float r = mixedValue<W, Op>(x[u].e[k], y[u].e[k], p);
          if (vo1) {
            y[u].e[k] = W::store(r);
            r = W::load(y[u].e[k]);
          }
          x[u].e[k] = r;
        }
        if (vo0) {
          vo0[2 * i] = x[u].raw[0];
          vo0[2 * i + 1] = x[u].raw[1];
        }
        if (vo1) vo1[i] = y[u].raw;
      }
    }
  }

  for (size_t i = p.head + p.vecs * kWirePerVec + tid; i < p.n; i += stride) mixedAt<W, Op>(p, i);
}

// out0 (float32) and out1 (W) from src: W when kFromWire (out0 widened, out1 a copy), else
// float32 (out1 rounded, out0 a copy). The launcher drops an output that is src itself.
struct ConvertParams {
  float* out0;
  uint16_t* out1;
  const float* f;     // src when !kFromWire
  const uint16_t* w;  // src when kFromWire
  size_t n, head, vecs;
};

template <typename W, bool kFromWire>
__device__ __forceinline__ void convertAt(const ConvertParams& p, size_t i) {
  float x;
  uint16_t y;
  if constexpr (kFromWire) {
    y = p.w[i];
    x = W::load(y);
  } else {
    x = p.f[i];
    y = W::store(x);
  }
  if (p.out0) p.out0[i] = x;
  if (p.out1) p.out1[i] = y;
}

template <typename W, bool kFromWire>
__global__ void __launch_bounds__(kThreads) convertKernel(const ConvertParams p) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = gridDim.x * static_cast<size_t>(blockDim.x);

  for (size_t i = tid; i < p.head; i += stride) convertAt<W, kFromWire>(p, i);

  const uint4* vf = kFromWire ? nullptr : reinterpret_cast<const uint4*>(p.f + p.head);
  const uint4* vw = kFromWire ? reinterpret_cast<const uint4*>(p.w + p.head) : nullptr;
  uint4* vo0 = p.out0 ? reinterpret_cast<uint4*>(p.out0 + p.head) : nullptr;
  uint4* vo1 = p.out1 ? reinterpret_cast<uint4*>(p.out1 + p.head) : nullptr;
  for (size_t base = tid; base < p.vecs; base += stride * kWireUnroll) {
    FloatVec x[kWireUnroll];
    WireVec y[kWireUnroll];
#pragma unroll
    for (int u = 0; u < kWireUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
        if constexpr (kFromWire) {
          y[u].raw = vw[i];
        } else {
          x[u].raw[0] = vf[2 * i];
          x[u].raw[1] = vf[2 * i + 1];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kWireUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < p.vecs) {
#pragma unroll
        for (int k = 0; k < kWirePerVec; ++k) {
          if constexpr (kFromWire)
            x[u].e[k] = W::load(y[u].e[k]);
          else
            y[u].e[k] = W::store(x[u].e[k]);
        }
        if (vo0) {
          vo0[2 * i] = x[u].raw[0];
          vo0[2 * i + 1] = x[u].raw[1];
        }
        if (vo1) vo1[i] = y[u].raw;
      }
    }
  }

  for (size_t i = p.head + p.vecs * kWirePerVec + tid; i < p.n; i += stride)
    convertAt<W, kFromWire>(p, i);
}

// -- host side -----------------------------------------------------------------------------------

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

struct Operand {
  const void* ptr;  // null: not used
  size_t size;      // bytes per element
};

// Elements to peel (fewer than one vector of `perVec`) so that every pointer is 16-byte aligned
// after them, or SIZE_MAX when no count does (then the whole range takes the scalar path).
size_t alignedHead(std::initializer_list<Operand> operands, size_t perVec) {
  for (size_t k = 0; k < perVec; ++k) {
    bool aligned = true;
    for (const Operand& o : operands)
      if (o.ptr != nullptr && (reinterpret_cast<uintptr_t>(o.ptr) + k * o.size) % 16 != 0)
        aligned = false;
    if (aligned) return k;
  }
  return SIZE_MAX;
}

// Fills head and vecs of a kernel's parameters; returns the grid size.
template <typename P>
unsigned split(P& p, size_t n, size_t head, size_t perVec) {
  p.n = n;
  p.head = head == SIZE_MAX ? n : (head < n ? head : n);
  p.vecs = (n - p.head) / perVec;
  const size_t work = p.vecs > 0 ? p.vecs : n;  // vector path: one thread per vector
  const size_t wanted = (work + kThreads - 1) / kThreads;
  const size_t limit = static_cast<size_t>(smCount()) * kBlocksPerSm;
  return static_cast<unsigned>(wanted < limit ? (wanted > 0 ? wanted : 1) : limit);
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
  const unsigned blocks =
      split(p, l.n, alignedHead({{l.out0, sizeof(S)}, {l.out1, sizeof(S)}, {l.a, sizeof(S)},
                                 {l.b, sizeof(S)}}, kPerVec), kPerVec);
  p.divide = l.finalize && l.op == RedOp::Avg && l.divisor != 1;
  p.divisor = static_cast<A>(l.divisor);
  p.scale = l.scale;
  p.scaled = l.scale != 1.0f;
  reduceKernel<C, Op><<<blocks, kThreads, 0, stream>>>(p);
  RC_CUDA_CHECK(cudaGetLastError());
}

template <typename W, KOp Op>
void launchMixedTyped(const ReduceLaunch& l, cudaStream_t stream) {
  MixedParams p;
  p.out0 = static_cast<float*>(l.out0);
  p.out1 = static_cast<uint16_t*>(l.out1);
  p.a = static_cast<const float*>(l.a);
  p.b = static_cast<const uint16_t*>(l.b);
  const unsigned blocks =
      split(p, l.n, alignedHead({{l.out0, 4}, {l.out1, 2}, {l.a, 4}, {l.b, 2}}, kWirePerVec),
            kWirePerVec);
  p.divide = l.finalize && l.op == RedOp::Avg && l.divisor != 1;
  p.divisor = static_cast<float>(l.divisor);
  p.scale = l.scale;
  p.scaled = l.scale != 1.0f;
  mixedReduceKernel<W, Op><<<blocks, kThreads, 0, stream>>>(p);
  RC_CUDA_CHECK(cudaGetLastError());
}

template <typename W>
void launchMixed(KOp op, const ReduceLaunch& l, cudaStream_t s) {
  switch (op) {
    case KOp::Sum: return launchMixedTyped<W, KOp::Sum>(l, s);
    case KOp::Prod: return launchMixedTyped<W, KOp::Prod>(l, s);
    case KOp::Min: return launchMixedTyped<W, KOp::Min>(l, s);
    case KOp::Max: return launchMixedTyped<W, KOp::Max>(l, s);
    default: break;
  }
  RC_THROW("op '", redOpName(l.op), "' is not defined for float32 data on a 16-bit wire");
}

template <typename W>
void launchConvertTyped(const ConvertLaunch& l, cudaStream_t stream) {
  ConvertParams p;
  p.out0 = static_cast<float*>(l.out0);
  p.out1 = static_cast<uint16_t*>(l.out1);
  p.f = l.srcIsWire ? nullptr : static_cast<const float*>(l.src);
  p.w = l.srcIsWire ? static_cast<const uint16_t*>(l.src) : nullptr;
  const unsigned blocks =
      split(p, l.n, alignedHead({{l.out0, 4}, {l.out1, 2}, {l.src, l.srcIsWire ? 2u : 4u}},
                                kWirePerVec), kWirePerVec);
  if (l.srcIsWire)
    convertKernel<W, true><<<blocks, kThreads, 0, stream>>>(p);
  else
    convertKernel<W, false><<<blocks, kThreads, 0, stream>>>(p);
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
  if (l.wireType && *l.wireType != l.type) {
    RC_CHECK(wireTypeSupported(l.type, *l.wireType), dataTypeName(l.type),
             " data cannot travel as ", dataTypeName(*l.wireType),
             " (a 16-bit wire is for float32 tensors)");
    if (*l.wireType == DataType::BFloat16) return launchMixed<Bf16>(op, l, stream);
    return launchMixed<Fp16>(op, l, stream);
  }
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

void launchConvert(const ConvertLaunch& launch, void* streamPtr) {
  ConvertLaunch l = launch;
  RC_CHECK(l.wireType == DataType::Float16 || l.wireType == DataType::BFloat16,
           "a 16-bit wire is float16 or bfloat16, not ", dataTypeName(l.wireType));
  RC_CHECK(l.n == 0 || l.src != nullptr, "convert source must not be null");
  // The output in src's own type, at src's address, already holds the result.
  void*& sameType = l.srcIsWire ? l.out1 : l.out0;
  if (sameType == l.src) sameType = nullptr;
  if (l.n == 0 || (l.out0 == nullptr && l.out1 == nullptr)) return;
  auto stream = static_cast<cudaStream_t>(streamPtr);
  if (l.wireType == DataType::BFloat16) return launchConvertTyped<Bf16>(l, stream);
  launchConvertTyped<Fp16>(l, stream);
}

}  // namespace ringcomm
