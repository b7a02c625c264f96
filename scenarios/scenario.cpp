#include "scenarios/scenario.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/units.hpp"
#include "model/cost.hpp"
#include "model/flops.hpp"
#include "model/layout.hpp"
#include "model/partition.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Groups a key table into the loader's schema: for each section path ("" = the top level,
// "model", "node.nvlink", …) the names allowed in it. Sections come from the keys' paths.
// Keys under `skip` are left out (the topology's, read by their own schema).
std::map<std::string, std::vector<std::string>> schema_of(const std::vector<KeyInfo>& table, const std::string& prefix,
                                                          std::vector<std::string> top_level, const std::string& skip = "") {
  std::map<std::string, std::vector<std::string>> schema;
  schema[""] = std::move(top_level);
  auto add = [&](const std::string& section, const std::string& name) {
    auto& names = schema[section];
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const auto& k : table) {
    std::string path = k.key;
    if (path.rfind(prefix, 0) != 0 || (!skip.empty() && path.rfind(skip, 0) == 0)) continue;
    path = path.substr(prefix.size());
    for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
      const std::string section = path.substr(0, dot);
      const size_t parent_end = section.rfind('.');
      add(parent_end == std::string::npos ? "" : section.substr(0, parent_end),
          parent_end == std::string::npos ? section : section.substr(parent_end + 1));
    }
    const size_t last = path.rfind('.');
    add(last == std::string::npos ? "" : path.substr(0, last), last == std::string::npos ? path : path.substr(last + 1));
  }
  return schema;
}

const std::map<std::string, std::vector<std::string>>& scenario_schema() {
  static const auto schema = schema_of(scenario_key_table(), "", {"description", "not_modelled", "model", "cluster", "parallel", "training", "cost"},
                                   "cluster.topology.");
  return schema;
}

const std::map<std::string, std::vector<std::string>>& topology_schema() {
  static const auto schema =
      schema_of(scenario_key_table(), "cluster.topology.", {"name", "description", "gpu", "node", "network", "nodes", "calibration"});
  return schema;
}

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

// Walks a YAML tree, reading typed values and remembering where each key came from.
class Reader {
 public:
  Reader(std::string file, std::map<std::string, std::string> overridden)
      : file_(std::move(file)), overridden_(std::move(overridden)) {}

  // `prefix` is the key path of `node` in the scenario (e.g. "cluster.topology").
  SourceLocation where(const YAML::Node& node, const std::string& path) const {
    auto it = overridden_.find(path);
    if (it != overridden_.end()) return SourceLocation{it->second, 0, 0};
    if (!node.IsDefined() || node.Mark().line < 0) {
      // A key created by an override (e.g. a misspelt nested key): point at that --set.
      for (const auto& [key, where] : overridden_)
        if (key.rfind(path + ".", 0) == 0) return SourceLocation{where, 0, 0};
    }
    if (node.IsDefined() && node.Mark().line >= 0) return SourceLocation{file_, node.Mark().line + 1, node.Mark().column + 1};
    return SourceLocation{file_, 0, 0};
  }

  [[noreturn]] void fail(const YAML::Node& node, const std::string& path, const std::string& msg) const {
    throw ConfigError(path, msg, where(node, path));
  }

  void remember(const YAML::Node& node, const std::string& path) { locations_[path] = where(node, path); }
  const std::map<std::string, SourceLocation>& locations() const { return locations_; }

  void check_map(const YAML::Node& node, const std::string& path, const std::vector<std::string>& allowed) {
    if (!node.IsMap()) fail(node, path.empty() ? std::string("(top level)") : path, "expected a mapping of keys");
    remember(node, path);
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) fail(kv.first, path.empty() ? std::string("(top level)") : path, "a key must be a plain name, not a list or mapping");
      const std::string key = kv.first.Scalar();
      // yaml-cpp keeps both pairs of a repeated key and reads the first: refuse it instead.
      const auto [first, fresh] = seen.emplace(key, kv.first.Mark());
      if (!fresh) {
        const std::string full = join(path, key);
        const YAML::Mark m = first->second;
        throw ConfigError(full, "duplicate key (first defined at " + SourceLocation{file_, m.line + 1, m.column + 1}.str() + ")",
                          where(kv.first, full));
      }
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        const std::string full = join(path, key);
        SourceLocation at = where(kv.first, full);
        std::string known;
        for (const auto& k : allowed) known += (known.empty() ? "" : ", ") + k;
        throw ConfigError(full, "unknown key" + did_you_mean(key, allowed) + "; known keys here: " + known, at);
      }
    }
  }

  std::string scalar(const YAML::Node& node, const std::string& path) {
    if (!node.IsScalar()) fail(node, path, "expected a single value");
    remember(node, path);
    // Values end up in JSON reports and messages: text must be UTF-8.
    if (!is_valid_utf8(node.Scalar())) fail(node, path, "is not valid UTF-8 text (got '" + printable(node.Scalar()) + "')");
    return node.Scalar();
  }

  int64_t integer(const YAML::Node& node, const std::string& path) {
    const std::string text = scalar(node, path);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end != text.c_str() && *end == '\0' && errno == 0) return v;
    const double d = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && *end == '\0' && std::isfinite(d) && d == std::floor(d)) {
      if (std::fabs(d) > 9e18) fail(node, path, "is far too large (got " + text + ")");
      return static_cast<int64_t>(d);
    }
    fail(node, path, "expected an integer (got '" + printable(text) + "')");
  }
  // An integer key stored in an int: out of the int range is an error at the key, never a cast
  // that wraps (zero_stage 4294967299 is not 3).
  int small_integer(const YAML::Node& node, const std::string& path) {
    const int64_t v = integer(node, path);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail(node, path, "is out of range (got " + std::to_string(v) + ")");
    return static_cast<int>(v);
  }

  double number(const YAML::Node& node, const std::string& path) {
    const std::string text = scalar(node, path);
    char* end = nullptr;
    const double d = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !std::isfinite(d)) fail(node, path, "expected a number (got '" + printable(text) + "')");
    return d;
  }

  double quantity(const YAML::Node& node, const std::string& path, Quantity kind) {
    const std::string text = scalar(node, path);
    try {
      return parse_quantity(text, kind);
    } catch (const ConfigError& e) {
      fail(node, path, e.message());
    }
  }

  bool boolean(const YAML::Node& node, const std::string& path) {
    const std::string text = scalar(node, path);
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
    fail(node, path, "expected true or false (got '" + printable(text) + "')");
  }

  template <class Parse>
  auto choice(const YAML::Node& node, const std::string& path, Parse parse) {
    const std::string text = scalar(node, path);
    try {
      return parse(text);
    } catch (const ConfigError& e) {
      fail(node, path, e.message());
    }
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, std::string> overridden_;
  std::map<std::string, SourceLocation> locations_;
};

// Nesting deeper than this is refused before yaml-cpp sees it (its own limit gives no location).
constexpr int kMaxYamlDepth = 64;

struct PrescanError {
  int line = 0, column = 0;
  std::string message;
};

// Refuses, with a location, inputs that yaml-cpp 0.7 handles badly before it sees them:
//  - nesting deeper than kMaxYamlDepth (flow brackets, or block indentation in steps of two),
//    which yaml-cpp rejects without a location;
//  - a ',' starting a value outside a flow collection ("[a]\n,", "&x ,"): invalid YAML on which
//    yaml-cpp loops forever (found by fuzzing, docs/RELIABILITY.md).
// Tracks quotes, comments, flow depth and whether the next character starts a value.
std::optional<PrescanError> prescan_yaml(const std::string& text) {
  int line = 1, column = 0, flow = 0, indent = 0;
  bool in_comment = false, line_start = true, value_start = true, in_token = false, in_name = false;
  char quote = 0, prev = '\n';
  for (char ch : text) {
    ++column;
    if (ch == '\n') {
      ++line;
      column = 0;
      in_comment = false;
      line_start = value_start = true;
      in_token = in_name = false;
      indent = 0;
      prev = ch;
      continue;
    }
    const char before = prev;
    prev = ch;
    if (in_comment) continue;
    if (quote) {
      if (ch == quote) quote = 0;
      continue;
    }
    if (line_start) {
      if (ch == ' ' || ch == '-' || ch == '\t') {
        if (++indent / 2 > kMaxYamlDepth)
          return PrescanError{line, column, "invalid YAML: nested deeper than " + std::to_string(kMaxYamlDepth) + " levels"};
        if (ch == '-') value_start = true;
        continue;
      }
      line_start = false;
    }
    if (ch == ' ' || ch == '\t') {
      in_token = in_name = false;
      continue;
    }
    if (ch == '#' && (before == ' ' || before == '\t' || before == '\n')) {
      in_comment = true;
      continue;
    }
    if (ch == '"' || ch == '\'') {
      if (value_start || flow > 0) quote = ch;
      value_start = false;
      continue;
    }
    if (ch == '[' || ch == '{') {
      if (++flow > kMaxYamlDepth)
        return PrescanError{line, column, "invalid YAML: nested deeper than " + std::to_string(kMaxYamlDepth) + " levels"};
      value_start = true;
      continue;
    }
    if ((ch == ']' || ch == '}') && flow > 0) {
      --flow;
      continue;
    }
    if (flow > 0) {
      if (ch == ',' || ch == ':') value_start = true;
      continue;
    }
    if (in_name) continue;  // inside an anchor (&name) or a tag (!tag)
    if (ch == ',' && value_start)
      return PrescanError{line, column, "invalid YAML: ',' cannot start a value outside a [list] or {mapping}"};
    if (value_start && !in_token && (ch == '&' || ch == '!')) {
      in_token = in_name = true;  // a value may still follow the anchor or tag
      continue;
    }
    if (value_start && !in_token && (ch == '?' || ch == '-')) {
      in_token = true;  // an indicator ("? key", "- item") or a sign: a value may follow
      continue;
    }
    in_token = true;
    value_start = ch == ':';  // "key:" then its value
  }
  return std::nullopt;
}

// Where each document of a YAML stream starts, for at most `limit` documents. (yaml-cpp's
// LoadAll loops forever on some invalid inputs; this loop is bounded.)
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  if (const auto bad = prescan_yaml(text)) throw ConfigError("", bad->message, SourceLocation{source, bad->line, bad->column});
  YAML::Node root;
  DocumentStarts docs;
  try {
    root = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    for (int i = 0; i < 2 && parser.HandleNextDocument(docs); ++i) {
    }
  } catch (const YAML::Exception& e) {
    const bool marked = e.mark.line >= 0;
    throw ConfigError("", "invalid YAML: " + e.msg, SourceLocation{source, marked ? e.mark.line + 1 : 0, marked ? e.mark.column + 1 : 0});
  }
  if (docs.marks.size() > 1) {
    // A second document would be ignored: say where it starts and where the first one did.
    const YAML::Mark second = docs.marks[1], first = docs.marks[0];
    const std::string first_at = first.line >= 0 ? SourceLocation{source, first.line + 1, first.column + 1}.str() : source;
    throw ConfigError("", "a second YAML document starts here; the file must hold one document (the first starts at " + first_at + ")",
                      SourceLocation{source, second.line >= 0 ? second.line + 1 : 0, second.line >= 0 ? second.column + 1 : 0});
  }
  return root;
}

// Sets root[k1][k2]… = value, creating mappings on the way. yaml-cpp nodes are references, so
// this recurses instead of re-binding a Node variable.
void set_path(YAML::Node node, const std::vector<std::string>& keys, size_t i, const YAML::Node& value,
              const std::string& override_text) {
  if (i + 1 == keys.size()) {
    node[keys[i]] = value;
    return;
  }
  YAML::Node child = node[keys[i]];
  if (child.IsDefined() && !child.IsNull() && !child.IsMap())
    throw ConfigError(keys[i], "cannot set a key inside a value that is not a mapping", SourceLocation{override_text, 0, 0});
  if (!child.IsDefined() || child.IsNull()) {
    YAML::Node fresh(YAML::NodeType::Map);
    set_path(fresh, keys, i + 1, value, override_text);
    node[keys[i]] = fresh;
  } else {
    set_path(child, keys, i + 1, value, override_text);
  }
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  return parts;
}

std::string resolve_topology_path(const std::string& ref, const std::string& relative_to) {
  const bool looks_like_path = ref.find('/') != std::string::npos || ref.ends_with(".yaml") || ref.ends_with(".yml");
  if (looks_like_path) {
    fs::path p(ref);
    if (p.is_relative() && !relative_to.empty() && !path_exists(p.string())) {
      fs::path alt = fs::path(relative_to).parent_path() / p;
      if (path_exists(alt.string())) return alt.string();
    }
    return p.string();
  }
  return (fs::path(data_dir()) / "topologies" / (ref + ".yaml")).string();
}

BandwidthCurve read_curve(Reader& r, const YAML::Node& node, const std::string& path, int* gpus_per_node) {
  BandwidthCurve curve;
  if (!node.IsDefined()) return curve;
  r.check_map(node, path, {"small_message_time", "busbw", "gpus_per_node"});
  if (node["small_message_time"]) curve.small_message_s = r.quantity(node["small_message_time"], path + ".small_message_time", Quantity::Time);
  if (node["gpus_per_node"] && gpus_per_node) *gpus_per_node = r.small_integer(node["gpus_per_node"], path + ".gpus_per_node");
  const YAML::Node pts = node["busbw"];
  if (pts.IsDefined()) {
    if (!pts.IsSequence()) r.fail(pts, path + ".busbw", "expected a list of [size, bus bandwidth] pairs");
    for (size_t i = 0; i < pts.size(); ++i) {
      const std::string p = path + ".busbw[" + std::to_string(i) + "]";
      if (!pts[i].IsSequence() || pts[i].size() != 2) r.fail(pts[i], p, "expected [size, bus bandwidth], e.g. [1MiB, 25.3GBps]");
      curve.points.emplace_back(r.quantity(pts[i][0], p, Quantity::Bytes), r.quantity(pts[i][1], p, Quantity::Bandwidth));
    }
  }
  return curve;
}

LinkSpec read_link(Reader& r, const YAML::Node& node, const std::string& path, LinkSpec link) {
  if (!node.IsDefined()) return link;
  r.check_map(node, path, {"bandwidth", "latency"});
  if (node["bandwidth"]) link.bw_Bps = r.quantity(node["bandwidth"], path + ".bandwidth", Quantity::Bandwidth);
  if (node["latency"]) link.latency_s = r.quantity(node["latency"], path + ".latency", Quantity::Time);
  return link;
}

// Reads a topology mapping; `base` is its key path in the scenario ("cluster.topology" or "").
ClusterSpec read_topology(Reader& r, const YAML::Node& node, const std::string& base) {
  const auto& schema = topology_schema();
  auto sub = [&](const std::string& rel) { return join(base, rel); };
  r.check_map(node, base, schema.at(""));
  ClusterSpec c;
  if (node["name"]) c.name = r.scalar(node["name"], sub("name"));
  if (node["nodes"]) c.max_nodes = r.small_integer(node["nodes"], sub("nodes"));
  if (const YAML::Node g = node["gpu"]) {
    r.check_map(g, sub("gpu"), schema.at("gpu"));
    if (g["name"]) c.gpu.name = r.scalar(g["name"], sub("gpu.name"));
    if (const YAML::Node t = g["gemm_rates"]) {
      const std::string path = sub("gpu.gemm_rates");
      if (!t.IsSequence()) r.fail(t, path, "expected a list of [m, n, k, FLOP/s], e.g. [[256, 128, 512, 95GFLOPS]]");
      for (size_t i = 0; i < t.size(); ++i) {
        const std::string p = path + "[" + std::to_string(i) + "]";
        if (!t[i].IsSequence() || t[i].size() != 4) r.fail(t[i], p, "expected [m, n, k, FLOP/s], e.g. [256, 128, 512, 95GFLOPS]");
        c.gpu.gemm_rates.push_back({r.integer(t[i][0], p + "[0]"), r.integer(t[i][1], p + "[1]"), r.integer(t[i][2], p + "[2]"),
                                    r.quantity(t[i][3], p + "[3]", Quantity::Flops)});
      }
    }
    if (const YAML::Node t = g["elementwise_bandwidth"]) {
      const std::string path = sub("gpu.elementwise_bandwidth");
      if (!t.IsSequence()) r.fail(t, path, "expected a list of [bytes, bandwidth], e.g. [[64KiB, 40GBps], [64MiB, 11GBps]]");
      for (size_t i = 0; i < t.size(); ++i) {
        const std::string p = path + "[" + std::to_string(i) + "]";
        if (!t[i].IsSequence() || t[i].size() != 2) r.fail(t[i], p, "expected [bytes, bandwidth], e.g. [64KiB, 40GBps]");
        c.gpu.elementwise_bandwidth.emplace_back(r.quantity(t[i][0], p, Quantity::Bytes), r.quantity(t[i][1], p, Quantity::Bandwidth));
      }
    }
    for (const auto& f : gpu_fields()) {
      const YAML::Node v = g[f.key];
      if (!v) continue;
      const std::string path = sub(std::string("gpu.") + f.key);
      switch (f.kind) {
        case GpuFieldKind::Number: set_gpu_field(c.gpu, f, r.number(v, path)); break;
        case GpuFieldKind::Integer: set_gpu_field(c.gpu, f, static_cast<double>(r.integer(v, path))); break;
        case GpuFieldKind::Flag: set_gpu_field(c.gpu, f, r.boolean(v, path) ? 1 : 0); break;
        case GpuFieldKind::Bytes: set_gpu_field(c.gpu, f, r.quantity(v, path, Quantity::Bytes)); break;
        case GpuFieldKind::Flops: set_gpu_field(c.gpu, f, r.quantity(v, path, Quantity::Flops)); break;
        case GpuFieldKind::Bandwidth: set_gpu_field(c.gpu, f, r.quantity(v, path, Quantity::Bandwidth)); break;
        case GpuFieldKind::Time: set_gpu_field(c.gpu, f, r.quantity(v, path, Quantity::Time)); break;
        case GpuFieldKind::Power: set_gpu_field(c.gpu, f, r.quantity(v, path, Quantity::Power)); break;
      }
    }
  }
  if (const YAML::Node n = node["node"]) {
    r.check_map(n, sub("node"), schema.at("node"));
    if (n["gpus"]) c.gpus_per_node = r.small_integer(n["gpus"], sub("node.gpus"));
    if (n["cores"]) c.cores_per_node = r.number(n["cores"], sub("node.cores"));
    if (n["wakeup_latency"]) c.wakeup_latency_s = r.quantity(n["wakeup_latency"], sub("node.wakeup_latency"), Quantity::Time);
    if (n["power"]) c.node_power_w = r.quantity(n["power"], sub("node.power"), Quantity::Power);
    if (n["host_link"]) c.host_link = read_link(r, n["host_link"], sub("node.host_link"), c.host_link);
    if (n["host_memory"]) c.host_memory_bytes = r.quantity(n["host_memory"], sub("node.host_memory"), Quantity::Bytes);
    if (n["host_memory_bandwidth"])
      c.host_memory_Bps = r.quantity(n["host_memory_bandwidth"], sub("node.host_memory_bandwidth"), Quantity::Bandwidth);
    if (const YAML::Node l = n["nvlink"]) {
      r.check_map(l, sub("node.nvlink"), schema.at("node.nvlink"));
      if (l["bandwidth"]) c.nvlink.bw_Bps = r.quantity(l["bandwidth"], sub("node.nvlink.bandwidth"), Quantity::Bandwidth);
      if (l["latency"]) c.nvlink.latency_s = r.quantity(l["latency"], sub("node.nvlink.latency"), Quantity::Time);
    }
  }
  if (const YAML::Node n = node["network"]) {
    r.check_map(n, sub("network"), schema.at("network"));
    if (n["nics_per_node"]) c.nics_per_node = r.small_integer(n["nics_per_node"], sub("network.nics_per_node"));
    if (const YAML::Node l = n["nic"]) {
      r.check_map(l, sub("network.nic"), schema.at("network.nic"));
      if (l["bandwidth"]) c.nic.bw_Bps = r.quantity(l["bandwidth"], sub("network.nic.bandwidth"), Quantity::Bandwidth);
      if (l["latency"]) c.nic.latency_s = r.quantity(l["latency"], sub("network.nic.latency"), Quantity::Time);
    }
    c.pcie = read_link(r, n["pcie"], sub("network.pcie"), c.pcie);
    if (const YAML::Node f = n["fabric"]) {
      r.check_map(f, sub("network.fabric"), schema.at("network.fabric"));
      if (f["kind"]) {
        const std::string kind = r.scalar(f["kind"], sub("network.fabric.kind"));
        if (kind != "fat_tree") r.fail(f["kind"], sub("network.fabric.kind"), "unknown fabric '" + kind + "', expected fat_tree" + did_you_mean(kind, {"fat_tree"}));
      }
      if (f["levels"]) c.fabric.levels = r.small_integer(f["levels"], sub("network.fabric.levels"));
      if (f["oversubscription"]) c.fabric.oversubscription = r.number(f["oversubscription"], sub("network.fabric.oversubscription"));
      if (f["leaf_radix"]) c.fabric.leaf_radix = r.small_integer(f["leaf_radix"], sub("network.fabric.leaf_radix"));
      if (f["switch_latency"]) c.fabric.switch_latency_s = r.quantity(f["switch_latency"], sub("network.fabric.switch_latency"), Quantity::Time);
    }
  }
  if (const YAML::Node cal = node["calibration"]) {
    r.check_map(cal, sub("calibration"), schema.at("calibration"));
    if (const YAML::Node m = cal["measured_on"]) {
      const std::string path = sub("calibration.measured_on");
      r.check_map(m, path, schema.at("calibration.measured_on"));
      c.measured_on.recorded = true;
      c.measured_on.nvlink = read_link(r, m["nvlink"], path + ".nvlink", {});
      c.measured_on.nic = read_link(r, m["nic"], path + ".nic", {});
      c.measured_on.pcie = read_link(r, m["pcie"], path + ".pcie", {});
      if (m["switch_latency"]) c.measured_on.switch_latency_s = r.quantity(m["switch_latency"], path + ".switch_latency", Quantity::Time);
    }
    c.intra_node_allreduce = read_curve(r, cal["intra_node_allreduce"], sub("calibration.intra_node_allreduce"),
                                        &c.intra_node_reference_gpus);
    c.inter_node_allreduce = read_curve(r, cal["inter_node_allreduce"], sub("calibration.inter_node_allreduce"),
                                        &c.inter_node_reference_gpus_per_node);
    c.oversubscribed_allreduce = read_curve(r, cal["oversubscribed_allreduce"], sub("calibration.oversubscribed_allreduce"), nullptr);
    c.intra_node_ring = read_curve(r, cal["intra_node_ring"], sub("calibration.intra_node_ring"), nullptr);
  }
  try {
    validate_cluster(c);
  } catch (const ConfigError& e) {
    // validate_cluster names keys under "cluster.topology"; re-root them at `base`.
    std::string key = e.key_path();
    const std::string root = "cluster.topology";
    if (key.rfind(root, 0) == 0) key = join(base, key.size() > root.size() ? key.substr(root.size() + 1) : "");
    const auto& locs = r.locations();
    auto it = locs.find(key);
    throw ConfigError::rule(key, e.message()).located(it != locs.end() ? it->second : SourceLocation{r.file(), 0, 0});
  }
  return c;
}

json topology_json(const ClusterSpec& c) {
  json gpu = {{"name", c.gpu.name}};
  for (const auto& f : gpu_fields()) {
    if (f.kind == GpuFieldKind::Flag)
      gpu[f.member] = c.gpu.*f.flag;
    else if (f.kind == GpuFieldKind::Integer)
      gpu[f.member] = c.gpu.*f.integer;
    else
      gpu[f.member] = c.gpu.*f.number;
  }
  json curve_intra = json::array(), curve_inter = json::array();
  for (auto [s, b] : c.intra_node_allreduce.points) curve_intra.push_back({s, b});
  for (auto [s, b] : c.inter_node_allreduce.points) curve_inter.push_back({s, b});
  return {{"name", c.name},
          {"gpu", gpu},
          {"node_power_w", c.node_power_w},
          {"host_link", {{"bw_Bps", c.host_link.bw_Bps}, {"latency_s", c.host_link.latency_s}}},
          {"host_memory_bytes", c.host_memory_bytes},
          {"host_memory_Bps", c.host_memory_Bps},
          {"gpus_per_node", c.gpus_per_node},
          {"cores_per_node", c.cores_per_node},
          {"wakeup_latency_s", c.wakeup_latency_s},
          {"nodes", c.max_nodes},
          {"nvlink", {{"bw_Bps", c.nvlink.bw_Bps}, {"latency_s", c.nvlink.latency_s}}},
          {"nic", {{"bw_Bps", c.nic.bw_Bps}, {"latency_s", c.nic.latency_s}}},
          {"pcie", {{"bw_Bps", c.pcie.bw_Bps}, {"latency_s", c.pcie.latency_s}}},
          {"nics_per_node", c.nics_per_node},
          {"fabric",
           {{"kind", "fat_tree"},
            {"levels", c.fabric.levels},
            {"oversubscription", c.fabric.oversubscription},
            {"leaf_radix", c.fabric.leaf_radix},
            {"switch_latency_s", c.fabric.switch_latency_s}}},
          {"intra_node_allreduce_busbw", curve_intra},
          {"inter_node_allreduce_busbw", curve_inter}};
}

// cluster.gpu_power_w: a power limit below the board's TDP lowers the clock the GPU sustains;
// compute-bound kernels (GEMMs, attention) run at that clock's share of peak, memory-bound ones at
// the full HBM bandwidth. Energy figures use the limit as the busy power.
void apply_power_limit(Reader& r, const YAML::Node& node, Scenario& sc) {
  const double limit = r.quantity(node, "cluster.gpu_power_w", Quantity::Power);
  GpuSpec& gpu = sc.cluster.gpu;
  if (!(gpu.power_w > 0))
    r.fail(node, "cluster.gpu_power_w", "needs the GPU's TDP (cluster.topology gpu.power), which " + gpu.name + " (cluster.topology " +
                                             sc.topology_ref + ") does not give");
  auto watts = [](double w) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f W", w);
    return std::string(buf);
  };
  if (!(limit >= gpu.power_w / 4 && limit <= gpu.power_w))
    r.fail(node, "cluster.gpu_power_w", "must lie between a quarter of the TDP and the TDP of " + gpu.name + ", [" + watts(gpu.power_w / 4) +
                                             ", " + watts(gpu.power_w) + "] (got " + watts(limit) + ")");
  const double f = sustained_clock_factor(limit, gpu.power_w);
  gpu.peak_flops *= f;
  gpu.fp8_peak_flops *= f;
  gpu.power_w = limit;
  gpu.idle_power_w = std::min(gpu.idle_power_w, limit);
}

// A key a section must have.
YAML::Node required(Reader& r, const YAML::Node& parent, const std::string& section, const char* key) {
  if (!parent[key]) throw ConfigError(section + "." + key, "missing (required)", r.where(parent, section));
  return parent[key];
}

using TopologyOverrides = std::vector<std::pair<Override, YAML::Node>>;

// model: the transformer (and its experts).
void read_model(Reader& r, const YAML::Node& m, Scenario& sc) {
  const auto& schema = scenario_schema();
  r.check_map(m, "model", schema.at("model"));
  if (m["name"]) sc.model.name = r.scalar(m["name"], "model.name");
  sc.model.num_layers = r.integer(required(r, m, "model", "num_layers"), "model.num_layers");
  sc.model.hidden_size = r.integer(required(r, m, "model", "hidden_size"), "model.hidden_size");
  sc.model.num_attention_heads = r.integer(required(r, m, "model", "num_attention_heads"), "model.num_attention_heads");
  if (m["ffn_hidden_size"]) sc.model.ffn_hidden_size = r.integer(m["ffn_hidden_size"], "model.ffn_hidden_size");
  sc.model.seq_length = r.integer(required(r, m, "model", "seq_length"), "model.seq_length");
  sc.model.vocab_size = r.integer(required(r, m, "model", "vocab_size"), "model.vocab_size");
  if (m["vocab_divisible_by"]) {
    sc.model.vocab_divisible_by = r.integer(m["vocab_divisible_by"], "model.vocab_divisible_by");
    if (sc.model.vocab_divisible_by < 1 || sc.model.vocab_divisible_by > 1'000'000)
      r.fail(m["vocab_divisible_by"], "model.vocab_divisible_by", "must be in [1, 1000000] (got " + std::to_string(sc.model.vocab_divisible_by) + ")");
  }
  if (m["padded_vocab_size"]) {
    sc.model.padded_vocab_size = r.integer(m["padded_vocab_size"], "model.padded_vocab_size");
    if (sc.model.padded_vocab_size != 0 &&
        (sc.model.padded_vocab_size < sc.model.vocab_size || sc.model.padded_vocab_size > 100'000'000))
      r.fail(m["padded_vocab_size"], "model.padded_vocab_size",
             "must be 0 (computed) or at least model.vocab_size (" + std::to_string(sc.model.vocab_size) + ") and at most 100000000 (got " +
                 std::to_string(sc.model.padded_vocab_size) + ")");
  }
  if (m["num_query_groups"]) sc.model.num_query_groups = r.integer(m["num_query_groups"], "model.num_query_groups");
  if (m["head_dim"]) {
    sc.model.head_dim_size = r.integer(m["head_dim"], "model.head_dim");
    // Flash attention and rotary embeddings work on heads of an even width, at most 256 wide
    // (FlashAttention's and cuDNN's kernels); the heads must also tile the tensor-parallel split.
    if (sc.model.head_dim_size < 2 || sc.model.head_dim_size > 1024 || sc.model.head_dim_size % 2 != 0)
      r.fail(m["head_dim"], "model.head_dim", "must be an even width in [2, 1024] (rotary embeddings rotate pairs of channels) (got " +
                                                  std::to_string(sc.model.head_dim_size) + ")");
  }
  if (m["mlp"]) sc.model.mlp = r.choice(m["mlp"], "model.mlp", parse_mlp_kind);
  if (m["normalization"]) sc.model.normalization = r.choice(m["normalization"], "model.normalization", parse_norm_kind);
  if (m["tie_embeddings"]) sc.model.tie_embeddings = r.boolean(m["tie_embeddings"], "model.tie_embeddings");
  if (m["attention"]) sc.model.attention = r.choice(m["attention"], "model.attention", parse_attention_kind);
  if (m["dropout"]) {
    sc.model.dropout = r.number(m["dropout"], "model.dropout");
    if (!(sc.model.dropout >= 0 && sc.model.dropout < 1))
      r.fail(m["dropout"], "model.dropout", "must be a probability in [0, 1) (got " + r.scalar(m["dropout"], "model.dropout") + ")");
  }
  if (m["bias"]) sc.model.bias = r.boolean(m["bias"], "model.bias") ? 1 : 0;
  if (m["position_embedding"])
    sc.model.position_embedding = r.choice(m["position_embedding"], "model.position_embedding", parse_position_kind);
  if (m["rotary_base"]) {
    sc.model.rotary_base = r.number(m["rotary_base"], "model.rotary_base");
    if (!(sc.model.rotary_base > 1 && sc.model.rotary_base < 1e12))
      r.fail(m["rotary_base"], "model.rotary_base", "must be above 1 (got " + r.scalar(m["rotary_base"], "model.rotary_base") + ")");
  }
  if (m["rotary_percent"]) {
    sc.model.rotary_percent = r.number(m["rotary_percent"], "model.rotary_percent");
    if (!(sc.model.rotary_percent > 0 && sc.model.rotary_percent <= 1))
      r.fail(m["rotary_percent"], "model.rotary_percent", "must be in (0, 1] (got " + r.scalar(m["rotary_percent"], "model.rotary_percent") + ")");
  }
  if (m["mtp_layers"]) {
    sc.model.mtp_layers = r.integer(m["mtp_layers"], "model.mtp_layers");
    if (sc.model.mtp_layers < 0 || sc.model.mtp_layers > 16)
      r.fail(m["mtp_layers"], "model.mtp_layers", "must be in [0, 16] (got " + std::to_string(sc.model.mtp_layers) + ")");
  }
  if (m["mtp_loss_scale"]) {
    sc.model.mtp_loss_scale = r.number(m["mtp_loss_scale"], "model.mtp_loss_scale");
    if (!(sc.model.mtp_loss_scale >= 0 && sc.model.mtp_loss_scale <= 100))
      r.fail(m["mtp_loss_scale"], "model.mtp_loss_scale", "must be in [0, 100] (got " + r.scalar(m["mtp_loss_scale"], "model.mtp_loss_scale") + ")");
  }
  if (const YAML::Node mla = m["mla"]) {
    r.check_map(mla, "model.mla", schema.at("model.mla"));
    if (!mla["kv_lora_rank"]) r.fail(mla, "model.mla.kv_lora_rank", "missing (required with model.mla)");
    MlaSpec& a = sc.model.mla;
    for (auto [key, field] : {std::pair<const char*, int64_t*>{"q_lora_rank", &a.q_lora_rank}, {"kv_lora_rank", &a.kv_lora_rank},
                              {"qk_head_dim", &a.qk_head_dim}, {"qk_pos_emb_head_dim", &a.qk_pos_emb_head_dim}, {"v_head_dim", &a.v_head_dim}}) {
      if (!mla[key]) continue;
      const std::string path = std::string("model.mla.") + key;
      *field = r.integer(mla[key], path);
      // kv_lora_rank 0: no MLA (the preset's attention as grouped-query attention).
      const int64_t lo = key == std::string("q_lora_rank") || key == std::string("qk_pos_emb_head_dim") || key == std::string("kv_lora_rank") ? 0 : 1;
      if (*field < lo || *field > 1'000'000)
        r.fail(mla[key], path, "must be in [" + std::to_string(lo) + ", 1000000] (got " + std::to_string(*field) + ")");
    }
  }
  if (const YAML::Node moe = m["moe"]) {
    r.check_map(moe, "model.moe", schema.at("model.moe"));
    MoeSpec& e = sc.model.moe;
    auto count = [&](const char* key, int64_t lo, int64_t hi) {
      const std::string path = std::string("model.moe.") + key;
      const int64_t v = r.integer(moe[key], path);
      if (v < lo || v > hi)
        r.fail(moe[key], path, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + std::to_string(v) + ")");
      return v;
    };
    if (!moe["num_experts"]) r.fail(moe, "model.moe.num_experts", "missing (required with model.moe)");
    e.num_experts = count("num_experts", 1, 100'000);
    if (moe["top_k"]) e.top_k = count("top_k", 1, 100'000);
    if (e.top_k > e.num_experts)
      r.fail(moe["top_k"] ? moe["top_k"] : moe, "model.moe.top_k",
             "each token picks top_k of num_experts experts: " + std::to_string(e.top_k) + " > " + std::to_string(e.num_experts));
    if (moe["expert_ffn_hidden_size"]) e.expert_ffn_hidden_size = count("expert_ffn_hidden_size", 1, 10'000'000);
    if (moe["shared_experts"]) e.shared_experts = count("shared_experts", 0, 1'000);
    if (moe["shared_expert_ffn_hidden_size"]) e.shared_expert_ffn_hidden_size = count("shared_expert_ffn_hidden_size", 1, 10'000'000);
    if (moe["moe_layer_frequency"]) e.layer_frequency = count("moe_layer_frequency", 1, 100'000);
    if (moe["first_dense_layers"]) e.first_dense_layers = count("first_dense_layers", 0, 100'000);
    if (moe["capacity_factor"]) {
      const std::string text = r.scalar(moe["capacity_factor"], "model.moe.capacity_factor");
      if (text != "none") {
        e.capacity_factor = r.number(moe["capacity_factor"], "model.moe.capacity_factor");
        if (!(e.capacity_factor > 0 && e.capacity_factor <= 1000))
          r.fail(moe["capacity_factor"], "model.moe.capacity_factor", "must be positive (or none for dropless) (got " + text + ")");
      }
    }
    if (moe["router_load_balance"]) {
      const std::string lb = r.scalar(moe["router_load_balance"], "model.moe.router_load_balance");
      if (lb != "aux_loss" && lb != "aux_free")
        r.fail(moe["router_load_balance"], "model.moe.router_load_balance",
               "unknown load balancing '" + printable(lb) + "', expected aux_loss or aux_free" + did_you_mean(lb, {"aux_loss", "aux_free"}));
      e.aux_free = lb == "aux_free";
    }
    if (moe["imbalance"]) {
      e.imbalance = r.number(moe["imbalance"], "model.moe.imbalance");
      if (!(e.imbalance >= 1 && e.imbalance <= static_cast<double>(e.num_experts)))
        r.fail(moe["imbalance"], "model.moe.imbalance",
               "the busiest expert's load over the mean: in [1, num_experts] (got " + r.scalar(moe["imbalance"], "model.moe.imbalance") + ")");
    }
    if (sc.model.num_layers > 0 && e.first_dense_layers >= sc.model.num_layers)
      r.fail(moe["first_dense_layers"], "model.moe.first_dense_layers",
             "leaves no MoE layer (" + std::to_string(e.first_dense_layers) + " of " + std::to_string(sc.model.num_layers) + " layers dense)");
  }
}

// cluster: the GPU count and the topology (a preset, a file, or inline), with --set overrides
// of topology keys applied to the topology's own YAML.
void read_cluster(Reader& r, const YAML::Node& c, const std::string& source, const TopologyOverrides& topology_overrides,
                  Scenario& sc) {
  const auto& schema = scenario_schema();
  r.check_map(c, "cluster", schema.at("cluster"));
  sc.gpus = r.integer(required(r, c, "cluster", "gpus"), "cluster.gpus");
  const YAML::Node topo = required(r, c, "cluster", "topology");
  if (topo.IsScalar()) {
    sc.topology_ref = r.scalar(topo, "cluster.topology");
    const std::string path = resolve_topology_path(sc.topology_ref, source);
    if (!path_exists(path)) {
      const auto presets = topology_presets();
      std::string list;
      for (const auto& p : presets) list += (list.empty() ? "" : ", ") + p;
      r.fail(topo, "cluster.topology", "no topology preset or file '" + sc.topology_ref + "'" + did_you_mean(sc.topology_ref, presets) +
                                           " (presets: " + list + ")");
    }
    YAML::Node tnode = parse_yaml(read_input_file(path, "topology file"), path);
    for (const auto& [o, value] : topology_overrides)
      set_path(tnode, split_key(o.key.substr(std::string("cluster.topology.").size())), 0, value, "--set " + o.key + "=" + o.value);
    std::map<std::string, std::string> topo_overridden;
    for (const auto& [o, value] : topology_overrides) topo_overridden[o.key] = "--set " + o.key + "=" + o.value;
    Reader tr(path, topo_overridden);
    sc.cluster = read_topology(tr, tnode, "cluster.topology");
    sc.cluster.source = path;
  } else {
    YAML::Node inline_topo = topo;
    for (const auto& [o, value] : topology_overrides)
      set_path(inline_topo, split_key(o.key.substr(17)), 0, value, "--set " + o.key + "=" + o.value);
    sc.topology_ref = "inline";
    sc.cluster = read_topology(r, inline_topo, "cluster.topology");
    sc.cluster.source = source;
  }
  if (c["gpu_power_w"]) apply_power_limit(r, c["gpu_power_w"], sc);
}

// parallel: the layout, schedule and the mechanisms of the plan.
void read_parallel(Reader& r, const YAML::Node& p, Scenario& sc) {
  const auto& schema = scenario_schema();
  r.check_map(p, "parallel", schema.at("parallel"));
  auto& plan = sc.plan;
  if (p["tensor"]) plan.tensor = r.integer(p["tensor"], "parallel.tensor");
  if (p["pipeline"]) plan.pipeline = r.integer(p["pipeline"], "parallel.pipeline");
  if (p["context"]) plan.context = r.integer(p["context"], "parallel.context");
  if (p["context_comm"]) plan.context_comm = r.choice(p["context_comm"], "parallel.context_comm", parse_context_comm);
  if (p["expert"]) plan.expert = r.integer(p["expert"], "parallel.expert");
  if (p["expert_tensor"]) {
    plan.expert_tensor = r.integer(p["expert_tensor"], "parallel.expert_tensor");
    if (plan.expert_tensor < 1)
      r.fail(p["expert_tensor"], "parallel.expert_tensor", "must be a positive integer (got " + std::to_string(plan.expert_tensor) + ")");
  }
  if (p["moe_comm_overlap"]) plan.moe_comm_overlap = r.boolean(p["moe_comm_overlap"], "parallel.moe_comm_overlap");
  if (p["moe_dispatcher"]) plan.moe_dispatcher = r.choice(p["moe_dispatcher"], "parallel.moe_dispatcher", parse_moe_dispatcher);
  if (p["virtual_stages"]) plan.virtual_stages = r.integer(p["virtual_stages"], "parallel.virtual_stages");
  if (p["schedule"]) plan.schedule = r.choice(p["schedule"], "parallel.schedule", parse_schedule_kind);
  if (p["recompute"]) plan.recompute = r.choice(p["recompute"], "parallel.recompute", parse_recompute);
  if (const YAML::Node list = p["recompute_modules"]) {
    // Megatron's --recompute-modules: a list of module names, or one name.
    plan.recompute_modules = 0;
    if (list.IsSequence()) {
      r.remember(list, "parallel.recompute_modules");
      for (size_t i = 0; i < list.size(); ++i)
        plan.recompute_modules |= r.choice(list[i], "parallel.recompute_modules[" + std::to_string(i) + "]", parse_recompute_module);
    } else {
      plan.recompute_modules = r.choice(list, "parallel.recompute_modules", parse_recompute_module);
    }
  }
  if (p["optimizer_sync"])
    plan.optimizer_sync = r.choice(p["optimizer_sync"], "parallel.optimizer_sync", parse_optimizer_sync);
  if (p["scatter_gather"]) plan.scatter_gather = r.boolean(p["scatter_gather"], "parallel.scatter_gather");
  if (p["overlap_p2p"]) plan.overlap_p2p = r.boolean(p["overlap_p2p"], "parallel.overlap_p2p");
  if (p["sequence_parallel"]) plan.sequence_parallel = r.boolean(p["sequence_parallel"], "parallel.sequence_parallel");
  if (p["microbatch_group"]) {
    plan.microbatch_group = r.integer(p["microbatch_group"], "parallel.microbatch_group");
    if (plan.microbatch_group < 1)
      r.fail(p["microbatch_group"], "parallel.microbatch_group",
             "must be a positive integer, or absent for the default (got " + std::to_string(plan.microbatch_group) + ")");
  }
  if (const YAML::Node list = p["layers_per_stage"]) {
    if (!list.IsSequence())  // [] = not set (e.g. to clear a file's list with --set)
      r.fail(list, "parallel.layers_per_stage", "expected a list of layer counts, one per stage, e.g. [5, 6, 6, 5]");
    r.remember(list, "parallel.layers_per_stage");
    for (size_t i = 0; i < list.size(); ++i)
      plan.layers_per_stage.push_back(r.integer(list[i], "parallel.layers_per_stage[" + std::to_string(i) + "]"));
  }
  if (p["pipeline_layout"]) {
    // Megatron's --pipeline-model-parallel-layout; "" = not set (to clear a file's with --set).
    const auto stages = r.choice(p["pipeline_layout"], "parallel.pipeline_layout", [](const std::string& text) {
      return text.empty() ? std::vector<LayoutStage>{} : parse_pipeline_layout(text, "parallel.pipeline_layout");
    });
    for (const LayoutStage& st : stages) {
      plan.layout_layers.push_back(st.layers);
      plan.layout_mtp.push_back(st.mtp);
    }
  }
  if (p["first_stage_layers"]) plan.first_stage_layers = r.integer(p["first_stage_layers"], "parallel.first_stage_layers");
  if (p["last_stage_layers"]) plan.last_stage_layers = r.integer(p["last_stage_layers"], "parallel.last_stage_layers");
  if (p["account_for_embedding_in_pipeline_split"])
    plan.account_embedding_in_split =
        r.boolean(p["account_for_embedding_in_pipeline_split"], "parallel.account_for_embedding_in_pipeline_split");
  if (p["account_for_loss_in_pipeline_split"])
    plan.account_loss_in_split = r.boolean(p["account_for_loss_in_pipeline_split"], "parallel.account_for_loss_in_pipeline_split");
  if (p["vocab_parallel_pipeline"])
    plan.vocab_parallel_pipeline = r.boolean(p["vocab_parallel_pipeline"], "parallel.vocab_parallel_pipeline");
  if (p["partition"]) plan.partition = r.choice(p["partition"], "parallel.partition", parse_partition);
  if (p["fsdp"]) {
    if (p["zero_stage"] || p["sharding_group"])
      r.fail(p["fsdp"], "parallel.fsdp", "spells zero_stage and sharding_group; give either fsdp or those keys, not both");
    r.choice(p["fsdp"], "parallel.fsdp", [&](const std::string& text) {
      apply_fsdp_strategy(text, plan);
      return 0;
    });
  }
  if (p["zero_stage"]) plan.zero_stage = r.small_integer(p["zero_stage"], "parallel.zero_stage");
  if (p["sharding_group"]) plan.sharding_group = r.choice(p["sharding_group"], "parallel.sharding_group", parse_sharding_group);
  if (p["offload"]) plan.offload = r.choice(p["offload"], "parallel.offload", parse_offload);
  if (p["overlap_grad_reduce"]) plan.overlap_grad_reduce = r.boolean(p["overlap_grad_reduce"], "parallel.overlap_grad_reduce");
  if (p["overlap_param_gather"]) plan.overlap_param_gather = r.boolean(p["overlap_param_gather"], "parallel.overlap_param_gather");
  if (p["tp_comm_overlap"]) plan.tp_comm_overlap = r.boolean(p["tp_comm_overlap"], "parallel.tp_comm_overlap");
  if (p["bucket_size"]) {
    const double bucket = r.quantity(p["bucket_size"], "parallel.bucket_size", Quantity::Count);
    if (!(bucket >= 0 && bucket <= 1e15))
      r.fail(p["bucket_size"], "parallel.bucket_size", "must be a parameter count in [0, 10¹⁵] (got " + r.scalar(p["bucket_size"], "parallel.bucket_size") + ")");
    plan.bucket_size = static_cast<int64_t>(bucket);
  }
  if (p["max_inflight_gathers"]) plan.max_inflight_gathers = r.integer(p["max_inflight_gathers"], "parallel.max_inflight_gathers");
  if (const YAML::Node n = p["reshard_after_forward"]) {
    // FSDP2's bool or int: true (reshard over the whole group), false (keep whole) or a group size.
    const std::string text = r.scalar(n, "parallel.reshard_after_forward");
    if (text == "true" || text == "false")
      plan.reshard_after_forward = text == "true" ? ParallelPlan::kReshardFull : 1;
    else if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      r.fail(n, "parallel.reshard_after_forward", "expected true, false or a group size (got '" + printable(text) + "')");
    else
      plan.reshard_after_forward = r.small_integer(n, "parallel.reshard_after_forward");
  }
  plan.node_gpus = sc.cluster.gpus_per_node;
  plan.gpu_runtime_memory = !sc.cluster.cpu_host();
  plan.nvls = !sc.cluster.intra_node_ring.empty();
  for (auto [key, value] : {std::pair{"tensor", plan.tensor}, std::pair{"pipeline", plan.pipeline}, std::pair{"context", plan.context},
                            std::pair{"expert", plan.expert}})
    if (value <= 0)
      throw ConfigError::rule(std::string("parallel.") + key, "must be a positive integer (got " + std::to_string(value) + ")")
          .located(r.where(p[key], std::string("parallel.") + key));
  if (p["data"]) {
    plan.data = r.integer(p["data"], "parallel.data");
  } else {
    // validate_plan reports sizes that do not fit; avoid overflowing the product here.
    const bool fits = plan.tensor <= sc.gpus && plan.pipeline <= sc.gpus && plan.context <= sc.gpus && sc.gpus > 0 &&
                      plan.tensor * plan.pipeline <= sc.gpus / plan.context;
    plan.data = fits ? std::max<int64_t>(1, sc.gpus / (plan.tensor * plan.pipeline * plan.context)) : 1;
  }
}

// training: batch, precision, framework and the token budget.
void read_training(Reader& r, const YAML::Node& t, Scenario& sc) {
  const auto& schema = scenario_schema();
  auto& plan = sc.plan;
  r.check_map(t, "training", schema.at("training"));
  plan.global_batch = r.integer(required(r, t, "training", "global_batch"), "training.global_batch");
  if (t["micro_batch"]) plan.micro_batch = r.integer(t["micro_batch"], "training.micro_batch");
  if (t["precision"]) plan.precision = r.choice(t["precision"], "training.precision", parse_precision);
  if (t["fp8_format"]) plan.fp8_format = r.choice(t["fp8_format"], "training.fp8_format", parse_fp8_format);
  if (t["fp8_param_gather"]) plan.fp8_param_gather = r.boolean(t["fp8_param_gather"], "training.fp8_param_gather");
  if (t["fp8_recipe"]) plan.fp8_recipe = r.choice(t["fp8_recipe"], "training.fp8_recipe", parse_fp8_recipe);
  if (t["framework"]) plan.framework = r.choice(t["framework"], "training.framework", parse_framework);
  if (t["attention_kernel"]) plan.attention_kernel = r.choice(t["attention_kernel"], "training.attention_kernel", parse_attention_kernel);
  if (t["expandable_segments"]) plan.expandable_segments = r.boolean(t["expandable_segments"], "training.expandable_segments");
  // A CPU host has no FP8 units: its executor emulates the casts (exec/runtime/fp8.hpp) and the
  // engines price its GEMMs at the host's rate, the casts as the element-wise passes they are.
  const bool fp8_emulated = sc.cluster.cpu_host();
  if (plan.precision == Precision::FP8 && !(sc.cluster.gpu.fp8_peak_flops > 0) && !fp8_emulated)
    r.fail(t["precision"], "training.precision",
           "fp8 needs FP8 tensor cores, and " + sc.cluster.gpu.name + " (cluster.topology " + sc.topology_ref +
               ") has none (no gpu.fp8_peak_flops): use bf16, or an H100/H200/B200/GB200 cluster");
  if (plan.precision == Precision::FP8 && plan.fp8_recipe == Fp8Recipe::MXFP8 && !sc.cluster.gpu.mx_formats && !fp8_emulated)
    r.fail(t["fp8_recipe"], "training.fp8_recipe",
           "mxfp8 needs tensor cores with microscaling formats, and " + sc.cluster.gpu.name + " (cluster.topology " + sc.topology_ref +
               ") has none (gpu.mx_formats false): use tensorwise, rowwise or blockwise, or a B200/GB200 cluster");
  if (t["train_tokens"]) {
    const double tokens = r.quantity(t["train_tokens"], "training.train_tokens", Quantity::Count);
    // Bounded so that days, GPU-hours and cost stay finite numbers (exit-0 output never says inf).
    if (!(tokens > 0 && tokens <= 1e18))
      r.fail(t["train_tokens"], "training.train_tokens", "must be a token count in (0, 10¹⁸] (got " + r.scalar(t["train_tokens"], "training.train_tokens") + ")");
    sc.train_tokens = tokens;
  }
}

// The optional top-level sections: not_modelled and cost.
void read_optional_sections(Reader& r, const YAML::Node& root, Scenario& sc) {
  const auto& schema = scenario_schema();
  // not_modelled (optional): a list of text.
  if (const YAML::Node nm = root["not_modelled"]) {
    if (!nm.IsSequence()) r.fail(nm, "not_modelled", "expected a list of text (- item per line)");
    r.remember(nm, "not_modelled");
    for (size_t k = 0; k < nm.size(); ++k) {
      if (k >= 1000) r.fail(nm, "not_modelled", "more than 1000 items");
      sc.not_modelled.push_back(r.scalar(nm[k], "not_modelled[" + std::to_string(k) + "]"));
    }
  }
  // cost (optional): prices in US dollars.
  if (const YAML::Node cost = root["cost"]) {
    r.check_map(cost, "cost", schema.at("cost"));
    auto price = [&](const char* key) {
      const std::string path = std::string("cost.") + key;
      const double v = r.number(cost[key], path);
      if (!(v >= 0 && v <= 1e6)) r.fail(cost[key], path, "must be a price in US dollars in [0, 10⁶] (got " + r.scalar(cost[key], path) + ")");
      return v;
    };
    if (cost["gpu_hour_price"]) sc.gpu_hour_usd = price("gpu_hour_price");
    if (cost["energy_price"]) sc.energy_usd_per_kwh = price("energy_price");
  }
}

Scenario build(const YAML::Node& root_in, const std::string& source, const std::vector<Override>& overrides) {
  YAML::Node root = root_in;  // parsed for this call: overrides may edit it (Clone would lose marks)
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  std::map<std::string, std::string> overridden;
  std::vector<std::pair<Override, YAML::Node>> topology_overrides;
  for (const auto& o : overrides) {
    const std::string where = "--set " + o.key + "=" + o.value;
    YAML::Node value;
    try {
      value = YAML::Load(o.value);
    } catch (const YAML::Exception& e) {
      throw ConfigError(o.key, "cannot parse the value: " + e.msg, SourceLocation{where, 0, 0});
    }
    overridden[o.key] = where;
    if (o.key.rfind("cluster.topology.", 0) == 0) {
      topology_overrides.emplace_back(o, value);
      continue;
    }
    // Reject unknown keys early, with the closest known key.
    const auto& keys = scenario_keys();
    if (std::find(keys.begin(), keys.end(), o.key) == keys.end())
      throw ConfigError(o.key, "unknown key" + did_you_mean(o.key, keys), SourceLocation{where, 0, 0});
    set_path(root, split_key(o.key), 0, value, where);
  }

  Reader r(source, overridden);
  const auto& schema = scenario_schema();
  r.check_map(root, "", schema.at(""));
  auto section = [&](const char* name) {
    if (!root[name]) throw ConfigError(name, "missing section", SourceLocation{source, 0, 0});
    return root[name];
  };

  Scenario sc;
  sc.source = source;
  read_model(r, section("model"), sc);
  read_cluster(r, section("cluster"), source, topology_overrides, sc);
  read_parallel(r, section("parallel"), sc);
  read_training(r, section("training"), sc);
  read_optional_sections(r, root, sc);
  auto& plan = sc.plan;

  auto located = [&](const ConfigError& e) {
    const auto& locs = r.locations();
    std::string key = e.key_path();
    auto it = locs.find(key);
    // "parallel.data" may be implied: point at its section then.
    while (it == locs.end() && key.find('.') != std::string::npos) {
      key = key.substr(0, key.rfind('.'));
      it = locs.find(key);
    }
    return e.located(it != locs.end() ? it->second : SourceLocation{source, 0, 0});
  };
  try {
    validate_cluster_for(sc.cluster, sc.gpus);
    validate_plan(sc.model, plan, sc.gpus);
    resolve_partition(sc.model, plan, sc.cluster.gpu);
  } catch (const ConfigError& e) {
    if (e.where().known()) throw;
    throw located(e);
  }

  sc.config_json = scenario_config_json(sc, overrides);
  return sc;
}

}  // namespace

std::string scenario_config_json(const Scenario& sc, const std::vector<Override>& overrides) {
  json cfg;
  cfg["source"] = sc.source;
  cfg["model"] = {{"name", sc.model.name},
                  {"num_layers", sc.model.num_layers},
                  {"hidden_size", sc.model.hidden_size},
                  {"num_attention_heads", sc.model.num_attention_heads},
                  {"num_query_groups", sc.model.query_groups()},
                  {"head_dim", sc.model.head_dim()},
                  {"ffn_hidden_size", sc.model.ffn()},
                  {"seq_length", sc.model.seq_length},
                  {"vocab_size", sc.model.vocab_size},
                  {"padded_vocab_size", sc.model.padded_vocab(sc.plan.tensor)},
                  {"mlp", to_string(sc.model.mlp)},
                  {"normalization", to_string(sc.model.normalization)},
                  {"tie_embeddings", sc.model.tie_embeddings},
                  {"attention", to_string(sc.model.attention)},
                  {"mla", sc.model.has_mla() ? json{{"q_lora_rank", sc.model.mla.q_lora_rank},
                                                    {"kv_lora_rank", sc.model.mla.kv_lora_rank},
                                                    {"qk_head_dim", sc.model.mla.qk_head_dim},
                                                    {"qk_pos_emb_head_dim", sc.model.mla.qk_pos_emb_head_dim},
                                                    {"v_head_dim", sc.model.mla.v_head_dim}}
                                             : json(nullptr)},
                  {"mtp_layers", sc.model.mtp_layers},
                  {"mtp_loss_scale", sc.model.mtp_loss_scale},
                  {"dropout", sc.model.dropout_rate()},
                  {"bias", sc.model.has_bias()},
                  {"position_embedding", to_string(sc.model.position_kind())},
                  {"parameters", parameter_count(sc.model)},
                  {"active_parameters", active_parameter_count(sc.model)},
                  {"flops_formula", flops_formula(sc.model)}};
  cfg["cluster"] = {{"topology", sc.topology_ref}, {"gpus", sc.gpus}, {"resolved_topology", topology_json(sc.cluster)}};
  cfg["parallel"] = {{"tensor", sc.plan.tensor},
                     {"pipeline", sc.plan.pipeline},
                     {"data", sc.plan.data},
                     {"context", sc.plan.context},
                     {"context_comm", to_string(sc.plan.context_comm)},
                     {"expert", sc.plan.expert},
                     {"expert_tensor", sc.plan.expert_tensor_size()},
                     {"moe_dispatcher", to_string(sc.plan.moe_dispatcher)},
                     {"moe_comm_overlap", sc.plan.moe_comm_overlap},
                     {"virtual_stages", sc.plan.virtual_stages},
                     {"schedule", to_string(sc.plan.schedule)},
                     {"optimizer_sync", to_string(sc.plan.optimizer_sync)},
                     {"scatter_gather", sc.plan.scatter_gather},
                     {"recompute", to_string(sc.plan.recompute)},
                     {"recompute_modules", recompute_module_list(sc.plan.recompute_modules)},
                     {"microbatch_group", sc.plan.group_size()},
                     {"overlap_p2p", sc.plan.overlap_p2p},
                     {"sequence_parallel", sc.plan.sequence_parallel},
                     {"partition", to_string(sc.plan.partition)},
                     {"first_stage_layers", sc.plan.first_stage_layers},
                     {"last_stage_layers", sc.plan.last_stage_layers},
                     {"pipeline_layout", sc.plan.layout_layers.empty() ? std::string()
                                                                       : format_pipeline_layout(sc.plan.layout_layers, sc.plan.layout_mtp)},
                     // The resolved layers of each stage (whatever keys chose them).
                     {"layers_per_stage", stage_layers(sc.model, sc.plan)},
                     {"zero_stage", sc.plan.zero_stage},
                     {"sharding_group", to_string(sc.plan.sharding_group)},
                     {"offload", to_string(sc.plan.offload)},
                     {"max_inflight_gathers", sc.plan.max_inflight_gathers},
                     {"overlap_grad_reduce", sc.plan.overlap_grad_reduce},
                     {"overlap_param_gather", sc.plan.overlap_param_gather},
                     {"tp_comm_overlap", sc.plan.tp_comm_overlap},
                     {"bucket_size", sc.plan.bucket_parameters()},
                     {"sharding_degree", sc.plan.sharding_degree()}};
  if (sc.plan.zero_stage == 3) {  // resolved: FSDP2's spelling
    const int64_t g = reshard_group(sc.plan);
    if (g == sc.plan.sharding_degree()) cfg["parallel"]["reshard_after_forward"] = true;
    else if (g == 1) cfg["parallel"]["reshard_after_forward"] = false;
    else cfg["parallel"]["reshard_after_forward"] = g;
  }
  cfg["training"] = {{"global_batch", sc.plan.global_batch},
                     {"micro_batch", sc.plan.micro_batch},
                     {"precision", to_string(sc.plan.precision)},
                     {"fp8_format", to_string(sc.plan.fp8_format)},
                     {"fp8_param_gather", sc.plan.fp8_param_gather},
                     {"fp8_recipe", to_string(sc.plan.fp8_recipe)},
                     {"framework", to_string(sc.plan.framework)},
                     {"attention_kernel", to_string(sc.plan.attention_kernel)},
                     {"expandable_segments", sc.plan.expandable_segments},
                     {"train_tokens", sc.train_tokens ? json(*sc.train_tokens) : json(nullptr)},
                     {"num_microbatches", sc.plan.num_microbatches()}};
  if (!sc.not_modelled.empty()) cfg["not_modelled"] = sc.not_modelled;
  cfg["cost"] = {{"gpu_hour_price", sc.gpu_hour_usd ? json(*sc.gpu_hour_usd) : json(nullptr)},
                 {"energy_price", sc.energy_usd_per_kwh}};
  json ov = json::object();
  for (const auto& o : overrides) ov[o.key] = o.value;
  cfg["overrides"] = ov;
  return cfg.dump(-1, ' ', false, json::error_handler_t::replace);  // --set text may not be UTF-8
}

Override parse_override(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("", "--set expects key=value, e.g. --set parallel.tensor=4 (got '" + text + "')",
                      SourceLocation{"--set " + text, 0, 0});
  return Override{text.substr(0, eq), text.substr(eq + 1)};
}

std::vector<Override> parse_overrides(const std::vector<std::string>& texts) {
  std::vector<Override> out;
  for (const auto& t : texts) out.push_back(parse_override(t));
  return out;
}

const std::vector<std::string>& scenario_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const auto& [section, names] : scenario_schema())
      if (!section.empty())
        for (const auto& n : names) out.push_back(section + "." + n);
    out.push_back("description");
    out.push_back("not_modelled");
    for (const auto& [section, names] : topology_schema())
      for (const auto& n : names) out.push_back("cluster.topology." + join(section, n));
    return out;
  }();
  return keys;
}

std::string data_dir() {
  if (const char* home = std::getenv("PTDP_HOME"); home && *home) return home;
  return PTDP_SOURCE_DIR;
}

std::string default_scenario_path() { return (fs::path(data_dir()) / "scenarios" / "gpt3-175b.yaml").string(); }

std::vector<std::string> topology_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(data_dir()) / "topologies", ec))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

Scenario load_scenario_text(const std::string& text, const std::string& source, const std::vector<Override>& overrides) {
  return build(parse_yaml(text, source), source, overrides);
}

Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides) {
  const std::string file = path.empty() ? default_scenario_path() : path;
  return load_scenario_text(read_input_file(file, "scenario file"), file, overrides);
}

ClusterSpec load_topology(const std::string& name_or_path) {
  const std::string path = resolve_topology_path(name_or_path, "");
  if (!path_exists(path)) {
    const auto presets = topology_presets();
    throw ConfigError("", "no topology preset or file '" + name_or_path + "'" + did_you_mean(name_or_path, presets),
                      SourceLocation{path, 0, 0});
  }
  Reader r(path, {});
  ClusterSpec c = read_topology(r, parse_yaml(read_input_file(path, "topology file"), path), "");
  c.source = path;
  return c;
}

}  // namespace ptdp
