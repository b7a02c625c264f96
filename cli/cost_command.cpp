// `ptdp cost SCENARIO`: the cost model's view of one layer — every operation of the forward,
// backward and recompute passes with its shape, FLOPs, bytes and time.
#include <cstdio>

#include "cli/commands.hpp"
#include "core/units.hpp"
#include "model/cost.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "topologies/collectives.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);

namespace {

void print_ops(const char* title, const std::vector<Op>& ops, const GpuSpec& gpu, const ClusterSpec& c,
               const ParallelPlan& plan) {
  std::printf("\n%s\n  %-30s %22s %12s %12s %12s %10s %8s  %s\n", title, "operation", "batch × m × n × k", "GFLOP", "MB", "kept MB", "time",
              "eff", "kernel (training.framework, fp8_recipe)");
  double total = 0, kept = 0;
  for (const auto& op : ops) {
    double t = op_time_s(op, gpu);
    char shape[64] = "";
    char eff[16] = "";
    if (op.kind == OpKind::Gemm) {
      std::snprintf(shape, sizeof shape, "%lld×%lld×%lld×%lld", static_cast<long long>(op.batch), static_cast<long long>(op.m),
                    static_cast<long long>(op.n), static_cast<long long>(op.k));
      const double peak = op.fp8 && gpu.fp8_peak_flops > 0 ? gpu.fp8_peak_flops : gpu.peak_flops;
      std::snprintf(eff, sizeof eff, "%.0f%%%s", 100 * op.flops / (t * peak), op.fp8 ? " fp8" : "");
    } else if (op.kind == OpKind::Attention) {
      // batch·heads × s × s × d_h, the causal kernel's executed FLOPs.
      std::snprintf(shape, sizeof shape, "%lld×%lld×%lld×%lld%s", static_cast<long long>(op.batch), static_cast<long long>(op.seq),
                    static_cast<long long>(op.seq), static_cast<long long>(op.head_dim), op.causal ? " c" : "");
      std::snprintf(eff, sizeof eff, "%.0f%%", 100 * op.flops / (t * gpu.peak_flops));
    }
    if (is_communication(op.kind)) t = comm_op_time_s(c, plan, op);
    total += t;
    kept += op.saved_bytes;
    // The kernel and why: the framework's element-wise implementation (eager: kernels launched,
    // host-bound when the dispatch outlasts them), the FP8 recipe's GEMM or quantisation kernel.
    std::string kernel = op.kernel;
    if (op.kind == OpKind::Elementwise && op.kernels > 1) kernel += ", " + std::to_string(op.kernels) + " kernels";
    if (!is_communication(op.kind) && op.host_s > 0 && op_time_s(op, gpu) <= op.host_s) kernel += ", host-bound";
    std::printf("  %-30s %22s %12.2f %12.1f %12.1f %10s %8s  %s\n", op.name.c_str(), shape, op.flops / 1e9, op.bytes / 1e6,
                op.saved_bytes / 1e6, format_time(t).c_str(), eff, kernel.c_str());
  }
  std::printf("  %-30s %22s %12s %12s %12.1f %10s\n", "total", "", "", "", kept / 1e6, format_time(total).c_str());
}

}  // namespace

void add_cost(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("cost", "show the cost model's operations of one layer for one microbatch (per TP rank)");
  static ScenarioArgs args;
  add_scenario_args(cmd, args, false);
  cmd->callback([&run] {
    run = [] {
      const Scenario sc = load_scenario(args.path, overrides_of(args));
      const GpuSpec& gpu = sc.cluster.gpu;
      std::printf("%s, t %lld, b %lld on %s: one layer, one microbatch, one tensor-parallel rank\n", sc.model.name.c_str(),
                  static_cast<long long>(sc.plan.tensor), static_cast<long long>(sc.plan.micro_batch), gpu.name.c_str());
      std::printf("attention %s, dropout %g, %s, %s%s; kept MB = activations an op keeps for the backward (c = causal kernel)\n",
                  to_string(sc.model.attention).c_str(), sc.model.dropout_rate(), sc.model.has_bias() ? "biases" : "no biases",
                  to_string(sc.plan.precision).c_str(), sc.plan.precision == Precision::FP8 ? " (linear layers' GEMMs in FP8)" : "");
      std::printf("framework %s%s%s\n", to_string(sc.plan.framework).c_str(), sc.plan.precision == Precision::FP8 ? ", fp8 recipe " : "",
                  sc.plan.precision == Precision::FP8 ? to_string(sc.plan.fp8_recipe).c_str() : "");
      print_ops("forward", layer_ops(sc.model, sc.plan, Pass::Forward), gpu, sc.cluster, sc.plan);
      print_ops("backward", layer_ops(sc.model, sc.plan, Pass::Backward), gpu, sc.cluster, sc.plan);
      print_ops("recompute", layer_ops(sc.model, sc.plan, Pass::Recompute), gpu, sc.cluster, sc.plan);
      print_ops("LM head + loss (last stage), forward", head_ops(sc.model, sc.plan, Pass::Forward), gpu, sc.cluster, sc.plan);
      print_ops("LM head + loss (last stage), backward", head_ops(sc.model, sc.plan, Pass::Backward), gpu, sc.cluster, sc.plan);
      if (sc.plan.mtp_apart()) {
        const std::string where = "multi-token prediction (stage " + std::to_string(sc.plan.mtp_stage()) + " of parallel.pipeline_layout), ";
        print_ops((where + "forward").c_str(), mtp_ops(sc.model, sc.plan, Pass::Forward), gpu, sc.cluster, sc.plan);
        print_ops((where + "backward").c_str(), mtp_ops(sc.model, sc.plan, Pass::Backward), gpu, sc.cluster, sc.plan);
      }
      if (sc.plan.vocab_parallel_pipeline && sc.plan.pipeline > 1) {
        print_ops("output layer + loss share of each pipeline rank (vocab_parallel_pipeline), forward",
                  vocab_ops(sc.model, sc.plan, Pass::Forward), gpu, sc.cluster, sc.plan);
        print_ops("output layer + loss share of each pipeline rank (vocab_parallel_pipeline), backward",
                  vocab_ops(sc.model, sc.plan, Pass::Backward), gpu, sc.cluster, sc.plan);
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
