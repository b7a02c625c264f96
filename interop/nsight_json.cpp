// Nsight Systems JSON exports in (interop/nsight.hpp): `nsys export --type json` writes nsys'
// event stream one JSON object per line; the kernels, runtime launches, NVTX ranges, strings and
// thread names are collected as from the SQLite export and classified by summarize_kernels.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.hpp"
#include "core/json_depth.hpp"
#include "core/json_read.hpp"
#include "interop/nsight.hpp"

namespace ptdp {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxLines = 20'000'000;
constexpr size_t kMaxStringBytes = size_t{256} << 20;
constexpr size_t kMaxFirstLine = size_t{1} << 20;

const char* kExpectedJson =
    "expected an Nsight Systems JSON export with CUDA kernels (nsys profile --trace=cuda,nvtx …; nsys export --type json "
    "REPORT.nsys-rep: one JSON object per line, kernels as \"CudaEvent\" records with a \"kernel\")";

// `o[name]` under either case of the name's first letter (nsys writes "GlobalTid" at the top of an
// event and "globalTid" in thread records), nullptr when absent.
const json* field(const json& o, const char* name) {
  if (!o.is_object()) return nullptr;
  std::string key = name;
  for (int pass = 0; pass < 2; ++pass) {
    if (const auto it = o.find(key); it != o.end()) return &*it;
    key[0] = static_cast<char>(std::isupper(static_cast<unsigned char>(key[0])) ? std::tolower(static_cast<unsigned char>(key[0]))
                                                                               : std::toupper(static_cast<unsigned char>(key[0])));
  }
  return nullptr;
}

// An integer as protobuf's JSON form writes 64-bit ones ("123") or as a JSON number; nullopt for
// anything else (a fraction, text that is not all digits, out of int64's range).
std::optional<int64_t> integer(const json* v) {
  if (!v) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return v->get<int64_t>();
  }
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    int64_t out = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return out;
  }
  return std::nullopt;
}

// A thread id as a key (text or number, as written).
std::string tid_of(const json* v) {
  if (!v) return "";
  if (const auto i = integer(v)) return std::to_string(*i);
  return v->is_string() ? v->get<std::string>() : v->dump();
}

// A name: inline text, or a string id resolved once the string table (after the events) is read.
struct Name {
  std::string text;
  int64_t id = -1;
};
Name name_of(const json* v) {
  if (!v) return {};
  if (const auto i = integer(v)) return Name{"", *i};
  if (v->is_string()) return Name{v->get<std::string>(), -1};
  return {};
}

struct Reader {
  const std::string& path;
  int64_t line = 0;

  [[noreturn]] void fail(const std::string& what, bool at_line = true) const {
    throw ConfigError("", what + "; " + kExpectedJson, SourceLocation{path, at_line ? static_cast<int>(std::min<int64_t>(line, INT32_MAX)) : 0, 0});
  }
  // A time in ns: refused, naming the record and key, when it is missing or not an integer.
  double seconds(const json& o, const char* record, const char* key) const {
    const json* v = field(o, key);
    const auto ns = integer(v);
    if (!ns || *ns < 0)
      fail(std::string(record) + "." + key + (v ? " is " + printable(v->dump(), 40) + ", not a non-negative integer of nanoseconds" : " is missing"));
    return static_cast<double>(*ns) * 1e-9;
  }
};

struct Kernel {
  double start = 0, end = 0;
  Name name;
  int64_t device = 0, correlation = -1;
};
struct Range {
  double start = 0, end = 0;
  Name text;
  std::string thread;
};

}  // namespace

bool is_nsight_json(const std::string& bytes) {
  const size_t begin = bytes.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos || bytes[begin] != '{') return false;
  const size_t end = std::min(bytes.find('\n', begin), bytes.size());
  if (end - begin > kMaxFirstLine) return false;
  const std::string first = bytes.substr(begin, end - begin);
  try {
    check_json_depth(first, "trace");
    const json o = json::parse(first);
    if (!o.is_object() || o.contains("traceEvents")) return false;
    for (const char* k : {"Type", "CudaEvent", "TraceProcessEvent", "NvtxEvent", "data"})
      if (o.contains(k)) return true;
  } catch (const std::exception&) {
  }
  return false;
}

KernelTrace read_nsight_json(const std::string& bytes, const std::string& path) {
  Reader r{path};
  std::vector<Kernel> kernels;
  std::map<int64_t, std::pair<std::string, double>> launch;  // correlation → (thread, start)
  std::vector<Range> ranges;
  std::map<std::string, Name> thread_name;
  std::unordered_map<int64_t, std::string> strings;
  size_t string_bytes = 0;
  auto add_string = [&](int64_t id, std::string value) {
    string_bytes += value.size();
    if (string_bytes > kMaxStringBytes) r.fail("the string table holds more than 256 MiB of text");
    strings[id] = std::move(value);
  };

  for (size_t at = 0; at < bytes.size();) {
    const size_t nl = std::min(bytes.find('\n', at), bytes.size());
    const std::string text = bytes.substr(at, nl - at);
    at = nl + 1;
    if (++r.line > kMaxLines) r.fail("more than " + std::to_string(kMaxLines) + " lines (refused: larger than any trace ptdp compares)");
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    json o;
    try {
      o = parse_json_text(text, path);
    } catch (const ConfigError& e) {
      throw ConfigError(e.key_path(), e.message() + "; " + kExpectedJson,
                        SourceLocation{path, static_cast<int>(std::min<int64_t>(r.line, INT32_MAX)), e.where().column});
    }
    if (!o.is_object()) r.fail("not a JSON object (nsys writes one record per line)");
    if (const json* cuda = field(o, "CudaEvent"); cuda && cuda->is_object()) {
      const json* k = field(*cuda, "kernel");
      if (!k || !k->is_object()) continue;  // a memcpy, memset or synchronization
      Kernel kn;
      kn.start = r.seconds(*cuda, "CudaEvent", "startNs");
      kn.end = r.seconds(*cuda, "CudaEvent", "endNs");
      if (kn.end < kn.start) r.fail("a kernel ends before it starts (CudaEvent.endNs < startNs)");
      for (const char* n : {"demangledName", "shortName", "mangledName"})
        if (kn.name.text.empty() && kn.name.id < 0) kn.name = name_of(field(*k, n));
      kn.device = integer(field(*cuda, "deviceId")).value_or(0);
      kn.correlation = integer(field(*cuda, "correlationId")).value_or(-1);
      kernels.push_back(std::move(kn));
    } else if (const json* api = field(o, "TraceProcessEvent"); api && api->is_object()) {
      const auto corr = integer(field(*api, "correlationId"));
      if (!corr) continue;
      const json* tid = field(o, "GlobalTid");
      launch[*corr] = {tid_of(tid ? tid : field(*api, "GlobalTid")), r.seconds(*api, "TraceProcessEvent", "startNs")};
    } else if (const json* nvtx = field(o, "NvtxEvent"); nvtx && nvtx->is_object()) {
      if (!field(*nvtx, "EndTimestamp")) continue;  // a mark, not a range
      Range g{r.seconds(*nvtx, "NvtxEvent", "Timestamp"), r.seconds(*nvtx, "NvtxEvent", "EndTimestamp"), {}, ""};
      if (g.end < g.start) continue;
      g.text = name_of(field(*nvtx, "Text"));
      if (g.text.text.empty() && g.text.id < 0) g.text = name_of(field(*nvtx, "TextId"));
      const json* tid = field(*nvtx, "GlobalTid");
      g.thread = tid_of(tid ? tid : field(o, "GlobalTid"));
      ranges.push_back(std::move(g));
    } else if (const json* data = field(o, "data"); data && data->is_array()) {
      for (size_t i = 0; i < data->size(); ++i)
        if ((*data)[i].is_string()) add_string(static_cast<int64_t>(i), (*data)[i].get<std::string>());
    } else if (const json* tid = field(o, "globalTid"); tid && (field(o, "nameId") || field(o, "name"))) {
      thread_name[tid_of(tid)] = name_of(field(o, "nameId") ? field(o, "nameId") : field(o, "name"));
    } else if (const auto id = integer(field(o, "id")); id && field(o, "value") && field(o, "value")->is_string()) {
      add_string(*id, field(o, "value")->get<std::string>());
    }
  }
  if (kernels.empty()) r.fail("no CUDA kernel records (\"CudaEvent\" with \"kernel\": profiled with --trace=cuda?)", false);

  auto resolve = [&](const Name& n) -> std::string {
    if (n.id < 0) return n.text;
    const auto it = strings.find(n.id);
    return it == strings.end() ? std::string() : it->second;
  };
  // The GPU with the most kernels; its device id becomes the trace's rank.
  std::map<int64_t, int64_t> per_device;
  for (const Kernel& k : kernels) ++per_device[k.device];
  const auto busiest = std::max_element(per_device.begin(), per_device.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  RawKernelTrace raw;
  raw.rank = static_cast<int>(std::clamp<int64_t>(busiest->first, 0, 1'000'000));
  raw.world_size = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(per_device.size()), 1, 1'000'000));
  std::stable_sort(kernels.begin(), kernels.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  for (const Kernel& k : kernels) {
    if (k.device != busiest->first) continue;
    RawKernelTrace::Kernel out{k.start, k.end - k.start, resolve(k.name), "", -1, ""};
    if (const auto it = launch.find(k.correlation); it != launch.end()) out.launch_thread = it->second.first, out.launch_ts = it->second.second;
    raw.kernels.push_back(std::move(out));
  }
  for (const Range& g : ranges) add_annotation_range(raw, g.start, g.end, resolve(g.text), g.thread);
  for (const auto& [tid, n] : thread_name) raw.thread_name[tid] = resolve(n);
  return summarize_kernels(std::move(raw));
}

}  // namespace ptdp
