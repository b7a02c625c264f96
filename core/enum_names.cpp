#include "core/enum_names.hpp"

#include <vector>

#include "core/error.hpp"

namespace ptdp {

std::string enum_name(std::span<const EnumName> names, int value) {
  for (const EnumName& n : names)
    if (n.value == value) return n.name;
  return "?";
}

std::string enum_choices(std::span<const EnumName> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i].name);
  return out;
}

int parse_enum(std::span<const EnumName> names, const std::string& text, const std::string& what, const std::string& key) {
  std::vector<std::string> all;
  for (const EnumName& n : names) {
    if (text == n.name) return n.value;
    all.emplace_back(n.name);
  }
  throw ConfigError(key, "unknown " + what + " '" + text + "', expected " + enum_choices(names) + did_you_mean(text, all));
}

}  // namespace ptdp
