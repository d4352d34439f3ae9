// The arithmetic of the reduction ops, defined once for the CPU reducer (plain C++) and the CUDA
// kernels (__host__ __device__ under nvcc). Results agree bit for bit across devices: signed
// integers wrap, min/max return NaN when either side is NaN (as torch.minimum), logical ops give
// 0 or 1, AVG adds here and divides once in the caller's epilogue.
#pragma once

#include <type_traits>
#include <utility>

#include "ringcomm/types.h"

#if defined(__CUDACC__)
#define RC_OP_INLINE __host__ __device__ __forceinline__
#else
#define RC_OP_INLINE inline
#endif

namespace ringcomm::opmath {

// Signed overflow is undefined in C++; unsigned arithmetic gives two's complement wrap.
template <typename A>
RC_OP_INLINE A wrapAdd(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>)
    return static_cast<A>(static_cast<std::make_unsigned_t<A>>(x) +
                          static_cast<std::make_unsigned_t<A>>(y));
  else
    return static_cast<A>(x + y);
}

template <typename A>
RC_OP_INLINE A wrapMul(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>)
    return static_cast<A>(static_cast<std::make_unsigned_t<A>>(x) *
                          static_cast<std::make_unsigned_t<A>>(y));
  else
    return static_cast<A>(x * y);
}

// op(x, y) in the accumulation type A. Bitwise and logical ops exist for integers only (bool
// data goes through boolOp on 0/1 bytes).
template <RedOp Op, typename A>
RC_OP_INLINE A apply(A x, A y) {
  constexpr bool kFloat = std::is_floating_point_v<A>;
  if constexpr (Op == RedOp::Sum || Op == RedOp::Avg) return wrapAdd(x, y);
  if constexpr (Op == RedOp::Prod) return wrapMul(x, y);
  if constexpr (Op == RedOp::Min) {
    if constexpr (kFloat)
      if (y != y) return y;  // NaN wins; a NaN x survives the compare below
    return y < x ? y : x;
  }
  if constexpr (Op == RedOp::Max) {
    if constexpr (kFloat)
      if (y != y) return y;
    return y > x ? y : x;
  }
  if constexpr (!kFloat) {
    if constexpr (Op == RedOp::BAnd) return x & y;
    if constexpr (Op == RedOp::BOr) return x | y;
    if constexpr (Op == RedOp::BXor) return x ^ y;
    if constexpr (Op == RedOp::LAnd) return static_cast<A>((x != 0) && (y != 0));
    if constexpr (Op == RedOp::LOr) return static_cast<A>((x != 0) || (y != 0));
  }
  return x;  // unreachable: callers instantiate only the ops kRedOps allows for A
}

// The op that combines two values: AVG adds (its division is an epilogue).
constexpr RedOp arithmeticOp(RedOp op) { return op == RedOp::Avg ? RedOp::Sum : op; }

// Bool data is 0/1 bytes combined bitwise: sum and max are or, prod and min are and.
constexpr RedOp boolOp(RedOp op) {
  switch (op) {
    case RedOp::Sum: case RedOp::Max: case RedOp::LOr: return RedOp::BOr;
    case RedOp::Prod: case RedOp::Min: case RedOp::LAnd: return RedOp::BAnd;
    default: return op;
  }
}

template <RedOp Op>
using OpTag = std::integral_constant<RedOp, Op>;

// Runs f(OpTag<op>{}) for a runtime op, so that callers instantiate one loop or kernel per op:
// SUM, PROD, MIN, MAX, plus the bitwise and logical ops when kAll (AVG: see arithmeticOp).
// False when op is outside that set. Host code.
template <bool kAll, typename F>
bool withOp(RedOp op, F&& f) {
  switch (op) {
    case RedOp::Sum: f(OpTag<RedOp::Sum>{}); return true;
    case RedOp::Prod: f(OpTag<RedOp::Prod>{}); return true;
    case RedOp::Min: f(OpTag<RedOp::Min>{}); return true;
    case RedOp::Max: f(OpTag<RedOp::Max>{}); return true;
    default: break;
  }
  if constexpr (kAll) {
    switch (op) {
      case RedOp::BAnd: f(OpTag<RedOp::BAnd>{}); return true;
      case RedOp::BOr: f(OpTag<RedOp::BOr>{}); return true;
      case RedOp::BXor: f(OpTag<RedOp::BXor>{}); return true;
      case RedOp::LAnd: f(OpTag<RedOp::LAnd>{}); return true;
      case RedOp::LOr: f(OpTag<RedOp::LOr>{}); return true;
      default: break;
    }
  }
  return false;
}

}  // namespace ringcomm::opmath
