// A comparison of secrets whose time does not depend on where they differ (as Python's
// hmac.compare_digest): an early exit would let a stranger learn a secret byte by byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ringcomm {

inline bool constantTimeEqual(const void* a, const void* b, size_t bytes) {
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t differ = 0;
  for (size_t i = 0; i < bytes; ++i) differ |= static_cast<uint8_t>(x[i] ^ y[i]);
  return differ == 0;
}

}  // namespace ringcomm
