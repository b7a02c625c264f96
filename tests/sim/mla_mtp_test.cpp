// Multi-head latent attention and multi-token prediction (issue 31, eighth session): DeepSeek-V3's
// attention and MTP module as its config gives them, checked against the FLOPs per token the
// published NeMo / Megatron-Bridge runs report (modern-training-facts.md §8), the direction each
// moves a prediction, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/flops.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"
#include "model/tensors.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"
#include "search/sweep.hpp"
#include "schedules/schedule.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;
const std::string kPreset = "scenarios/moe/deepseek-v3.yaml";

Scenario load(const std::vector<Override>& sets) { return load_scenario(kRoot + "/" + kPreset, sets); }

// The DeepSeek-V3 GB200 row of scenarios/moe/nemo-moe-runs.csv (MXFP8, TP 1, PP 4 VP 4, EP 64).
std::vector<Override> gb200_row(std::vector<Override> more = {}) {
  std::vector<Override> sets = {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "256"},           {"parallel.tensor", "1"},
                                {"parallel.sequence_parallel", "false"}, {"parallel.pipeline", "4"},     {"parallel.schedule", "interleaved"},
                                {"parallel.virtual_stages", "4"},       {"parallel.expert", "64"},       {"parallel.expert_tensor", "1"},
                                {"parallel.recompute", "selective"},    {"training.fp8_recipe", "mxfp8"}, {"training.global_batch", "8192"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

Report run(const Scenario& sc) { return simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report; }

double sum_params(const std::vector<ParamTensor>& tensors) { return tensor_totals(tensors).all; }

const Op& find_op(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return ops.front();
}

// MLA's projections as DeepSeek-V3's config declares them: 7168·1536 + 1536·128·192 +
// 7168·(512 + 64) + 512·128·(128 + 128) + 128·128·7168 = 187.1 M weights per layer (+ the two
// latent norms), against 205.5 M for multi-head attention of width h.
TEST(Mla, DeepSeekV3AttentionHasItsPublishedShape) {
  const Scenario sc = load({});
  ASSERT_TRUE(sc.model.has_mla());
  const std::vector<ParamTensor> dense = layer_kind_tensors(sc.model, false);
  double attention = 0;
  for (const ParamTensor& t : dense)
    if (std::string(t.suffix).rfind("attention.", 0) == 0) attention += t.count();
  EXPECT_DOUBLE_EQ(attention, 7168.0 * 1536 + 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512 + 512.0 * 128 * 256 + 128.0 * 128 * 7168);
  // The kernel: 192-wide QKᵀ, 128-wide ·V over 128 heads.
  const std::vector<Op> fwd = layer_ops(sc.model, sc.plan, Pass::Forward, true);
  const Op& attn = find_op(fwd, "attn.flash");
  EXPECT_EQ(attn.head_dim, 192);
  const double b = static_cast<double>(sc.plan.micro_batch), s = 4096;
  EXPECT_DOUBLE_EQ(attn.model_flops, 2 * b * 128 * s * s * (192 + 128));
  EXPECT_DOUBLE_EQ(find_op(fwd, "proj").k, 128 * 128);  // heads · v_head_dim, one TP rank
  // The preset counts the published 671 B for the main model, the MTP module on top.
  const double mtp = mtp_parameter_count(sc.model);
  EXPECT_NEAR((parameter_count(sc.model) - mtp) / 1e9, 671, 1.0);
  EXPECT_NEAR(mtp / 1e9, 11.5, 0.3);
}

// §8: the runs' model TFLOP/s over their tokens/s per GPU give the FLOPs per token they counted —
// 1028 / 3955 (GB200), 699 / 2689 (B200), 338 / 1297 (H100): 259.9, 259.9, 260.6 GFLOP. Megatron-
// Bridge counts causal attention at half (the Qwen3 rows show it exactly); with MLA and the MTP
// module ptdp's count, causal attention at half, is the same.
TEST(Mla, DeepSeekV3FlopsPerTokenMatchTheRunsPublishedCount) {
  const Scenario sc = load(gb200_row());
  const double tokens = static_cast<double>(sc.plan.global_batch) * static_cast<double>(sc.model.seq_length);
  double attention = 0;  // forward, every (query, key) pair, per sequence
  for (const Op& op : layer_ops(sc.model, sc.plan, Pass::Forward, true))
    if (op.attention_core) attention += op.model_flops;
  const double layers = static_cast<double>(sc.model.num_layers + sc.model.mtp_layers);
  const double per_token = reported_iteration_flops(sc.model, sc.plan) / tokens;
  const double causal_half = per_token - 3 * layers * attention / 2 / static_cast<double>(sc.model.seq_length * sc.plan.micro_batch);
  RecordProperty("gflop_per_token", std::to_string(causal_half / 1e9));
  EXPECT_NEAR(causal_half / 1e9 / 260.1, 1.0, 0.01) << causal_half / 1e9;
  // Without MLA and MTP the count misses it by 4.6 % (248.0 every pair, 237.3 causal at half).
  const Scenario mha = load(gb200_row({{"model.mla.kv_lora_rank", "0"}, {"model.mtp_layers", "0"}}));
  EXPECT_LT(reported_iteration_flops(mha.model, mha.plan) / tokens, 0.97 * per_token);
}

// Each mechanism moves the GB200 row the way its work says: MLA's attention has 2.86× the
// kernel FLOPs of 56-wide multi-head attention (slower) and smaller projections; the MTP module
// adds an MoE layer and a second output layer and loss to the last stage (slower, the last
// stage holds more parameters and activations).
TEST(Mla, LatentAttentionAndMultiTokenPredictionEachSlowTheDeepSeekV3Row) {
  const Report both = run(load(gb200_row()));
  const Report no_mla = run(load(gb200_row({{"model.mla.kv_lora_rank", "0"}})));
  const Report no_mtp = run(load(gb200_row({{"model.mtp_layers", "0"}})));
  RecordProperty("iteration_s", std::to_string(both.iteration_time_s));
  RecordProperty("iteration_s_without_mla", std::to_string(no_mla.iteration_time_s));
  RecordProperty("iteration_s_without_mtp", std::to_string(no_mtp.iteration_time_s));
  EXPECT_GT(both.iteration_time_s, 1.03 * no_mla.iteration_time_s);
  EXPECT_GT(both.iteration_time_s, 1.01 * no_mtp.iteration_time_s);
  // The MTP module's layer and logits sit on the last stage: its ops are in the head's.
  const Scenario sc = load(gb200_row());
  const std::vector<Op> head = head_ops(sc.model, sc.plan, Pass::Forward);
  EXPECT_DOUBLE_EQ(find_op(head, "mtp.logits").flops, find_op(head, "logits").flops);
  find_op(head, "mtp.expert.fc1");
  find_op(head_ops(sc.model, sc.plan, Pass::Backward), "mtp.expert.fc1.wgrad");
  // The head unit holds the module's parameters: its layer's tensors, the rank's 4 of 256 experts,
  // the projection and norms, and the word embedding's copy the module reads (untied: Megatron-Core
  // keeps one on the MTP stage). (The balanced partition moves a layer off the last stage for it.)
  const Scenario plain = load(gb200_row({{"model.mtp_layers", "0"}}));
  const int last = static_cast<int>(sc.plan.num_stages() - 1);
  const double head_params = stage_parameters(sc.model, sc.plan, last).units.back();
  const double plain_head = stage_parameters(plain.model, plain.plan, last).units.back();
  const double embedding_copy =
      embedding_tensors(sc.model, sc.model.padded_vocab(sc.plan.tensor)).front().local_count(sc.plan.tensor);
  EXPECT_DOUBLE_EQ(head_params - plain_head,
                   sum_params(mtp_tensors(sc.model)) + 4 * sum_params(expert_tensors(sc.model)) + embedding_copy);
  EXPECT_LT(stage_layers(sc.model, sc.plan).back(), stage_layers(plain.model, plain.plan).back() + 1);
}

// The enumeration keeps one MoE layer's saved bytes per shape (layer_kind_activation_bytes) and
// the MTP module's layer reads it for every head it checks: a plan differing from the memo's
// earlier plans in one field the layer's ops read (recompute, micro batch, tensor, sequence
// parallelism, expert tensor split) must get its own figure, the one computed without the memo.
TEST(Mla, TheMtpLayersSavedBytesKeptPerShapeAreEachPlansOwn) {
  const Scenario sc = load(gb200_row());
  const auto head_bytes = [&](const ParallelPlan& plan) {
    double bytes = 0;
    for (const Op& op : head_ops(sc.model, plan, Pass::Forward)) bytes += op.saved_bytes;
    return bytes;
  };
  std::vector<ParallelPlan> plans(1, sc.plan);
  auto vary = [&](auto change) {
    ParallelPlan p = sc.plan;
    change(p);
    plans.push_back(p);
  };
  vary([](ParallelPlan& p) { p.recompute = Recompute::Full; });
  vary([](ParallelPlan& p) { p.recompute = Recompute::None; });
  vary([](ParallelPlan& p) { p.micro_batch = 2; });
  vary([](ParallelPlan& p) { p.tensor = 2, p.sequence_parallel = true; });
  vary([](ParallelPlan& p) { p.tensor = 2, p.sequence_parallel = true, p.expert_tensor = 2; });
  std::vector<double> plain;
  for (const ParallelPlan& p : plans) plain.push_back(head_bytes(p));
  ActivationBytesMemo memo;
  const ActivationBytesScope scope(&memo);
  for (size_t i = 0; i < plans.size(); ++i) {
    layer_activation_bytes(sc.model, plans[i]);  // warms the memo as the memory check does
    EXPECT_EQ(head_bytes(plans[i]), plain[i]) << plan_label(plans[i]);
    EXPECT_EQ(layer_kind_activation_bytes(sc.model, plans[i], true), layer_kind_saved_bytes(sc.model, plans[i], true))
        << plan_label(plans[i]);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(plain[i], plain[j]) << plan_label(plans[i]) << " vs " << plan_label(plans[j]);
  }
}

// Megatron's layout with the MTP module and the loss on stages of their own (parallel.pipeline_layout):
// the MTP stage holds the module's parameters (its tensors and the rank's 4 of 256 experts), the
// last stage the head without it; the analytic and SimGrid engines price the same plan.
TEST(Mla, ALayoutGivesTheMtpModuleAStageOfItsOwnInBothEngines) {
  const Scenario sc = load(gb200_row({{"parallel.partition", "uniform"}, {"parallel.pipeline_layout", "Et*3|(t*5|)*6(t*4|)*7,m|L"}}));
  const Scenario plain = load(gb200_row({{"model.mtp_layers", "0"}}));
  ASSERT_EQ(sc.plan.mtp_stage(), 14);
  const StageParameters mtp_stage = stage_parameters(sc.model, sc.plan, 14);
  EXPECT_TRUE(mtp_stage.has_mtp);
  ASSERT_EQ(mtp_stage.units.size(), 1u);
  EXPECT_DOUBLE_EQ(mtp_stage.units[0], sum_params(mtp_tensors(sc.model)) + 4 * sum_params(expert_tensors(sc.model)));
  const int last = static_cast<int>(sc.plan.num_stages() - 1);
  EXPECT_DOUBLE_EQ(stage_parameters(sc.model, sc.plan, last).total, stage_parameters(plain.model, plain.plan, last).units.back());
  // The module's layer runs on stage 14, its logits on the last stage.
  find_op(mtp_ops(sc.model, sc.plan, Pass::Forward), "mtp.expert.fc1");
  find_op(head_ops(sc.model, sc.plan, Pass::Forward), "mtp.logits");
  for (const Op& op : head_ops(sc.model, sc.plan, Pass::Forward)) EXPECT_EQ(op.name.find("mtp.expert"), std::string::npos) << op.name;
  const Report analytic = run(sc);
  const Report reduced = simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Reduced, false).report;
  RecordProperty("iteration_s", std::to_string(analytic.iteration_time_s));
  EXPECT_NEAR(reduced.iteration_time_s, analytic.iteration_time_s, 0.05 * analytic.iteration_time_s);
  EXPECT_NE(analytic.iteration_time_s, run(load(gb200_row())).iteration_time_s);
}

TEST(Mla, BadValuesAreRefusedNamingTheKey) {
  auto refused = [](const std::vector<Override>& sets, const std::string& key) {
    try {
      load(sets);
      ADD_FAILURE() << key << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused({{"model.mla.kv_lora_rank", "-1"}}, "model.mla.kv_lora_rank");
  refused({{"model.mla.v_head_dim", "0"}}, "model.mla.v_head_dim");
  refused({{"model.mla.qk_head_dim", "196"}}, "model.mla.qk_head_dim");  // 196 + 64: past flash's 256
  refused({{"model.mla.v_head_dim", "100"}}, "model.mla.v_head_dim");    // not a multiple of 8
  refused({{"model.mla.qk_pos_emb_head_dim", "63"}}, "model.mla.qk_pos_emb_head_dim");
  refused({{"model.mla.q_lora_rank", "100000"}}, "model.mla.q_lora_rank");
  refused({{"model.mla.kv_rank", "512"}}, "model.mla.kv_rank");
  refused({{"model.mtp_layers", "-1"}}, "model.mtp_layers");
  refused({{"model.mtp_layers", "17"}}, "model.mtp_layers");
  // Queries straight from h (DeepSeek-V2-Lite's q_lora_rank 0) are a model of their own.
  const Scenario lite = load({{"model.mla.q_lora_rank", "0"}});
  const std::vector<Op> fwd = layer_ops(lite.model, lite.plan, Pass::Forward, true);
  EXPECT_EQ(find_op(fwd, "mla.q_up").k, 7168);
  EXPECT_EQ(find_op(fwd, "mla.kv_down").n, 512 + 64);
  EXPECT_EQ(find_op(fwd, "mla.kv_down").k, 7168);
  EXPECT_FALSE(std::any_of(fwd.begin(), fwd.end(), [](const Op& op) { return op.name == "mla.q_down"; }));
}

}  // namespace
}  // namespace ptdp
