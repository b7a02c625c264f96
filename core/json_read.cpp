#include "core/json_read.hpp"

#include "core/json_depth.hpp"

#include <set>
#include <vector>

namespace ptdp {

nlohmann::json parse_json_text(const std::string& text, const std::string& source, bool refuse_duplicates) {
  using json = nlohmann::json;
  check_json_depth(text, source);
  // The path of keys being read ("zero_optimization.stage"), for the error's key.
  std::vector<std::string> path;
  std::vector<std::set<std::string>> seen;
  std::vector<bool> in_object;  // per open container: an object (keys) or an array
  auto key_path = [&] {
    std::string out;
    for (const auto& k : path) out += (out.empty() ? "" : ".") + k;
    return out;
  };
  try {
    return json::parse(text, [&](int /*depth*/, json::parse_event_t event, json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
          in_object.push_back(event == json::parse_event_t::object_start);
          seen.emplace_back();
          path.emplace_back();  // the key of a member, filled by its key event
          break;
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          if (!in_object.empty()) in_object.pop_back(), seen.pop_back(), path.pop_back();
          break;
        case json::parse_event_t::key: {
          const std::string k = parsed.get<std::string>();
          if (!path.empty()) path.back() = k;
          if (refuse_duplicates && !seen.empty() && !seen.back().insert(k).second)
            throw ConfigError(key_path(), "duplicate key (JSON keeps one of them silently; give it once)",
                              SourceLocation{source, 0, 0});
          break;
        }
        default:
          break;
      }
      return true;
    });
  } catch (const json::exception& e) {
    // The library's text starts "[json.exception.parse_error.101] parse error at line 1, column 3: …"
    std::string why = e.what();
    if (const size_t close = why.find("] "); why.rfind("[json.exception.", 0) == 0 && close != std::string::npos) why = why.substr(close + 2);
    int line = 0, col = 0;
    if (const auto* pe = dynamic_cast<const json::parse_error*>(&e)) {
      line = 1, col = 1;
      for (size_t i = 0; i + 1 < pe->byte && i < text.size(); ++i) {
        if (text[i] == '\n') ++line, col = 1;
        else ++col;
      }
      if (const size_t at = why.find(": "); why.rfind("parse error", 0) == 0 && at != std::string::npos) why = why.substr(at + 2);
    }
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) why = "the file is empty";
    // An unnamed key (the array items' path entries are empty) is left out.
    std::string key;
    for (const auto& k : path)
      if (!k.empty()) key += (key.empty() ? "" : ".") + k;
    throw ConfigError(key, "not valid JSON (" + printable(why, 200) + ")", SourceLocation{source, line, col});
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
