// Checked integer arithmetic for values that come from users (keys, flags, importer values):
// out of range is a ConfigError naming what overflowed, never a wrap or a truncating cast.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"

namespace ptdp {

/// a × b; ConfigError at `key` (`where`) when the product does not fit in 64 bits.
int64_t checked_mul(int64_t a, int64_t b, const std::string& key, const SourceLocation& where = {});
/// `value` as an int when it lies in [lo, hi]; ConfigError at `key` otherwise (no truncating cast).
int checked_int(int64_t value, int64_t lo, int64_t hi, const std::string& key, const SourceLocation& where = {});

}  // namespace ptdp
