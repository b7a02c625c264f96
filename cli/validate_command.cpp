// `ptdp validate`: run the identical lowered schedule for real (mpirun -np N ptdp train) and in
// the simulator on a measured profile, and report how far the prediction was off.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/process.hpp"
#include "core/csv.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/units.hpp"
#include "exec/train.hpp"
#include "scenarios/scenario.hpp"
#include "model/cost.hpp"
#include "model/memory.hpp"
#include "sim/costing.hpp"
#include "sim/scenario_input.hpp"
#include "sim/simulate.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);
int run_plot_script(const std::string& script, const std::vector<std::string>& args);

namespace {
namespace fs = std::filesystem;

struct Validation {
  std::string name;
  ParallelPlan plan;
  Report predicted, measured;  // the simulator on the profile; the executor's wall clock
  // The load-robust comparison (compare_compute): one iteration composed from the cost model's
  // computation, and from the computation the executor measured in CPU seconds — both with the
  // fabric's communication, on dedicated cores.
  double predicted_compute_s = 0, measured_compute_s = 0;
  // The host's speed during the run against the calibration's (the speed probe): the prediction
  // above is the profile's computation scaled by it; `unscaled_compute_s` is the profile's as is.
  double speed_gemm = 1, unscaled_compute_s = 0;
  std::vector<std::pair<std::string, std::pair<double, double>>> actions;  // class → (predicted, measured) mean CPU s
};

// The plan's costs with each compute action's computation (its duration less the collectives
// and sharding transfers the cost model puts inside it) replaced by `replacement(kind, stage,
// model)` when it gives one (OPTIM per pipeline rank). `classes` receives per action kind the mean
// over stages of (model, replacement) computation.
using ComputeReplacement = std::function<std::optional<double>(const char* kind, size_t at, double model)>;
PlanCosts with_compute(PlanCosts c, const ComputeReplacement& replacement,
                       std::vector<std::pair<std::string, std::pair<double, double>>>* classes) {
  auto part = [](const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : 0.0; };
  std::map<std::string, std::pair<double, double>> sums;
  std::map<std::string, int> counts;
  auto replace = [&](const char* kind, size_t at, double model, std::initializer_list<std::vector<double>*> fields) {
    const auto m = replacement(kind, at, model);
    if (!m) return;
    for (std::vector<double>* f : fields)
      if (at < f->size()) (*f)[at] += *m - model;
    sums[kind].first += model;
    sums[kind].second += *m;
    ++counts[kind];
  };
  for (size_t st = 0; st < c.forward_s.size(); ++st) {
    replace("F", st, c.forward_s[st] - c.forward_tp_s[st] - part(c.forward_shard_s, st), {&c.forward_s, &c.forward_gathered_s});
    replace("B", st, c.backward_s[st] - (c.backward_tp_s[st] - part(c.backward_hidden_tp_s, st)) - part(c.backward_shard_s, st),
            {&c.backward_s, &c.backward_gathered_s});
    replace("I", st, c.input_backward_s[st] - c.backward_tp_s[st] - part(c.input_shard_s, st),
            {&c.input_backward_s, &c.input_gathered_s});
    replace("W", st, c.weight_backward_s[st] - part(c.weight_shard_s, st), {&c.weight_backward_s});
  }
  for (size_t pp = 0; pp < c.optim_s.size(); ++pp)
    replace("OPTIM", pp, c.optim_s[pp] - c.grad_norm_allreduce_s - part(c.optim_shard_s, pp), {&c.optim_s});
  if (classes != nullptr)
    for (const auto& [kind, s] : sums) classes->push_back({kind, {s.first / counts[kind], s.second / counts[kind]}});
  return c;
}

// The computation the executor measured in CPU seconds ("compute_cpu_s.KIND.STAGE").
PlanCosts with_measured_compute(PlanCosts c, const Report& measured,
                                std::vector<std::pair<std::string, std::pair<double, double>>>* classes) {
  return with_compute(
      std::move(c),
      [&](const char* kind, size_t at, double) -> std::optional<double> {
        auto it = measured.extra.find(std::string("compute_cpu_s.") + kind + "." + std::to_string(at));
        return it == measured.extra.end() ? std::nullopt : std::optional<double>(it->second);
      },
      classes);
}

// What `validate` compares, load-robust: the iteration the simulator composes (analytic critical
// path of the same lowered schedule, the fabric's communication) from the cost model's
// computation, against the same composition from the computation the executor measured in CPU
// seconds. The cores are dedicated on both sides (one per rank: CPU time does not depend on how
// many processes share the machine). Wall time under load is not a property of the plan.
//
// The profile's computation is scaled to the run's moment by the speed probe
// (exec/speed_probe.hpp): the executor timed a fixed GEMM on its ranks before the run and after each iteration,
// calibrate the same around its kernels; F, B, I and W are scaled by the ratio (1 where the
// profile or the run has no probe). OPTIM is not: an optimizer step probed the same way moved the
// optimizer's error from 5 to 8 % (two ranks) and 10 to 31 % (one rank) in the suite, its ratio
// not following the executor's step.
// On this shared machine one row's computation moved by 30-90 % between runs minutes apart
// (t1p1d1 b4: 62.3, 81.0 and 118 ms), more than the whole error budget.
void compare_compute(const SimulationInput& in, const Schedule& s, Validation& v) {
  SimulationInput dedicated = in;
  dedicated.cluster.cores_per_node = std::max(dedicated.cluster.cores_per_node, static_cast<double>(dedicated.cluster.gpus_per_node));
  dedicated.cluster.wakeup_latency_s = 0;
  const PlanCosts priced = plan_costs(dedicated.model, dedicated.plan, dedicated.cluster, true, &s);
  const auto probed = v.measured.extra.find("speed_probe_gemm_s");
  const double calibrated = in.cluster.gpu.speed_probe_gemm_s;
  v.speed_gemm = probed != v.measured.extra.end() && probed->second > 0 && calibrated > 0 ? probed->second / calibrated : 1.0;
  const PlanCosts model = with_compute(
      priced,
      [&](const char* kind, size_t, double computation) -> std::optional<double> {
        return std::string(kind) == "OPTIM" ? computation : computation * v.speed_gemm;
      },
      nullptr);
  const PlanCosts measured = with_measured_compute(model, v.measured, &v.actions);
  v.unscaled_compute_s = simulate(dedicated, s, Fidelity::Analytic, false, &priced).report.iteration_time_s;
  v.predicted_compute_s = simulate(dedicated, s, Fidelity::Analytic, false, &model).report.iteration_time_s;
  v.measured_compute_s = simulate(dedicated, s, Fidelity::Analytic, false, &measured).report.iteration_time_s;
}

std::string slurp(const std::string& path) {
  return read_input_file(path, "file");
}

// `mpirun -np N ptdp COMMAND …` on this host.
std::vector<std::string> mpirun_ptdp(int ranks, const std::string& command) {
  std::vector<std::string> argv = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np", std::to_string(ranks),
                                   fs::read_symlink("/proc/self/exe").string(), command};
  if (::geteuid() == 0) argv.insert(argv.begin() + 1, "--allow-run-as-root");
  return argv;
}

// Runs `mpirun -np N ptdp train …`; returns the exit status and leaves its output in `log`.
int run_training(int ranks, const std::vector<std::string>& train_args, const std::string& log, double timeout_s) {
  std::vector<std::string> argv = mpirun_ptdp(ranks, "train");
  argv.insert(argv.end(), train_args.begin(), train_args.end());
  return run_program(argv, log, "install openmpi-bin (./scripts/setup.sh does)", timeout_s);
}

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Where the self-calibrated profile of this machine is kept: $PTDP_CACHE_DIR, else
// $XDG_CACHE_HOME/ptdp, else ~/.cache/ptdp; one file per host name and core count.
fs::path profile_cache_path(const std::string& variant) {
  fs::path dir;
  if (const char* d = std::getenv("PTDP_CACHE_DIR"); d && *d) dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = fs::path(x) / "ptdp";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = fs::path(h) / ".cache" / "ptdp";
  else dir = fs::temp_directory_path() / "ptdp-cache";
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  // "-v5": profiles with the executor's kernels measured by shape and working set (gemm_rates,
  // elementwise_bandwidth, emulated casts), its arithmetic-bound element-wise kernels (SwiGLU,
  // rotary), context parallelism's block kernel and the optimizer step with its state from
  // memory, timed on every rank at once; "-v6": with the speed probe (gpu.speed_probe_gemm_time),
  // which a -v5 profile lacks (the scaling would silently stay 1). An older cached profile is not reused.
  return dir / ("cpu-profile-" + std::string(host) + "-" + std::to_string(cores()) + "cores" + variant + "-v6.yaml");
}

// The profile to predict runs of `ranks` ranks with: the one given, else (CPU back end) this
// machine's, calibrated once with `mpirun -np RANKS ptdp calibrate --backend cpu` and cached. The
// kernels are timed on every rank at once, as the run's ranks compute: a kernel's CPU time on a
// rank depends on what the other ranks run on the shared cores (on this 2-vCPU machine SwiGLU read
// 3.5 ns per element alone and 6–9 ns with a second rank busy), so a profile is per rank count.
std::string resolve_profile(const std::string& given, const std::string& backend, bool recalibrate, int64_t ranks,
                            double evict_bytes, const std::string& gemm_shapes = "") {
  if (!given.empty()) return given;
  if (backend != "cpu") {
    std::fprintf(stderr, "ptdp: warning: no --profile: predicting with the scenario's topology (uncalibrated for this machine)\n");
    return "";
  }
  // Calibrated at given GEMM shapes (the suite's): its own file, named by their digest.
  char digest[24] = "";
  if (!gemm_shapes.empty()) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (unsigned char ch : gemm_shapes) h = (h ^ ch) * 0x100000001b3ULL;
    std::snprintf(digest, sizeof digest, "-gemms-%08llx", static_cast<unsigned long long>(h & 0xffffffffULL));
  }
  const long long evict_mib = std::llround(evict_bytes / (1 << 20));
  const fs::path cached = profile_cache_path(digest + ("-np" + std::to_string(ranks) + "-evict" + std::to_string(evict_mib) + "MiB"));
  if (path_exists(cached.string()) && !recalibrate) {
    std::fprintf(stderr, "ptdp: using this machine's calibrated profile %s (--recalibrate to measure again)\n", cached.c_str());
    return cached.string();
  }
  fs::create_directories(cached.parent_path());
  std::fprintf(stderr,
               "ptdp: no --profile: calibrating this machine once for %lld-rank runs (mpirun -np %lld ptdp calibrate --backend cpu) "
               "into %s\n",
               static_cast<long long>(ranks), static_cast<long long>(ranks), cached.c_str());
  const std::string id = std::to_string(::getpid());  // concurrent validations calibrate side by side
  const fs::path tmp = cached.string() + "." + id + ".tmp", log = cached.string() + "." + id + ".log";
  std::vector<std::string> argv = mpirun_ptdp(static_cast<int>(ranks), "calibrate");
  for (const char* a : {"--backend", "cpu", "--out"}) argv.push_back(a);
  argv.push_back(tmp.string());
  argv.push_back("--evict-bytes");
  argv.push_back(std::to_string(evict_mib << 20));
  if (!gemm_shapes.empty()) {
    argv.push_back("--gemm-shapes");
    argv.push_back(gemm_shapes);
  }
  const int rc = run_program(argv, log.string(), "install openmpi-bin (./scripts/setup.sh does)", 600);
  if (rc != 0 || !path_exists(tmp.string()))
    throw EnvironmentError("calibration failed (exit " + std::to_string(rc) + "), see " + log.string() + ":\n" + slurp(log.string()));
  fs::rename(tmp, cached);  // atomic: a half-written profile is never used
  return cached.string();
}

// The bytes a rank of `sc` streams through the caches between two uses of a weight (one
// microbatch's forward and backward): its weights and gradients, 4 + 4 bytes per local parameter
// of the largest pipeline rank (the Adam moments are touched once per step, by OPTIM). calibrate
// times the GEMMs with that much other traffic between calls. With the moments too (16 bytes per
// parameter: 13 MiB at one rank) the one-rank rows were priced at 1.5-2x their CPU time.
double training_state_bytes(const Scenario& sc) {
  const std::vector<double> params = rank_parameter_counts(sc.model, sc.plan);
  return 8.0 * *std::max_element(params.begin(), params.end());
}

// The executor runs one process per rank on this host: refuse plans this machine cannot run.
void check_runnable(const Scenario& sc, const Report& predicted, bool force) {
  if (force) return;
  const int64_t ranks = sc.plan.gpus();
  const int64_t most = std::max<int64_t>(8, 4 * static_cast<int64_t>(cores()));
  if (ranks > most)
    throw ConfigError("cluster.gpus", std::to_string(ranks) + " ranks (tensor × pipeline × data) would run as mpirun -np " +
                                          std::to_string(ranks) + " on this machine's " + std::to_string(cores()) +
                                          " cores (at most " + std::to_string(most) +
                                          "); shrink the plan, e.g. --set cluster.gpus=4 --set parallel.tensor=2 "
                                          "--set parallel.pipeline=2 --set parallel.data=1, or pass --force");
  long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double available = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  const double needed = predicted.peak_memory_bytes * static_cast<double>(ranks);
  if (available > 0 && needed > available)
    throw ConfigError("model", "the ranks need about " + format_bytes(needed) + " (" + format_bytes(predicted.peak_memory_bytes) +
                                   " each, predicted) but this machine has " + format_bytes(available) +
                                   " available; use a smaller model or plan, or pass --force");
}

struct RunLimits {
  bool force = false;
  double timeout_s = 0;
};

Validation validate_one(const std::string& name, const std::string& scenario, std::vector<Override> sets,
                        const std::string& profile, const std::string& backend, int steps, Fidelity fidelity,
                        const fs::path& dir, const std::string& schedule_path, const RunLimits& limits) {
  if (!profile.empty()) sets.push_back({"cluster.topology", fs::absolute(profile).string()});
  Scenario sc = load_scenario(scenario, sets);
  // What the executor would refuse (exit 2 naming the key) is refused before simulating.
  exec::check_trainable(sc.model, sc.plan, !schedule_path.empty(), backend);
  // A prediction that hides the expert all-to-alls (a topology whose communication runs beside
  // compute) against the CPU executor, where nothing hides: not the same run.
  if (sc.plan.moe_comm_overlap && sc.cluster.overlaps_communication())
    throw ConfigError("parallel.moe_comm_overlap", "the prediction on " + sc.cluster.name +
                                                       " hides the expert all-to-alls under compute, which the executor does not "
                                                       "(validate it with a CPU profile, or set it false)");
  Validation v;
  v.name = name;
  v.plan = sc.plan;
  if (!limits.force && sc.plan.gpus() > std::max<int64_t>(8, 4 * static_cast<int64_t>(cores())))
    check_runnable(sc, Report{}, false);  // before a long simulation of a plan that cannot run here
  // Predicted: the simulator on the profile.
  SimulationInput in = simulation_input(sc);
  // The identical lowered schedule for both: the plan's, or the --schedule CSV.
  const Schedule schedule = schedule_of(sc, schedule_path);
  SimulationResult res = simulate(in, schedule, fidelity, true);
  check_report(res.report);
  v.predicted = res.report;
  check_runnable(sc, res.report, limits.force);
  fs::create_directories(dir);
  std::ofstream(dir / "predicted.json") << report_to_json(res.report) << "\n";
  write_chrome_trace(res.timeline, (dir / "predicted-trace.json").string());
  // Measured: the executor on the same plan and schedule.
  std::vector<std::string> train_args = {scenario, "--backend", backend, "--steps", std::to_string(steps), "--json",
                                         (dir / "measured.json").string(), "--trace", (dir / "measured-trace.json").string()};
  if (backend == "cpu") train_args.push_back("--speed-probe");
  if (!schedule_path.empty()) {
    train_args.push_back("--schedule");
    train_args.push_back(fs::absolute(schedule_path).string());
  }
  for (const auto& o : sets) {
    train_args.push_back("--set");
    train_args.push_back(o.key + "=" + o.value);
  }
  const std::string log = (dir / "train.log").string();
  const int rc = run_training(static_cast<int>(sc.plan.gpus()), train_args, log, limits.timeout_s);
  if (rc != 0) throw EnvironmentError("training failed (exit " + std::to_string(rc) + "), see " + log + ":\n" + slurp(log));
  v.measured = report_from_json(slurp((dir / "measured.json").string()), (dir / "measured.json").string());
  check_report(v.measured);
  compare_compute(in, schedule, v);
  {
    nlohmann::json j = {{"predicted_iteration_s", v.predicted_compute_s}, {"measured_iteration_s", v.measured_compute_s},
                        {"unscaled_predicted_iteration_s", v.unscaled_compute_s},
                        {"speed_probe_ratio", v.speed_gemm},
                        {"actions", nlohmann::json::object()}};
    for (const auto& [kind, pm] : v.actions) j["actions"][kind] = {{"predicted_s", pm.first}, {"measured_s", pm.second}};
    std::ofstream(dir / "compute.json") << j.dump(2) << "\n";
  }
  if (v.predicted.mfu > 1)
    std::fprintf(stderr, "ptdp: warning: %s: predicted MFU %.2f is above 1: the profile's GEMM peak under-estimates this machine "
                         "(calibrated under load?); the times are still compared; recalibrate with --recalibrate\n",
                 name.c_str(), v.predicted.mfu);
  return v;
}

double rel(double predicted, double measured) { return (predicted - measured) / measured; }

void print_one(const Validation& v) {
  auto line = [](const char* what, const std::string& p, const std::string& m, double e) {
    std::printf("  %-18s %14s %14s %+9.1f%%\n", what, p.c_str(), m.c_str(), 100 * e);
  };
  std::printf("  %-18s %14s %14s %10s\n", "", "predicted", "measured", "error");
  line("iteration time", format_time(v.predicted.iteration_time_s), format_time(v.measured.iteration_time_s),
       rel(v.predicted.iteration_time_s, v.measured.iteration_time_s));
  char pt[32], mt[32], pb[32], mb[32];
  std::snprintf(pt, sizeof pt, "%.0f", v.predicted.tokens_per_s);
  std::snprintf(mt, sizeof mt, "%.0f", v.measured.tokens_per_s);
  line("tokens/s", pt, mt, rel(v.predicted.tokens_per_s, v.measured.tokens_per_s));
  std::snprintf(pb, sizeof pb, "%.1f%%", 100 * v.predicted.bubble_fraction);
  std::snprintf(mb, sizeof mb, "%.1f%%", 100 * v.measured.bubble_fraction);
  std::printf("  %-18s %14s %14s\n", "pipeline bubble", pb, mb);
  std::printf("\n  computation in CPU seconds (load-robust), composed with the fabric's communication:\n");
  line("iteration time", format_time(v.predicted_compute_s), format_time(v.measured_compute_s),
       rel(v.predicted_compute_s, v.measured_compute_s));
  for (const auto& [kind, pm] : v.actions)
    line((kind + " (mean)").c_str(), format_time(pm.first), format_time(pm.second), rel(pm.first, pm.second));
  if (v.speed_gemm != 1)
    std::printf("  speed probe: the profile's F, B, I, W x%.3f; unscaled iteration %s (%+.1f%%)\n", v.speed_gemm,
                format_time(v.unscaled_compute_s).c_str(), 100 * rel(v.unscaled_compute_s, v.measured_compute_s));
}

std::string plan_label(const ParallelPlan& p) {
  std::ostringstream o;
  o << "t" << p.tensor << "p" << p.pipeline << "d" << p.data << " b" << p.micro_batch << " " << to_string(p.schedule);
  if (p.schedule == ScheduleKind::Interleaved) o << " v" << p.virtual_stages;
  if (p.recompute != Recompute::None) o << " rc-" << to_string(p.recompute);
  if (p.sequence_parallel) o << " sp";
  if (p.zero_stage > 0) o << " z" << p.zero_stage << (p.sharding_group == ShardingGroup::Node ? "-node" : "");
  if (p.context > 1) o << " cp" << p.context << context_comm_mark(p.context_comm);
  if (p.expert > 1) o << " ep" << p.expert;
  if (p.overlap_grad_reduce) o << " ogr";
  if (p.zero_stage == 3 && p.max_inflight_gathers != ParallelPlan{}.max_inflight_gathers) o << " g" << p.max_inflight_gathers;
  if (p.precision == Precision::FP8) o << " fp8-" << to_string(p.fp8_recipe);
  return o.str();
}

// A suite row's label: the plan, and the model when it is not the scenario's GPT.
std::string config_label(const Scenario& sc) {
  std::string label = plan_label(sc.plan);
  if (sc.model.has_moe()) label += " moe";
  else if (sc.model.llama_style()) label += " llama";
  if (sc.model.has_dropout()) label += " dropout";
  return label;
}

// Every GEMM shape (m, n, k per TP rank) the plans of `scenarios` multiply, forward and backward,
// as calibrate --gemm-shapes takes them: the suite calibrates this machine at its own kernels.
std::string gemm_shapes_of(const std::vector<Scenario>& scenarios) {
  std::set<std::array<int64_t, 3>> shapes;
  for (const Scenario& sc : scenarios)
    for (Pass pass : {Pass::Forward, Pass::Backward}) {
      std::vector<Op> ops = layer_ops(sc.model, sc.plan, pass, false);
      if (sc.model.has_moe()) {
        const std::vector<Op> moe = layer_ops(sc.model, sc.plan, pass, true);
        ops.insert(ops.end(), moe.begin(), moe.end());
      }
      for (const auto& more : {embedding_ops(sc.model, sc.plan, pass), head_ops(sc.model, sc.plan, pass), mtp_ops(sc.model, sc.plan, pass)})
        ops.insert(ops.end(), more.begin(), more.end());
      for (const Op& op : ops)
        if (op.kind == OpKind::Gemm && op.m > 0 && op.n > 0 && op.k > 0) shapes.insert({op.m, op.n, op.k});
    }
  std::string out;
  for (const auto& [m, n, k] : shapes) out += (out.empty() ? "" : ",") + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  return out;
}

// The CPU suite: different t, p, d, micro batch and schedule, 1–4 ranks, on the tiny GPT.
// Each configuration is its overrides of the scenario; its label is the plan they give
// (plan_label of the loaded scenario).
std::vector<std::vector<Override>> cpu_suite() {
  auto plan = [](int t, int p, int d, int b, const char* schedule, int v) {
    std::vector<Override> s = {{"cluster.gpus", std::to_string(t * p * d)},
                               {"parallel.tensor", std::to_string(t)},
                               {"parallel.pipeline", std::to_string(p)},
                               {"parallel.data", std::to_string(d)},
                               {"training.micro_batch", std::to_string(b)},
                               {"parallel.schedule", schedule},
                               {"parallel.virtual_stages", std::to_string(v)}};
    if (v > 1) s.push_back({"parallel.overlap_p2p", "true"});
    // zb-v puts 2p stages in a V: the tiny model's 4 layers cover p = 2; p = 4 gets 8 layers.
    if (std::string(schedule) == "zb-v" && 4 % (2 * p) != 0) s.push_back({"model.num_layers", std::to_string(2 * p)});
    return s;
  };
  std::vector<std::vector<Override>> suite;
  for (auto [t, p, d, b, sched, v] : std::vector<std::tuple<int, int, int, int, const char*, int>>{
           {1, 1, 1, 4, "1f1b", 1},   {1, 1, 1, 1, "1f1b", 1}, {2, 1, 1, 4, "1f1b", 1},   {1, 1, 2, 4, "1f1b", 1},
           {1, 2, 1, 4, "1f1b", 1},   {1, 2, 1, 2, "gpipe", 1}, {1, 2, 1, 2, "interleaved", 2}, {2, 2, 1, 4, "1f1b", 1},
           {1, 4, 1, 2, "1f1b", 1},   {2, 1, 2, 2, "1f1b", 1}, {4, 1, 1, 4, "1f1b", 1},
           // Zero-bubble schedules (issue 12), p = 2 and 4.
           {1, 2, 1, 2, "zb-h1", 1},  {1, 4, 1, 2, "zb-h1", 1}, {1, 2, 1, 2, "zb-h2", 1},  {1, 4, 1, 2, "zb-h2", 1},
           {1, 2, 1, 2, "zb-v", 2},   {1, 4, 1, 2, "zb-v", 2}}) {
    suite.push_back(plan(t, p, d, b, sched, v));
  }
  // Sequence parallelism (issue 11) at t 2 and 4, with selective and full recompute.
  for (auto [t, recompute] : std::vector<std::pair<int, const char*>>{{2, "selective"}, {2, "full"}, {4, "selective"}, {4, "full"}}) {
    auto sets = plan(t, 1, 1, 4, "1f1b", 1);
    sets.push_back({"parallel.recompute", recompute});
    sets.push_back({"parallel.sequence_parallel", "true"});
    suite.push_back(sets);
  }
  // Sharded data parallelism (issue 10): stages 1–3 on 2 and 4 ranks, with t and p, and a node
  // sharding group (2-rank "nodes" of one core each, so the machine still has two cores).
  for (auto [t, p, d, z, node] : std::vector<std::tuple<int, int, int, int, bool>>{
           {1, 1, 2, 1, false}, {1, 1, 2, 2, false}, {1, 1, 2, 3, false}, {1, 1, 4, 3, false},
           {2, 1, 2, 1, false}, {1, 2, 2, 2, false}, {1, 1, 4, 3, true}}) {
    auto sets = plan(t, p, d, 2, "1f1b", 1);
    sets.push_back({"parallel.zero_stage", std::to_string(z)});
    if (node) {
      sets.push_back({"parallel.sharding_group", "node"});
      sets.push_back({"cluster.topology.node.gpus", "2"});
      sets.push_back({"cluster.topology.node.cores", "1"});
    }
    suite.push_back(sets);
  }
  // Today's mechanisms (issue 33): a Llama-style model (GQA, SwiGLU, RMSNorm, rope, flash
  // attention), mixture of experts with expert parallelism, context parallelism (ring,
  // all-gather and Ulysses' all-to-alls), DualPipe, ZeRO-3 with three units' gathers in flight, the overlapped gradient
  // reduction, FP8 and dropout.
  const std::vector<Override> llama = {{"model.mlp", "swiglu"},          {"model.normalization", "rmsnorm"},
                                       {"model.num_query_groups", "2"},   {"model.attention", "flash"},
                                       {"model.position_embedding", "rope"}};
  auto with = [](std::vector<Override> sets, const std::vector<Override>& more) {
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  suite.push_back(with(plan(2, 1, 1, 4, "1f1b", 1), llama));
  suite.push_back(with(plan(1, 2, 1, 2, "1f1b", 1), llama));
  suite.push_back(with(plan(1, 1, 2, 2, "1f1b", 1), with(llama, {{"model.moe.num_experts", "4"}, {"model.moe.top_k", "2"},
                                                                   {"model.moe.expert_ffn_hidden_size", "256"},
                                                                   {"parallel.expert", "2"}})));
  suite.push_back(with(plan(1, 1, 1, 4, "1f1b", 1), with(llama, {{"cluster.gpus", "2"}, {"parallel.context", "2"}})));
  suite.push_back(with(plan(1, 1, 1, 4, "1f1b", 1),
                       with(llama, {{"cluster.gpus", "2"}, {"parallel.context", "2"}, {"parallel.context_comm", "allgather"}})));
  suite.push_back(with(plan(1, 1, 1, 4, "1f1b", 1),
                       with(llama, {{"cluster.gpus", "2"}, {"parallel.context", "2"}, {"parallel.context_comm", "alltoall"}})));
  suite.push_back(plan(1, 2, 1, 2, "dualpipe", 2));
  suite.push_back(with(plan(1, 1, 2, 2, "1f1b", 1), {{"parallel.zero_stage", "3"}, {"parallel.max_inflight_gathers", "3"}}));
  suite.push_back(with(plan(1, 1, 2, 2, "1f1b", 1), {{"parallel.overlap_grad_reduce", "true"}}));
  // FP8 emulated (the linear layers' casts and unrounded GEMMs; the rest bf16) and dropout (on
  // the embedding and each block's output).
  suite.push_back(with(plan(2, 1, 1, 4, "1f1b", 1), with(llama, {{"training.precision", "fp8"}})));
  suite.push_back(with(plan(1, 2, 1, 2, "1f1b", 1), {{"model.dropout", "0.1"}}));
  return suite;
}

// A configuration of the suite as run: the user's --set first, then the configuration's.
struct SuiteRow {
  std::string label;
  std::vector<Override> sets;
  Scenario scenario;
};

std::vector<SuiteRow> suite_rows(const std::string& scenario, const std::vector<Override>& user) {
  std::vector<SuiteRow> rows;
  for (const auto& config : cpu_suite()) {
    std::vector<Override> sets = user;
    sets.insert(sets.end(), config.begin(), config.end());
    Scenario sc = load_scenario(scenario, sets);
    std::string label = config_label(sc);
    rows.push_back({std::move(label), std::move(sets), std::move(sc)});
  }
  return rows;
}

std::string suite_gemm_shapes(const std::vector<SuiteRow>& rows) {
  std::vector<Scenario> scenarios;
  for (const SuiteRow& r : rows) scenarios.push_back(r.scenario);
  return gemm_shapes_of(scenarios);
}

// The profile of each rank count among `rows`, resolved when its first row runs (rows run by
// rank count, see run_suite): the one given, else this machine's calibrated at the suite's GEMM
// shapes with that many ranks at once, the GEMMs evicted by the median training state of those
// rows' ranks. Calibrated just before its rows, a profile sees the machine's load of the next few
// minutes, not of the suite's start: calibrated all at once at the start (load 14) and run over
// the next ten minutes (load 6-10), the two-rank rows' forwards were priced +17 ... +49 %.
class SuiteProfiles {
 public:
  SuiteProfiles(const std::vector<SuiteRow>& rows, std::string gemm_shapes, std::string given, std::string backend, bool recalibrate)
      : shapes_(std::move(gemm_shapes)), given_(std::move(given)), backend_(std::move(backend)), recalibrate_(recalibrate) {
    for (const SuiteRow& r : rows) states_[r.scenario.plan.gpus()].push_back(training_state_bytes(r.scenario));
  }
  const std::string& of(int64_t ranks) {
    auto it = profiles_.find(ranks);
    if (it != profiles_.end()) return it->second;
    std::vector<double>& bytes = states_.at(ranks);
    std::nth_element(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2), bytes.end());
    return profiles_[ranks] = resolve_profile(given_, backend_, recalibrate_, ranks, bytes[bytes.size() / 2], shapes_);
  }

 private:
  std::string shapes_, given_, backend_;
  bool recalibrate_;
  std::map<int64_t, std::vector<double>> states_;
  std::map<int64_t, std::string> profiles_;
};

}  // namespace

void add_validate(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("validate", "train for real and simulate the same schedule; print both and the error");
  static ScenarioArgs args;
  static std::string backend = "cpu", profile, suite, csv_path, plot_path, out_dir, fidelity = "reduced", schedule_path, match;
  static int steps = 8;
  static bool force = false, recalibrate = false;
  static double timeout_s = 0;
  add_scenario_args(cmd, args, false);
  cmd->add_option("--backend", backend, "executor back end")->capture_default_str();
  cmd->add_option("--profile", profile,
                  "topology profile of this machine (ptdp calibrate --out …); without it, the CPU back end calibrates this "
                  "machine once and caches the profile ($PTDP_CACHE_DIR, else $XDG_CACHE_HOME/ptdp or ~/.cache/ptdp)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--recalibrate", recalibrate, "measure this machine again instead of using the cached profile");
  cmd->add_flag("--force", force, "run plans with more ranks (or memory) than this machine can reasonably hold");
  cmd->add_option("--timeout", timeout_s, "seconds each training run may take; then mpirun and its ranks are killed (0: no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", steps, "training iterations (the first is not timed)")->capture_default_str()->check(CLI::Range(2, 100000));
  cmd->add_option("--fidelity", fidelity, "simulator fidelity for the prediction")->capture_default_str();
  cmd->add_option("--schedule", schedule_path, kScheduleHelp)->type_name("FILE.csv");
  cmd->add_option("--suite", suite, "run a suite of configurations instead of one scenario: cpu");
  cmd->add_option("--match", match, "suite: only the configurations whose name contains this text (e.g. ' z' for the sharded ones)")
      ->type_name("TEXT");
  cmd->add_option("--csv", csv_path, "suite: one row per configuration");
  cmd->add_option("--plot", plot_path, "suite: predicted vs measured iteration time (PNG)");
  cmd->add_option("--out-dir", out_dir, "keep reports and traces here (default: a folder under /tmp)");
  cmd->callback([&run] {
    run = [] {
      const Fidelity f = parse_fidelity(fidelity);
      const RunLimits limits{force, timeout_s};
      fs::path dir = out_dir.empty() ? fs::temp_directory_path() / ("ptdp-validate-" + std::to_string(::getpid())) : fs::path(out_dir);
      if (suite.empty()) {
        if (args.path.empty()) throw ConfigError("SCENARIO", "give a scenario, or --suite cpu");
        // Refused before calibrating with the plan's ranks (what the executor cannot run, more
        // ranks than the machine holds).
        const Scenario sc = load_scenario(args.path, overrides_of(args));
        exec::check_trainable(sc.model, sc.plan, !schedule_path.empty(), backend);
        check_runnable(sc, Report{}, force);
        const std::string used = resolve_profile(profile, backend, recalibrate, sc.plan.gpus(), training_state_bytes(sc));
        const Validation v =
            validate_one(args.path, args.path, overrides_of(args), used, backend, steps, f, dir, schedule_path, limits);
        std::printf("ptdp validate: %s (%s), %d steps, backend %s, prediction %s\n", args.path.c_str(), plan_label(v.plan).c_str(),
                    steps, backend.c_str(), fidelity.c_str());
        print_one(v);
        std::printf("\n  reports and traces in %s (try: ptdp compare %s/predicted.json %s/measured.json;\n"
                    "  ptdp plot timeline timeline.png %s/predicted-trace.json %s/measured-trace.json)\n",
                    dir.c_str(), dir.c_str(), dir.c_str(), dir.c_str(), dir.c_str());
        return 0;
      }
      if (suite != "cpu") throw ConfigError("--suite", "unknown suite '" + suite + "', expected cpu");
      if (!schedule_path.empty()) throw ConfigError("--schedule", "applies to one scenario, not to --suite");
      const std::string scenario = args.path.empty() ? data_dir() + "/scenarios/tiny-gpt-cpu.yaml" : args.path;
      std::vector<SuiteRow> configs = suite_rows(scenario, overrides_of(args));
      const std::string shapes = suite_gemm_shapes(configs);  // of the whole suite, whatever --match picks: one digest
      if (!match.empty()) {
        std::erase_if(configs, [](const SuiteRow& r) { return r.label.find(match) == std::string::npos; });
        if (configs.empty()) throw ConfigError("--match", "no configuration of the suite contains '" + match + "'");
      }
      // By rank count (1, 2, 4), each count's profile calibrated right before its rows.
      std::stable_sort(configs.begin(), configs.end(),
                       [](const SuiteRow& a, const SuiteRow& b) { return a.scenario.plan.gpus() < b.scenario.plan.gpus(); });
      SuiteProfiles profiles(configs, shapes, profile, backend, recalibrate);
      std::vector<Validation> results;
      std::printf("ptdp validate --suite cpu: %zu configurations of %s, %d steps each, prediction %s\n\n", configs.size(),
                  scenario.c_str(), steps, fidelity.c_str());
      std::printf("  iteration: computation in CPU seconds (predicted: the cost model; measured: the executor), composed with the\n"
                  "  fabric's communication on the same schedule; wall: the simulator on the profile against the executor's clock\n\n");
      std::printf("  %-34s %5s %10s %10s %8s %10s %10s %8s %10s %10s %8s\n", "configuration", "ranks", "predicted", "measured",
                  "error", "wall p", "wall m", "error", "memory p", "memory m", "error");
      double ape_sum = 0, wall_ape_sum = 0, worst = 0, mem_ape_sum = 0, action_ape_sum = 0, unscaled_ape_sum = 0;
      size_t mem_count = 0, action_count = 0;
      for (size_t i = 0; i < configs.size(); ++i) {
        std::fprintf(stderr, "validate %zu/%zu: %s\n", i + 1, configs.size(), configs[i].label.c_str());
        const Validation v = validate_one(configs[i].label, scenario, configs[i].sets, profiles.of(configs[i].scenario.plan.gpus()), backend, steps, f,
                                          dir / ("config-" + std::to_string(i)), "", limits);
        const double e = rel(v.predicted_compute_s, v.measured_compute_s);
        const double we = rel(v.predicted.iteration_time_s, v.measured.iteration_time_s);
        ape_sum += std::fabs(e);
        worst = std::max(worst, std::fabs(e));
        wall_ape_sum += std::fabs(we);
        std::printf("  %-34s %5lld %10s %10s %+7.1f%% %10s %10s %+7.1f%%", v.name.c_str(), static_cast<long long>(v.plan.gpus()),
                    format_time(v.predicted_compute_s).c_str(), format_time(v.measured_compute_s).c_str(), 100 * e,
                    format_time(v.predicted.iteration_time_s).c_str(), format_time(v.measured.iteration_time_s).c_str(), 100 * we);
        // Memory: the predicted peak per rank against the most bytes the executor's device
        // allocator held on any rank (train's memory_measured_bytes).
        if (auto it = v.measured.extra.find("memory_measured_bytes"); it != v.measured.extra.end() && it->second > 0) {
          const double me = rel(v.predicted.peak_memory_bytes, it->second);
          mem_ape_sum += std::fabs(me);
          ++mem_count;
          std::printf(" %10s %10s %+7.1f%%", format_bytes(v.predicted.peak_memory_bytes).c_str(), format_bytes(it->second).c_str(),
                      100 * me);
        }
        std::printf("\n");
        // Each action kind's computation: the cost model's price against the executor's CPU time
        // (mean over stages); the largest miss names the mechanism to look at.
        std::string worst_kind;
        double worst_action = 0;
        for (const auto& [kind, pm] : v.actions) {
          if (!(pm.second > 0)) continue;
          const double ae = rel(pm.first, pm.second);
          action_ape_sum += std::fabs(ae);
          ++action_count;
          if (std::fabs(ae) >= std::fabs(worst_action)) worst_action = ae, worst_kind = kind;
        }
        if (!worst_kind.empty()) std::printf("  %-34s       largest per-action error: %s %+.1f%%\n", "", worst_kind.c_str(), 100 * worst_action);
        if (v.speed_gemm != 1)
          std::printf("  %-34s       speed probe: F, B, I, W x%.3f of the calibration's; unscaled %+.1f%%\n", "", v.speed_gemm,
                      100 * rel(v.unscaled_compute_s, v.measured_compute_s));
        unscaled_ape_sum += std::fabs(rel(v.unscaled_compute_s, v.measured_compute_s));
        std::fflush(stdout);
        results.push_back(v);
      }
      const double n = static_cast<double>(results.size());
      std::printf("\n  iteration MAPE %.1f%% (largest %.1f%%) over %zu configurations, computation in CPU seconds (reports in %s)\n",
                  100 * ape_sum / n, 100 * worst, results.size(), dir.c_str());
      std::printf("  without the speed probe's scaling (the profile's computation as calibrated): iteration MAPE %.1f%%\n",
                  100 * unscaled_ape_sum / n);
      if (action_count > 0)
        std::printf("  per-action MAPE %.1f%% over %zu (configuration, action kind) pairs: the cost model's price of each compute\n"
                    "  action against the executor's CPU seconds, without communication\n",
                    100 * action_ape_sum / static_cast<double>(action_count), action_count);
      std::printf("  wall-clock iteration-time MAPE %.1f%% (depends on what else runs on the machine)\n", 100 * wall_ape_sum / n);
      if (mem_count > 0)
        std::printf("  memory MAPE %.1f%% over the %zu configurations that measured it\n", 100 * mem_ape_sum / static_cast<double>(mem_count),
                    mem_count);
      if (!csv_path.empty()) {
        std::ofstream csv(csv_path);
        if (!csv) throw EnvironmentError("cannot write '" + csv_path + "'");
        // Per action kind: the mean computation per stage, predicted and measured (empty when the
        // plan has no such action).
        const std::vector<std::string> kinds = {"F", "B", "I", "W", "OPTIM"};
        std::vector<std::string> header = {"name", "ranks", "tensor", "pipeline", "data", "micro_batch", "schedule", "virtual_stages",
                                           "predicted_iteration_time_s", "measured_iteration_time_s", "predicted_tokens_per_s",
                                           "measured_tokens_per_s", "predicted_bubble_fraction", "measured_bubble_fraction",
                                           "iteration_time_error", "zero_stage", "sharding_group", "predicted_memory_bytes",
                                           "measured_memory_bytes", "predicted_compute_iteration_s", "measured_compute_iteration_s",
                                           "compute_iteration_error", "speed_probe_ratio",
                                           "unscaled_predicted_compute_iteration_s"};
        for (const auto& k : kinds)
          for (const char* side : {"predicted_", "measured_"}) header.push_back(side + k + "_s");
        // The run's ranks' share of a core and their involuntary context switches per CPU second
        // (train's rank_cpu_share, rank_preemptions_per_cpu_s): how busy the machine was.
        const std::vector<std::string> load_keys = {"rank_cpu_share", "rank_preemptions_per_cpu_s"};
        header.insert(header.end(), load_keys.begin(), load_keys.end());
        csv << csv_record(header);
        for (const auto& v : results) {
          std::vector<std::string> row = {
              v.name, std::to_string(v.plan.gpus()), std::to_string(v.plan.tensor), std::to_string(v.plan.pipeline),
              std::to_string(v.plan.data), std::to_string(v.plan.micro_batch), to_string(v.plan.schedule),
              std::to_string(v.plan.virtual_stages), csv_number(v.predicted.iteration_time_s),
              csv_number(v.measured.iteration_time_s), csv_number(v.predicted.tokens_per_s), csv_number(v.measured.tokens_per_s),
              csv_number(v.predicted.bubble_fraction), csv_number(v.measured.bubble_fraction),
              csv_number(rel(v.predicted.iteration_time_s, v.measured.iteration_time_s)), std::to_string(v.plan.zero_stage),
              to_string(v.plan.sharding_group), csv_number(v.predicted.peak_memory_bytes),
              v.measured.extra.count("memory_measured_bytes") ? csv_number(v.measured.extra.at("memory_measured_bytes")) : "",
              csv_number(v.predicted_compute_s), csv_number(v.measured_compute_s),
              csv_number(rel(v.predicted_compute_s, v.measured_compute_s)), csv_number(v.speed_gemm),
              csv_number(v.unscaled_compute_s)};
          for (const auto& k : kinds) {
            const auto it = std::find_if(v.actions.begin(), v.actions.end(), [&](const auto& a) { return a.first == k; });
            row.push_back(it == v.actions.end() ? "" : csv_number(it->second.first));
            row.push_back(it == v.actions.end() ? "" : csv_number(it->second.second));
          }
          for (const auto& k : load_keys) row.push_back(v.measured.extra.count(k) ? csv_number(v.measured.extra.at(k)) : "");
          csv << csv_record(row);
        }
        csv.close();  // complete on disk before the plot script reads it
        if (!csv) throw EnvironmentError("failed writing '" + csv_path + "'");
        std::fprintf(stderr, "wrote %s\n", csv_path.c_str());
        if (!plot_path.empty() && run_plot_script("plot_validation.py", {csv_path, plot_path, "ptdp validate --suite cpu"}) != 0)
          throw EnvironmentError("plot_validation.py failed");
      } else if (!plot_path.empty()) {
        throw ConfigError("--plot", "needs --csv FILE (the chart is drawn from the CSV)");
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
