#include "cpu/half_blocks.h"

#include <cmath>

#include "cpu/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define RC_HAVE_F16C_PATH 1
#endif

namespace ringcomm {
namespace {

#ifdef RC_HAVE_F16C_PATH
// F16C quiets NaNs and keeps other payload bits than half.h does: NaN lanes are redone by the
// scalar code so every path (and the GPU kernels, which follow half.h) gives the same bits.
__attribute__((target("avx,f16c"))) void widenF16c(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = fp16ToFloat(src[i]);
  for (size_t j = 0; j < n; ++j)
    if ((src[j] & 0x7fffu) > 0x7c00u) dst[j] = fp16ToFloat(src[j]);
}

__attribute__((target("avx,f16c"))) void narrowF16c(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = floatToFp16(src[i]);
  for (size_t j = 0; j < n; ++j)
    if (std::isnan(src[j])) dst[j] = floatToFp16(src[j]);
}

bool hasF16c() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

}  // namespace

void widenHalf(const uint16_t* src, float* dst, size_t n) {
#ifdef RC_HAVE_F16C_PATH
  if (hasF16c()) return widenF16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = fp16ToFloat(src[i]);
}

void narrowHalf(const float* src, uint16_t* dst, size_t n) {
#ifdef RC_HAVE_F16C_PATH
  if (hasF16c()) return narrowF16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = floatToFp16(src[i]);
}

}  // namespace ringcomm
