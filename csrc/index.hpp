// The engine's index type, and the one checked conversion to a narrower integer.
//
// Sample ids, pack ids, positions and counts are Index, a signed 64-bit integer: numpy's int64 on the Python
// side, and room for data sets of more than 2**31 samples. Narrower integers appear only as compact copies in
// hot buffers (a sample's loads next to its id, a pack's block in a sort); every conversion into one goes
// through narrow(), which refuses a value that does not fit instead of wrapping it into a wrong plan.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace omnibal {

using Index = std::int64_t;

// Thrown for data too large for the engine's compact types; std::invalid_argument, which the bindings raise
// as ValueError. Out of line: the checks sit in hot loops and their failure is rare.
[[noreturn]] inline void throw_too_large(const std::string& what, Index value, Index low, Index high) {
  throw std::invalid_argument(what + " is " + std::to_string(value) + ", outside [" + std::to_string(low) + ", " +
                              std::to_string(high) + "]");
}

// `value` as the narrower integer type Narrow, refused (throw_too_large naming `what`) when it does not fit.
template <typename Narrow>
Narrow narrow(Index value, const char* what) {
  static_assert(std::is_integral<Narrow>::value && std::is_signed<Narrow>::value && sizeof(Narrow) < sizeof(Index),
                "narrow() converts Index to a narrower signed integer");
  constexpr Index kLow = std::numeric_limits<Narrow>::min(), kHigh = std::numeric_limits<Narrow>::max();
  if (value < kLow || value > kHigh) throw_too_large(what, value, kLow, kHigh);
  return static_cast<Narrow>(value);
}

}  // namespace omnibal
