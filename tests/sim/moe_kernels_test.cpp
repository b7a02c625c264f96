// Mixture-of-experts and Blackwell kernels (issue 31, fifth session): grouped GEMMs, their
// weight gradients by FP8 recipe, their quantisation, and the Blackwell presets' ceilings, each
// checked against the kernel-level figure it was fitted to (kernel-and-framework-facts.md §2,
// §6) and against the direction it moves an end-to-end prediction.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/cost.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;

Scenario load(const std::string& file, const std::vector<Override>& sets) { return load_scenario(kRoot + "/" + file, sets); }

const Op& find_op(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return ops.front();
}

// The B200 MXFP8 MoE kernel benchmark (§2, torchao, 1000 W): DeepSeek-V3's expert shape, 131 072
// tokens over 8 experts (16 384 each), N 2048, K 7168: forward 1671 µs, dgrad 1683 µs, wgrad
// (K-grouped) 2103 µs.
struct GroupedTimes {
  double fwd = 0, dgrad = 0, wgrad = 0;
};
GroupedTimes dsv3_grouped_gemm(const std::string& topology, Fp8Recipe recipe) {
  const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", {{"cluster.topology", topology}});
  Op fwd;
  fwd.name = "expert.fc1";
  fwd.kind = OpKind::Gemm;
  fwd.batch = 8, fwd.m = 16384, fwd.n = 2048, fwd.k = 7168;
  fwd.flops = 2.0 * 8 * 16384 * 2048 * 7168;
  fwd.fp8 = true;
  fwd.kernel_factor = fp8_recipe_costs(recipe).gemm_factor;
  Op dgrad = fwd, wgrad = fwd;
  dgrad.backward_quantised = wgrad.backward_quantised = true;
  wgrad.kernel_factor /= fp8_recipe_costs(recipe).grouped_wgrad_slowdown;
  const GpuSpec& gpu = sc.cluster.gpu;
  return {op_time_s(fwd, gpu), op_time_s(dgrad, gpu), op_time_s(wgrad, gpu)};
}

TEST(MoeKernels, B200Mxfp8GroupedGemmReproducesItsBenchmark) {
  const GroupedTimes t = dsv3_grouped_gemm("dgx-b200", Fp8Recipe::MXFP8);
  RecordProperty("fwd_us", std::to_string(t.fwd * 1e6));
  RecordProperty("dgrad_us", std::to_string(t.dgrad * 1e6));
  RecordProperty("wgrad_us", std::to_string(t.wgrad * 1e6));
  EXPECT_NEAR(t.fwd, 1671e-6, 0.05 * 1671e-6);
  EXPECT_NEAR(t.dgrad, 1683e-6, 0.10 * 1683e-6);
  EXPECT_NEAR(t.wgrad, 2103e-6, 0.10 * 2103e-6);
}

TEST(MoeKernels, GroupedWeightGradientSlowdownIsTheRecipesMeasuredOne) {
  // wgrad over dgrad at equal FLOPs: H100 blockwise (DeepGEMM via torchao) 2105 / 779 µs,
  // B200 MXFP8 2103 / 1683 µs; the unmeasured recipes take their geometric mean.
  EXPECT_NEAR(fp8_recipe_costs(Fp8Recipe::Blockwise).grouped_wgrad_slowdown, 2.70, 0.01);
  EXPECT_NEAR(fp8_recipe_costs(Fp8Recipe::MXFP8).grouped_wgrad_slowdown, 1.25, 0.01);
  EXPECT_NEAR(fp8_recipe_costs(Fp8Recipe::Tensorwise).grouped_wgrad_slowdown, std::sqrt(2.70 * 1.25), 0.01);
  const GroupedTimes block = dsv3_grouped_gemm("dgx-h100", Fp8Recipe::Blockwise);
  EXPECT_NEAR(block.wgrad / block.dgrad, 2105.0 / 779.0, 0.01);
  // The layer's expert weight gradients follow the plan's recipe: MXFP8's are cheaper than
  // tensorwise's at the same shape, relative to their own input gradients.
  auto ratio = [](Fp8Recipe r) {
    const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", {{"cluster.topology", "dgx-b200"}, {"training.precision", "fp8"}});
    ParallelPlan plan = sc.plan;
    plan.fp8_recipe = r;
    const std::vector<Op> bwd = layer_ops(sc.model, plan, Pass::Backward, true);
    return op_time_s(find_op(bwd, "expert.fc1.wgrad"), sc.cluster.gpu) / op_time_s(find_op(bwd, "expert.fc1.dgrad"), sc.cluster.gpu);
  };
  EXPECT_LT(ratio(Fp8Recipe::MXFP8), ratio(Fp8Recipe::Tensorwise));
}

TEST(MoeKernels, TheOutputGradientOfEveryExpertIsQuantised) {
  // A grouped GEMM's backward quantises the output gradients of all its local experts, as the
  // forward quantises all their inputs (it was one expert's).
  const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", {{"training.precision", "fp8"}});
  const std::vector<Op> fwd = layer_ops(sc.model, sc.plan, Pass::Forward, true);
  const std::vector<Op> bwd = layer_ops(sc.model, sc.plan, Pass::Backward, true);
  const Op& fc2 = find_op(fwd, "expert.fc2");
  ASSERT_GT(fc2.batch, 1);
  const double elements = static_cast<double>(fc2.batch) * static_cast<double>(fc2.m) * static_cast<double>(fc2.n);
  EXPECT_DOUBLE_EQ(find_op(bwd, "expert.fc2.grad.cast_fp8").bytes, elements * fp8_recipe_costs(sc.plan.fp8_recipe).quant_bytes_per_element);
}

// A Llama-3.1-8B step at 8k tokens on H200 and B200 (§6): attention 1.87× faster on B200, the
// rest 1.67× (≈ the HBM ratio), not the 2.28× of the peaks. One layer, t 1, bf16.
struct LayerSplit {
  double attention = 0, other = 0;
};
LayerSplit llama8b_layer(const std::string& topology) {
  const Scenario sc = load("scenarios/llama3-8b.yaml", {{"cluster.topology", topology}, {"cluster.gpus", "8"},
                                                        {"parallel.tensor", "1"}, {"parallel.pipeline", "1"},
                                                        {"parallel.data", "8"}, {"model.seq_length", "8192"},
                                                        {"parallel.recompute", "none"}, {"training.precision", "bf16"},
                                                        {"parallel.sequence_parallel", "false"}, {"parallel.tp_comm_overlap", "false"},
                                                        {"training.framework", "torchtitan_compiled"}});
  LayerSplit s;
  for (Pass pass : {Pass::Forward, Pass::Backward})
    for (const Op& op : layer_ops(sc.model, sc.plan, pass)) {
      if (is_communication(op.kind)) continue;
      (op.kind == OpKind::Attention ? s.attention : s.other) += op_time_s(op, sc.cluster.gpu);
    }
  return s;
}

TEST(BlackwellKernels, B200RunsTheStepAtItsMeasuredRatiosOverH200) {
  const LayerSplit h200 = llama8b_layer("dgx-h200"), b200 = llama8b_layer("dgx-b200");
  RecordProperty("attention_ratio", std::to_string(h200.attention / b200.attention));
  RecordProperty("other_ratio", std::to_string(h200.other / b200.other));
  EXPECT_NEAR(h200.attention / b200.attention, 1.87, 0.03 * 1.87);
  EXPECT_NEAR(h200.other / b200.other, 1.67, 0.03 * 1.67);
}

TEST(BlackwellKernels, TheFittedCeilingsSlowBlackwellMoeRows) {
  // Lower ceilings than the MAMF-based ones: the same MoE plan takes longer than with them.
  const std::vector<Override> sets = {{"cluster.topology", "dgx-b200"}, {"cluster.gpus", "256"}, {"parallel.tensor", "1"},
                                      {"parallel.sequence_parallel", "false"}, {"parallel.pipeline", "16"},
                                      {"parallel.schedule", "1f1b"}, {"parallel.virtual_stages", "1"}, {"parallel.expert", "8"},
                                      {"parallel.expert_tensor", "1"}, {"training.fp8_recipe", "mxfp8"}, {"training.global_batch", "8192"}};
  const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", sets);
  SimulationInput fitted = input_of(sc), mamf = input_of(sc);
  mamf.cluster.gpu.gemm_max_efficiency = 0.677;
  mamf.cluster.gpu.fp8_gemm_max_efficiency = 0.624;
  mamf.cluster.gpu.cudnn_attention_fwd_max_efficiency = 0.604;
  mamf.cluster.gpu.cudnn_attention_bwd_max_efficiency = 0.529;
  const Schedule schedule = make_schedule(sc.plan);
  const double t_fitted = simulate(fitted, schedule, Fidelity::Analytic, false).report.iteration_time_s;
  const double t_mamf = simulate(mamf, schedule, Fidelity::Analytic, false).report.iteration_time_s;
  EXPECT_GT(t_fitted, 1.02 * t_mamf);
}

}  // namespace
}  // namespace ptdp
