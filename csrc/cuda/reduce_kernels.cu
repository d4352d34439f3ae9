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
using namespace kern;
namespace {

constexpr int kUnroll = 4;  // 16-byte vectors per thread per iteration

template <typename C>
struct Params : Range {
  using S = typename C::Storage;
  S* out0;
  S* out1;
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
        if (p.out0) p.out0[i] = v;
        if (p.out1) p.out1[i] = v;
      },
      [&] {
        return Views{vecIn(p.a, p.head), vecIn(p.b, p.head), vecOut(p.out0, p.head),
                     vecOut(p.out1, p.head)};
      },
      [&](const Views& v, Vec& x, Vec& y, size_t i) {
        x.raw = v.a[i];
        y.raw = v.b[i];
      },
      [&](const Views& v, Vec& x, Vec& y, size_t i) {
#pragma unroll
        for (int k = 0; k < kPerVec; ++k) x.e[k] = combine<C, Op>(x.e[k], y.e[k], p);
        if (v.o0) v.o0[i] = x.raw;
        if (v.o1) v.o1[i] = x.raw;
      });
}

template <typename C, RedOp Op>
void launchTyped(const ReduceLaunch& l, cudaStream_t stream) {
  using S = typename C::Storage;
  constexpr size_t kPerVec = 16 / sizeof(S);
  Params<C> p;
  p.out0 = static_cast<S*>(l.out0);
  p.out1 = static_cast<S*>(l.out1);
  p.a = static_cast<const S*>(l.a);
  p.b = static_cast<const S*>(l.b);
  p.fin = Epilogue<typename C::Acc>::from(l);
  const size_t head = alignedHead(
      {{l.out0, sizeof(S)}, {l.out1, sizeof(S)}, {l.a, sizeof(S)}, {l.b, sizeof(S)}}, kPerVec);
  launchOver(reduceKernel<C, Op>, p, l.n, head, kPerVec, l.smsForNccl, l.device, stream);
}

// kAll: the integer ops too. Callers have checked the (dtype, op) pair (opSupported), so the
// throw is a guard.
template <typename C, bool kAll>
void launchFor(RedOp op, const ReduceLaunch& l, cudaStream_t s) {
  if (!withOp<kAll>(op, [&](auto tag) { launchTyped<C, decltype(tag)::value>(l, s); }))
    RC_THROW("op '", redOpName(l.op), "' is not defined for ", dataTypeName(l.type), " tensors");
}

}  // namespace

void launchReduce(const ReduceLaunch& l, void* streamPtr) {
  RC_CHECK(l.divisor != 0, "AVG divisor must not be zero");
  RC_CHECK(l.n == 0 || (l.a != nullptr && l.b != nullptr), "reduce inputs must not be null");
  if (l.n == 0 || (l.out0 == nullptr && l.out1 == nullptr)) return;
  auto stream = static_cast<cudaStream_t>(streamPtr);
  const RedOp op = opmath::arithmeticOp(l.op);
  if (l.wireType && *l.wireType != l.type) {
    checkWireType(l.type, *l.wireType);
    return launchWireReduce(op, l, stream);
  }
  switch (l.type) {
    case DataType::Float32: return launchFor<Plain<float>, false>(op, l, stream);
    case DataType::Float64: return launchFor<Plain<double>, false>(op, l, stream);
    case DataType::Float16: return launchFor<Fp16, false>(op, l, stream);
    case DataType::BFloat16: return launchFor<Bf16, false>(op, l, stream);
    case DataType::Int8: return launchFor<Plain<int8_t>, true>(op, l, stream);
    case DataType::UInt8: return launchFor<Plain<uint8_t>, true>(op, l, stream);
    case DataType::Int32: return launchFor<Plain<int32_t>, true>(op, l, stream);
    case DataType::Int64: return launchFor<Plain<int64_t>, true>(op, l, stream);
    case DataType::Bool: return launchFor<Plain<uint8_t>, true>(opmath::boolOp(l.op), l, stream);
  }
  RC_THROW("unknown data type ", static_cast<int>(l.type));
}

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
