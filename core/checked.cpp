#include "core/checked.hpp"

namespace ptdp {

int64_t checked_mul(int64_t a, int64_t b, const std::string& key, const SourceLocation& where) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw ConfigError(key, std::to_string(a) + " × " + std::to_string(b) + " does not fit in a 64-bit integer", where);
  return out;
}

int checked_int(int64_t value, int64_t lo, int64_t hi, const std::string& key, const SourceLocation& where) {
  if (value < lo || value > hi)
    throw ConfigError(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + std::to_string(value) + ")", where);
  return static_cast<int>(value);
}

}  // namespace ptdp
