// `ptdp calibrate --backend cpu --out PROFILE.yaml` (run under mpirun with ≥ 2 ranks for the
// communication figures): measures this machine with the executor's own kernels and its MPI
// communicator and writes a topology profile the simulator accepts (cluster.topology: PROFILE).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "exec/calibrate_cpu.hpp"
#include "exec/runtime/cuda/calibrate.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "scenarios/measured_runs.hpp"
#include "scenarios/scenario.hpp"
#include "search/fit_runs.hpp"
#include "sim/scenario_input.hpp"
#include "topologies/cluster_yaml.hpp"

namespace ptdp::cli {
namespace {

void write_file(const std::string& path, const std::string& text) {
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  std::ofstream f(path);
  if (!f) throw EnvironmentError("cannot write '" + path + "'");
  f << text;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  for (char ch : text + ",") {
    if (ch == ',') {
      if (!item.empty()) out.push_back(item);
      item.clear();
    } else if (ch != ' ') {
      item += ch;
    }
  }
  return out;
}

// `ptdp calibrate --measured RUNS.csv --topology NAME --out PROFILE.yaml`.
int calibrate_from_runs(const std::string& csv, const std::string& topology, const std::string& fit_list, bool loo,
                        const std::string& out) {
  const std::vector<MeasuredRun> rows = load_measured_runs(csv, topology);
  std::vector<RunToFit> runs;
  for (const auto& r : rows)
    runs.push_back(RunToFit{r.label, simulation_input(r.scenario), r.metric, r.measured, {}});
  std::vector<std::string> params = fit_list.empty() ? default_fit_parameters() : split_list(fit_list);
  // A parameter named twice would be fitted twice (two columns of one Jacobian).
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (params[i] == params[j])
        throw ConfigError("--fit", "parameter '" + printable(params[i], 60) + "' is named twice", SourceLocation{"--fit " + fit_list, 0, 0});
  if (!fit_list.empty() && params.empty()) throw ConfigError("--fit", "names no parameter", SourceLocation{"--fit " + fit_list, 0, 0});
  RunFitResult fit;
  try {
    fit = fit_runs(runs, params, loo, [](const std::string& line) { std::fprintf(stderr, "calibrate: %s\n", line.c_str()); });
  } catch (const ConfigError& e) {
    // Too few rows or an unknown parameter: say where (the CSV's last row / the --fit flag).
    const bool rows_short = e.message().find("measured run") != std::string::npos;
    throw ConfigError(rows_short ? "rows" : "--fit", e.message(),
                      rows_short ? SourceLocation{csv, rows.empty() ? 1 : rows.back().row, 1} : SourceLocation{"--fit " + fit_list, 0, 0});
  }
  // Every residual finite: a prediction or measurement that makes one inf or NaN is no fit.
  for (size_t i = 0; i < rows.size() && i < fit.error.size(); ++i)
    if (!std::isfinite(fit.error[i]) || !std::isfinite(fit.predicted[i]))
      throw ConfigError(to_string(rows[i].metric), "row " + std::to_string(rows[i].row) + ": the fitted prediction (" +
                                                       std::to_string(fit.predicted[i]) + ") against the measurement " +
                                                       std::to_string(rows[i].measured) + " gives no finite error",
                        SourceLocation{csv, rows[i].row, 1});
  for (const auto& w : fit.warnings) std::fprintf(stderr, "calibrate: warning: %s\n", w.c_str());
  params = fit.parameters;
  std::printf("fitted %zu parameter(s) of topology '%s' to %zu measured run(s) (Levenberg–Marquardt, %d analytic simulations, %s)\n",
              params.size(), topology.c_str(), runs.size(), fit.evaluations, fit.status.c_str());
  for (size_t i = 0; i < params.size(); ++i) std::printf("  %-24s %.6g\n", params[i].c_str(), fit.values[i]);
  if (!fit.dropped.empty()) {
    std::printf("  not fitted (kept at the preset's values):");
    for (const auto& d : fit.dropped) std::printf(" %s", d.c_str());
    std::printf("\n");
  }
  std::printf("\n  %-4s %-44s %-17s %12s %12s %9s %9s\n", "row", "run", "metric", "measured", "predicted", "error", "loo error");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string label = rows[i].label.size() > 44 ? rows[i].label.substr(0, 41) + "..." : rows[i].label;
    char loo_text[32] = "n/a";
    if (!fit.loo_error.empty()) std::snprintf(loo_text, sizeof loo_text, "%+.1f%%", 100 * fit.loo_error[i]);
    std::printf("  %-4d %-44s %-17s %12.4g %12.4g %+8.1f%% %9s\n", rows[i].row, label.c_str(), to_string(rows[i].metric).c_str(),
                rows[i].measured, fit.predicted[i], 100 * fit.error[i], loo_text);
  }
  std::printf("\n  rms error %.2f%%", 100 * fit.rms_error);
  // As many runs as parameters: the fit passes through every run whatever the model is worth.
  const char* exact = " (exactly determined: as many runs as fitted parameters, so the error says nothing about the model; "
                      "add runs to test it)";
  if (fit.exactly_determined) std::printf("%s", exact);
  if (!fit.loo_error.empty())
    std::printf(", leave-one-out rms %.2f%%, largest %.2f%%", 100 * fit.loo_rms_error, 100 * fit.loo_max_error);
  else if (loo)
    std::printf(" (leave-one-out needs more rows than parameters)");
  std::printf("\n");
  std::string comment = "Fitted by `ptdp calibrate --measured " + csv + " --topology " + topology + "` to " +
                        std::to_string(runs.size()) + " measured runs (" ;
  for (size_t i = 0; i < params.size(); ++i) comment += (i ? ", " : "") + params[i];
  char figures[160];
  std::snprintf(figures, sizeof figures, "); rms error %.2f%%%s", 100 * fit.rms_error, fit.exactly_determined ? " (exactly determined)" : "");
  comment += figures;
  for (const auto& w : fit.warnings) comment += "\nWarning: " + w;
  if (!fit.loo_error.empty()) {
    std::snprintf(figures, sizeof figures, ", leave-one-out rms %.2f%%, largest %.2f%%", 100 * fit.loo_rms_error, 100 * fit.loo_max_error);
    comment += figures;
  }
  comment += ".";
  // The profile names itself after the file and says it was fitted: reports print the name.
  ClusterSpec profile = fit.topology;
  profile.name = std::filesystem::path(out).stem().string() + " (fitted from " + fit.topology.name + ")";
  write_file(out, to_yaml(profile, comment));
  std::printf("wrote fitted profile '%s' to %s (use it as cluster.topology: %s)\n", profile.name.c_str(), out.c_str(), out.c_str());
  return 0;
}

}  // namespace

void add_calibrate(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("calibrate", "measure this machine (or, with --measured, fit a topology to measured runs) and write a topology profile for the simulator");
  static std::string backend = "cpu", out, base = "dgx-a100";
  cmd->add_option("--backend", backend,
                  "cpu (Eigen kernels + MPI; run under mpirun -np ≥ 2 for communication) or cuda (cuBLAS + NCCL; "
                  "mpirun with one rank per GPU, across nodes for the inter-node curve)")
      ->capture_default_str();
  cmd->add_option("--base", base, "cuda: topology whose unmeasured fields (fabric, NIC count) the profile keeps")
      ->capture_default_str();
  cmd->add_option("--out", out, "profile YAML to write (e.g. profiles/local.yaml)")->required();
  static std::string measured, topology = "dgx-a100", fit_list;
  static bool no_loo = false;
  static std::string gemm_shapes;
  cmd->add_option("--gemm-shapes", gemm_shapes,
                  "cpu: time the GEMMs at these shapes (the ones the runs to be predicted multiply) and fit the efficiency "
                  "model to them alone: MxNxK,MxNxK,… (validate's suite passes its own)")
      ->type_name("MxNxK,…");
  static double evict_bytes = 0;
  cmd->add_option("--evict-bytes", evict_bytes,
                  "cpu: write this many other bytes between two timed GEMM calls, so that their operands come from beyond "
                  "the per-core caches as a training step's weights do (validate passes the bytes of the rank's weights and gradients)")
      ->check(CLI::Range(0.0, 4294967296.0))
      ->capture_default_str();
  cmd->add_option("--measured", measured,
                  "fit the topology to measured runs instead of measuring this machine: a CSV with columns scenario "
                  "(relative to the CSV), set (k=v;k=v), and iteration_time_s, tflops_per_gpu, layer_forward_s or "
                  "layer_backward_s");
  cmd->add_option("--topology", topology, "--measured: the topology (preset or file) whose parameters are fitted")
      ->capture_default_str();
  cmd->add_option("--fit", fit_list,
                  "--measured: comma-separated parameters to fit (default: gemm_max_efficiency, gemm_half_dim, gemm_half_k, "
                  "gemm_thin_exponent, elementwise_efficiency, iteration_overhead; also kernel_launch, fp8_gemm_max_efficiency, "
                  "fp8_gemm_half_dim, attention_fwd_max_efficiency, attention_bwd_max_efficiency)");
  cmd->add_flag("--no-loo", no_loo, "--measured: skip the leave-one-out cross-validation");
  cmd->callback([&run] {
    run = [] {
      if (!measured.empty()) return calibrate_from_runs(measured, topology, fit_list, !no_loo, out);
      if (backend != "cpu" && backend != "cuda")
        throw ConfigError("--backend", "unknown back end '" + backend + "', expected cpu or cuda" +
                                           did_you_mean(backend, {"cpu", "cuda"}));
      exec::MpiSession mpi(nullptr, nullptr);
      auto world = exec::make_mpi_world(600);
      if (backend == "cuda") {
        const ClusterSpec base_spec = load_topology(base);
        const std::string yaml = exec::cuda::calibrate_topology(*world, base_spec);
        if (mpi.rank() == 0) {
          const auto dir = std::filesystem::path(out).parent_path();
          if (!dir.empty()) std::filesystem::create_directories(dir);
          std::ofstream f(out);
          if (!f) throw EnvironmentError("cannot write '" + out + "'");
          f << yaml;
          std::printf("wrote %s\n", out.c_str());
        }
        return 0;
      }
      const bool rank0 = mpi.rank() == 0;
      std::vector<std::array<int64_t, 3>> shapes;
      for (size_t at = 0; !gemm_shapes.empty() && at <= gemm_shapes.size();) {
        const size_t comma = std::min(gemm_shapes.find(',', at), gemm_shapes.size());
        const std::string item = gemm_shapes.substr(at, comma - at);
        std::array<int64_t, 3> mnk{};
        char x1 = 0, x2 = 0;
        long long m = 0, n = 0, k = 0;
        int used = 0;
        if (std::sscanf(item.c_str(), "%lld%c%lld%c%lld%n", &m, &x1, &n, &x2, &k, &used) != 5 || x1 != 'x' || x2 != 'x' ||
            used != static_cast<int>(item.size()) || m < 1 || n < 1 || k < 1 || m > 65536 || n > 65536 || k > 65536)
          throw ConfigError("--gemm-shapes", "'" + item + "' is not MxNxK with each side in 1 … 65536");
        mnk = {m, n, k};
        shapes.push_back(mnk);
        at = comma + 1;
      }
      const exec::CpuCalibration p = exec::calibrate_cpu(
          *world, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }, shapes, evict_bytes);
      if (rank0) {
        const auto dir = std::filesystem::path(out).parent_path();
        if (!dir.empty()) std::filesystem::create_directories(dir);
        std::ofstream f(out);
        if (!f) throw EnvironmentError("cannot write '" + out + "'");
        f << exec::cpu_profile_yaml(p);
        std::printf("wrote %s: peak %.1f GFLOP/s per rank, stream %s, %.2f cores, p2p %s\n", out.c_str(), p.peak_flops / 1e9,
                    format_bandwidth(p.stream_Bps).c_str(), p.cores, format_bandwidth(p.p2p_Bps).c_str());
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
