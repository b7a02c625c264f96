// One way to read JSON from users (checkpoint metadata and manifests, traces, reports, DeepSpeed
// and Hugging Face configs): every error of the JSON library — a syntax error, a number out of
// range (1e400), a value of the wrong type, a missing key — becomes a ConfigError naming the file
// and the key, and the text's nesting is bounded (check_json_depth) before it is parsed.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ptdp {

/// Parses `text` read from `source`: ConfigError "SOURCE:LINE:COL: KEY: not valid JSON (…)" when
/// it is not — the key being read when the library failed (a number beyond double's range, 1e400,
/// names its key), the library's own prefix ("[json.exception…]") dropped — or nests too deep.
/// With `refuse_duplicates`, an object naming a key twice is refused (the library keeps the last).
nlohmann::json parse_json_text(const std::string& text, const std::string& source, bool refuse_duplicates = false);

/// `j[key]` of an object; ConfigError "SOURCE: KEY is missing" (`parent` prefixes the key path,
/// "a.b") when `j` is not an object or lacks the key.
const nlohmann::json& json_at(const nlohmann::json& j, const std::string& key, const std::string& source,
                              const std::string& parent = "");

/// A value converted to T (an integer type, double, bool or std::string): ConfigError naming
/// SOURCE and KEY when it has another type, a fraction where an integer belongs, or does not fit T.
template <typename T>
T json_get(const nlohmann::json& v, const std::string& source, const std::string& key) {
  auto bad = [&](const std::string& why) { return ConfigError(key, why + " (got " + printable(v.dump(), 60) + ")", SourceLocation{source, 0, 0}); };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw bad("expected true or false");
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw bad("expected a string");
    return v.get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw bad("expected a number");
    const double d = v.get<double>();
    if (!std::isfinite(d)) throw bad("expected a finite number");
    return static_cast<T>(d);
  } else {
    static_assert(std::is_integral_v<T>);
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw bad("out of range");
      return static_cast<T>(u);
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0) throw bad("expected a non-negative integer");
        return static_cast<T>(i);
      } else {
        if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) || i > static_cast<int64_t>(std::numeric_limits<T>::max()))
          throw bad("out of range");
        return static_cast<T>(i);
      }
    }
    throw bad("expected an integer");
  }
}

}  // namespace ptdp
