// CPU reduction: dispatch on (dtype, op) once per slice, then one tight loop per variant.
#include "cpu/cpu_reducer.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/half.h"
#include "cpu/half_blocks.h"
#include "ringcomm/error.h"
#include "ringcomm/op_math.h"

namespace ringcomm {
namespace {

struct Half { uint16_t bits; };
struct BHalf { uint16_t bits; };

// How an element is loaded into the type arithmetic happens in, and stored back.
template <typename T>
struct Codec {
  using Acc = T;
  static Acc load(T v) { return v; }
  static T store(Acc v) { return v; }
};
template <>
struct Codec<Half> {
  using Acc = float;
  static float load(Half v) { return fp16ToFloat(v.bits); }
  static Half store(float v) { return Half{floatToFp16(v)}; }
};
template <>
struct Codec<BHalf> {
  using Acc = float;
  static float load(BHalf v) { return bf16ToFloat(v.bits); }
  static BHalf store(float v) { return BHalf{floatToBf16(v)}; }
};
template <>
struct Codec<bool> {
  using Acc = uint8_t;  // bool buffers hold 0 or 1 bytes; opmath::boolOp keeps them so
  static uint8_t load(bool v) { return v; }
  static bool store(uint8_t v) { return v != 0; }
};

// T: the buffer's element type (result, a); W: the wire's (message, b). Same type except for a
// 16-bit wire under float32 buffers.
template <typename T, typename W, typename Fn>
__attribute__((always_inline)) inline void loopBody(T* result, W* message, const T* a, const W* b,
                                                    size_t n, Fn fn) {
  using CT = Codec<T>;
  using CW = Codec<W>;
  // One loop per output combination keeps each loop branch-free, so it vectorises.
  if (result && message) {
    for (size_t i = 0; i < n; ++i) {
      const W w = CW::store(fn(CT::load(a[i]), CW::load(b[i])));
      message[i] = w;
      if constexpr (std::is_same_v<T, W>)
        result[i] = w;
      else
        result[i] = CT::store(CW::load(w));  // keep what the other ranks receive
    }
  } else if (result) {
    for (size_t i = 0; i < n; ++i) result[i] = CT::store(fn(CT::load(a[i]), CW::load(b[i])));
  } else if (message) {
    for (size_t i = 0; i < n; ++i) message[i] = CW::store(fn(CT::load(a[i]), CW::load(b[i])));
  }
}

// The portable build targets baseline x86-64 (SSE2); the same loops compiled for AVX2 move twice
// the bytes per instruction, which shows once slices sit in cache (docs/benchmarks.md).
#if defined(__x86_64__)
bool hasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

template <typename T, typename W, typename Fn>
__attribute__((target("avx2"))) void loopAvx2(T* result, W* message, const T* a, const W* b,
                                              size_t n, Fn fn) {
  loopBody(result, message, a, b, n, fn);
}
#endif

template <typename T, typename W, typename Fn>
void loopOnce(T* result, W* message, const T* a, const W* b, size_t n, Fn fn) {
#if defined(__x86_64__)
  if (hasAvx2()) return loopAvx2(result, message, a, b, n, fn);
#endif
  loopBody(result, message, a, b, n, fn);
}

template <typename T, typename W, typename Fn>
void loop(T* result, W* message, const T* a, const W* b, size_t n, Fn fn) {
  if constexpr (std::is_same_v<T, W>) {
    if (result != nullptr && message != nullptr) {
      // Two outputs (the rank's result and the next hop's slot): reduce an L1-sized block into
      // result, whose lines the loop has just read as `a` when in place, then memcpy it on.
      // memcpy's string moves write whole lines without first reading them, which vector stores
      // into a slot the other core last read cannot (measured: docs/benchmarks.md).
      constexpr size_t kBlock = 16384 / sizeof(T);
      for (size_t i = 0; i < n; i += kBlock) {
        const size_t m = std::min(kBlock, n - i);
        loopOnce(result + i, static_cast<W*>(nullptr), a + i, b + i, m, fn);
        std::memcpy(message + i, result + i, m * sizeof(T));
      }
      return;
    }
  }
  loopOnce(result, message, a, b, n, fn);
}

template <typename T, typename W = T>
void reduceTyped(void* resultBuffer, void* messageBuffer, const void* a, const void* b, size_t n,
                 const ReduceSpec& spec, bool finalize) {
  using A = typename Codec<T>::Acc;
  auto* result = static_cast<T*>(resultBuffer);
  auto* message = static_cast<W*>(messageBuffer);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const W*>(b);
  if (finalize && spec.op == RedOp::Avg && spec.divisor != 1) {
    const A d = static_cast<A>(spec.divisor);
    return loop(result, message, x, y, n, [d](A p, A q) {
      return static_cast<A>(opmath::apply<RedOp::Sum>(p, q) / d);
    });
  }
  // One loop per op, so the op is known at compile time and the loop vectorises.
  constexpr bool kBool = std::is_same_v<T, bool>;
  const RedOp op = kBool ? opmath::boolOp(spec.op) : opmath::arithmeticOp(spec.op);
  const bool found = opmath::withOp<std::is_integral_v<A>>(op, [&](auto tag) {
    loop(result, message, x, y, n,
         [](A p, A q) { return opmath::apply<decltype(tag)::value>(p, q); });
  });
  RC_CHECK(found, "op '", redOpName(spec.op), "' is not defined for ", dataTypeName(spec.type));
}

// float16 in a reduction: widen blocks with F16C, reduce them as float32 (the arithmetic
// float16 gets anyway), narrow the results. Same bits as the per-element path, several times
// faster. T is float or Half (buffer), W is Half (wire) or T.
template <typename T, typename W>
void reduceThroughFloat(void* result, void* message, const void* a, const void* b, size_t n,
                        const ReduceSpec& spec, bool finalize) {
  constexpr size_t kBlock = 2048;
  float fa[kBlock], fb[kBlock], value[kBlock];
  ReduceSpec asFloat = spec;
  asFloat.type = asFloat.wireType = DataType::Float32;
  auto half = [](const void* p, size_t i) { return static_cast<const uint16_t*>(p) + i; };
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    const float* pa = fa;
    if constexpr (std::is_same_v<T, Half>)
      widenHalf(half(a, i), fa, m);
    else
      pa = static_cast<const float*>(a) + i;
    widenHalf(half(b, i), fb, m);
    reduceTyped<float>(value, nullptr, pa, fb, m, asFloat, finalize);
    if (message != nullptr) {
      uint16_t* wire = static_cast<uint16_t*>(message) + i;
      narrowHalf(value, wire, m);
      if (result == nullptr) continue;
      if constexpr (std::is_same_v<T, Half>)
        std::memcpy(static_cast<uint16_t*>(result) + i, wire, m * 2);
      else
        widenHalf(wire, static_cast<float*>(result) + i, m);  // keep what the others receive
    } else if (result != nullptr) {
      if constexpr (std::is_same_v<T, Half>)
        narrowHalf(value, static_cast<uint16_t*>(result) + i, m);
      else
        std::memcpy(static_cast<float*>(result) + i, value, m * sizeof(float));
    }
  }
}

template <typename W>
void convertFromFloat(void* resultBuffer, void* messageBuffer, const void* src, bool srcIsWire,
                      size_t n) {
  auto* result = static_cast<float*>(resultBuffer);
  auto* message = static_cast<W*>(messageBuffer);
  if (srcIsWire) {
    auto* s = static_cast<const W*>(src);
    if (message && message != s) std::memcpy(message, s, n * sizeof(W));
    if constexpr (std::is_same_v<W, Half>) {
      if (result) widenHalf(&s->bits, result, n);
    } else if (result) {
      for (size_t i = 0; i < n; ++i) result[i] = Codec<W>::load(s[i]);
    }
  } else {
    auto* s = static_cast<const float*>(src);
    if constexpr (std::is_same_v<W, Half>) {
      if (message) narrowHalf(s, &message->bits, n);
    } else if (message) {
      for (size_t i = 0; i < n; ++i) message[i] = Codec<W>::store(s[i]);
    }
    if (result && result != s) std::memcpy(result, s, n * sizeof(float));
  }
}

}  // namespace

void CpuReducer::convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
                         const ReduceSpec& spec) {
  checkWireType(spec.type, spec.wireType);
  if (spec.wireType == DataType::BFloat16)
    return convertFromFloat<BHalf>(result, message, src, srcIsWire, n);
  if (spec.wireType == DataType::Float16)
    return convertFromFloat<Half>(result, message, src, srcIsWire, n);
  Reducer::convert(result, message, src, srcIsWire, n, spec);
}

void CpuReducer::reduce(void* result, void* message, const void* a, const void* b, size_t n,
                        const ReduceSpec& spec, bool finalize) {
  if (spec.wireType != spec.type) {
    checkWireType(spec.type, spec.wireType);
    if (spec.wireType == DataType::BFloat16)
      return reduceTyped<float, BHalf>(result, message, a, b, n, spec, finalize);
    return reduceThroughFloat<float, Half>(result, message, a, b, n, spec, finalize);
  }
  switch (spec.type) {
    case DataType::Float32: return reduceTyped<float>(result, message, a, b, n, spec, finalize);
    case DataType::Float64: return reduceTyped<double>(result, message, a, b, n, spec, finalize);
    case DataType::Float16:
      return reduceThroughFloat<Half, Half>(result, message, a, b, n, spec, finalize);
    case DataType::BFloat16: return reduceTyped<BHalf>(result, message, a, b, n, spec, finalize);
    case DataType::Int8: return reduceTyped<int8_t>(result, message, a, b, n, spec, finalize);
    case DataType::UInt8: return reduceTyped<uint8_t>(result, message, a, b, n, spec, finalize);
    case DataType::Int32: return reduceTyped<int32_t>(result, message, a, b, n, spec, finalize);
    case DataType::Int64: return reduceTyped<int64_t>(result, message, a, b, n, spec, finalize);
    case DataType::Bool: return reduceTyped<bool>(result, message, a, b, n, spec, finalize);
  }
  RC_THROW("unknown data type ", static_cast<int>(spec.type));
}

void CpuReducer::copy(void* result, void* message, const void* src, size_t bytes) {
  // Two memcpy calls: their string moves write whole lines without reading them first, which
  // beat a single pass with two vector stores per load (docs/benchmarks.md).
  if (result && result != src) std::memcpy(result, src, bytes);
  if (message && message != src) std::memcpy(message, src, bytes);
}

}  // namespace ringcomm
