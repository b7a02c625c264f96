#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <functional>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "cli/commands.hpp"
#include "cli/process.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "model/flops.hpp"
#include "model/layout.hpp"
#include "model/partition.hpp"
#include "scenarios/scenario.hpp"
#include "sim/scenario_input.hpp"
#include "sim/simulate.hpp"

namespace ptdp::cli {

void add_scenario_args(CLI::App* cmd, ScenarioArgs& args, bool scenario_required) {
  auto* opt = cmd->add_option("SCENARIO", args.path, "scenario YAML file");
  if (scenario_required) opt->required();
  cmd->add_option("--set", args.sets, "override a scenario key, e.g. --set parallel.tensor=4 (repeatable)")
      ->type_name("KEY=VALUE");
}

void add_price_option(CLI::App* cmd, ScenarioArgs& args) {
  cmd->add_option("--gpu-hour-price", args.gpu_hour_price,
                  "US dollars per GPU-hour: the report's cost_usd for training.train_tokens (same as --set cost.gpu_hour_price=USD)")
      ->type_name("USD");
}

std::vector<Override> overrides_of(const ScenarioArgs& args) {
  std::vector<Override> out = parse_overrides(args.sets);
  if (!args.gpu_hour_price.empty()) out.push_back({"cost.gpu_hour_price", args.gpu_hour_price});
  return out;
}

void write_text_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path);
  if (!out) throw EnvironmentError(std::string("cannot write ") + what + " '" + path + "'");
  out << text;
  out.close();
  if (!out) throw EnvironmentError(std::string("failed writing ") + what + " '" + path + "'");
}

namespace {

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * x);
  return b;
}

// Per pipeline rank: where its GPU memory goes (and the host memory offloading takes).
void print_memory_table(const std::vector<MemoryBreakdown>& memory) {
  if (memory.empty()) return;
  const bool host = std::any_of(memory.begin(), memory.end(), [](const MemoryBreakdown& m) { return m.host_bytes > 0; });
  // runtime: the CUDA context and NCCL buffers, with the allocator's reserve (fragmentation).
  const bool runtime = std::any_of(memory.begin(), memory.end(), [](const MemoryBreakdown& m) { return m.runtime_bytes + m.allocator_bytes > 0; });
  std::printf("\n  %-6s %10s %10s %10s %11s %10s%s %10s%s\n", "p-rank", "weights", "gradients", "optimizer", "activations",
              "buffers", runtime ? "    runtime" : "", "total", host ? "       host" : "");
  const size_t n = memory.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 16 && i >= 8 && i + 8 < n) {
      if (i == 8) std::printf("  %-6s\n", "…");
      continue;
    }
    const auto& m = memory[i];
    std::printf("  %-6d %10s %10s %10s %11s %10s", m.pipeline_rank, format_bytes(m.weights_bytes).c_str(),
                format_bytes(m.gradients_bytes).c_str(), format_bytes(m.optimizer_bytes).c_str(),
                format_bytes(m.activations_bytes).c_str(), format_bytes(m.buffers_bytes).c_str());
    if (runtime) std::printf(" %10s", format_bytes(m.runtime_bytes + m.allocator_bytes).c_str());
    std::printf(" %10s", format_bytes(m.total_bytes).c_str());
    if (host) std::printf(" %10s", format_bytes(m.host_bytes).c_str());
    std::printf("\n");
  }
}

void print_report(const Scenario& sc, const SimulationResult& res, const std::string& schedule_path) {
  const Report& r = res.report;
  const auto& p = sc.plan;
  std::ostringstream plan;
  plan << "t " << p.tensor;
  if (p.context > 1) plan << " · cp " << p.context << " (" << to_string(p.context_comm) << ")";
  plan << " · p " << p.pipeline << " · d " << p.data;
  if (sc.model.has_moe()) {
    plan << " · ep " << p.expert;
    if (p.expert_tensor_size() != p.tensor) plan << " · etp " << p.expert_tensor_size();
    plan << " (" << to_string(p.moe_dispatcher) << ")";
  }
  plan << ", " << to_string(p.schedule);
  if (p.schedule == ScheduleKind::Interleaved) plan << " v " << p.virtual_stages;
  plan << ", b " << p.micro_batch << ", B " << p.global_batch << " (m " << p.num_microbatches() << ")"
       << ", recompute " << to_string(p.recompute) << (p.sequence_parallel ? ", sequence parallel" : "")
       << (p.scatter_gather && !p.sequence_parallel ? ", scatter/gather" : "");
  if (p.zero_stage > 0) {
    plan << ", ZeRO-" << p.zero_stage << " over " << p.sharding_degree() << " ranks";
    if (p.sharding_group == ShardingGroup::Node) plan << " (node, replicated across nodes)";
    if (p.offload != Offload::None) plan << ", offload " << to_string(p.offload);
  }
  auto line = [](const std::string& k, const std::string& v) { std::printf("  %-18s %s\n", k.c_str(), v.c_str()); };
  char buf[256];
  std::printf("ptdp simulate: %s on %lld × %s (%s), fidelity %s\n", sc.model.name.c_str(), static_cast<long long>(sc.gpus),
              sc.cluster.gpu.name.c_str(), sc.cluster.name.c_str(), r.fidelity.c_str());
  line("plan", plan.str());
  if (!schedule_path.empty())
    line("schedule", schedule_path + " (p " + std::to_string(res.schedule.p) + ", v " + std::to_string(res.schedule.v) +
                         ", m " + std::to_string(res.schedule.m) + ", " + std::to_string(res.schedule.num_actions()) +
                         " actions)");
  line("parameters", format_count(r.parameters) + (sc.model.has_moe() ? " (" + format_count(active_parameter_count(sc.model)) +
                                                      " active per token; each rank holds " +
                                                      std::to_string(sc.model.moe.num_experts / p.expert) + " of " +
                                                      std::to_string(sc.model.moe.num_experts) + " experts per MoE layer)"
                                                : std::string()));
  line("FLOPs counted by", flops_formula(sc.model));
  if (!p.layout_layers.empty())
    line("pipeline layout", format_pipeline_layout(p.layout_layers, p.layout_mtp) +
                                (p.mtp_apart() ? " (multi-token prediction on stage " + std::to_string(p.mtp_stage()) + ")" : std::string()));
  const auto layers = stage_layers(sc.model, p);
  if (p.layout_layers.empty() && (std::adjacent_find(layers.begin(), layers.end(), std::not_equal_to<>()) != layers.end() ||
                                  p.partition == Partition::Balanced)) {
    std::string list;
    for (size_t i = 0; i < layers.size(); ++i) list += (i ? ", " : "") + std::to_string(layers[i]);
    line("layers per stage", "[" + list + "] (" + (p.partition == Partition::Balanced ? "balanced" : "given") + ")");
  }
  line("iteration time", format_time(r.iteration_time_s));
  const bool fp8 = p.precision == Precision::FP8;
  std::snprintf(buf, sizeof buf, "%.1f TFLOP/s per GPU (%s of the %s peak), MFU %s%s", r.tflops_per_gpu,
                pct(r.tflops_per_gpu * 1e12 / sc.cluster.gpu.peak_flops).c_str(), fp8 ? "bf16" : "dense", pct(r.mfu).c_str(),
                fp8 ? " of the FP8 peak" : "");
  line("throughput", buf);
  if (r.mfu > 1)
    std::fprintf(stderr, "ptdp: warning: MFU %.2f is above 1: the profile's peak (%s) under-estimates these devices (a calibration "
                         "taken under load?); recalibrate (ptdp calibrate, or ptdp validate --recalibrate)\n",
                 r.mfu, format_count(sc.cluster.gpu.peak_flops).c_str());
  std::snprintf(buf, sizeof buf, "%.0f tokens/s (%.1f sequences/s)", r.tokens_per_s, r.tokens_per_s / sc.model.seq_length);
  line("tokens", buf);
  line("pipeline bubble", pct(r.bubble_fraction) + " of iteration time");
  line("exposed comm", "tp " + format_time(r.exposed_comm_s.at("tp")) + " · pp " + format_time(r.exposed_comm_s.at("pp")) +
                           " · dp " + format_time(r.exposed_comm_s.at("dp")) +
                           (r.exposed_comm_s.count("cp") ? " · cp " + format_time(r.exposed_comm_s.at("cp")) : std::string()) +
                           (r.exposed_comm_s.count("ep") ? " · ep " + format_time(r.exposed_comm_s.at("ep")) : std::string()) +
                           (r.exposed_comm_s.count("shard") && r.exposed_comm_s.at("shard") > 0
                                ? " · shard " + format_time(r.exposed_comm_s.at("shard"))
                                : std::string()) +
                           " per iteration");
  if (!r.overlap_gain_s.empty()) {
    std::string gains;
    for (const auto& [key, gain] : r.overlap_gain_s) {
      std::snprintf(buf, sizeof buf, "%s%s %s %s (%s)", gains.empty() ? "" : " · ", key.c_str(), gain >= 0 ? "saves" : "costs",
                    format_time(std::abs(gain)).c_str(), pct(std::abs(gain) / (r.iteration_time_s + std::max(0.0, gain))).c_str());
      gains += buf;
    }
    line("overlaps", gains + " (against the plan without it, analytic)");
  }
  line("peak memory", format_bytes(r.peak_memory_bytes) + " of " + format_bytes(r.gpu_memory_bytes) + " per GPU" +
                          (r.fits_in_memory ? " (fits)" : " (DOES NOT FIT)"));
  if (r.training_days) {
    std::snprintf(buf, sizeof buf, "%.1f days for %.3g tokens", *r.training_days, *sc.train_tokens);
    line("training time", buf);
    std::snprintf(buf, sizeof buf, "%.3g GPU-hours", *r.gpu_hours);
    std::string cost = buf;
    if (r.energy_kwh) {
      std::snprintf(buf, sizeof buf, ", %.3g MWh (GPUs at %.0f W busy / %.0f W idle, nodes %.0f W)", *r.energy_kwh / 1e3,
                    sc.cluster.gpu.power_w, sc.cluster.gpu.idle_power_w, sc.cluster.node_power_w);
      cost += buf;
    }
    if (r.cost_usd) {
      std::snprintf(buf, sizeof buf, ", $%.3g", *r.cost_usd);
      cost += buf;
    }
    line("cost", cost);
  }
  line("bottleneck", r.bottleneck);
  // What the run does that this prediction leaves out (an imported launch line's unmapped
  // arguments): the numbers above are of the plan without it.
  if (!sc.not_modelled.empty()) {
    line("not modelled", std::to_string(sc.not_modelled.size()) + " thing" + (sc.not_modelled.size() > 1 ? "s" : "") +
                             " the run does that this prediction leaves out (not_modelled in the scenario):");
    for (const auto& item : sc.not_modelled) std::printf("  %-18s - %s\n", "", printable(item, 200).c_str());
  }
  print_memory_table(r.memory);
  if (!r.ranks.empty()) {
    const bool shard = sc.plan.zero_stage > 0, cp = sc.plan.context > 1, ep = sc.model.has_moe();
    // Exposed communication by group: tensor, context and expert parallel (inside F/B), pipeline,
    // data parallel.
    std::printf("\n  %-6s %12s %12s %12s%s%s %12s %12s %12s%s\n", "p-rank", "busy", "bubble", "tp", cp ? "           cp" : "",
                ep ? "           ep" : "", "pp", "dp", "recompute", shard ? "        shard" : "");
    const size_t n = r.ranks.size();
    for (size_t i = 0; i < n; ++i) {
      if (n > 16 && i >= 8 && i + 8 < n) {
        if (i == 8) std::printf("  %-6s\n", "…");
        continue;
      }
      const auto& rb = r.ranks[i];
      std::printf("  %-6d %12s %12s %12s", rb.pipeline_rank, format_time(rb.busy_s).c_str(), format_time(rb.bubble_s).c_str(),
                  format_time(rb.exposed_tp_s).c_str());
      if (cp) std::printf(" %12s", format_time(rb.exposed_cp_s).c_str());
      if (ep) std::printf(" %12s", format_time(rb.exposed_ep_s).c_str());
      std::printf(" %12s %12s %12s", format_time(rb.exposed_pp_s).c_str(), format_time(rb.exposed_dp_s).c_str(),
                  format_time(rb.recompute_s).c_str());
      if (shard) std::printf(" %12s", format_time(rb.exposed_shard_s).c_str());
      std::printf("\n");
    }
  }
}

// What each overlap the plan turns on buys: the same plan without it (and without the overlaps
// that need it: overlap_param_gather needs overlap_grad_reduce), both analytic. A CPU cluster
// overlaps nothing (its collectives block the core): none.
// `analytic_with_s`: the plan's own analytic time when the caller has it (< 0: simulated here).
std::map<std::string, double> overlap_gains(const Scenario& sc, const std::string& path, const std::vector<Override>& sets,
                                            const std::string& schedule_path, double analytic_with_s) {
  std::map<std::string, double> out;
  if (!sc.cluster.overlaps_communication()) return out;
  const ParallelPlan& p = sc.plan;
  struct Switch {
    const char* name;
    bool on;
    std::vector<Override> off;
  };
  const std::vector<Switch> switches = {
      {"overlap_grad_reduce", p.overlap_grad_reduce, {{"parallel.overlap_param_gather", "false"}, {"parallel.overlap_grad_reduce", "false"}}},
      {"overlap_param_gather", p.overlap_param_gather, {{"parallel.overlap_param_gather", "false"}}},
      {"tp_comm_overlap", p.tp_comm_overlap, {{"parallel.tp_comm_overlap", "false"}}},
      {"moe_comm_overlap", p.moe_comm_overlap, {{"parallel.moe_comm_overlap", "false"}}},
      // Pipeline sends beside compute (interleaving at pipeline 2 needs them: no plan without).
      {"overlap_p2p", p.overlap_p2p && p.pipeline > 1 && !(p.pipeline == 2 && p.schedule == ScheduleKind::Interleaved),
       {{"parallel.overlap_p2p", "false"}}},
      // ZeRO-3 / FSDP prefetch: the next units' gathers under this unit's compute.
      {"max_inflight_gathers", p.zero_stage >= 3 && p.max_inflight_gathers > 1, {{"parallel.max_inflight_gathers", "1"}}}};
  auto analytic_s = [&](const std::vector<Override>& extra) {
    std::vector<Override> all = sets;
    all.insert(all.end(), extra.begin(), extra.end());
    const Scenario variant = extra.empty() ? sc : load_scenario(path, all);
    const Schedule schedule = schedule_of(variant, schedule_path, false);
    return simulate(simulation_input(variant), schedule, Fidelity::Analytic, false).report.iteration_time_s;
  };
  double with = analytic_with_s;
  for (const Switch& sw : switches) {
    if (!sw.on) continue;
    if (with < 0) with = analytic_s({});
    out[sw.name] = analytic_s(sw.off) - with;
  }
  return out;
}

}  // namespace

void add_simulate(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("simulate", "predict one training iteration of a scenario (default: GPT-3 175B on 1024 A100s)");
  static ScenarioArgs args;
  static std::string fidelity = "analytic", json_path, trace_path, schedule_path;
  add_scenario_args(cmd, args, false);
  add_price_option(cmd, args);
  cmd->add_option("--schedule", schedule_path, kScheduleHelp)->type_name("FILE.csv");
  cmd->add_option("--fidelity", fidelity, "analytic (critical path), reduced or full (SimGrid)")->capture_default_str();
  cmd->add_option("--json", json_path, "write the report as JSON to FILE")->type_name("FILE");
  cmd->add_option("--trace", trace_path, "write a Chrome/Perfetto trace of the predicted iteration to FILE")->type_name("FILE");
  cmd->callback([&run] {
    run = [] {
      const Scenario sc = load_scenario(args.path, overrides_of(args));
      const Fidelity f = parse_fidelity(fidelity);
      SimulationInput in = simulation_input(sc);
      in.show_progress = true;
      Schedule schedule = schedule_of(sc, schedule_path, /*check_deadlocks=*/f != Fidelity::Analytic);
      SimulationResult res = simulate(in, std::move(schedule), f, !trace_path.empty());
      res.report.schedule = schedule_path.empty() ? to_string(sc.plan.schedule) + " (generated)" : schedule_path;
      res.report.overlap_gain_s = overlap_gains(sc, args.path, overrides_of(args), schedule_path,
                                                f == Fidelity::Analytic ? res.report.iteration_time_s : -1.0);
      for (const auto& w : res.warnings) std::cerr << "ptdp: warning: " << w << "\n";
      check_report(res.report);
      print_report(sc, res, schedule_path);
      if (!json_path.empty()) write_text_file(json_path, report_to_json(res.report) + "\n", "JSON report");
      if (!trace_path.empty()) {
        const SlowNotice notice("writing the trace " + trace_path + " (" + std::to_string(res.timeline.events.size()) + " events)");
        write_chrome_trace(res.timeline, trace_path);
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
