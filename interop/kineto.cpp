#include "interop/kineto.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_read.hpp"
#include "core/json_depth.hpp"

namespace ptdp {
namespace {

using json = nlohmann::json;

const char* kExpected =
    "expected a PyTorch profiler (Kineto) trace: a JSON object {\"traceEvents\": [...]} with GPU kernel events "
    "(\"cat\": \"kernel\"), as torch.profiler's export_chrome_trace writes with ProfilerActivity.CUDA";

json parse(const std::string& text, const std::string& source) {
  try {
    return parse_json_text(text, source);
  } catch (const ConfigError& e) {
    throw ConfigError(e.key_path(), e.message() + "; " + kExpected, e.where());
  }
}

bool has_kernels(const json& root) {
  if (!root.is_object() || !root.contains("traceEvents") || !root["traceEvents"].is_array()) return false;
  if (root.contains("schemaVersion") || root.contains("deviceProperties")) return true;
  for (const json& e : root["traceEvents"])
    if (e.is_object() && e.value("cat", json()) == "kernel") return true;
  return false;
}

struct Interval {
  double a = 0, b = 0;
};

double union_length(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
  double total = 0, lo = 0, hi = -1;
  bool open = false;
  for (const Interval& i : v) {
    if (!open || i.a > hi) {
      if (open) total += hi - lo;
      lo = i.a, hi = i.b, open = true;
    } else {
      hi = std::max(hi, i.b);
    }
  }
  if (open) total += hi - lo;
  return total;
}

// A thread of the trace: "pid/tid" (either may be a number or a string).
std::string thread_of(const json& e) {
  auto part = [&](const char* k) { return e.contains(k) ? e[k].dump() : std::string("?"); };
  return part("pid") + "/" + part("tid");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// The communication class of a process group description or name (Megatron names its groups
// TENSOR_MODEL_PARALLEL_GROUP, PIPELINE_MODEL_PARALLEL_GROUP, DATA_PARALLEL_GROUP, …), "" unknown.
std::string class_of_group(const std::string& text) {
  const std::string t = lower(text);
  if (t.find("expert") != std::string::npos) return "ep";
  if (t.find("context") != std::string::npos) return "cp";
  if (t.find("tensor") != std::string::npos || t.find("tp") == 0) return "tp";
  if (t.find("pipeline") != std::string::npos || t.find("pp") == 0 || t.find("embedding") != std::string::npos) return "pp";
  if (t.find("data") != std::string::npos || t.find("dp") == 0 || t.find("fsdp") != std::string::npos) return "dp";
  return "";
}

bool is_kineto_trace(const std::string& text) {
  try {
    check_json_depth(text, "trace");
    return has_kernels(json::parse(text));
  } catch (const std::exception&) {
    return false;
  }
}

KernelTrace read_kineto_trace(const std::string& text, const std::string& source) {
  const json root = parse(text, source);
  auto fail = [&](const std::string& what) -> KernelTrace { throw ConfigError("", what, SourceLocation{source, 0, 0}); };
  if (!has_kernels(root)) return fail(std::string("not a PyTorch profiler trace: ") + kExpected);
  KernelTrace k;
  if (root.contains("distributedInfo") && root["distributedInfo"].is_object()) {
    const json& d = root["distributedInfo"];
    if (d.contains("rank") && d["rank"].is_number_integer() && d["rank"].get<int64_t>() >= 0 && d["rank"].get<int64_t>() < 1'000'000)
      k.rank = static_cast<int>(d["rank"].get<int64_t>());
    if (d.contains("world_size") && d["world_size"].is_number_integer() && d["world_size"].get<int64_t>() >= 1 &&
        d["world_size"].get<int64_t>() <= 1'000'000)
      k.world_size = static_cast<int>(d["world_size"].get<int64_t>());
  }
  const json& events = root["traceEvents"];
  // First pass: CPU threads' names, the backward operators' intervals per thread, launches by
  // correlation, process groups by the operator's external id, profiler steps.
  std::map<std::string, std::string> thread_name;
  std::map<std::string, std::vector<Interval>> backward_ops;
  std::map<int64_t, std::pair<std::string, double>> launch;  // correlation → (thread, ts)
  std::map<int64_t, std::string> group_of_op;                // external id → comm class
  std::vector<double> steps;
  struct Kernel {
    double ts, dur;
    std::string name;
    int64_t correlation = -1, external = -1;
  };
  std::vector<Kernel> kernels;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (!e.is_object()) continue;
    const std::string at = "traceEvents[" + std::to_string(i) + "]";
    const std::string ph = e.contains("ph") && e["ph"].is_string() ? e["ph"].get<std::string>() : "";
    const std::string cat = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    const std::string name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "";
    const json args = e.contains("args") && e["args"].is_object() ? e["args"] : json::object();
    if (ph == "M") {
      if (name == "thread_name" && args.contains("name") && args["name"].is_string()) thread_name[thread_of(e)] = args["name"].get<std::string>();
      continue;
    }
    if (ph != "X") continue;
    auto number = [&](const char* key) {
      if (!e.contains(key) || !e[key].is_number() || !std::isfinite(e[key].get<double>()) || e[key].get<double>() < 0)
        throw ConfigError("", at + "." + key + ": expected a non-negative number of microseconds (a " + cat + " event)",
                          SourceLocation{source, 0, 0});
      return e[key].get<double>() * 1e-6;
    };
    auto id = [&](const char* key) -> int64_t {
      return args.contains(key) && args[key].is_number_integer() ? args[key].get<int64_t>() : -1;
    };
    if (cat == "kernel") {
      kernels.push_back(Kernel{number("ts"), number("dur"), name, id("correlation"), id("External id")});
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      if (const int64_t c = id("correlation"); c >= 0) launch[c] = {thread_of(e), number("ts")};
    } else if (cat == "cpu_op" || cat == "user_annotation") {
      const double ts = number("ts"), dur = number("dur");
      if (name.rfind("ProfilerStep#", 0) == 0) steps.push_back(dur);
      if (name.find("Backward") != std::string::npos || name.rfind("autograd::engine::evaluate_function", 0) == 0)
        backward_ops[thread_of(e)].push_back(Interval{ts, ts + dur});
      for (const char* key : {"Process Group Description", "Process Group Name", "pg_desc", "pg_name"})
        if (args.contains(key) && args[key].is_string()) {
          const std::string c = class_of_group(args[key].get<std::string>());
          if (!c.empty() && id("External id") >= 0) group_of_op[id("External id")] = c;
          if (!c.empty()) break;
        }
    }
  }
  if (kernels.empty())
    return fail("the trace has no GPU kernel events (\"cat\": \"kernel\"): was the profiler run with ProfilerActivity.CUDA?");
  RawKernelTrace raw;
  raw.rank = k.rank;
  raw.world_size = k.world_size;
  raw.thread_name = std::move(thread_name);
  for (auto& [thread, list] : backward_ops)
    for (const Interval& i : list) raw.backward_ranges[thread].emplace_back(i.a, i.b);
  raw.steps = std::move(steps);
  for (const Kernel& kn : kernels) {
    RawKernelTrace::Kernel r{kn.ts, kn.dur, kn.name, "", -1, ""};
    if (const auto it = launch.find(kn.correlation); it != launch.end()) r.launch_thread = it->second.first, r.launch_ts = it->second.second;
    if (const auto g = group_of_op.find(kn.external); g != group_of_op.end()) r.group_class = g->second;
    raw.kernels.push_back(std::move(r));
  }
  return summarize_kernels(std::move(raw));
}

KernelTrace summarize_kernels(RawKernelTrace raw) {
  PTDP_ASSERT(!raw.kernels.empty(), "summarize_kernels needs kernels");
  KernelTrace k;
  k.rank = raw.rank;
  k.world_size = raw.world_size;
  std::map<std::string, std::vector<Interval>> backward_ops;
  for (auto& [thread, list] : raw.backward_ranges) {  // merged, sorted: one binary search per launch
    std::vector<Interval> sorted;
    for (const auto& [a, b] : list) sorted.push_back(Interval{a, b});
    std::sort(sorted.begin(), sorted.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
    std::vector<Interval> merged;
    for (const Interval& i : sorted)
      if (!merged.empty() && i.a <= merged.back().b) merged.back().b = std::max(merged.back().b, i.b);
      else merged.push_back(i);
    backward_ops[thread] = std::move(merged);
  }
  auto in_backward = [&](const RawKernelTrace::Kernel& kn) {
    if (kn.launch_thread.empty()) return false;
    if (auto n = raw.thread_name.find(kn.launch_thread); n != raw.thread_name.end() && n->second.rfind("pt_autograd", 0) == 0) return true;
    const auto ops = backward_ops.find(kn.launch_thread);
    if (ops == backward_ops.end()) return false;
    const auto& list = ops->second;
    const double ts = kn.launch_ts;
    auto after = std::upper_bound(list.begin(), list.end(), ts, [](double t, const Interval& i) { return t < i.a; });
    return after != list.begin() && std::prev(after)->b >= ts;
  };
  double t0 = raw.kernels.front().ts, t1 = 0;
  for (const auto& kn : raw.kernels) t0 = std::min(t0, kn.ts), t1 = std::max(t1, kn.ts + kn.dur);
  k.span_s = t1 - t0;
  k.kernels = static_cast<int64_t>(raw.kernels.size());
  std::vector<Interval> busy, fwd, bwd;
  std::map<std::string, std::vector<Interval>> comm;
  for (const auto& kn : raw.kernels) {
    KernelEvent ev{kn.ts - t0, kn.dur, "", kn.name};
    const Interval iv{kn.ts, kn.ts + kn.dur};
    if (lower(kn.name).rfind("nccl", 0) == 0) {
      ++k.nccl_kernels;
      std::string c = kn.group_class;
      if (c.empty()) c = kn.name.find("SendRecv") != std::string::npos || kn.name.find("_Send") != std::string::npos ||
                                 kn.name.find("_Recv") != std::string::npos
                             ? "pp"
                             : "nccl";
      ev.klass = c;
      comm[c].push_back(iv);
    } else {
      ev.klass = in_backward(kn) ? "B" : "F";
      busy.push_back(iv);
      (ev.klass == "B" ? bwd : fwd).push_back(iv);
    }
    k.events.push_back(std::move(ev));
  }
  k.busy_s = union_length(busy);
  k.forward_s = union_length(fwd);
  k.backward_s = union_length(bwd);
  for (auto& [c, list] : comm) k.comm_s[c] = union_length(list);
  if (!raw.steps.empty()) {
    k.steps = static_cast<int>(raw.steps.size());
    double sum = 0;
    for (double x : raw.steps) sum += x;
    k.step_s = sum / static_cast<double>(raw.steps.size());
  }
  return k;
}

std::string kernel_trace_json(const KernelTrace& k, int pipeline_rank) {
  json events = json::array();
  for (const KernelEvent& e : k.events) {
    const bool compute = e.klass == "F" || e.klass == "B";
    events.push_back({{"ph", "X"},
                      {"pid", k.rank},
                      {"tid", compute ? 0 : 1},
                      {"name", e.name},
                      {"cat", compute ? "compute" : e.klass},
                      {"ts", e.start_s * 1e6},
                      {"dur", e.dur_s * 1e6},
                      {"args", {{"pipeline_rank", pipeline_rank}, {"action", compute ? e.klass : e.klass}}}});
  }
  // The iteration as `ptdp compare` counts it (KernelTrace::iteration_s), for the plot's title:
  // the profiled window can hold several steps.
  const std::string how = k.steps > 0 ? "ProfilerStep mean of " + std::to_string(k.steps) + " steps" : "kernel span";
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"ptdp_iteration", {{"seconds", k.iteration_s()}, {"from", how}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);  // kernel names: invalid UTF-8 becomes U+FFFD
}

}  // namespace ptdp
