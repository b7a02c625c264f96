#include "interop/common.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/json_read.hpp"
#include "core/json_depth.hpp"
#include "interop/interop.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {

bool has_key(const std::string& key) {
  const auto& keys = scenario_keys();
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

std::string yaml_list(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) out += (out.empty() ? "" : ", ") + k + ": " + v;
  return "{" + out + "}";
}

std::string scalar_yaml(const std::string& s) {
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return nlohmann::json(s).dump();
  return s.empty() ? "\"\"" : s;
}

std::string not_modelled_yaml(const ImportResult& r, const std::vector<std::string>& kept) {
  std::vector<std::string> items = kept;
  for (const auto& item : r.unsupported)
    if (std::find(items.begin(), items.end(), item) == items.end()) items.push_back(item);
  if (items.empty()) return "";
  std::string out = "not_modelled:\n";
  for (const auto& item : items) out += "  - " + nlohmann::json(item).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return out;
}

// Checks the produced YAML loads; a plan Megatron-LM accepts but ptdp refuses names the key.
void check_loads(const ImportResult& r, const std::string& source) {
  try {
    (void)load_scenario_text(r.yaml, source + " (imported)");
  } catch (const ConfigError& e) {
    throw ConfigError(e.key_path(), "the imported plan is not valid: " + e.message(), SourceLocation{source, 0, 0});
  }
}

void finish_import(ImportResult& r, const std::string& body, const std::string& source, const std::vector<std::string>& kept) {
  r.yaml = body + not_modelled_yaml(r, kept);
  check_loads(r, source);
}

std::string import_report(const ImportResult& r) {
  std::ostringstream out;
  auto section = [&](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    out << "# " << title << ":\n";
    for (const auto& i : items) out << "#   " << i << "\n";
  };
  section("not modelled by ptdp (the prediction leaves them out)", r.unsupported);
  section("unknown arguments (not read)", r.unknown);
  section("no effect on the plan's time or memory (not read)", r.no_effect);
  section("assumed", r.notes);
  return out.str();
}

nlohmann::json parse_config_json(const std::string& text, const std::string& source) {
  // Duplicate keys: JSON allows them, the tool reading the config means one of them; refused
  // rather than keep one silently. Errors name the file, line and key (core/json_read.hpp).
  return parse_json_text(text, source, /*refuse_duplicates=*/true);
}

void json_fail(const std::string& source, const std::string& path, const std::string& msg, const nlohmann::json& got) {
  throw ConfigError(path, msg + " (got " + printable(got.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)) + ")",
                    SourceLocation{source, 0, 0});
}

int64_t deepspeed_zero_stage(int64_t stage, bool bf16, std::vector<std::string>& notes) {
  if (!bf16 || stage != 0) return stage;
  notes.push_back("bf16 at ZeRO stage 0: DeepSpeed's BF16 optimizer shards the fp32 optimizer state over the data-parallel ranks "
                  "(imported as zero_stage 1)");
  return 1;
}

}  // namespace ptdp
