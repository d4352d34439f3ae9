// float32 buffers on a 16-bit wire W (Fp16 or Bf16): the reduce kernels (2x4 instantiations)
// and the float32 <-> W conversions (2x2), with their launchers and launchConvert.
//
// A vector is 8 elements: two 16-byte float loads and one 16-byte wire load. When message (W) is
// written, result (float32) gets the value after the round trip through W, so the rank that keeps
// a result holds the bits the others receive.
#include <cstdint>

#include "cuda/kernel_common.cuh"
#include "cuda/reduce_kernels.h"
#include "ringcomm/reducer.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // kernel_build.h
using namespace kernels;
namespace {

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

__device__ __forceinline__ void loadFloats(FloatVec& x, const uint4* v, size_t i) {
  x.raw[0] = v[2 * i];
  x.raw[1] = v[2 * i + 1];
}
__device__ __forceinline__ void storeBoth(const Views& v, const FloatVec& x, const WireVec& y,
                                          size_t i) {
  if (v.result) {
    v.result[2 * i] = x.raw[0];
    v.result[2 * i + 1] = x.raw[1];
  }
  if (v.message) v.message[i] = y.raw;
}

// -- reduce: out = op(a float32, b in W) ----------------------------------------------------------
struct MixedParams {
  float* result;
  uint16_t* message;
  const float* a;
  const uint16_t* b;
  size_t n, head, vecs;  // as in Range
  Epilogue<float> fin;
};

template <typename W, RedOp Op>
__device__ __forceinline__ float mixedValue(float x, uint16_t y, const MixedParams& p) {
  return p.fin(apply<Op>(x, W::load(y)));
}

template <typename W, RedOp Op>
__device__ __forceinline__ void mixedAt(const MixedParams& p, size_t i) {
  float r = mixedValue<W, Op>(p.a[i], p.b[i], p);
  if (p.message) {
    const uint16_t w = W::store(r);
    p.message[i] = w;
    r = W::load(w);
  }
  if (p.result) p.result[i] = r;
}

template <typename W, RedOp Op>
__global__ void __launch_bounds__(kThreads) mixedReduceKernel(const MixedParams p) {
  walk<kWirePerVec, kWireUnroll, FloatVec, WireVec>(
      p, [&](size_t i) { mixedAt<W, Op>(p, i); },
      [&] {  // a: float32 (two uint4 per vector), b: the wire
        return Views{vecIn(p.a, p.head), vecIn(p.b, p.head), vecOut(p.result, p.head),
                     vecOut(p.message, p.head)};
      },
      [&](const Views& v, FloatVec& x, WireVec& y, size_t i) {
        loadFloats(x, v.a, i);
        y.raw = v.b[i];
      },
      [&](const Views& v, FloatVec& x, WireVec& y, size_t i) {
#pragma unroll
        for (int k = 0; k < kWirePerVec; ++k) {
          float r = mixedValue<W, Op>(x.e[k], y.e[k], p);
          if (v.message) {
            y.e[k] = W::store(r);
            r = W::load(y.e[k]);
          }
          x.e[k] = r;
        }
        storeBoth(v, x, y, i);
      });
}

// -- convert: result (float32) and message (W) from src ------------------------------------------
// src is W when kFromWire (result widened, message a copy), else float32 (message rounded, result
// a copy).
// The launcher drops an output that is src itself.
struct ConvertParams {
  float* result;
  uint16_t* message;
  const float* f;     // src when !kFromWire
  const uint16_t* w;  // src when kFromWire
  size_t n, head, vecs;  // as in Range
};

template <typename W, bool kFromWire>
__global__ void __launch_bounds__(kThreads) convertKernel(const ConvertParams p) {
  walk<kWirePerVec, kWireUnroll, FloatVec, WireVec>(
      p,
      [&](size_t i) {
        float x;
        uint16_t y;
        if constexpr (kFromWire) {
          y = p.w[i];
          x = W::load(y);
        } else {
          x = p.f[i];
          y = W::store(x);
        }
        if (p.result) p.result[i] = x;
        if (p.message) p.message[i] = y;
      },
      [&] {  // a: float32 src, b: wire src
        return Views{kFromWire ? nullptr : vecIn(p.f, p.head),
                     kFromWire ? vecIn(p.w, p.head) : nullptr, vecOut(p.result, p.head),
                     vecOut(p.message, p.head)};
      },
      [&](const Views& v, FloatVec& x, WireVec& y, size_t i) {
        if constexpr (kFromWire)
          y.raw = v.b[i];
        else
          loadFloats(x, v.a, i);
      },
      [&](const Views& v, FloatVec& x, WireVec& y, size_t i) {
#pragma unroll
        for (int k = 0; k < kWirePerVec; ++k) {
          if constexpr (kFromWire)
            x.e[k] = W::load(y.e[k]);
          else
            y.e[k] = W::store(x.e[k]);
        }
        storeBoth(v, x, y, i);
      });
}

// -- host side ------------------------------------------------------------------------------------

template <typename W, RedOp Op>
void launchMixedTyped(const ReduceLaunch& launch, cudaStream_t stream) {
  MixedParams p;
  p.result = static_cast<float*>(launch.result);
  p.message = static_cast<uint16_t*>(launch.message);
  p.a = static_cast<const float*>(launch.a);
  p.b = static_cast<const uint16_t*>(launch.b);
  p.fin = Epilogue<float>::from(launch);
  const size_t head = alignedHead(
      {{launch.result, 4}, {launch.message, 2}, {launch.a, 4}, {launch.b, 2}}, kWirePerVec);
  launchOver(mixedReduceKernel<W, Op>, p, launch.n, head, kWirePerVec, launch.smsForNccl,
             launch.device, stream);
}

template <typename W>
void launchMixed(RedOp op, const ReduceLaunch& launch, cudaStream_t s) {
  if (!withOp<false>(op, [&](auto tag) { launchMixedTyped<W, decltype(tag)::value>(launch, s); }))
    RC_THROW("op '", redOpName(launch.op), "' is not defined for float32 data on a 16-bit wire");
}

template <typename W>
void launchConvertTyped(const ConvertLaunch& launch, cudaStream_t stream) {
  ConvertParams p;
  p.result = static_cast<float*>(launch.result);
  p.message = static_cast<uint16_t*>(launch.message);
  p.f = launch.srcIsWire ? nullptr : static_cast<const float*>(launch.src);
  p.w = launch.srcIsWire ? static_cast<const uint16_t*>(launch.src) : nullptr;
  const size_t head = alignedHead(
      {{launch.result, 4}, {launch.message, 2}, {launch.src, launch.srcIsWire ? 2u : 4u}},
      kWirePerVec);
  launchOver(launch.srcIsWire ? convertKernel<W, true> : convertKernel<W, false>, p, launch.n, head,
             kWirePerVec, launch.smsForNccl, launch.device, stream);
}

}  // namespace

void kernels::launchWireReduce(RedOp op, const ReduceLaunch& launch, cudaStream_t stream) {
  if (*launch.wireType == DataType::BFloat16) return launchMixed<Bf16>(op, launch, stream);
  launchMixed<Fp16>(op, launch, stream);
}

void launchConvert(const ConvertLaunch& asked, void* streamPtr) {
  ConvertLaunch launch = asked;
  RC_CHECK(launch.wireType == DataType::Float16 || launch.wireType == DataType::BFloat16,
           "a 16-bit wire is float16 or bfloat16, not ", dataTypeName(launch.wireType));
  RC_CHECK(launch.n == 0 || launch.src != nullptr, "convert source must not be null");
  // The output in src's own type, at src's address, already holds the result.
  void*& sameType = launch.srcIsWire ? launch.message : launch.result;
  if (sameType == launch.src) sameType = nullptr;
  if (launch.n == 0 || (launch.result == nullptr && launch.message == nullptr)) return;
  auto stream = static_cast<cudaStream_t>(streamPtr);
  if (launch.wireType == DataType::BFloat16) return launchConvertTyped<Bf16>(launch, stream);
  launchConvertTyped<Fp16>(launch, stream);
}

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
