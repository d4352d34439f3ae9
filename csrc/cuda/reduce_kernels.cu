// Same-type reduction kernels, and launchReduce. One kernel per (storage type, op): the op is a
// template parameter so the inner loop is branch-free; AVG is SUM plus a runtime divide, bool
// reuses uint8's bitwise kernels, so there are 4x4 float + 4x9 integer instantiations and no
// more (compile time). float32 on a 16-bit wire is in wire_kernels.cu.
#include "cuda/reduce_kernels.h"

#include <cstdint>

#include "cuda/kernel_common.cuh"
#include "ringcomm/reducer.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // kernel_build.h
using namespace kernels;
namespace {

constexpr int kUnroll = 4;  // 16-byte vectors per thread per iteration

template <typename C>
struct Params : Range {
  using S = typename C::Storage;
  S* result;
  S* message;
  const S* a;
  const S* b;
  Epilogue<typename C::Acc> fin;
};

template <typename C, RedOp Op>
__device__ __forceinline__ typename C::Storage combine(typename C::Storage x,
                                                       typename C::Storage y,
                                                       const Params<C>& p) {
  return C::store(p.fin(apply<Op>(C::load(x), C::load(y))));
}

template <typename C, RedOp Op>
__global__ void __launch_bounds__(kThreads) reduceKernel(const Params<C> p) {
  using S = typename C::Storage;
  constexpr int kPerVec = 16 / sizeof(S);
  union Vec {
    uint4 raw;
    S e[kPerVec];
  };
  walk<kPerVec, kUnroll, Vec, Vec>(
      p,
      [&](size_t i) {
        const S v = combine<C, Op>(p.a[i], p.b[i], p);
        if (p.result) p.result[i] = v;
        if (p.message) p.message[i] = v;
      },
      [&] {
        return Views{vecIn(p.a, p.head), vecIn(p.b, p.head), vecOut(p.result, p.head),
                     vecOut(p.message, p.head)};
      },
      [&](const Views& v, Vec& x, Vec& y, size_t i) {
        x.raw = v.a[i];
        y.raw = v.b[i];
      },
      [&](const Views& v, Vec& x, Vec& y, size_t i) {
#pragma unroll
        for (int k = 0; k < kPerVec; ++k) x.e[k] = combine<C, Op>(x.e[k], y.e[k], p);
        if (v.result) v.result[i] = x.raw;
        if (v.message) v.message[i] = x.raw;
      });
}

template <typename C, RedOp Op>
void launchTyped(const ReduceLaunch& launch, cudaStream_t stream) {
  using S = typename C::Storage;
  constexpr size_t kPerVec = 16 / sizeof(S);
  Params<C> p;
  p.result = static_cast<S*>(launch.result);
  p.message = static_cast<S*>(launch.message);
  p.a = static_cast<const S*>(launch.a);
  p.b = static_cast<const S*>(launch.b);
  p.fin = Epilogue<typename C::Acc>::from(launch);
  const size_t head = alignedHead({{launch.result, sizeof(S)}, {launch.message, sizeof(S)},
                                   {launch.a, sizeof(S)}, {launch.b, sizeof(S)}},
                                  kPerVec);
  launchOver(reduceKernel<C, Op>, p, launch.n, head, kPerVec, launch.smsForNccl, launch.device,
             stream);
}

// kAll: the integer ops too. Callers have checked the (dtype, op) pair (opSupported), so the
// throw is a guard.
template <typename C, bool kAll>
void launchFor(RedOp op, const ReduceLaunch& launch, cudaStream_t s) {
  if (!withOp<kAll>(op, [&](auto tag) { launchTyped<C, decltype(tag)::value>(launch, s); }))
    RC_THROW("op '", redOpName(launch.op), "' is not defined for ", dataTypeName(launch.type),
             " tensors");
}

}  // namespace

void launchReduce(const ReduceLaunch& launch, void* streamPtr) {
  RC_CHECK(launch.divisor != 0, "AVG divisor must not be zero");
  RC_CHECK(launch.n == 0 || (launch.a != nullptr && launch.b != nullptr),
           "reduce inputs must not be null");
  if (launch.n == 0 || (launch.result == nullptr && launch.message == nullptr)) return;
  auto stream = static_cast<cudaStream_t>(streamPtr);
  const RedOp op = opmath::arithmeticOp(launch.op);
  if (launch.wireType && *launch.wireType != launch.type) {
    checkWireType(launch.type, *launch.wireType);
    return launchWireReduce(op, launch, stream);
  }
  switch (launch.type) {
    case DataType::Float32: return launchFor<Plain<float>, false>(op, launch, stream);
    case DataType::Float64: return launchFor<Plain<double>, false>(op, launch, stream);
    case DataType::Float16: return launchFor<Fp16, false>(op, launch, stream);
    case DataType::BFloat16: return launchFor<Bf16, false>(op, launch, stream);
    case DataType::Int8: return launchFor<Plain<int8_t>, true>(op, launch, stream);
    case DataType::UInt8: return launchFor<Plain<uint8_t>, true>(op, launch, stream);
    case DataType::Int32: return launchFor<Plain<int32_t>, true>(op, launch, stream);
    case DataType::Int64: return launchFor<Plain<int64_t>, true>(op, launch, stream);
    case DataType::Bool:
      return launchFor<Plain<uint8_t>, true>(opmath::boolOp(launch.op), launch, stream);
  }
  RC_THROW("unknown data type ", static_cast<int>(launch.type));
}

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
