// float16 <-> float32 for whole arrays: F16C where the CPU has it (checked once at run time),
// else the portable conversions of half.h. Results match half.h bit for bit, NaNs included.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ringcomm {

void widenHalf(const uint16_t* src, float* dst, size_t n);
void narrowHalf(const float* src, uint16_t* dst, size_t n);

}  // namespace ringcomm
