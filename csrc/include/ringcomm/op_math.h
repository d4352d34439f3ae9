// The arithmetic of the reduction ops, defined once for the CPU reducer (plain C++) and the CUDA
// kernels (__host__ __device__ under nvcc). Results agree bit for bit across devices: signed
// integers wrap, min/max return NaN when either side is NaN (as torch.minimum), logical ops give
// 0 or 1, AVG adds here and divides once in the caller's epilogue.
#pragma once

#include <cstddef>
#include <iterator>
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

namespace detail {

// f(OpTag<kRedOps[I].op>) when that op combines values of the class kIntegral picks (AVG is
// SUM's loop, see arithmeticOp); false otherwise.
template <bool kIntegral, size_t I, typename F>
bool callIfCombines(F& f) {
  constexpr RedOpInfo row = kRedOps[I];
  if constexpr (row.op != RedOp::Avg && (kIntegral ? row.integer : row.floating)) {
    f(OpTag<row.op>{});
    return true;
  } else {
    return false;
  }
}

template <bool kIntegral, typename F, size_t... I>
bool withOpOf(RedOp op, F& f, std::index_sequence<I...>) {
  return ((kRedOps[I].op == op && callIfCombines<kIntegral, I>(f)) || ...);
}

}  // namespace detail

// Runs f(OpTag<op>{}) for a runtime op, so that callers instantiate one loop or kernel per op:
// every op kRedOps defines for integers when kIntegral, for floating types otherwise (AVG: see
// arithmeticOp). False when op is outside that set. Host code.
template <bool kIntegral, typename F>
bool withOp(RedOp op, F&& f) {
  return detail::withOpOf<kIntegral>(op, f, std::make_index_sequence<std::size(kRedOps)>{});
}

}  // namespace ringcomm::opmath
