// Memory per GPU: activations per layer (Korthikanti et al. 2022), model state of mixed-precision
// Adam, and activations of the in-flight microbatches a schedule keeps.
#include "model/memory.hpp"

#include <gtest/gtest.h>

#include "models.hpp"

#include <algorithm>

namespace ptdp {
namespace {

TransformerSpec model(int64_t l, int64_t h, int64_t a, int64_t s = 2048, int64_t V = 51200) {
  return test_models::gpt(l, h, a, s, V);
}

ParallelPlan plan_of(int64_t t, int64_t p, int64_t b, Recompute r, Precision prec = Precision::FP16) {
  ParallelPlan plan;
  plan.tensor = t;
  plan.pipeline = p;
  plan.micro_batch = b;
  plan.global_batch = 512;
  plan.recompute = r;
  plan.precision = prec;
  return plan;
}

TEST(LayerActivationBytes, MatchesKorthikantiFormulasInFp16) {
  struct Case {
    int64_t h, a, s, b, t;
  };
  for (const Case& c : {Case{12288, 96, 2048, 1, 8}, Case{2304, 24, 2048, 16, 1}, Case{6144, 48, 2048, 8, 8},
                        Case{4096, 32, 1024, 2, 4}, Case{25600, 160, 2048, 1, 8}}) {
    const TransformerSpec m = model(24, c.h, c.a, c.s);
    const double s = static_cast<double>(c.s), b = static_cast<double>(c.b), h = static_cast<double>(c.h),
                 a = static_cast<double>(c.a), t = static_cast<double>(c.t);
    EXPECT_NEAR(layer_activation_bytes(m, plan_of(c.t, 1, c.b, Recompute::None)) /
                    (s * b * h * (10 + 24 / t + 5 * a * s / (h * t))), 1.0, 1e-12)
        << "h " << c.h << " t " << c.t;
    EXPECT_NEAR(layer_activation_bytes(m, plan_of(c.t, 1, c.b, Recompute::Selective)), s * b * h * (10 + 24 / t), 1e-6)
        << "h " << c.h << " t " << c.t;
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, plan_of(c.t, 1, c.b, Recompute::Full)), 2 * s * b * h);
  }
}

TEST(LayerActivationBytes, WithoutTensorParallelismIs34PlusAttentionTerm) {
  // ptdp-facts.md: s·b·h·(34 + 5·a·s/h) bytes at t = 1 (GPT-3 175B, b = 1: 2.87 GB per layer).
  const TransformerSpec m = model(96, 12288, 96);
  const double s = 2048, h = 12288, a = 96;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, plan_of(1, 1, 1, Recompute::None)), s * h * (34 + 5 * a * s / h));
  // fp32 activations take twice the bytes of fp16.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, plan_of(1, 1, 1, Recompute::Full, Precision::FP32)), 4 * s * h);
}

TEST(RankParameterCount, SingleStageWithoutTensorParallelismHoldsTheWholeModel) {
  const TransformerSpec m = model(24, 2304, 24);  // V = 51200 is a multiple of 128: no padding
  EXPECT_DOUBLE_EQ(rank_parameter_count(m, plan_of(1, 1, 1, Recompute::None), 0), parameter_count(m));
}

TEST(RankParameterCount, TensorParallelismSplitsTheLayerWeightsAndVocabulary) {
  // Megatron: QKV/FC1 (column) and proj/FC2 (row) weights, and the column biases, are split over t;
  // row biases, LayerNorms and the position embedding are replicated; the word embedding is split
  // by vocabulary.
  const TransformerSpec m = model(40, 6144, 48);
  const double h = 6144;
  const double want = 40 * ((12 * h * h + 7 * h) / 8 + 6 * h) + 51200 * h / 8 + 2048 * h + 2 * h;
  EXPECT_NEAR(rank_parameter_count(m, plan_of(8, 1, 1, Recompute::None), 0), want, 1.0);
  const double one = rank_parameter_count(m, plan_of(1, 1, 1, Recompute::None), 0);
  EXPECT_NEAR(want / (one / 8), 1.0, 0.01);
}

TEST(RankParameterCount, MiddlePipelineStagesHoldTheirLayersOnly) {
  const TransformerSpec m = model(96, 12288, 96);
  const ParallelPlan plan = plan_of(8, 16, 1, Recompute::Full);
  const double h = 12288;
  const double per_layer_local = (4 * h * h + 2 * h * 4 * h + 3 * h + 4 * h) / 8 + 6 * h;  // split / t + replicated
  EXPECT_NEAR(rank_parameter_count(m, plan, 5), 6 * per_layer_local, 1.0);
  // The first and last stages add a vocabulary shard (tied embedding and LM head).
  EXPECT_GT(rank_parameter_count(m, plan, 0), rank_parameter_count(m, plan, 5) + 51200.0 * h / 8 - 1);
  EXPECT_GT(rank_parameter_count(m, plan, 15), rank_parameter_count(m, plan, 5) + 51200.0 * h / 8 - 1);
}

TEST(MemoryPerRank, Fp16ModelStateIsSixteenBytesPerParameter) {
  const TransformerSpec m = model(96, 12288, 96);
  const ParallelPlan plan = plan_of(8, 16, 1, Recompute::Full);
  std::vector<int> inflight(16);
  for (int r = 0; r < 16; ++r) inflight[r] = 16 - r;
  const auto ranks = memory_per_rank(m, plan, inflight);
  ASSERT_EQ(ranks.size(), 16u);
  for (const auto& r : ranks) {
    EXPECT_DOUBLE_EQ(r.parameters, rank_parameter_count(m, plan, r.pipeline_rank));
    EXPECT_DOUBLE_EQ(r.weights_bytes + r.gradients_bytes + r.optimizer_bytes, 16 * r.parameters);
    EXPECT_DOUBLE_EQ(r.weights_bytes, 2 * r.parameters);
    EXPECT_DOUBLE_EQ(r.total_bytes, r.weights_bytes + r.gradients_bytes + r.optimizer_bytes + r.activations_bytes);
  }
  // fp32 training: 4 (weights) + 4 (gradients) + 8 (Adam moments) = 16 too.
  const auto fp32 = memory_per_rank(m, plan_of(8, 16, 1, Recompute::Full, Precision::FP32), inflight);
  EXPECT_DOUBLE_EQ(fp32[3].weights_bytes + fp32[3].gradients_bytes + fp32[3].optimizer_bytes, 16 * fp32[3].parameters);
}

TEST(MemoryPerRank, Bf16GradientsReducedInFp32AreEighteenBytesPerParameter) {
  // With bf16, Megatron-LM accumulates and all-reduces gradients in fp32 — and so does ptdp's own
  // cost model (sim/costing.hpp grad_reduce_bytes(BF16) == 4) — so model state is 2 + 4 + 12 = 18
  // bytes per parameter (ptdp-facts.md: "18 if gradients are reduced in fp32").
  const TransformerSpec m = model(96, 12288, 96);
  const ParallelPlan plan = plan_of(8, 16, 1, Recompute::Full, Precision::BF16);
  const auto ranks = memory_per_rank(m, plan, std::vector<int>(16, 1));
  const double per_param = (ranks[3].weights_bytes + ranks[3].gradients_bytes + ranks[3].optimizer_bytes) / ranks[3].parameters;
  EXPECT_DOUBLE_EQ(per_param, 18.0);
}

TEST(MemoryPerRank, ActivationsScaleWithInFlightMicrobatchesOnMiddleRanks) {
  // No recompute, a middle rank (no embedding, no logits): in-flight × layers per stage × per layer.
  const TransformerSpec m = model(96, 12288, 96);
  const ParallelPlan plan = plan_of(8, 16, 1, Recompute::None);
  std::vector<int> inflight(16);
  for (int r = 0; r < 16; ++r) inflight[r] = 16 - r;
  const auto ranks = memory_per_rank(m, plan, inflight);
  const double per_layer = layer_activation_bytes(m, plan);
  for (int r = 1; r < 15; ++r) EXPECT_NEAR(ranks[r].activations_bytes, (16 - r) * 6 * per_layer, 1.0) << "rank " << r;
  // 1F1B: the first rank keeps the most activations and is the peak among the middle ones.
  EXPECT_GT(ranks[1].activations_bytes, ranks[14].activations_bytes);
}

TEST(MemoryPerRank, FullRecomputeKeepsFarLessThanNone) {
  const TransformerSpec m = model(96, 12288, 96);
  const std::vector<int> inflight(16, 16);
  const auto none = memory_per_rank(m, plan_of(8, 16, 1, Recompute::None), inflight);
  const auto full = memory_per_rank(m, plan_of(8, 16, 1, Recompute::Full), inflight);
  const auto sel = memory_per_rank(m, plan_of(8, 16, 1, Recompute::Selective), inflight);
  EXPECT_LT(full[5].activations_bytes, sel[5].activations_bytes);
  EXPECT_LT(sel[5].activations_bytes, none[5].activations_bytes);
  EXPECT_EQ(peak_memory(none).total_bytes, std::max_element(none.begin(), none.end(), [](auto& a, auto& b) {
                                             return a.total_bytes < b.total_bytes;
                                           })->total_bytes);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(LayerActivationBytes, SequenceParallelismMatchesKorthikantiFormulas) {
  // sharding-sp-zb-facts.md: TP + SP sbh(34/t + 5as/(ht)); + selective sbh·34/t; full recompute
  // keeps the (sequence-split) layer input, 2sbh/t.
  for (int64_t t : {2, 4, 8}) {
    const TransformerSpec m = model(48, 6144, 64);
    ParallelPlan plan = plan_of(t, 1, 4, Recompute::None);
    plan.sequence_parallel = true;
    const double s = 2048, b = 4, h = 6144, a = 64, T = static_cast<double>(t);
    EXPECT_NEAR(layer_activation_bytes(m, plan), s * b * h * (34 / T + 5 * a * s / (h * T)), 1e-3) << "t " << t;
    plan.recompute = Recompute::Selective;
    EXPECT_NEAR(layer_activation_bytes(m, plan), s * b * h * 34 / T, 1e-3) << "t " << t;
    plan.recompute = Recompute::Full;
    EXPECT_NEAR(layer_activation_bytes(m, plan), 2 * s * b * h / T, 1e-3) << "t " << t;
  }
}

TEST(LayerActivationBytes, SequenceParallelSelectiveIsAboutFiveTimesLessThanTensorParallelAlone) {
  // Korthikanti et al.: SP + selective recompute cut activation memory ~5× for GPT-3 175B at t 8.
  const TransformerSpec m = model(96, 12288, 96);
  ParallelPlan tp_only = plan_of(8, 1, 1, Recompute::None);
  ParallelPlan sp_sel = tp_only;
  sp_sel.sequence_parallel = true;
  sp_sel.recompute = Recompute::Selective;
  const double ratio = layer_activation_bytes(m, tp_only) / layer_activation_bytes(m, sp_sel);
  EXPECT_GT(ratio, 4.5);
  EXPECT_LT(ratio, 6.0);
}

TEST(MemoryPerRank, EmbeddingAndOutputTermsSitOnTheFirstAndLastRank) {
  const TransformerSpec m = model(96, 12288, 96);
  ParallelPlan plan = plan_of(8, 16, 1, Recompute::Selective);
  const std::vector<int> inflight(16, 4);
  for (bool sp : {false, true}) {
    plan.sequence_parallel = sp;
    const auto ranks = memory_per_rank(m, plan, inflight);
    const double layers = 4 * 6 * layer_activation_bytes(m, plan);
    ParallelPlan none = plan;
    none.recompute = Recompute::None;
    const double recompute_peak = layer_activation_bytes(m, none) - layer_activation_bytes(m, plan);
    EXPECT_NEAR(ranks[5].activations_bytes, layers + recompute_peak, 1.0);
    // First rank: 4 in-flight embedding dropout masks of sbh bytes (÷t with SP).
    EXPECT_NEAR(ranks[0].activations_bytes - ranks[5].activations_bytes, 4 * 2048.0 * 12288 / (sp ? 8 : 1), 1.0);
    // Last rank: the final norm's input and output (4sbh, ÷t with SP) and the fp32 logits.
    EXPECT_NEAR(ranks[15].activations_bytes - ranks[5].activations_bytes,
                4 * 2048.0 * 12288 / (sp ? 8 : 1) + 8 * 2048.0 * 51200 / 8, 1.0);
  }
  // Vocabulary parallelism: every rank holds its 1/p share of the fp32 logits and their gradient;
  // the final norm stays on the last rank only.
  plan.sequence_parallel = false;
  plan.vocab_parallel_pipeline = true;
  const auto ranks = memory_per_rank(m, plan, inflight);
  const auto plain = memory_per_rank(m, plan_of(8, 16, 1, Recompute::Selective), inflight);
  const double share = 8 * 2048.0 * 51200 / 8 / 16;
  EXPECT_NEAR(ranks[5].activations_bytes - plain[5].activations_bytes, share, 1.0);
  EXPECT_NEAR(ranks[15].activations_bytes - ranks[5].activations_bytes, 4 * 2048.0 * 12288, 1.0);
}

TEST(MemoryPerRank, SequenceParallelismLowersEveryRanksActivations) {
  const TransformerSpec m = model(96, 12288, 96);
  std::vector<int> inflight(16);
  for (int r = 0; r < 16; ++r) inflight[r] = 16 - r;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    ParallelPlan plan = plan_of(8, 16, 1, rc);
    const auto without = memory_per_rank(m, plan, inflight);
    plan.sequence_parallel = true;
    const auto with = memory_per_rank(m, plan, inflight);
    for (int r = 0; r < 16; ++r) {
      EXPECT_LT(with[r].activations_bytes, without[r].activations_bytes) << to_string(rc) << " rank " << r;
      EXPECT_DOUBLE_EQ(with[r].weights_bytes, without[r].weights_bytes);  // parameters are not split further
    }
  }
}

TEST(RankParameters, ZeroBubbleVKeepsEmbeddingAndHeadOnRankZero) {
  // zb-v: rank 0 holds the first and the last stage, so it carries the embedding, the final norm
  // and (tied) the one word-embedding copy; rank p − 1 holds two middle stages only.
  TransformerSpec spec = test_models::gpt(8, 1024, 16);
  ParallelPlan plan;
  plan.pipeline = 4;
  plan.virtual_stages = 2;
  plan.schedule = ScheduleKind::ZeroBubbleV;
  plan.global_batch = 64;
  const double h = 1024, vocab = static_cast<double>(spec.padded_vocab(1)) * h;
  const double layer = layer_split_parameter_count(spec) + layer_replicated_parameter_count(spec);
  EXPECT_NEAR(rank_parameter_count(spec, plan, 3), 2 * layer, 1e-6);
  EXPECT_NEAR(rank_parameter_count(spec, plan, 0), 2 * layer + vocab + 2048 * h + norm_parameter_count(spec), 1e-6);
  plan.schedule = ScheduleKind::OneFOneB;
  plan.virtual_stages = 1;
  EXPECT_NEAR(rank_parameter_count(spec, plan, 3), 2 * layer + vocab + norm_parameter_count(spec), 1e-6);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// Llama 3 8B (scenarios/llama3-8b.yaml) under FSDP on 8 GPUs: t 1, zero_stage 3, b 2, s 8192,
// selective recompute, bf16.
using test_models::llama3_8b;
ParallelPlan fsdp_plan(Framework f) {
  ParallelPlan plan;
  plan.data = 8;
  plan.zero_stage = 3;
  plan.micro_batch = 2;
  plan.global_batch = 16;
  plan.recompute = Recompute::Selective;
  plan.precision = Precision::BF16;
  plan.framework = f;
  return plan;
}

TEST(MemoryPerRank, PytorchFsdpKeepsTheFp32ShardAsTheMasterAndNoBf16Shard) {
  // FSDP2 / FSDP1 with mixed precision: 4 (fp32 sharded parameter, the master) + 4 (fp32 sharded
  // gradient) + 8 (Adam's moments) = 16 bytes per parameter per shard, 2 less than Megatron's and
  // DeepSpeed's bf16 shard + fp32 gradient + 12 bytes of master and moments.
  const TransformerSpec m = llama3_8b();
  for (Framework f : {Framework::Torchtitan, Framework::TorchtitanCompiled, Framework::PytorchFsdp, Framework::Megatron,
                      Framework::DeepSpeed}) {
    const ParallelPlan plan = fsdp_plan(f);
    const MemoryBreakdown r = memory_per_rank(m, plan, {1})[0];
    const double n = 8, psi = r.parameters;
    const bool fsdp = f != Framework::Megatron && f != Framework::DeepSpeed;
    EXPECT_DOUBLE_EQ(r.weights_bytes + r.gradients_bytes + r.optimizer_bytes, (fsdp ? 16 : 18) * psi / n) << to_string(f);
    EXPECT_DOUBLE_EQ(r.weights_bytes, (fsdp ? 4 : 2) * psi / n) << to_string(f);
    EXPECT_DOUBLE_EQ(r.gradients_bytes, 4 * psi / n) << to_string(f);
    EXPECT_DOUBLE_EQ(r.optimizer_bytes, (fsdp ? 8 : 12) * psi / n) << to_string(f);
  }
  // Below stage 3 the parameters are not sharded: the framework changes nothing.
  for (int64_t zero : {0, 1, 2}) {
    ParallelPlan titan = fsdp_plan(Framework::Torchtitan), megatron = fsdp_plan(Framework::Megatron);
    titan.zero_stage = megatron.zero_stage = zero;
    MemoryBreakdown a, b;
    add_model_states(titan, 1e9, a);
    add_model_states(megatron, 1e9, b);
    EXPECT_DOUBLE_EQ(a.weights_bytes + a.gradients_bytes + a.optimizer_bytes, b.weights_bytes + b.gradients_bytes + b.optimizer_bytes);
  }
}

TEST(MemoryPerRank, EagerLossPeaksAtTwelveBytesPerLogitApartFromTheLayersBackward) {
  // torchtitan's cross_entropy(pred.float(), labels): 12 bytes per logit element alive at the
  // loss's backward (log-softmax output, incoming and outgoing fp32 gradients), none held into
  // the layers' backward; Megatron's fused loss holds 8 through the microbatch's backward.
  const TransformerSpec m = llama3_8b();
  const double logits = 2.0 * 8192 * 128256;
  for (Recompute rc : {Recompute::None, Recompute::Selective}) {
    for (Framework f : {Framework::Torchtitan, Framework::Megatron}) {
      ParallelPlan plan = fsdp_plan(f);
      plan.recompute = rc;
      ParallelPlan none = plan;
      none.recompute = Recompute::None;
      const double held = 32 * layer_activation_bytes(m, plan) + embedding_activation_bytes(m, plan);
      const double norm = 2 * (2.0 * 8192 * 4096) * 2;  // the final norm's input and output, bf16
      const double recompute = layer_activation_bytes(m, none) - layer_activation_bytes(m, plan);
      const double act = memory_per_rank(m, plan, {1})[0].activations_bytes;
      if (f == Framework::Megatron) {
        EXPECT_NEAR(head_loss_transient_bytes(m, plan), 0, 1.0);
        EXPECT_NEAR(act, held + norm + 8 * logits + recompute, 1.0);
      } else {
        EXPECT_NEAR(head_loss_transient_bytes(m, plan), 12 * logits, 1.0);
        EXPECT_NEAR(act, held + norm + std::max(recompute, 12 * logits), 1.0);
      }
    }
  }
  // Without recomputation the eager loss's peak is 4 bytes per logit element above Megatron's.
  ParallelPlan titan = fsdp_plan(Framework::Torchtitan), megatron = fsdp_plan(Framework::Megatron);
  titan.recompute = megatron.recompute = Recompute::None;
  EXPECT_NEAR(head_activation_bytes(m, titan) + head_loss_transient_bytes(m, titan) -
                  (head_activation_bytes(m, megatron) + head_loss_transient_bytes(m, megatron)),
              4 * logits, 1.0);
}

TEST(MemoryPerRank, TheHeadsTwoFiguresKeptUnderAMemoAreTheUnkeptOnesWhicheverIsAskedFirst) {
  // Under an ActivationBytesMemo one build of the head's ops fills both its figures (the
  // sweep's memory checks read both): each key must hold its own figure, the eager loss's
  // transient (12 bytes per logit element) apart from what the head keeps.
  const TransformerSpec m = llama3_8b();
  const ParallelPlan plan = fsdp_plan(Framework::Torchtitan);
  const double saved = head_activation_bytes(m, plan), transient = head_loss_transient_bytes(m, plan);
  ASSERT_GT(transient, 0);
  ASSERT_NE(saved, transient);
  for (bool transient_first : {false, true}) {
    ActivationBytesMemo memo;
    const ActivationBytesScope scope(&memo);
    if (transient_first) {
      EXPECT_DOUBLE_EQ(head_loss_transient_bytes(m, plan), transient);
    }
    EXPECT_DOUBLE_EQ(head_activation_bytes(m, plan), saved);
    EXPECT_DOUBLE_EQ(head_loss_transient_bytes(m, plan), transient);
    EXPECT_DOUBLE_EQ(head_activation_bytes(m, plan), saved);
  }
}

}  // namespace
}  // namespace ptdp
