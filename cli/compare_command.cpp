// `ptdp compare PREDICTED.json MEASURED.json`: how far a prediction is from a measurement, per
// action class and per pipeline rank (reports of `ptdp simulate --json` / `ptdp train --json`).
#include <cmath>
#include <map>
#include <set>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/units.hpp"
#include "interop/nsight.hpp"
#include "report/timeline.hpp"

#include <nlohmann/json.hpp>

namespace ptdp::cli {
namespace {

Report read_report(const std::string& path) {
  Report r = report_from_json(read_input_file(path, "report file"), path);
  if (const std::string v = report_violation(r); !v.empty())
    throw ConfigError("", "not a valid report: " + v, SourceLocation{path, 0, 0});
  return r;
}

std::string err(double predicted, double measured) {
  if (!(measured > 0) || !std::isfinite(predicted)) return "-";
  // Two durations that are both next to nothing (e.g. REDUCE_GRAD with d = 1 and one pipeline
  // rank) do not have a meaningful relative error.
  constexpr double kNegligible_s = 10e-6;
  if (std::fabs(predicted) < kNegligible_s && std::fabs(measured) < kNegligible_s) return "≈0";
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", 100 * (predicted - measured) / measured);
  return b;
}

// The pipeline rank of global rank `rank` under the report's plan (Megatron's order: tensor,
// context, data, then pipeline), or -1 when the report has no plan.
int pipeline_rank_of(const Report& r, int rank) {
  try {
    const auto cfg = nlohmann::json::parse(r.config_json);
    const auto& p = cfg.at("parallel");
    const int64_t t = p.value("tensor", 1), cp = p.value("context", 1), d = p.value("data", 1);
    if (t < 1 || cp < 1 || d < 1) return -1;
    return static_cast<int>(rank / (t * cp * d));
  } catch (const std::exception&) {
    return -1;
  }
}

// The first key of the model, parallel layout or training settings in which the two reports'
// plans differ ("parallel.pipeline 2 vs 1"), or "" when they agree or a report has no plan.
std::string plan_difference(const Report& a, const Report& b) {
  nlohmann::json ca, cb;
  try {
    ca = nlohmann::json::parse(a.config_json);
    cb = nlohmann::json::parse(b.config_json);
  } catch (const std::exception&) {
    return "";
  }
  if (!ca.is_object() || !cb.is_object()) return "";
  for (const char* group : {"model", "parallel", "training"}) {
    if (!ca.contains(group) || !cb.contains(group) || !ca[group].is_object() || !cb[group].is_object()) continue;
    std::set<std::string> keys;
    for (const auto& [k, v] : ca[group].items()) keys.insert(k);
    for (const auto& [k, v] : cb[group].items()) keys.insert(k);
    for (const std::string& k : keys) {
      const nlohmann::json va = ca[group].value(k, nlohmann::json()), vb = cb[group].value(k, nlohmann::json());
      if (va != vb)
        return std::string(group) + "." + k + " " + printable(va.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 40) +
               " vs " + printable(vb.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 40);
    }
  }
  return "";
}

// The GPUs of the report's plan (t · cp · d · p), 0 when the report has no plan.
int64_t plan_world_size(const Report& r) {
  try {
    const auto cfg = nlohmann::json::parse(r.config_json);
    const auto& p = cfg.at("parallel");
    const int64_t t = p.value("tensor", 1), cp = p.value("context", 1), d = p.value("data", 1), pp = p.value("pipeline", 1);
    if (t < 1 || cp < 1 || d < 1 || pp < 1) return 0;
    return t * cp * d * pp;
  } catch (const std::exception&) {
    return 0;
  }
}

// A measured PyTorch profiler trace of one rank against the predicted report: the kernels' time by
// class beside the predicted rank's figures.
int compare_with_kernels(const Report& p, const std::string& predicted_path, const std::string& text, const std::string& path) {
  KernelTrace k;
  try {
    k = read_measured_trace(text, path);
  } catch (const ConfigError& e) {
    throw ConfigError(e.key_path(), e.message() + "; or give a report of ptdp train --json", e.where());
  }
  int pr = pipeline_rank_of(p, k.rank);
  const RankBreakdown* rb = nullptr;
  for (const auto& r : p.ranks)
    if (r.pipeline_rank == pr) rb = &r;
  std::printf("ptdp compare: predicted %s (%s) vs measured %s (%s of rank %d of %d: %lld kernels, %lld NCCL)\n",
              predicted_path.c_str(), p.fidelity.c_str(), path.c_str(),
              is_sqlite_file(text) || is_nsight_json(text) ? "Nsight Systems export, the GPU" : "PyTorch profiler trace", k.rank, k.world_size, static_cast<long long>(k.kernels),
              static_cast<long long>(k.nccl_kernels));
  if (const int64_t gpus = plan_world_size(p); gpus > 0 && k.world_size != gpus)
    std::fprintf(stderr,
                 "ptdp: warning: the trace is of a run of %d ranks (its world size), the prediction of a plan on %lld GPUs: "
                 "the figures compare different runs\n",
                 k.world_size, static_cast<long long>(gpus));
  if (rb == nullptr && !p.ranks.empty()) {
    std::fprintf(stderr, "ptdp: warning: the report does not say which pipeline rank global rank %d is: comparing with pipeline rank %d\n",
                 k.rank, p.ranks.front().pipeline_rank);
    rb = &p.ranks.front();
    pr = rb->pipeline_rank;
  }
  std::printf("\n  %-34s %14s %14s %9s\n", "", "predicted", "measured", "error");
  std::printf("  %-34s %14s %14s %9s\n", k.steps > 0 ? "iteration (ProfilerStep mean)" : "iteration (kernel span)",
              format_time(p.iteration_time_s).c_str(), format_time(k.iteration_s()).c_str(), err(p.iteration_time_s, k.iteration_s()).c_str());
  if (rb != nullptr) {
    const std::string at = " of pipeline rank " + std::to_string(pr);
    auto row = [&](const std::string& what, double predicted, double measured) {
      std::printf("  %-34s %14s %14s %9s\n", what.c_str(), format_time(predicted).c_str(), format_time(measured).c_str(),
                  err(predicted, measured).c_str());
    };
    row("compute busy" + at, rb->busy_s, k.busy_s);
    row("  forward", rb->class_time_s[static_cast<int>(ActionClass::F)], k.forward_s);
    row("  backward (B, I, W)", rb->class_time_s[static_cast<int>(ActionClass::B)] + rb->class_time_s[static_cast<int>(ActionClass::IW)],
        k.backward_s);
    std::printf("\n  communication: predicted exposed time against measured NCCL kernel time (overlapped or not)\n");
    std::map<std::string, double> predicted = {{"tp", rb->exposed_tp_s}, {"pp", rb->exposed_pp_s}, {"dp", rb->exposed_dp_s},
                                               {"shard", rb->exposed_shard_s}};
    if (rb->exposed_cp_s > 0) predicted["cp"] = rb->exposed_cp_s;
    if (rb->exposed_ep_s > 0) predicted["ep"] = rb->exposed_ep_s;
    std::set<std::string> classes;
    for (const auto& [c, v] : predicted) classes.insert(c);
    for (const auto& [c, v] : k.comm_s) classes.insert(c);
    for (const std::string& c : classes) {
      const auto pi = predicted.find(c);
      const auto mi = k.comm_s.find(c);
      std::printf("  %-34s %14s %14s\n", (c == "nccl" ? std::string("nccl (group unknown)") : c).c_str(),
                  pi == predicted.end() ? "-" : format_time(pi->second).c_str(), mi == k.comm_s.end() ? "-" : format_time(mi->second).c_str());
    }
  }
  return 0;
}

}  // namespace

void add_compare(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("compare", "compare a predicted report with a measured one, per action class and rank");
  static std::string predicted_path, measured_path;
  cmd->add_option("PREDICTED", predicted_path, "report JSON of ptdp simulate --json")->required();
  cmd->add_option("MEASURED", measured_path,
                  "report JSON of ptdp train --json (or another simulation), or a measured trace of one rank: PyTorch profiler "
                  "(Kineto) JSON or Nsight Systems SQLite or JSON export")
      ->required();
  cmd->callback([&run] {
    run = [] {
      const Report p = read_report(predicted_path);
      {
        const std::string text = read_input_file(measured_path, "measured report or trace");
        // A trace (of any kind) is read as a profiler trace, which says what it expected.
        if (looks_like_trace(text))
          return compare_with_kernels(p, predicted_path, text, measured_path);
      }
      const Report m = read_report(measured_path);
      std::printf("ptdp compare: predicted %s (%s) vs measured %s (%s)\n", predicted_path.c_str(), p.fidelity.c_str(),
                  measured_path.c_str(), m.fidelity.c_str());
      if (p.gpus != m.gpus)
        std::fprintf(stderr, "ptdp: warning: the reports are for different GPU counts (%lld vs %lld)\n",
                     static_cast<long long>(p.gpus), static_cast<long long>(m.gpus));
      if (const std::string diff = plan_difference(p, m); !diff.empty())
        std::fprintf(stderr, "ptdp: warning: the reports are of different plans (%s): the errors below compare two different runs\n",
                     diff.c_str());
      std::printf("\n  %-22s %14s %14s %9s\n", "", "predicted", "measured", "error");
      std::printf("  %-22s %14s %14s %9s\n", "iteration time", format_time(p.iteration_time_s).c_str(),
                  format_time(m.iteration_time_s).c_str(), err(p.iteration_time_s, m.iteration_time_s).c_str());
      std::printf("  %-22s %14.1f %14.1f %9s\n", "tokens/s", p.tokens_per_s, m.tokens_per_s, err(p.tokens_per_s, m.tokens_per_s).c_str());
      std::printf("  %-22s %13.1f%% %13.1f%% %9s\n", "bubble", 100 * p.bubble_fraction, 100 * m.bubble_fraction,
                  err(p.bubble_fraction, m.bubble_fraction).c_str());

      // Per action class: mean duration of one action, over all pipeline ranks.
      std::printf("\n  per action class (mean duration of one action; SEND/RECV: time blocked per receive)\n");
      std::printf("  %-12s %8s %8s %14s %14s %9s\n", "class", "count", "count", "predicted", "measured", "error");
      for (int c = 0; c < kActionClasses; ++c) {
        int64_t pc = 0, mc = 0;
        double pt = 0, mt = 0;
        int64_t p_recv = 0, m_recv = 0;
        for (const auto& rb : p.ranks) {
          pc += rb.class_count[c];
          pt += rb.class_time_s[c];
        }
        for (const auto& rb : m.ranks) {
          mc += rb.class_count[c];
          mt += rb.class_time_s[c];
        }
        if (pc == 0 && mc == 0) continue;
        const bool p2p = static_cast<ActionClass>(c) == ActionClass::P2P;
        // Half the p2p actions are receives; the time belongs to them.
        p_recv = p2p ? pc / 2 : pc;
        m_recv = p2p ? mc / 2 : mc;
        const double pm = p_recv ? pt / static_cast<double>(p_recv) : NAN, mm = m_recv ? mt / static_cast<double>(m_recv) : NAN;
        std::printf("  %-12s %8lld %8lld %14s %14s %9s\n", std::string(to_string(static_cast<ActionClass>(c))).c_str(),
                    static_cast<long long>(pc), static_cast<long long>(mc), std::isnan(pm) ? "-" : format_time(pm).c_str(),
                    std::isnan(mm) ? "-" : format_time(mm).c_str(), err(pm, mm).c_str());
      }

      // Recompute is a part of the B and I actions: its time per iteration, all ranks together.
      double p_rc = 0, m_rc = 0;
      for (const auto& rb : p.ranks) p_rc += rb.recompute_s;
      for (const auto& rb : m.ranks) m_rc += rb.recompute_s;
      if (p_rc > 0 || m_rc > 0)
        std::printf("  %-12s %8s %8s %14s %14s %9s   (of B/I, per iteration)\n", "recompute", "", "", format_time(p_rc).c_str(),
                    format_time(m_rc).c_str(), err(p_rc, m_rc).c_str());

      std::printf("\n  per pipeline rank: predicted / measured (error)\n");
      std::printf("  %-6s %-30s %-30s %-30s %-30s %-30s\n", "rank", "busy", "bubble", "exposed tp + cp + ep", "exposed pp", "exposed dp");
      for (const auto& pr : p.ranks) {
        const RankBreakdown* mr = nullptr;
        for (const auto& r : m.ranks)
          if (r.pipeline_rank == pr.pipeline_rank) mr = &r;
        if (!mr) continue;
        auto cell = [](double a, double b) {
          return format_time(a) + " / " + format_time(b) + " (" + err(a, b) + ")";
        };
        std::printf("  %-6d %-30s %-30s %-30s %-30s %-30s\n", pr.pipeline_rank, cell(pr.busy_s, mr->busy_s).c_str(),
                    cell(pr.bubble_s, mr->bubble_s).c_str(), cell(pr.exposed_tp_s + pr.exposed_cp_s + pr.exposed_ep_s, mr->exposed_tp_s + mr->exposed_cp_s + mr->exposed_ep_s).c_str(),
                    cell(pr.exposed_pp_s, mr->exposed_pp_s).c_str(), cell(pr.exposed_dp_s, mr->exposed_dp_s).c_str());
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
