// Mixture-of-experts and Blackwell kernels (issue 31, fifth session): grouped GEMMs, their
// weight gradients by FP8 recipe, their quantisation, and the Blackwell presets' ceilings, each
// checked against the kernel-level figure it was fitted to (kernel-and-framework-facts.md §2,
// §6) and against the direction it moves an end-to-end prediction.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"
#include "topologies/collectives.hpp"
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
                                                        {"training.framework", "torchtitan_compiled"},
                                                        // the measured step ran FA3 on H200, FA4 on B200: the flash curves
                                                        {"training.attention_kernel", "flash"}});
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


// The flex dispatcher (issue 31, sixth session): DeepEP's dispatch and combine against its
// published figures (kernel-and-framework facts §3; V1 normal kernels: 4096 tokens per rank,
// h 7168, top 8, FP8 dispatch), then the direction it moves an MoE iteration.
TEST(MoeKernels, DeepEpDispatchReproducesItsBenchmarks) {
  EXPECT_NEAR(expected_other_groups(8, 8), 7 * (1 - std::pow(7.0 / 8, 8)), 1e-12);
  EXPECT_NEAR(expected_other_groups(4, 1), 0.75, 1e-12);
  EXPECT_EQ(expected_other_groups(1, 8), 0);
  const double tokens = 4096, h = 7168, copies = 8;
  const double bytes = tokens * copies * h;  // the rank's routed copies, one byte per element
  // DeepEP's bandwidth counts the bytes it moves: one copy per other rank a token reaches.
  auto measured_Bps = [&](const ClusterSpec& c, int64_t n, double moved_per_token) {
    const GroupShape g = group_shape(c, n, 1);
    return tokens * h * moved_per_token / deepep_alltoall_time_s(c, g, bytes, static_cast<int64_t>(copies));
  };
  // EP 8 over NVLink: H800 (NVLink cut to 200 GB/s) 153 / 158 GB/s, B200 726 / 740 GB/s.
  const ClusterSpec h800 = load("scenarios/moe/deepseek-v3.yaml", {{"cluster.topology.node.nvlink.bandwidth", "200GBps"}}).cluster;
  const double h800_Bps = measured_Bps(h800, 8, expected_other_groups(8, 8));
  EXPECT_GT(h800_Bps, 0.94 * 153e9) << h800_Bps;
  EXPECT_LT(h800_Bps, 1.06 * 158e9) << h800_Bps;
  const ClusterSpec b200 = load("scenarios/moe/deepseek-v3.yaml", {{"cluster.topology", "dgx-b200"}}).cluster;
  EXPECT_NEAR(measured_Bps(b200, 8, expected_other_groups(8, 8)) / 733e9, 1.0, 0.05) << measured_Bps(b200, 8, expected_other_groups(8, 8));
  // EP 64 over 8 nodes of 400 Gb/s NICs: RDMA 51 / 50 GB/s (EP 16 … 64: 43 … 58).
  const ClusterSpec h100 = load("scenarios/moe/deepseek-v3.yaml", {}).cluster;
  const double rdma_Bps = measured_Bps(h100, 64, expected_other_groups(8, 8));
  RecordProperty("h800_ep8_GBps", std::to_string(h800_Bps / 1e9));
  RecordProperty("b200_ep8_GBps", std::to_string(measured_Bps(b200, 8, expected_other_groups(8, 8)) / 1e9));
  RecordProperty("h100_ep64_rdma_GBps", std::to_string(rdma_Bps / 1e9));
  EXPECT_GT(rdma_Bps, 43e9) << rdma_Bps;
  EXPECT_LT(rdma_Bps, 58e9) << rdma_Bps;
  // Against NCCL's all-to-all of every copy: fewer bytes, so faster inside a node and across.
  EXPECT_LT(deepep_alltoall_time_s(h100, group_shape(h100, 8, 1), bytes, 8), alltoall_time_s(h100, group_shape(h100, 8, 1), bytes));
  EXPECT_LT(deepep_alltoall_time_s(h100, group_shape(h100, 64, 1), bytes, 8), 0.7 * alltoall_time_s(h100, group_shape(h100, 64, 1), bytes));
}

TEST(MoeKernels, FlexDispatcherShortensTheExpertAllToAllOfAnIteration) {
  // DeepSeek-V3's H100 layout: EP 64 over 8 nodes, all-to-alls exposed (no overlap).
  const std::vector<Override> h100 = {{"cluster.gpus", "1024"}, {"parallel.tensor", "2"}, {"parallel.pipeline", "8"},
                                      {"parallel.expert", "64"}, {"parallel.expert_tensor", "1"}, {"parallel.sequence_parallel", "true"},
                                      {"parallel.recompute", "selective"}, {"training.global_batch", "8192"}};
  auto run = [](const Scenario& sc) { return simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report; };
  std::vector<Override> flex = h100;
  flex.push_back({"parallel.moe_dispatcher", "flex"});
  const Report nccl = run(load("scenarios/moe/deepseek-v3.yaml", h100)), deepep = run(load("scenarios/moe/deepseek-v3.yaml", flex));
  EXPECT_LT(deepep.exposed_comm_s.at("ep"), 0.75 * nccl.exposed_comm_s.at("ep")) << deepep.exposed_comm_s.at("ep") << " vs " << nccl.exposed_comm_s.at("ep");
  EXPECT_LT(deepep.iteration_time_s, nccl.iteration_time_s);
  // The same ops, the same FLOPs: only the all-to-alls' price changes.
  EXPECT_DOUBLE_EQ(deepep.tflops_per_gpu * deepep.iteration_time_s, nccl.tflops_per_gpu * nccl.iteration_time_s);
  // `ptdp cost` names the kernel of the flex dispatcher's all-to-alls, forward and backward.
  const Scenario flex_sc = load("scenarios/moe/deepseek-v3.yaml", flex);
  const std::vector<Op> bwd = layer_ops(flex_sc.model, flex_sc.plan, Pass::Backward, true);
  EXPECT_NE(find_op(bwd, "moe.dispatch.alltoall.backward").kernel.find("DeepEP"), std::string::npos);
  // Megatron-Core's dispatcher: another framework says it has none, naming the key.
  flex.push_back({"training.framework", "torchtitan"});
  try {
    load("scenarios/moe/deepseek-v3.yaml", flex);
    ADD_FAILURE() << "torchtitan with the flex dispatcher was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.moe_dispatcher"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load("scenarios/moe/deepseek-v3.yaml", {{"parallel.moe_dispatcher", "flx"}}), ConfigError);
}

// Megatron-Core's alltoall dispatcher sorts the received rows into one chunk per local expert
// before the grouped GEMM and back before the combine (sort_chunks_by_idxs; issue 31, seventh
// session): two passes over the rank's received rows, each priced as the permute's traffic.
TEST(MoeKernels, AlltoallDispatcherSortsTheChunksOfItsLocalExperts) {
  // DeepSeek-V3 on GB200: EP 64, 4 of 256 experts per rank, 4096 tokens × top 8 per rank.
  const std::vector<Override> gb200 = {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "256"}, {"parallel.tensor", "1"},
                                       {"parallel.pipeline", "4"},          {"parallel.expert", "64"}, {"training.global_batch", "8192"}};
  const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", gb200);
  const std::vector<Op> fwd = layer_ops(sc.model, sc.plan, Pass::Forward, true);
  const double received = 4.0 * (64.0 * 4096 * 8 / 256) * 7168 * 2;  // local experts × rows each × h × bf16
  const Op& sort = find_op(fwd, "moe.sort_chunks");
  EXPECT_DOUBLE_EQ(sort.bytes, 2 * received);
  EXPECT_DOUBLE_EQ(find_op(fwd, "moe.unsort_chunks").bytes, 2 * received);
  // In order: after the dispatch, before the first grouped GEMM; after the last, before the combine.
  auto at = [&](const std::string& name) {
    for (size_t i = 0; i < fwd.size(); ++i)
      if (fwd[i].name == name) return i;
    return fwd.size();
  };
  EXPECT_LT(at("moe.dispatch.alltoall"), at("moe.sort_chunks"));
  EXPECT_LT(at("moe.sort_chunks"), at("expert.fc1"));
  EXPECT_LT(at("expert.fc2"), at("moe.unsort_chunks"));
  EXPECT_LT(at("moe.unsort_chunks"), at("moe.combine.alltoall"));
  // Both run again in the backward, and they lengthen the layer the engines price.
  const std::vector<Op> bwd = layer_ops(sc.model, sc.plan, Pass::Backward, true);
  EXPECT_GT(find_op(bwd, "moe.sort_chunks.backward").bytes, 0);
  const GpuSpec& gpu = sc.cluster.gpu;
  double without = 0;
  for (const Op& op : fwd)
    if (op.name.find("sort_chunks") == std::string::npos) without += op_time_s(op, gpu);
  EXPECT_GT(cost_of(fwd, gpu).compute_s, without + op_time_s(sort, gpu));
  // None with one local expert (EP 256), or with DeepEP, which lays out its rows by expert.
  auto has_sort = [](const Scenario& s) {
    for (const Op& op : layer_ops(s.model, s.plan, Pass::Forward, true))
      if (op.name == "moe.sort_chunks") return true;
    return false;
  };
  std::vector<Override> one = gb200, flex = gb200;
  one.push_back({"cluster.gpus", "1024"});
  one.push_back({"parallel.expert", "256"});
  flex.push_back({"parallel.moe_dispatcher", "flex"});
  EXPECT_FALSE(has_sort(load("scenarios/moe/deepseek-v3.yaml", one)));
  EXPECT_FALSE(has_sort(load("scenarios/moe/deepseek-v3.yaml", flex)));
}

// Before any token moves each rank learns what it will receive (issue 33, session 39): the
// alltoall dispatcher all-gathers every rank's tokens per expert over the expert group (and over
// the expert-tensor group with split tokens), the allgather dispatcher every rank's choices and
// weights; the CPU executor runs exactly these (its ledger books them, ctest -R Conformance). A
// synchronising collective each, in the forward only: the backward reuses the routing.
TEST(MoeKernels, EachDispatcherGathersItsRoutingBeforeTheTokensMove) {
  const std::vector<Override> gb200 = {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "256"}, {"parallel.tensor", "1"},
                                       {"parallel.pipeline", "4"},          {"parallel.expert", "64"}, {"training.global_batch", "8192"}};
  auto ops_of = [](const std::vector<Override>& sets, Pass pass) {
    const Scenario sc = load("scenarios/moe/deepseek-v3.yaml", sets);
    return layer_ops(sc.model, sc.plan, pass, true);
  };
  auto at = [](const std::vector<Op>& ops, const std::string& name) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].name == name) return i;
    return ops.size();
  };
  auto metadata = [](const std::vector<Op>& ops) {
    int n = 0;
    for (const Op& op : ops) n += op.routing_metadata ? 1 : 0;
    return n;
  };
  const std::vector<Op> fwd = ops_of(gb200, Pass::Forward);
  const Op& counts = find_op(fwd, "moe.dispatch.counts.allgather");
  EXPECT_EQ(counts.kind, OpKind::AllGather);
  EXPECT_EQ(counts.group, CommGroup::Expert);
  EXPECT_DOUBLE_EQ(counts.bytes, 64.0 * 256 * 4);  // 256 counts from each of 64 ranks
  EXPECT_LT(at(fwd, "moe.dispatch.counts.allgather"), at(fwd, "moe.dispatch.alltoall"));
  EXPECT_EQ(metadata(fwd), 1);
  // The backward has no collective of its own for it (an all-gather over the expert group would
  // otherwise come back as a reduce-scatter).
  for (const Op& op : ops_of(gb200, Pass::Backward)) EXPECT_EQ(op.name.find("counts"), std::string::npos) << op.name;
  // Split tokens (t 2 with sequence parallelism, expert tensor 2): the members' counts too.
  std::vector<Override> split = gb200;
  for (const Override& o : std::vector<Override>{{"cluster.gpus", "512"}, {"parallel.tensor", "2"}, {"parallel.expert_tensor", "2"},
                                                 {"parallel.sequence_parallel", "true"}})
    split.push_back(o);
  const std::vector<Op> split_fwd = ops_of(split, Pass::Forward);
  EXPECT_DOUBLE_EQ(find_op(split_fwd, "moe.dispatch.member_counts.allgather").bytes, 2.0 * 64 * 256 * 4);
  EXPECT_EQ(find_op(split_fwd, "moe.dispatch.member_counts.allgather").group, CommGroup::ExpertTensor);
  // The allgather dispatcher: each of the 64 ranks' 4096 tokens × top 8, an expert and a weight each.
  std::vector<Override> gather = gb200;
  gather.push_back({"parallel.moe_dispatcher", "allgather"});
  const std::vector<Op> gather_fwd = ops_of(gather, Pass::Forward);
  EXPECT_DOUBLE_EQ(find_op(gather_fwd, "moe.dispatch.routing.allgather").bytes, 64.0 * 2 * 4096 * 8 * 4);
  EXPECT_LT(at(gather_fwd, "moe.dispatch.routing.allgather"), at(gather_fwd, "moe.dispatch.allgather"));
  EXPECT_EQ(metadata(gather_fwd), 1);
  // None with DeepEP (its dispatch kernel exchanges the counts itself) or without expert parallelism.
  std::vector<Override> flex = gb200, none = gb200;
  flex.push_back({"parallel.moe_dispatcher", "flex"});
  none.push_back({"parallel.expert", "1"});
  EXPECT_EQ(metadata(ops_of(flex, Pass::Forward)), 0);
  EXPECT_EQ(metadata(ops_of(none, Pass::Forward)), 0);
}

// --overlap-moe-expert-parallel-comm against its published gain (modern-training-facts.md §6,
// [MB-ovl]): Qwen3-30B-A3B on 16 H100, EP 16 (two nodes), alltoall dispatcher: step 41.25 s →
// 31.31 s (1.317×). The layout's other settings are not published (TP 1, PP 1, BF16, global
// batch 512 assumed; the gain barely depends on the batch: 1.314× at 256, 1.317× at 1024).
TEST(MoeKernels, ExpertAllToAllOverlapGainsWhatMegatronBridgeMeasured) {
  const std::vector<Override> qwen3_30b = {
      {"model.num_layers", "48"},        {"model.hidden_size", "2048"},      {"model.num_attention_heads", "32"},
      {"model.num_query_groups", "4"},   {"model.head_dim", "128"},          {"model.moe.num_experts", "128"},
      {"model.moe.top_k", "8"},          {"model.moe.expert_ffn_hidden_size", "768"}, {"model.moe.shared_experts", "0"},
      {"model.seq_length", "4096"},      {"model.moe.first_dense_layers", "0"}, {"cluster.gpus", "16"},
      {"parallel.tensor", "1"},          {"parallel.sequence_parallel", "false"}, {"parallel.pipeline", "1"},
      {"parallel.expert", "16"},         {"parallel.expert_tensor", "1"},    {"training.precision", "bf16"},
      {"training.global_batch", "512"}};
  auto step = [&](bool overlap) {
    std::vector<Override> sets = qwen3_30b;
    sets.push_back({"parallel.moe_comm_overlap", overlap ? "true" : "false"});
    const Scenario sc = load("scenarios/moe/qwen2-57b-a14b.yaml", sets);
    return simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report.iteration_time_s;
  };
  const double gain = step(false) / step(true);
  RecordProperty("modelled_gain", std::to_string(gain));
  EXPECT_NEAR(gain, 41.25 / 31.31, 0.10 * 41.25 / 31.31);
}

}  // namespace
}  // namespace ptdp
