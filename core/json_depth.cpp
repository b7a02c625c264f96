#include "core/json_depth.hpp"

#include "core/error.hpp"

namespace ptdp {

void check_json_depth(const std::string& text, const std::string& source, int max_depth) {
  int depth = 0, line = 1;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw ConfigError("", "JSON nested deeper than " + std::to_string(max_depth) + " levels (refused: no ptdp input nests like that)",
                          SourceLocation{source, line, 0});
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
}

}  // namespace ptdp
