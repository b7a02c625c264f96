// `ptdp sweep`: flags and printing around the sweep engine (search/sweep.hpp). Under mpirun the
// configurations are split across ranks over the executor's MPI communicator.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "interop/interop.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "sim/scenario_input.hpp"
#include "search/sweep.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);
int run_plot_script(const std::string& script, const std::vector<std::string>& args);

namespace {

std::vector<Override> to_overrides(const Overrides& sets) {
  std::vector<Override> out;
  for (const auto& [k, v] : sets) out.push_back({k, v});
  return out;
}

// --vary KEY=V1,V2,… → (key, values), checked against the scenario keys.
std::vector<std::pair<std::string, std::vector<std::string>>> parse_axes(const std::vector<std::string>& vary) {
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  const auto& keys = scenario_keys();
  for (const auto& v : vary) {
    const auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--vary", "expects KEY=V1,V2,… e.g. --vary parallel.tensor=1,2,4,8 (got '" + v + "')");
    const std::string key = v.substr(0, eq);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      throw ConfigError(key, "--vary: unknown key" + did_you_mean(key, keys));
    std::vector<std::string> values;
    std::stringstream ss(v.substr(eq + 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) throw ConfigError(key, "--vary: empty value in '" + v + "'");
      values.push_back(item);
    }
    if (values.empty()) throw ConfigError(key, "--vary: no values in '" + v + "'");
    // A key varied twice: the second list replaced the first silently (issue 36).
    for (const auto& [k, given] : axes)
      if (k == key) throw ConfigError(key, "--vary: given twice (give all its values in one list: --vary " + key + "=V1,V2,…)");
    axes.emplace_back(key, values);
  }
  return axes;
}

// The ranking figure of a report, for the table: what --rank-by compares, in readable units.
std::string rank_text(const Report& r, SweepRank by) {
  const RankFigure f = rank_figure(r, by);
  char buf[48];
  if (f.name == "tokens_per_s") std::snprintf(buf, sizeof buf, "%.0f", f.value);
  else if (f.name == "cost_usd") std::snprintf(buf, sizeof buf, "$%.4g", f.value);
  else std::snprintf(buf, sizeof buf, "%.3g", f.value);
  return buf;
}
std::string rank_heading(SweepRank by, bool priced) {
  switch (by) {
    case SweepRank::Time: return "tokens/s";
    case SweepRank::Cost: return priced ? "cost USD" : "GPU-h/Mtok";
    case SweepRank::Energy: return "kWh/Mtok";
  }
  return "";
}

using Axes = std::vector<std::pair<std::string, std::vector<std::string>>>;

// The keys --auto chooses (search/sweep auto_candidates): not --vary-able with it.
const char* const kAutoKeys[] = {"parallel.tensor", "parallel.pipeline", "parallel.data", "parallel.context", "parallel.expert",
                                 "parallel.expert_tensor", "training.micro_batch", "parallel.schedule", "parallel.virtual_stages",
                                 "parallel.recompute", "parallel.partition", "parallel.sequence_parallel", "parallel.zero_stage",
                                 "parallel.sharding_group", "parallel.offload", "parallel.overlap_grad_reduce",
                                 "parallel.overlap_param_gather", "parallel.tp_comm_overlap", "parallel.moe_comm_overlap",
                                 "parallel.layers_per_stage", "parallel.pipeline_layout", "parallel.first_stage_layers", "parallel.last_stage_layers",
                                 "parallel.microbatch_group"};

void print_table(const Scenario& base, const SweepResult& res, size_t invalid_total, const SkipReasons& invalid, size_t top,
                 Fidelity refine, int ranks, SweepRank by, const Axes& axes) {
  const auto& outs = res.outcomes;
  const size_t oom = res.out_of_memory;  // (without --csv only the closest to fitting has an outcome)
  size_t errors = 0;
  for (const auto& o : outs) errors += o.status == "error";
  const size_t pruned = res.pruned, swept = res.candidates;  // pruned plans are counted, not kept (but with --csv)
  std::printf("ptdp sweep: %s on %lld × %s — %zu valid configurations (%zu ranked, %zu do not fit in %s, %zu failed), "
              "%zu invalid skipped\n",
              base.model.name.c_str(), static_cast<long long>(base.gpus), base.cluster.gpu.name.c_str(), swept,
              res.ranking.size(), oom, format_bytes(base.cluster.gpu.memory_bytes).c_str(), errors, invalid_total);
  // By reason, each with the numbers of one plan it refused.
  for (const auto& [reason, s] : invalid) std::printf("  skipped %6zu, e.g. %s\n", s.count, s.example.c_str());
  // The plans the memory model refuses, with the one that comes closest to fitting.
  const SweepOutcome* closest = nullptr;
  for (const auto& o : outs)
    if (o.status == "oom" && (!closest || o.analytic.peak_memory_bytes < closest->analytic.peak_memory_bytes)) closest = &o;
  if (closest)
    std::printf("  no room %6zu, e.g. %s needs %s per GPU of %s (the closest to fitting)\n", oom, plan_label(closest->plan).c_str(),
                format_bytes(closest->analytic.peak_memory_bytes).c_str(), format_bytes(closest->analytic.gpu_memory_bytes).c_str());
  std::printf("  analytic: %zu configurations in %.2f s (%.0f per second%s; %zu critical paths, %zu memory checks only, "
              "%zu skipped by their lower bound: they cannot enter the top %zu; --exhaustive simulates them)\n",
              swept, res.analytic_s, static_cast<double>(swept) / res.analytic_s, ranks > 1 ? ", all ranks" : "",
              res.ranking.size() + errors, oom, pruned, std::max<size_t>(1, top));
  if (by == SweepRank::Time)
    std::printf("  ranked by tokens/s (higher is better; TFLOP/s per GPU also counts recompute FLOPs, so it can order plans "
                "differently); re-simulated ones by their %s figure; --plot draws the same figure\n",
                to_string(refine).c_str());
  else
    std::printf("  ranked by %s (%s, lower is better); re-simulated ones by their %s figure; --plot draws the same figure\n", to_string(by).c_str(),
                by == SweepRank::Energy ? "energy per token: GPUs busy/idle and node power"
                                        : (base.gpu_hour_usd ? "cost_usd for training.train_tokens" : "GPU-hours per token"),
                to_string(refine).c_str());
  const size_t shown = std::min<size_t>(res.ranking.size(), std::max<size_t>(top, 10));
  int label_w = 40;  // the configuration column fits its longest label
  for (size_t i = 0; i < shown; ++i) label_w = std::max(label_w, static_cast<int>(plan_label(outs[res.ranking[i]].plan).size()));
  // The varied keys get a column each (their last path component as heading), then the
  // ranked figure, then the rest.
  std::vector<std::pair<std::string, int>> vcols;  // key, width
  for (const auto& [key, values] : axes) {
    const std::string heading = key.substr(key.rfind('.') + 1);
    int w = static_cast<int>(heading.size());
    for (const auto& v : values) w = std::max(w, static_cast<int>(v.size()));
    vcols.emplace_back(key, w);
  }
  const std::string heading = rank_heading(by, base.gpu_hour_usd.has_value());
  std::printf("\n  %4s ", "rank");
  for (const auto& [key, w] : vcols) std::printf(" %-*s", w, key.substr(key.rfind('.') + 1).c_str());
  std::printf("  %-*s %11s %11s %11s %10s %9s %8s %9s  %s\n", label_w, "configuration", heading.c_str(), "analytic", to_string(refine).c_str(),
              "iteration", "half NIC", "bubble", "memory", "bottleneck");
  std::printf("  %4s ", "");
  for (const auto& [key, w] : vcols) std::printf(" %-*s", w, "");
  std::printf("  %-*s %11s %11s %11s %10s %9s %8s %9s\n", label_w, "", "(ranked)", "TFLOP/s/GPU",
              "TFLOP/s/GPU", "s", "s (*)", "%", "GB/GPU");
  for (size_t i = 0; i < shown; ++i) {
    const SweepOutcome& o = outs[res.ranking[i]];
    const Report& r = o.refined ? *o.refined : o.analytic;
    char refined[32] = "-";
    if (o.refined)
      std::snprintf(refined, sizeof refined, "%.1f", o.refined->tflops_per_gpu);
    else if (o.refined_error.rfind("not re-simulated", 0) == 0)
      std::snprintf(refined, sizeof refined, "(budget)");
    else if (!o.refined_error.empty())
      std::snprintf(refined, sizeof refined, "failed");
    std::printf("  %4zu ", i + 1);
    for (const auto& [key, w] : vcols) {
      std::string value;
      for (const auto& [k, v] : o.sets)
        if (k == key) value = v;
      std::printf(" %-*s", w, value.c_str());
    }
    char half[32] = "";
    if (o.half_nic_iteration_s) std::snprintf(half, sizeof half, "%.3f", *o.half_nic_iteration_s);
    std::printf("  %-*s %11s %11.1f %11s %10.3f %9s %8.1f %9.1f  %s\n", label_w, plan_label(o.plan).c_str(), rank_text(r, by).c_str(),
                o.analytic.tflops_per_gpu, refined, r.iteration_time_s, half, 100 * r.bubble_fraction, r.peak_memory_bytes / 1e9,
                r.bottleneck.c_str());
    // A top row without its refined figure says why.
    if (!o.refined_error.empty() && o.refined_error.rfind("not re-simulated", 0) != 0)
      std::printf("        %s failed: %s\n", to_string(refine).c_str(), o.refined_error.c_str());
    else if (!o.refined_error.empty())
      std::printf("        %s\n", o.refined_error.c_str());
  }
  // Rank stability: did the re-simulation reorder the analytic top three?
  const auto& before = res.analytic_top;
  const size_t three = std::min<size_t>(3, before.size());
  bool all_refined = three >= 2;
  for (size_t i = 0; i < three; ++i) all_refined = all_refined && outs[before[i]].refined.has_value();
  if (all_refined) {
    std::string moved;
    bool same = true;
    for (size_t i = 0; i < three; ++i) {
      const size_t was = static_cast<size_t>(std::find(before.begin(), before.end(), res.ranking[i]) - before.begin());
      same = same && was == i;
      moved += (i ? ", " : "") + std::to_string(was + 1);
    }
    if (same)
      std::printf("  rank stability: the top %zu keep their analytic order at %s fidelity\n", three, to_string(refine).c_str());
    else
      std::printf("  rank stability: the top %zu changed order between the analytic and %s passes: %s ranks 1–%zu were analytic "
                  "ranks %s\n", three, to_string(refine).c_str(), to_string(refine).c_str(), three, moved.c_str());
  } else if (refine != Fidelity::Analytic && three >= 2) {
    std::printf("  rank stability: unknown — not all of the top %zu were re-simulated (see above)\n", three);
  }
  size_t leaning = 0;
  for (size_t i = 0; i < shown; ++i) leaning += outs[res.ranking[i]].half_nic_iteration_s.has_value();
  if (leaning > 0)
    std::printf("  (*) %zu plan(s) hide more than half of their data-parallel/sharding communication behind compute: their iteration "
                "time with the NICs at half bandwidth (analytic) says how much their place depends on it\n", leaning);
  std::printf("  total %.1f s\n", res.total_s);
}

// --auto keeps the scenario's precision (FP8 changes the run's arithmetic, not only its speed);
// where the GPUs have FP8 tensor cores and no --vary asked for it, the table says what FP8 would
// give: rank 1's plan in FP8, analytic, against the same plan as ranked.
void print_fp8_note(const std::vector<std::shared_ptr<const SimulationInput>>& families, const SweepOutcome& winner, const Axes& axes) {
  for (const auto& [key, values] : axes)
    if (key == "training.precision") return;  // swept: the table has both
  if (winner.family < 0 || static_cast<size_t>(winner.family) >= families.size()) return;
  SimulationInput in = *families[static_cast<size_t>(winner.family)];
  in.plan = winner.plan;
  if (in.plan.precision == Precision::FP8 || in.plan.precision == Precision::FP32 || in.cluster.gpu.fp8_peak_flops <= 0) return;
  SimulationInput fp8 = in;
  fp8.plan.precision = Precision::FP8;
  try {
    validate_plan(fp8.model, fp8.plan, fp8.plan.gpus());
    const Report r = simulate(fp8, make_costed_schedule(fp8.model, fp8.plan, fp8.cluster, false), Fidelity::Analytic, false).report;
    std::printf("  precision: kept at %s (--auto does not change the numerics). FP8 would run rank 1's plan %.2f× as fast "
                "(analytic: %.3f s → %.3f s per iteration%s); --vary training.precision=%s,fp8 sweeps both\n",
                to_string(in.plan.precision).c_str(), winner.analytic.iteration_time_s / r.iteration_time_s,
                winner.analytic.iteration_time_s, r.iteration_time_s, r.fits_in_memory ? "" : ", but it would not fit",
                to_string(in.plan.precision).c_str());
  } catch (const std::exception& e) {
    std::printf("  precision: kept at %s (--auto does not change the numerics); rank 1's plan in FP8: %s\n",
                to_string(in.plan.precision).c_str(), e.what());
  }
}

// The flags of `ptdp sweep`.
struct SweepFlags {
  ScenarioArgs args;
  std::vector<std::string> vary;
  bool automatic = false, megatron = false, exhaustive = false, budget_given = false;
  double refine_budget = 5;
  int top = 10, jobs = 0;
  int64_t max_configurations = static_cast<int64_t>(kDefaultMaxConfigurations);
  std::string fidelity = "reduced", csv_path, plot_path, rank_by = "time";
};

// Under mpirun: this process's rank in the executor's communicator, and the gather/broadcast the
// sweep splits its work with. (`mpi` and `world` outlive the group's functions: the caller's.)
void join_mpi(std::optional<exec::MpiSession>& mpi, std::unique_ptr<exec::Communicator>& world, SweepGroup& group) {
  mpi.emplace(nullptr, nullptr);
  world = exec::make_mpi_world(3600.0);
  group.rank = world->rank();
  group.size = world->size();
  exec::Communicator* w = world.get();
  group.gather = [w](const std::string& mine) {
    std::vector<std::string> out;
    for (const auto& part : w->gather_bytes(std::vector<char>(mine.begin(), mine.end()), 0)) out.emplace_back(part.begin(), part.end());
    return out;
  };
  group.broadcast = [w](const std::string& text) {
    std::string s = text;
    uint64_t len = s.size();
    w->broadcast(&len, sizeof len, 0);
    s.resize(len);
    w->broadcast(s.data(), len, 0);
    return s;
  };
}

// The candidates of this rank: --auto's layouts of the scenario (or of each combination of the
// --vary keys it keeps, a family each), or the --vary product.
SweepCandidates sweep_candidates(const SweepFlags& f, const Axes& axes, const Scenario& base,
                                 const std::function<SimulationInput(const Overrides&)>& load, SkipReasons& invalid,
                                 SweepGroup& group) {
  if (!f.automatic)
    return SweepCandidates(product_candidates(axes, load, invalid, static_cast<size_t>(f.max_configurations), group.rank == 0));
  // The sweep's outputs name each plan by its overrides (table, CSV); resolving every one of
  // a few hundred thousand candidates into its config JSON would cost more than costing it: the
  // candidates have none, and come in shape groups (built as the sweep needs them).
  // Under mpirun each rank enumerates its share of the layouts (group.split).
  const int part = group.rank, parts = group.size;
  std::vector<std::shared_ptr<const SimulationInput>> families;  // each family's input
  SweepCandidates cands;
  if (axes.empty()) {
    families.push_back(std::make_shared<const SimulationInput>(simulation_input(base)));
    cands = auto_candidate_groups(*families[0], invalid, f.jobs, 0, part, parts);
  } else {
    // Each combination of the varied keys (e.g. the precision) is a family of its own, its
    // layouts enumerated as for the scenario alone.
    const auto combos = product_candidates(axes, load, invalid, static_cast<size_t>(f.max_configurations), false);
    for (size_t i = 0; i < combos.size(); ++i) {
      families.push_back(std::make_shared<const SimulationInput>(combos[i].input()));
      SweepCandidates more = auto_candidate_groups(*families.back(), invalid, f.jobs, static_cast<int>(i), part, parts);
      more.prepend_sets(combos[i].sets);
      cands.append(std::move(more));
    }
  }
  group.split = true;
  group.family_inputs = std::move(families);
  return cands;
}

// --auto under mpirun: every rank's candidates counted and skips merged on rank 0 (the example of
// each reason: the one the first layout gave, as one process would report it); the total is
// every rank's.
size_t count_across_ranks(size_t mine_count, SkipReasons& invalid, const SweepGroup& group) {
  nlohmann::json mine = nlohmann::json::object();
  mine["candidates"] = mine_count;
  for (const auto& [reason, sk] : invalid) mine["skips"][reason] = {sk.count, sk.example, sk.first};
  const auto parts = group.gather(mine.dump());
  size_t total = 0;
  if (group.rank == 0) {
    invalid.clear();
    for (const auto& text : parts) {
      const auto j = nlohmann::json::parse(text);
      total += j["candidates"].get<size_t>();
      if (!j.contains("skips")) continue;
      for (const auto& [reason, v] : j["skips"].items()) {
        Skipped& into = invalid[reason];
        const size_t first = v[2].get<size_t>();
        if (into.count == 0 || first < into.first) {
          into.example = v[1].get<std::string>();
          into.first = first;
        }
        into.count += v[0].get<size_t>();
      }
    }
  }
  return std::stoull(group.broadcast(std::to_string(total)));
}

// --megatron: rank 1's launch line when Megatron-LM runs it as such; otherwise which framework
// rank 1 needs, and the launch line of the best plan Megatron-LM can run.
void print_megatron_lines(const SweepFlags& f, const std::vector<Override>& base_sets, const SweepResult& res) {
  auto print_line = [&](size_t rank, const char* what) {
    const SweepOutcome& o = res.outcomes[res.ranking[rank]];
    std::vector<Override> sets = base_sets;
    for (const auto& x : to_overrides(o.sets)) sets.push_back(x);
    std::vector<std::string> caveats;
    std::printf("\nMegatron-LM launch line of rank %zu (%s)%s:\n%s", rank + 1, plan_label(o.plan).c_str(), what,
                export_megatron(load_scenario(f.args.path, sets), &caveats).c_str());
    for (const auto& c : caveats) std::printf("  note: %s\n", c.c_str());
  };
  const std::string needs = framework_needed(res.outcomes[res.ranking[0]].plan);
  if (needs.empty()) {
    print_line(0, "");
    return;
  }
  std::printf("\nrank 1 (%s) needs %s: Megatron-LM cannot run it as such\n", plan_label(res.outcomes[res.ranking[0]].plan).c_str(),
              needs.c_str());
  size_t i = 1;
  while (i < res.ranking.size() && !framework_needed(res.outcomes[res.ranking[i]].plan).empty()) ++i;
  if (i < res.ranking.size()) print_line(i, ", the best plan Megatron-LM can run");
  else std::printf("no ranked plan is one Megatron-LM can run as such\n");
}

// --csv (complete on disk before the plot script reads it) and --plot.
void write_sweep_csv(const SweepFlags& f, const Scenario& base, const SweepResult& res) {
  std::ofstream csv(f.csv_path);
  if (!csv) throw EnvironmentError("cannot write '" + f.csv_path + "'");
  csv << sweep_csv(res);
  csv.close();
  if (!csv) throw EnvironmentError("failed writing '" + f.csv_path + "'");
  std::fprintf(stderr, "wrote %zu rows to %s\n", res.outcomes.size(), f.csv_path.c_str());
  if (f.plot_path.empty()) return;
  const int rc = run_plot_script("plot_sweep.py", {f.csv_path, f.plot_path, base.model.name + " on " + std::to_string(base.gpus) + " GPUs"});
  if (rc != 0) throw EnvironmentError("plot script failed (exit " + std::to_string(rc) + ")");
}

int run_sweep_command(const SweepFlags& f) {
  // Distributed when launched by mpirun: the work is split over the executor's communicator.
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  std::optional<exec::MpiSession> mpi;
  std::unique_ptr<exec::Communicator> world;
  SweepGroup group;
  if (under_mpi) join_mpi(mpi, world, group);
  const Fidelity refine = parse_fidelity(f.fidelity);
  const SweepRank by = parse_sweep_rank(f.rank_by);
  if (!f.automatic && f.vary.empty()) throw ConfigError("--vary", "give --vary KEY=V1,V2,… or --auto");
  const Axes axes = parse_axes(f.vary);
  if (f.automatic)
    for (const auto& [key, values] : axes)
      if (std::find(std::begin(kAutoKeys), std::end(kAutoKeys), key) != std::end(kAutoKeys))
        throw ConfigError("--vary", "--auto chooses " + key + " itself: fix it with --set " + key + "=…, or list the layouts "
                                    "you want with --vary without --auto (--auto takes --vary of the keys it keeps, e.g. "
                                    "--vary training.precision=bf16,fp8)");
  if (!f.plot_path.empty() && f.csv_path.empty()) throw ConfigError("--plot", "needs --csv FILE (the chart is drawn from the CSV)");
  const Scenario base = load_scenario(f.args.path, overrides_of(f.args));
  const auto base_sets = overrides_of(f.args);
  auto load = [&](const Overrides& sets) {
    std::vector<Override> all = base_sets;
    for (const auto& o : to_overrides(sets)) all.push_back(o);
    // (A scenario that leaves parallel.data out gets data = gpus / (t·p) for each combination.)
    return simulation_input(load_scenario(f.args.path, all));
  };

  SkipReasons invalid;
  SweepCandidates cands = sweep_candidates(f, axes, base, load, invalid, group);
  const size_t candidates_total = under_mpi && f.automatic ? count_across_ranks(cands.size(), invalid, group) : cands.size();
  size_t invalid_total = 0;
  for (const auto& [k, v] : invalid) invalid_total += v.count;
  if (candidates_total == 0) {
    std::ostringstream msg;
    msg << "no valid configuration among " << invalid_total << " (skipped by reason, each with one example:";
    for (const auto& [k, v] : invalid) msg << "\n  " << v.count << " × " << v.example;
    msg << ")";
    throw ConfigError("--vary", msg.str());
  }
  SweepOptions options;
  options.top = static_cast<size_t>(f.top);
  options.refine = refine;
  options.jobs = f.jobs;
  options.progress = true;
  options.rank_by = by;
  // --auto's space is pruned by the bound; a --vary sweep is the user's own list: every plan.
  options.prune = f.automatic && !f.exhaustive;
  options.keep_pruned = !f.csv_path.empty();  // a CSV row for every plan; else they are only counted
  options.refine_budget_s = f.refine_budget;
  // The default budget never leaves the top ten at their analytic figure (it applies to the
  // plans after them); a budget the user gives applies to all.
  options.refine_guaranteed = f.budget_given ? 0 : 10;
  const SweepResult res = run_sweep(std::move(cands), options, under_mpi ? &group : nullptr);
  if (group.rank != 0) return 0;
  for (const auto& o : res.outcomes) {  // the invariants of every report before any is shown
    if (o.status == "ok") check_report(o.analytic);
    if (o.refined) check_report(*o.refined);
  }
  print_table(base, res, invalid_total, invalid, static_cast<size_t>(f.top), refine, group.size, by, axes);
  if (f.automatic && !res.ranking.empty()) print_fp8_note(group.family_inputs, res.outcomes[res.ranking[0]], axes);
  if (f.automatic) {
    // What --auto did not build, because the framework runs no such plan.
    std::string list;
    for (const auto& e : auto_exclusions(base.model, base.plan)) list += (list.empty() ? "" : "; ") + e;
    if (!list.empty())
      std::printf("  framework: %s (training.framework): --auto built only plans it runs, none with %s; --set "
                  "training.framework=… plans for another\n", to_string(base.plan.framework).c_str(), list.c_str());
  }
  if (f.megatron && !res.ranking.empty()) print_megatron_lines(f, base_sets, res);
  if (!f.csv_path.empty()) write_sweep_csv(f, base, res);
  return 0;
}

}  // namespace

void add_sweep(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("sweep", "rank parallel plans by predicted throughput (what-if sweeps)");
  static SweepFlags f;
  add_scenario_args(cmd, f.args, true);
  add_price_option(cmd, f.args);
  cmd->add_option("--vary", f.vary, "sweep a key over values, e.g. --vary parallel.tensor=1,2,4,8 (repeatable; cartesian product)")
      ->type_name("KEY=V1,V2,…");
  cmd->add_flag("--auto", f.automatic,
                "every valid (tensor, pipeline, data, micro_batch, virtual_stages, schedule, recompute) for the "
                "scenario's model, GPU count and global batch (not with --vary: fix other keys with --set)");
  cmd->add_option("--max-configurations", f.max_configurations,
                  "refuse a --vary sweep with more configurations than this (counted before any is built)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100'000'000}));
  cmd->add_option("--top", f.top, "re-simulate the best K with --fidelity")->capture_default_str()->check(CLI::Range(0, 100000));
  cmd->add_option("--fidelity", f.fidelity, "fidelity of the top-K runs: reduced, full or analytic (no re-run)")->capture_default_str();
  cmd->add_option("--rank-by", f.rank_by,
                  "time (tokens/s), cost (cost_usd with --gpu-hour-price and training.train_tokens, else GPU-hours per "
                  "token) or energy (per token, from the topology's GPU and node power)")
      ->capture_default_str();
  cmd->add_flag("--megatron", f.megatron, "print the Megatron-LM launch line of the winner (as `ptdp export megatron`); when the winner needs another framework, name it and print the best plan Megatron-LM can run");
  cmd->add_option("--jobs", f.jobs, "threads of the analytic pass and simulations at once (default: number of cores)")->check(CLI::Range(1, 1024));
  static CLI::Option* budget_option = nullptr;
  budget_option = cmd->add_option("--refine-budget", f.refine_budget,
                  "seconds the top-K re-simulation may take: plans run cheapest first, the rest keep their analytic figure "
                  "(0 = no limit); by default the top ten are re-simulated whatever it takes and the budget applies to the "
                  "plans after them")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return end != v.c_str() && *end == '\0' && std::isfinite(x) && x >= 0 ? std::string()
                                                                                  : "expected seconds, a finite number ≥ 0 (got '" + v + "')";
          },
          "SECONDS"));
  cmd->add_flag("--exhaustive", f.exhaustive,
                "--auto: simulate every plan (by default plans whose lower bound cannot enter the top K are skipped, the top K "
                "unchanged; a --vary sweep simulates every plan)");
  cmd->add_option("--csv", f.csv_path, "write one row per configuration with every report key")->type_name("FILE");
  cmd->add_option("--plot", f.plot_path, "write a PNG chart: throughput by (t, p) for each micro batch size")->type_name("FILE");
  cmd->callback([&run] {
    run = [] {
      f.budget_given = budget_option->count() > 0;
      return run_sweep_command(f);
    };
  });
}

}  // namespace ptdp::cli
