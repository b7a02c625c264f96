#include "schedules/timeline.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.hpp"
#include "model/flops.hpp"

namespace ptdp {

using nlohmann::json;

std::string_view to_string(Stream s) {
  switch (s) {
    case Stream::Compute: return "compute";
    case Stream::TP: return "tp";
    case Stream::PP: return "pp";
    case Stream::DP: return "dp";
  }
  return "?";
}

std::string_view to_string(ActionClass c) {
  switch (c) {
    case ActionClass::F: return "F";
    case ActionClass::B: return "B";
    case ActionClass::IW: return "I/W";
    case ActionClass::P2P: return "SEND/RECV";
    case ActionClass::ReduceGrad: return "REDUCE_GRAD";
    case ActionClass::Optim: return "OPTIM";
  }
  return "?";
}

ActionClass action_class(ActionKind k) {
  switch (k) {
    case ActionKind::F: return ActionClass::F;
    case ActionKind::B: return ActionClass::B;
    case ActionKind::I:
    case ActionKind::W: return ActionClass::IW;
    case ActionKind::REDUCE_GRAD: return ActionClass::ReduceGrad;
    case ActionKind::OPTIM: return ActionClass::Optim;
    default: return ActionClass::P2P;
  }
}

void add_action_time(RankBreakdown& rb, const Action& a, double duration_s) {
  const auto c = static_cast<size_t>(action_class(a.kind));
  ++rb.class_count[c];
  if (a.kind != ActionKind::SEND_F && a.kind != ActionKind::SEND_B) rb.class_time_s[c] += duration_s;
}

std::string chrome_trace_json(const Timeline& t) {
  json events = json::array();
  std::map<int, bool> devices;
  for (const auto& e : t.events) devices[e.device] = true;
  for (const auto& [dev, unused] : devices) {
    (void)unused;
    auto name = t.device_names.count(dev) ? t.device_names.at(dev) : "device " + std::to_string(dev);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", dev}, {"args", {{"name", name}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", dev}, {"args", {{"sort_index", dev}}}});
    for (Stream s : {Stream::Compute, Stream::TP, Stream::PP, Stream::DP})
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", dev},
                        {"tid", static_cast<int>(s)},
                        {"args", {{"name", std::string(to_string(s))}}}});
  }
  // Flow arrows: a SEND on device X towards Y pairs with the RECV on Y from X of the next stage.
  using Key = std::tuple<int, int, int, int, int>;  // sender, receiver, direction, sender stage, mb
  std::map<Key, int> flow_ids;
  int next_flow = 1;
  for (const auto& e : t.events) {
    const double ts = e.start_s * 1e6, dur = (e.end_s - e.start_s) * 1e6;
    json ev = {{"name", e.label.empty() ? e.action.str() : e.label},
               {"cat", std::string(to_string(e.stream))},
               {"ph", "X"},
               {"ts", ts},
               {"dur", dur},
               {"pid", e.device},
               {"tid", static_cast<int>(e.stream)},
               {"args", {{"action", e.action.str()}, {"pipeline_rank", e.pipeline_rank}}}};
    events.push_back(ev);
    const ActionKind k = e.action.kind;
    if (!is_p2p(k) || e.peer < 0) continue;
    const bool send = k == ActionKind::SEND_F || k == ActionKind::SEND_B;
    const int dir = (k == ActionKind::SEND_F || k == ActionKind::RECV_F) ? 0 : 1;
    const int sender_stage = send ? e.action.stage : (dir == 0 ? e.action.stage - 1 : e.action.stage + 1);
    const Key key = send ? Key{e.device, e.peer, dir, sender_stage, e.action.microbatch}
                         : Key{e.peer, e.device, dir, sender_stage, e.action.microbatch};
    auto [it, inserted] = flow_ids.try_emplace(key, next_flow);
    if (inserted) ++next_flow;
    json flow = {{"name", "p2p"}, {"cat", "p2p"}, {"id", it->second}, {"pid", e.device}, {"tid", static_cast<int>(e.stream)}};
    if (send) {
      flow["ph"] = "s";
      flow["ts"] = ts;
    } else {
      flow["ph"] = "f";
      flow["bp"] = "e";
      flow["ts"] = ts + dur;
    }
    events.push_back(flow);
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void write_chrome_trace(const Timeline& t, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw EnvironmentError("cannot write trace file '" + path + "'");
  out << chrome_trace_json(t);
  if (!out) throw EnvironmentError("failed writing trace file '" + path + "'");
}

void complete_report(Report& r, const TransformerSpec& spec, const ParallelPlan& plan, double peak_flops,
                     std::optional<double> train_tokens) {
  PTDP_ASSERT(r.iteration_time_s > 0, "iteration time must be positive");
  r.gpus = plan.gpus();
  r.parameters = parameter_count(spec);
  const double n = static_cast<double>(r.gpus);
  r.tflops_per_gpu = reported_iteration_flops(spec, plan) / (r.iteration_time_s * n) / 1e12;
  r.mfu = iteration_flops(spec, plan.global_batch, false) / (r.iteration_time_s * n * peak_flops);
  r.tokens_per_s = static_cast<double>(plan.global_batch * spec.seq_length) / r.iteration_time_s;
  if (train_tokens) r.training_days = *train_tokens / r.tokens_per_s / 86400.0;
  double bubble = 0, tp = 0, pp = 0, dp = 0, busy = 0;
  for (const auto& rb : r.ranks) {
    bubble += rb.bubble_s;
    tp += rb.exposed_tp_s;
    pp += rb.exposed_pp_s;
    dp += rb.exposed_dp_s;
    busy += rb.busy_s;
  }
  const double k = r.ranks.empty() ? 1.0 : static_cast<double>(r.ranks.size());
  r.bubble_fraction = bubble / k / r.iteration_time_s;
  r.exposed_comm_s = {{"tp", tp / k}, {"pp", pp / k}, {"dp", dp / k}};
  // The bottleneck is the largest loss when it costs at least a tenth of the iteration.
  std::pair<double, std::string> worst{bubble / k, "bubble"};
  for (auto [v, name] : {std::pair{tp / k, "tp"}, std::pair{pp / k, "pp"}, std::pair{dp / k, "dp"}})
    if (v > worst.first) worst = {v, name};
  r.bottleneck = worst.first >= 0.1 * r.iteration_time_s ? worst.second : "compute";
}

std::string report_violation(const Report& r) {
  char buf[160];
  auto bad = [&](const std::string& key, const char* what, double v) {
    std::snprintf(buf, sizeof buf, ": %s (got %g)", what, v);
    return key + buf;
  };
  auto finite_at_least = [&](const std::string& key, double v, double lo) {
    return !std::isfinite(v) || !(v >= lo) ? bad(key, lo == 0 ? "must be finite and >= 0" : "must be finite and positive", v)
                                           : std::string();
  };
  auto positive = [&](const std::string& key, double v) {
    return !std::isfinite(v) || !(v > 0) ? bad(key, "must be finite and positive", v) : std::string();
  };
  auto fraction = [&](const std::string& key, double v) {
    return !(v >= 0 && v <= 1 + 1e-9) ? bad(key, "must be in [0, 1]", v) : std::string();
  };
  std::vector<std::string> found = {
      positive("iteration_time_s", r.iteration_time_s),
      finite_at_least("tflops_per_gpu", r.tflops_per_gpu, 0),
      fraction("mfu", r.mfu),
      fraction("bubble_fraction", r.bubble_fraction),
      finite_at_least("peak_memory_bytes", r.peak_memory_bytes, 0),
      finite_at_least("gpu_memory_bytes", r.gpu_memory_bytes, 0),
      positive("tokens_per_s", r.tokens_per_s),
      r.training_days ? positive("training_days", *r.training_days) : std::string(),
      positive("parameters", r.parameters),
      r.gpus >= 1 ? std::string() : bad("gpus", "must be at least 1", static_cast<double>(r.gpus)),
  };
  for (const auto& [k, v] : r.exposed_comm_s) found.push_back(finite_at_least("exposed_comm_s." + k, v, 0));
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const RankBreakdown& rb = r.ranks[i];
    const std::string at = "ranks[" + std::to_string(i) + "].";
    for (auto [name, v] : {std::pair{"busy_s", rb.busy_s}, std::pair{"bubble_s", rb.bubble_s},
                           std::pair{"exposed_tp_s", rb.exposed_tp_s}, std::pair{"exposed_pp_s", rb.exposed_pp_s},
                           std::pair{"exposed_dp_s", rb.exposed_dp_s}})
      found.push_back(finite_at_least(at + name, v, 0));
    for (int c = 0; c < kActionClasses; ++c)
      found.push_back(finite_at_least(at + "actions." + std::string(to_string(static_cast<ActionClass>(c))) + ".time_s",
                                      rb.class_time_s[c], 0));
  }
  for (size_t i = 0; i < r.losses.size(); ++i)
    if (!std::isfinite(r.losses[i])) found.push_back(bad("losses[" + std::to_string(i) + "]", "must be finite", r.losses[i]));
  for (const auto& [k, v] : r.extra)
    if (!std::isfinite(v)) found.push_back(bad(k, "must be finite", v));
  for (const auto& f : found)
    if (!f.empty()) return f;
  return "";
}

void check_report(const Report& r) {
  const std::string v = report_violation(r);
  if (!v.empty()) throw InternalError("internal error (a bug in ptdp): the report breaks an invariant: " + v);
}

std::string report_to_json(const Report& r) {
  json j;
  j["fidelity"] = r.fidelity;
  j["backend"] = r.backend;
  j["iteration_time_s"] = r.iteration_time_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["bubble_fraction"] = r.bubble_fraction;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["gpu_memory_bytes"] = r.gpu_memory_bytes;
  j["fits_in_memory"] = r.fits_in_memory;
  j["tokens_per_s"] = r.tokens_per_s;
  j["training_days"] = r.training_days ? json(*r.training_days) : json(nullptr);
  j["parameters"] = r.parameters;
  j["gpus"] = r.gpus;
  j["bottleneck"] = r.bottleneck;
  j["exposed_comm_s"] = r.exposed_comm_s;
  json ranks = json::array();
  for (const auto& rb : r.ranks) {
    json actions = json::object();
    for (int c = 0; c < kActionClasses; ++c)
      if (rb.class_count[c] > 0)
        actions[std::string(to_string(static_cast<ActionClass>(c)))] = {{"count", rb.class_count[c]},
                                                                         {"time_s", rb.class_time_s[c]}};
    ranks.push_back({{"pipeline_rank", rb.pipeline_rank},
                     {"busy_s", rb.busy_s},
                     {"bubble_s", rb.bubble_s},
                     {"exposed_tp_s", rb.exposed_tp_s},
                     {"exposed_pp_s", rb.exposed_pp_s},
                     {"exposed_dp_s", rb.exposed_dp_s},
                     {"actions", actions}});
  }
  j["ranks"] = ranks;
  if (!r.losses.empty()) j["losses"] = r.losses;
  for (const auto& [k, v] : r.extra) j[k] = v;
  j["config"] = r.config_json.empty() ? json::object() : json::parse(r.config_json);
  return j.dump(2);
}

namespace {

// The first key of a report JSON whose value has the wrong type ("ranks[2].busy_s"), so that
// a malformed report's message says where.
std::string first_mistyped_key(const json& j) {
  if (!j.is_object()) return "(top level)";
  for (const char* k : {"fidelity", "backend", "bottleneck"})
    if (j.contains(k) && !j[k].is_string()) return k;
  for (const char* k : {"iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction", "peak_memory_bytes",
                        "gpu_memory_bytes", "tokens_per_s", "parameters", "gpus"})
    if (j.contains(k) && !j[k].is_number()) return k;
  if (!j.contains("iteration_time_s")) return "iteration_time_s";
  if (j.contains("fits_in_memory") && !j["fits_in_memory"].is_boolean()) return "fits_in_memory";
  if (j.contains("training_days") && !j["training_days"].is_number() && !j["training_days"].is_null()) return "training_days";
  if (j.contains("exposed_comm_s")) {
    if (!j["exposed_comm_s"].is_object()) return "exposed_comm_s";
    for (const auto& [k, v] : j["exposed_comm_s"].items())
      if (!v.is_number()) return "exposed_comm_s." + k;
  }
  if (j.contains("ranks")) {
    if (!j["ranks"].is_array()) return "ranks";
    for (size_t i = 0; i < j["ranks"].size(); ++i) {
      const json& rj = j["ranks"][i];
      const std::string at = "ranks[" + std::to_string(i) + "]";
      if (!rj.is_object()) return at;
      for (const auto& [k, v] : rj.items())
        if (k != "actions" && !v.is_number()) return at + "." + k;
      if (rj.contains("actions")) {
        if (!rj["actions"].is_object()) return at + ".actions";
        for (const auto& [k, v] : rj["actions"].items()) {
          if (!v.is_object()) return at + ".actions." + k;
          for (const auto& [f, x] : v.items())
            if (!x.is_number()) return at + ".actions." + k + "." + f;
        }
      }
    }
  }
  if (j.contains("losses")) {
    if (!j["losses"].is_array()) return "losses";
    for (size_t i = 0; i < j["losses"].size(); ++i)
      if (!j["losses"][i].is_number()) return "losses[" + std::to_string(i) + "]";
  }
  return "";
}

}  // namespace

Report report_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError("", std::string("not a JSON report: ") + e.what(), SourceLocation{source, 0, 0});
  }
  Report r;
  try {
    r.fidelity = j.value("fidelity", "");
    r.backend = j.value("backend", "");
    r.iteration_time_s = j.at("iteration_time_s").get<double>();
    r.tflops_per_gpu = j.value("tflops_per_gpu", 0.0);
    r.mfu = j.value("mfu", 0.0);
    r.bubble_fraction = j.value("bubble_fraction", 0.0);
    r.peak_memory_bytes = j.value("peak_memory_bytes", 0.0);
    r.gpu_memory_bytes = j.value("gpu_memory_bytes", 0.0);
    r.fits_in_memory = j.value("fits_in_memory", true);
    r.tokens_per_s = j.value("tokens_per_s", 0.0);
    if (j.contains("training_days") && j["training_days"].is_number()) r.training_days = j["training_days"].get<double>();
    r.parameters = j.value("parameters", 0.0);
    r.gpus = j.value("gpus", int64_t{0});
    r.bottleneck = j.value("bottleneck", "");
    if (j.contains("exposed_comm_s")) r.exposed_comm_s = j["exposed_comm_s"].get<std::map<std::string, double>>();
    if (j.contains("ranks"))
      for (const auto& rj : j["ranks"]) {
        RankBreakdown rb;
        rb.pipeline_rank = rj.value("pipeline_rank", 0);
        rb.busy_s = rj.value("busy_s", 0.0);
        rb.bubble_s = rj.value("bubble_s", 0.0);
        rb.exposed_tp_s = rj.value("exposed_tp_s", 0.0);
        rb.exposed_pp_s = rj.value("exposed_pp_s", 0.0);
        rb.exposed_dp_s = rj.value("exposed_dp_s", 0.0);
        if (rj.contains("actions"))
          for (int c = 0; c < kActionClasses; ++c) {
            const std::string name(to_string(static_cast<ActionClass>(c)));
            if (!rj["actions"].contains(name)) continue;
            rb.class_count[c] = rj["actions"][name].value("count", int64_t{0});
            rb.class_time_s[c] = rj["actions"][name].value("time_s", 0.0);
          }
        r.ranks.push_back(rb);
      }
    if (j.contains("losses")) r.losses = j["losses"].get<std::vector<double>>();
    if (j.contains("config")) r.config_json = j["config"].dump();
    static const std::set<std::string> known = {"fidelity", "backend", "iteration_time_s", "tflops_per_gpu", "mfu",
                                                "bubble_fraction", "peak_memory_bytes", "gpu_memory_bytes",
                                                "fits_in_memory", "tokens_per_s", "training_days", "parameters", "gpus",
                                                "bottleneck", "exposed_comm_s", "ranks", "losses", "config"};
    for (const auto& [k, v] : j.items())
      if (!known.count(k) && v.is_number()) r.extra[k] = v.get<double>();
  } catch (const json::exception& e) {
    throw ConfigError(first_mistyped_key(j), std::string("malformed report: ") + e.what(), SourceLocation{source, 0, 0});
  }
  return r;
}

}  // namespace ptdp
