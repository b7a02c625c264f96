#include "report/timeline.hpp"

#include <limits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.hpp"
#include "core/json_read.hpp"
#include "core/json_depth.hpp"
#include "model/metrics.hpp"
#include <algorithm>

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
    if (!is_p2p(k) || e.peer < 0 || (!e.label.empty() && e.label != kBlockingSend)) continue;  // the wait, not its all-gather
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

void complete_report(Report& r, const RunMetrics& m) {
  PTDP_ASSERT(r.iteration_time_s > 0, "iteration time must be positive");
  r.gpus = m.gpus;
  r.parameters = m.parameters;
  r.tflops_per_gpu = m.tflops_per_gpu;
  r.mfu = m.mfu;
  r.tokens_per_s = m.tokens_per_s;
  r.training_days = m.training_days;
  double bubble = 0, tp = 0, pp = 0, dp = 0, shard = 0, busy = 0;
  for (const auto& rb : r.ranks) {
    shard += rb.exposed_shard_s;
    bubble += rb.bubble_s;
    tp += rb.exposed_tp_s;
    pp += rb.exposed_pp_s;
    dp += rb.exposed_dp_s;
    busy += rb.busy_s;
  }
  const double k = r.ranks.empty() ? 1.0 : static_cast<double>(r.ranks.size());
  r.bubble_fraction = bubble / k / r.iteration_time_s;
  // Energy: GPUs draw busy power except in the bubble (without a breakdown: busy throughout).
  const CostFigures cost = cost_figures(m.energy, m.gpus, r.iteration_time_s, r.ranks.empty() ? 1.0 : 1 - r.bubble_fraction,
                                        m.iterations);
  r.gpu_hours = cost.gpu_hours;
  r.energy_kwh = cost.energy_kwh;
  r.cost_usd = cost.cost_usd;
  r.iteration_energy_j = cost.iteration_energy_j;
  r.exposed_comm_s = {{"tp", tp / k}, {"pp", pp / k}, {"dp", dp / k}, {"shard", shard / k}};
  // The bottleneck is the largest loss when it costs at least a tenth of the iteration.
  std::pair<double, std::string> worst{bubble / k, "bubble"};
  for (auto [v, name] : {std::pair{tp / k, "tp"}, std::pair{pp / k, "pp"}, std::pair{dp / k, "dp"}, std::pair{shard / k, "shard"}})
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
      // MFU against a calibrated peak (a CPU profile measured under load) may exceed 1: a fact
      // about the profile, reported with a warning (cli), not a broken report. Four times a peak
      // is no load effect.
      !(r.mfu >= 0 && r.mfu <= 4) ? bad("mfu", "must be in [0, 4] (above 1 only against a calibrated peak)", r.mfu) : std::string(),
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
                           std::pair{"exposed_cp_s", rb.exposed_cp_s}, std::pair{"exposed_ep_s", rb.exposed_ep_s},
                           std::pair{"exposed_dp_s", rb.exposed_dp_s}, std::pair{"exposed_shard_s", rb.exposed_shard_s}})
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

namespace {

bool is_send(ActionKind k) { return k == ActionKind::SEND_F || k == ActionKind::SEND_B; }
bool is_recv(ActionKind k) { return k == ActionKind::RECV_F || k == ActionKind::RECV_B; }

// A transfer: (sender device, receiver device, direction, sender stage, microbatch).
TransferKey transfer_key(int sender, int receiver, bool forward, int sender_stage, int mb) {
  return TransferKey{sender, receiver, forward ? 0 : 1, sender_stage, mb};
}

}  // namespace

RankBreakdownBuilder::RankBreakdownBuilder(const std::vector<int>& representative) {
  int top = -1;
  for (int d : representative) top = std::max(top, d);
  rank_of_.assign(static_cast<size_t>(top + 1), -1);
  for (size_t r = 0; r < representative.size(); ++r)
    if (representative[r] >= 0) rank_of_[representative[r]] = static_cast<int>(r);
  ranks_.resize(representative.size());
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r].out.pipeline_rank = static_cast<int>(r);
}

double RankBreakdownBuilder::longest_rank_window_s() const {
  double longest = 0;
  for (const Rank& r : ranks_)
    if (r.seen && r.last_end_s > r.first_compute_s) longest = std::max(longest, r.last_end_s - r.first_compute_s);
  return longest;
}

RankBreakdownBuilder::Part RankBreakdownBuilder::part_of(Stream stream, ActionKind kind, std::string_view label) {
  // Most events carry no label: that is tested before any text is compared (once per event).
  if (label.empty()) return Part::Whole;
  if (stream == Stream::Compute && label == std::string_view(kRecompute)) return Part::Recompute;
  if (stream == Stream::DP && label == std::string_view(kShardWait)) return Part::Shard;
  if (is_recv(kind) && label == std::string_view(kPipelineAllGather)) return Part::PipelineAllGather;
  if (is_send(kind) && label == std::string_view(kBlockingSend)) return Part::BlockingSend;
  return Part::Whole;
}

void RankBreakdownBuilder::add(const TimelineEvent& e) {
  add(e.device, e.peer, e.action, e.stream, part_of(e.stream, e.action.kind, e.label), e.start_s, e.end_s);
}

void RankBreakdownBuilder::post(int device, int peer, const Action& send, double start_s) {
  posted_.emplace_back(transfer_key(device, peer, send.kind == ActionKind::SEND_F, send.stage, send.microbatch), start_s);
}

void RankBreakdownBuilder::wait(int r, int device, int peer, const Action& recv, double start_s, double end_s) {
  const bool fwd = recv.kind == ActionKind::RECV_F;
  waits_.push_back(Wait{r, transfer_key(peer, device, fwd, fwd ? recv.stage - 1 : recv.stage + 1, recv.microbatch), start_s, end_s});
}

std::vector<RankBreakdown> RankBreakdownBuilder::finish(double iteration_s) {
  // Waiting while the data was on the wire is pipeline communication; before, bubble. Among
  // transfers towards representatives, (direction, sender stage, microbatch) names one: a dense
  // table when it is small enough, else a sorted list.
  // Paired by the engine (add_paired_recv_wait): priced already.
  for (Rank& r : ranks_)
    for (const double x : r.paired_exposed_s) r.out.exposed_pp_s += x;
  int max_stage = 0, max_mb = 0;
  for (const auto& [t, at] : posted_) max_stage = std::max(max_stage, t.stage), max_mb = std::max(max_mb, t.microbatch);
  const size_t cells = 2 * static_cast<size_t>(max_stage + 1) * static_cast<size_t>(max_mb + 1);
  auto cell = [&](const TransferKey& t) {
    return (static_cast<size_t>(t.direction) * (max_stage + 1) + t.stage) * (max_mb + 1) + t.microbatch;
  };
  auto in_table = [&](const TransferKey& t) { return t.stage >= 0 && t.stage <= max_stage && t.microbatch >= 0 && t.microbatch <= max_mb; };
  if (cells <= (size_t{1} << 24)) {
    std::vector<double> sent(cells, -1.0);
    std::vector<TransferKey> who(cells);
    for (const auto& [t, at] : posted_)
      if (in_table(t)) sent[cell(t)] = at, who[cell(t)] = t;
    for (const Wait& w : waits_)
      if (in_table(w.transfer) && sent[cell(w.transfer)] >= 0 && who[cell(w.transfer)] == w.transfer)
        ranks_[w.rank].out.exposed_pp_s += exposed_wait_s(w.start_s, w.end_s, sent[cell(w.transfer)]);
  } else {
    std::sort(posted_.begin(), posted_.end());
    for (const Wait& w : waits_) {
      const auto it = std::lower_bound(posted_.begin(), posted_.end(), std::pair<TransferKey, double>{w.transfer, -1e300});
      if (it != posted_.end() && it->first == w.transfer)
        ranks_[w.rank].out.exposed_pp_s += exposed_wait_s(w.start_s, w.end_s, it->second);
    }
  }
  std::vector<RankBreakdown> result;
  for (Rank& r : ranks_) {
    if (!r.seen) continue;
    RankBreakdown& rb = r.out;
    rb.busy_s = std::max(0.0, r.compute_s - rb.exposed_tp_s - rb.exposed_shard_s);
    rb.bubble_s = std::max(0.0, iteration_s - rb.busy_s - rb.exposed_tp_s - rb.exposed_pp_s - rb.exposed_dp_s - rb.exposed_shard_s);
    result.push_back(rb);
  }
  return result;
}

std::vector<RankBreakdown> rank_breakdown(const std::vector<TimelineEvent>& events,
                                          const std::vector<int>& representative, double iteration_s) {
  RankBreakdownBuilder b(representative);
  for (const TimelineEvent& e : events) b.add(e);
  return b.finish(iteration_s);
}

std::string timeline_to_json(const Timeline& t) {
  json events = json::array();
  for (const TimelineEvent& e : t.events)
    events.push_back({e.device, e.pipeline_rank, e.action.str(), static_cast<int>(e.stream), e.start_s, e.end_s, e.peer,
                      e.label});
  json names = json::object();
  for (const auto& [id, name] : t.device_names) names[std::to_string(id)] = name;
  return json{{"events", std::move(events)}, {"device_names", std::move(names)}}.dump();
}

Timeline timeline_from_json(const std::string& text, const std::string& source) {
  Timeline t;
  check_json_depth(text, source);
  try {
    const json j = json::parse(text);
    t.events.reserve(j.at("events").size());
    for (const json& e : j.at("events")) {
      TimelineEvent ev;
      ev.device = e.at(0).get<int>();
      ev.pipeline_rank = e.at(1).get<int>();
      ev.action = parse_action(e.at(2).get<std::string>());
      const int stream = e.at(3).get<int>();
      if (stream < 0 || stream > static_cast<int>(Stream::DP)) throw ConfigError("", "bad stream " + std::to_string(stream));
      ev.stream = static_cast<Stream>(stream);
      ev.start_s = e.at(4).get<double>();
      ev.end_s = e.at(5).get<double>();
      ev.peer = e.at(6).get<int>();
      ev.label = e.at(7).get<std::string>();
      t.events.push_back(std::move(ev));
    }
    for (const auto& [id, name] : j.at("device_names").items()) t.device_names[std::stoi(id)] = name.get<std::string>();
  } catch (const json::exception& e) {
    throw ConfigError("", std::string("malformed timeline: ") + e.what(), SourceLocation{source, 0, 0});
  } catch (const ConfigError& e) {
    throw ConfigError("", "malformed timeline: " + e.message(), SourceLocation{source, 0, 0});
  } catch (const std::logic_error& e) {  // std::stoi
    throw ConfigError("", std::string("malformed timeline: bad device id (") + e.what() + ")", SourceLocation{source, 0, 0});
  }
  return t;
}

namespace {
// The JSON keys of a MemoryBreakdown's byte figures, for the writer and the reader alike.
constexpr std::pair<const char*, double MemoryBreakdown::*> kMemoryKeys[] = {
    {"weights", &MemoryBreakdown::weights_bytes},     {"gradients", &MemoryBreakdown::gradients_bytes},
    {"optimizer", &MemoryBreakdown::optimizer_bytes}, {"activations", &MemoryBreakdown::activations_bytes},
    {"buffers", &MemoryBreakdown::buffers_bytes},     {"runtime", &MemoryBreakdown::runtime_bytes},
    {"allocator", &MemoryBreakdown::allocator_bytes}, {"total", &MemoryBreakdown::total_bytes},
    {"host", &MemoryBreakdown::host_bytes}};
}  // namespace

std::string report_to_json(const Report& r) {
  json j;
  j["fidelity"] = r.fidelity;
  j["backend"] = r.backend;
  if (!r.schedule.empty()) j["schedule"] = r.schedule;
  j["iteration_time_s"] = r.iteration_time_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["bubble_fraction"] = r.bubble_fraction;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["gpu_memory_bytes"] = r.gpu_memory_bytes;
  j["fits_in_memory"] = r.fits_in_memory;
  j["tokens_per_s"] = r.tokens_per_s;
  j["training_days"] = r.training_days ? json(*r.training_days) : json(nullptr);
  j["gpu_hours"] = r.gpu_hours ? json(*r.gpu_hours) : json(nullptr);
  j["energy_kwh"] = r.energy_kwh ? json(*r.energy_kwh) : json(nullptr);
  j["cost_usd"] = r.cost_usd ? json(*r.cost_usd) : json(nullptr);
  j["iteration_energy_j"] = r.iteration_energy_j;
  j["parameters"] = r.parameters;
  j["gpus"] = r.gpus;
  j["bottleneck"] = r.bottleneck;
  j["exposed_comm_s"] = r.exposed_comm_s;
  if (!r.overlap_gain_s.empty()) j["overlap_gain_s"] = r.overlap_gain_s;
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
                     {"exposed_cp_s", rb.exposed_cp_s},
                     {"exposed_ep_s", rb.exposed_ep_s},
                     {"exposed_pp_s", rb.exposed_pp_s},
                     {"exposed_dp_s", rb.exposed_dp_s},
                     {"recompute_s", rb.recompute_s},
                     {"exposed_shard_s", rb.exposed_shard_s},
                     {"actions", actions}});
  }
  j["ranks"] = ranks;
  if (!r.memory.empty()) {
    auto to_json = [](const MemoryBreakdown& m) {
      json o{{"pipeline_rank", m.pipeline_rank}};
      for (const auto& [key, field] : kMemoryKeys) o[key] = m.*field;
      return o;
    };
    j["memory_breakdown"] = to_json(peak_memory(r.memory));
    json per_rank = json::array();
    for (const auto& m : r.memory) per_rank.push_back(to_json(m));
    j["memory_breakdown_per_rank"] = per_rank;
  }
  if (!r.losses.empty()) j["losses"] = r.losses;
  if (!r.mtp_losses.empty()) j["mtp_losses"] = r.mtp_losses;
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
  for (const char* map : {"exposed_comm_s", "overlap_gain_s"})
    if (j.contains(map)) {
      if (!j[map].is_object()) return map;
      for (const auto& [k, v] : j[map].items())
        if (!v.is_number()) return std::string(map) + "." + k;
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
  if (j.contains("memory_breakdown_per_rank")) {
    if (!j["memory_breakdown_per_rank"].is_array()) return "memory_breakdown_per_rank";
    for (size_t i = 0; i < j["memory_breakdown_per_rank"].size(); ++i) {
      const json& mj = j["memory_breakdown_per_rank"][i];
      const std::string at = "memory_breakdown_per_rank[" + std::to_string(i) + "]";
      if (!mj.is_object()) return at;
      for (const auto& [k, v] : mj.items())
        if (!v.is_number()) return at + "." + k;
    }
  }
  for (const char* k : {"losses", "mtp_losses"}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_array()) return k;
    for (size_t i = 0; i < j[k].size(); ++i)
      if (!j[k][i].is_number()) return std::string(k) + "[" + std::to_string(i) + "]";
  }
  return "";
}

}  // namespace

Report report_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = parse_json_text(text, source);
  } catch (const ConfigError& e) {
    throw ConfigError(e.key_path(), "not a JSON report: " + e.message(), e.where());
  }
  Report r;
  try {
    r.fidelity = j.value("fidelity", "");
    r.backend = j.value("backend", "");
    r.schedule = j.value("schedule", "");
    r.iteration_time_s = j.at("iteration_time_s").get<double>();
    r.tflops_per_gpu = j.value("tflops_per_gpu", 0.0);
    r.mfu = j.value("mfu", 0.0);
    r.bubble_fraction = j.value("bubble_fraction", 0.0);
    r.peak_memory_bytes = j.value("peak_memory_bytes", 0.0);
    r.gpu_memory_bytes = j.value("gpu_memory_bytes", 0.0);
    r.fits_in_memory = j.value("fits_in_memory", true);
    r.tokens_per_s = j.value("tokens_per_s", 0.0);
    if (j.contains("training_days") && j["training_days"].is_number()) r.training_days = j["training_days"].get<double>();
    for (auto [key, field] : {std::pair{"gpu_hours", &Report::gpu_hours}, std::pair{"energy_kwh", &Report::energy_kwh},
                              std::pair{"cost_usd", &Report::cost_usd}})
      if (j.contains(key) && j[key].is_number()) r.*field = j[key].get<double>();
    r.iteration_energy_j = j.value("iteration_energy_j", 0.0);
    r.parameters = j.value("parameters", 0.0);
    r.gpus = j.value("gpus", int64_t{0});
    r.bottleneck = j.value("bottleneck", "");
    if (j.contains("exposed_comm_s")) r.exposed_comm_s = j["exposed_comm_s"].get<std::map<std::string, double>>();
    if (j.contains("overlap_gain_s")) r.overlap_gain_s = j["overlap_gain_s"].get<std::map<std::string, double>>();
    if (j.contains("ranks"))
      for (const auto& rj : j["ranks"]) {
        RankBreakdown rb;
        rb.pipeline_rank = rj.value("pipeline_rank", 0);
        rb.busy_s = rj.value("busy_s", 0.0);
        rb.bubble_s = rj.value("bubble_s", 0.0);
        rb.exposed_tp_s = rj.value("exposed_tp_s", 0.0);
        rb.exposed_cp_s = rj.value("exposed_cp_s", 0.0);
        rb.exposed_ep_s = rj.value("exposed_ep_s", 0.0);
        rb.exposed_pp_s = rj.value("exposed_pp_s", 0.0);
        rb.exposed_dp_s = rj.value("exposed_dp_s", 0.0);
        rb.recompute_s = rj.value("recompute_s", 0.0);
        rb.exposed_shard_s = rj.value("exposed_shard_s", 0.0);
        if (rj.contains("actions"))
          for (int c = 0; c < kActionClasses; ++c) {
            const std::string name(to_string(static_cast<ActionClass>(c)));
            if (!rj["actions"].contains(name)) continue;
            rb.class_count[c] = rj["actions"][name].value("count", int64_t{0});
            rb.class_time_s[c] = rj["actions"][name].value("time_s", 0.0);
          }
        r.ranks.push_back(rb);
      }
    if (j.contains("memory_breakdown_per_rank"))
      for (const auto& mj : j["memory_breakdown_per_rank"]) {
        MemoryBreakdown m;
        m.pipeline_rank = mj.value("pipeline_rank", 0);
        for (const auto& [key, field] : kMemoryKeys) m.*field = mj.value(key, 0.0);
        r.memory.push_back(m);
      }
    if (j.contains("losses")) r.losses = j["losses"].get<std::vector<double>>();
    if (j.contains("mtp_losses")) r.mtp_losses = j["mtp_losses"].get<std::vector<double>>();
    if (j.contains("config")) r.config_json = j["config"].dump();
    static const std::set<std::string> known = {"fidelity", "backend", "iteration_time_s", "tflops_per_gpu", "mfu",
                                                "bubble_fraction", "peak_memory_bytes", "gpu_memory_bytes",
                                                "fits_in_memory", "tokens_per_s", "training_days", "parameters", "gpus",
                                                "gpu_hours", "energy_kwh", "cost_usd", "iteration_energy_j",
                                                "bottleneck", "exposed_comm_s", "overlap_gain_s", "ranks", "losses", "config", "schedule",
                                                "memory_breakdown", "memory_breakdown_per_rank"};
    for (const auto& [k, v] : j.items())
      if (!known.count(k) && v.is_number()) r.extra[k] = v.get<double>();
  } catch (const json::exception& e) {
    throw ConfigError(first_mistyped_key(j), std::string("malformed report: ") + e.what(), SourceLocation{source, 0, 0});
  }
  return r;
}

}  // namespace ptdp
