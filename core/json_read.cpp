#include "core/json_read.hpp"

#include "core/json_depth.hpp"

namespace ptdp {

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // The library's text starts "[json.exception.parse_error.101] parse error at line 1, column 3: …"
    std::string why = e.what();
    if (const size_t close = why.find("] "); why.rfind("[json.exception.", 0) == 0 && close != std::string::npos) why = why.substr(close + 2);
    throw ConfigError("", "not valid JSON (" + printable(why, 200) + ")", SourceLocation{source, 0, 0});
  }
}

const nlohmann::json& json_at(const nlohmann::json& j, const std::string& key, const std::string& source, const std::string& parent) {
  const std::string path = parent.empty() ? key : parent + "." + key;
  if (!j.is_object())
    throw ConfigError(parent.empty() ? "" : parent, parent.empty() ? "not a JSON object" : "is not a JSON object", SourceLocation{source, 0, 0});
  const auto it = j.find(key);
  if (it == j.end()) throw ConfigError(path, "is missing", SourceLocation{source, 0, 0});
  return *it;
}

}  // namespace ptdp
