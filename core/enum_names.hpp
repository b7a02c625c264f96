// An enum's names, each spelled once: the to_string and parse_* of every enum a user writes
// (schedule, precision, recompute, …) read one table of (value, name), so the names, the error's
// list of choices and its "did you mean" cannot disagree.
#pragma once

#include <span>
#include <string>

namespace ptdp {

struct EnumName {
  int value;
  const char* name;
};

/// The name of `value` in `names` ("?" when it has none).
std::string enum_name(std::span<const EnumName> names, int value);

/// "a, b or c": the names in table order.
std::string enum_choices(std::span<const EnumName> names);

/// The value named `text`; otherwise ConfigError(key, "unknown WHAT 'TEXT', expected a, b or c"
/// + the nearest name).
int parse_enum(std::span<const EnumName> names, const std::string& text, const std::string& what, const std::string& key = "");

template <class E>
E parse_enum_as(std::span<const EnumName> names, const std::string& text, const std::string& what, const std::string& key = "") {
  return static_cast<E>(parse_enum(names, text, what, key));
}

}  // namespace ptdp
