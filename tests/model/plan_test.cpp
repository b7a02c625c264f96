// validate_plan: the Megatron-LM rules users meet, each reported under the scenario key to fix.
#include "model/plan.hpp"

#include <gtest/gtest.h>

#include "models.hpp"

#include <chrono>
#include <string>

#include "core/error.hpp"
#include "model/transformer.hpp"

namespace ptdp {
namespace {

using test_models::gpt3;

ParallelPlan plan(int64_t t, int64_t p, int64_t d, int64_t B, int64_t b = 1) {
  ParallelPlan pl;
  pl.tensor = t;
  pl.pipeline = p;
  pl.data = d;
  pl.global_batch = B;
  pl.micro_batch = b;
  return pl;
}

// Runs validate_plan and returns the ConfigError it throws ("" key and message when it passes).
ConfigError rejection(const TransformerSpec& m, const ParallelPlan& p, int64_t gpus) {
  try {
    validate_plan(m, p, gpus);
  } catch (const ConfigError& e) {
    return e;
  }
  return ConfigError("", "");
}

TEST(ValidatePlan, AcceptsThePaperConfigurations) {
  EXPECT_NO_THROW(validate_plan(gpt3(), plan(8, 16, 8, 1536), 1024));
  ParallelPlan inter = plan(8, 16, 8, 1536);
  inter.schedule = ScheduleKind::Interleaved;
  inter.virtual_stages = 2;
  EXPECT_NO_THROW(validate_plan(gpt3(), inter, 1024));
}

TEST(ValidatePlan, HeadsMustBeDivisibleByTensor) {
  TransformerSpec m = gpt3();
  m.num_layers = 24;
  m.hidden_size = 2304;
  m.num_attention_heads = 24;
  const ConfigError e = rejection(m, plan(5, 1, 8, 512), 40);
  EXPECT_EQ(e.key_path(), "parallel.tensor");
  EXPECT_EQ(e.message(), "5 does not divide num_attention_heads (24)");
}

TEST(ValidatePlan, LayersMustBeDivisibleByPipeline) {
  const ConfigError e = rejection(gpt3(), plan(8, 5, 1, 1536), 40);
  EXPECT_EQ(e.key_path(), "parallel.pipeline");
  EXPECT_NE(e.message().find("does not divide num_layers (96)"), std::string::npos) << e.what();
}

TEST(ValidatePlan, GlobalBatchMustBeDivisibleByMicroBatchTimesData) {
  const ConfigError e = rejection(gpt3(), plan(8, 16, 8, 1540, 1), 1024);
  EXPECT_EQ(e.key_path(), "training.global_batch");
  EXPECT_NE(e.message().find("(got 1540)"), std::string::npos) << e.what();
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1536, 2), 1024).key_path(), "");  // 1536 / (2·8) = 96
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1536, 5), 1024).key_path(), "training.global_batch");
}

TEST(ValidatePlan, GpusMustEqualTensorTimesPipelineTimesData) {
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 4, 1536), 1024).key_path(), "parallel.data");
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1536), 1000).key_path(), "parallel.tensor");  // 128 ∤ 1000
}

TEST(ValidatePlan, HiddenMustBeDivisibleByHeads) {
  TransformerSpec m = gpt3();
  m.hidden_size = 12290;
  EXPECT_EQ(rejection(m, plan(8, 16, 8, 1536), 1024).key_path(), "model.hidden_size");
}

TEST(ValidatePlan, InterleavingRules) {
  auto interleaved = [](int64_t p, int64_t v, int64_t d, int64_t B) {
    ParallelPlan pl = plan(8, p, d, B);
    pl.schedule = ScheduleKind::Interleaved;
    pl.virtual_stages = v;
    return pl;
  };
  // p = 2 only with overlapped p2p.
  ConfigError e = rejection(gpt3(), interleaved(2, 2, 64, 1536), 1024);
  EXPECT_EQ(e.key_path(), "parallel.pipeline");
  ParallelPlan overlapped = interleaved(2, 2, 64, 1536);
  overlapped.overlap_p2p = true;
  EXPECT_NO_THROW(validate_plan(gpt3(), overlapped, 1024));
  // l divisible by p·v: 96 layers, p 16, v 4 → 64 ∤ 96.
  e = rejection(gpt3(), interleaved(16, 4, 8, 1536), 1024);
  EXPECT_EQ(e.key_path(), "parallel.virtual_stages");
  EXPECT_NE(e.message().find("must divide num_layers (96)"), std::string::npos) << e.what();
  // Fewer microbatches than pipeline stages cannot fill the group.
  EXPECT_NE(rejection(gpt3(), interleaved(16, 2, 8, 64), 1024).key_path(), "");  // m = 8 < p = 16
  // m mod G must be 0 or at least p: m = 24, G = p = 16 → 8 < 16.
  EXPECT_EQ(rejection(gpt3(), interleaved(16, 2, 8, 192), 1024).key_path(), "training.global_batch");
  // Interleaving needs v ≥ 2; v > 1 needs the interleaved schedule.
  EXPECT_EQ(rejection(gpt3(), interleaved(16, 1, 8, 1536), 1024).key_path(), "parallel.virtual_stages");
  ParallelPlan virtual_1f1b = plan(8, 16, 8, 1536);
  virtual_1f1b.virtual_stages = 2;
  EXPECT_EQ(rejection(gpt3(), virtual_1f1b, 1024).key_path(), "parallel.virtual_stages");
}

TEST(ValidatePlan, NegativeAndZeroSizesAreRejectedWithTheirKey) {
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1536, -1), 1024).key_path(), "training.micro_batch");
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 0), 1024).key_path(), "training.global_batch");
  EXPECT_EQ(rejection(gpt3(), plan(-8, 16, 8, 1536), 1024).key_path(), "parallel.tensor");
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1536), -1024).key_path(), "cluster.gpus");
  TransformerSpec m = gpt3();
  m.seq_length = -2048;
  EXPECT_EQ(rejection(m, plan(8, 16, 8, 1536), 1024).key_path(), "model.seq_length");
  const ConfigError e = rejection(gpt3(), plan(8, 16, 8, 1536, -1), 1024);
  EXPECT_NE(e.message().find("(got -1)"), std::string::npos) << e.what();
}

TEST(ValidatePlan, AbsurdSizesAreRejectedQuickly) {
  const auto start = std::chrono::steady_clock::now();
  // 10^12 sequences per batch.
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 8, 1'000'000'000'000), 1024).key_path(), "training.global_batch");
  // 10^9 microbatches per pipeline (B = 10^9, b = 1, d = 1).
  EXPECT_EQ(rejection(gpt3(), plan(8, 12, 1, 1'000'000'000), 96).key_path(), "training.global_batch");
  // 10^9 GPUs.
  EXPECT_EQ(rejection(gpt3(), plan(8, 16, 7'812'500, 1'000'000'000), 1'000'000'000).key_path(), "cluster.gpus");
  // 10^12 layers, hidden sizes.
  TransformerSpec m = gpt3();
  m.num_layers = 1'000'000'000'000;
  EXPECT_EQ(rejection(m, plan(8, 16, 8, 1536), 1024).key_path(), "model.num_layers");
  m = gpt3();
  m.hidden_size = 96'000'000'000;
  EXPECT_EQ(rejection(m, plan(8, 16, 8, 1536), 1024).key_path(), "model.hidden_size");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);  // guards against a hang, not a benchmark
}

TEST(ValidatePlan, ScheduleSizesThatCannotBeSimulatedInMemoryAreRejected) {
  // 10^6 microbatches over 128 pipeline stages: 1.28e8 (stage, microbatch) cells, i.e. ~5e8 lowered
  // actions. Measured: m 10^6 × p 8 already needs 4.9 GB RSS and 19 s in `ptdp simulate`, so this
  // plan would need ~40 GB — the issue asks for a clear error, never an out-of-memory.
  TransformerSpec m = gpt3();
  m.num_layers = 128;
  const ConfigError e = rejection(m, plan(1, 128, 1, 1'000'000), 128);
  EXPECT_EQ(e.key_path(), "training.global_batch");
}

TEST(ParseEnums, NameTheChoicesAndSuggest) {
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::Interleaved);
  EXPECT_EQ(parse_recompute("selective"), Recompute::Selective);
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  try {
    parse_schedule_kind("interleave");
    FAIL() << "accepted 'interleave'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'interleaved'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_recompute("partial"), ConfigError);
  EXPECT_THROW(parse_precision("fp4"), ConfigError);
  EXPECT_EQ(parse_precision("fp8"), Precision::FP8);
}

TEST(ParallelPlan, MicrobatchesPerPipelineIsBOverBTimesD) {
  const ParallelPlan pl = plan(8, 16, 8, 1536, 2);
  EXPECT_EQ(pl.num_microbatches(), 96);
  EXPECT_EQ(pl.gpus(), 1024);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(ValidatePlan, SequenceParallelismNeedsTensorParallelismAndADivisibleSequence) {
  ParallelPlan sp = plan(8, 16, 8, 1536);
  sp.sequence_parallel = true;
  EXPECT_NO_THROW(validate_plan(test_models::gpt3(), sp, 1024));
  ParallelPlan one = plan(1, 16, 64, 1536);
  one.sequence_parallel = true;
  const ConfigError e = rejection(test_models::gpt3(), one, 1024);
  EXPECT_EQ(e.key_path(), "parallel.sequence_parallel");
  EXPECT_EQ(e.message(), "needs parallel.tensor > 1: the sequence is split over the tensor-parallel ranks (got tensor 1)");
  TransformerSpec odd = test_models::gpt3();
  odd.seq_length = 2044;  // divisible by 4, not by 8
  const ConfigError f = rejection(odd, sp, 1024);
  EXPECT_EQ(f.key_path(), "parallel.sequence_parallel");
  EXPECT_EQ(f.message(), "model.seq_length (2044) must be divisible by parallel.tensor (8)");
  sp.tensor = 4;
  sp.data = 16;
  EXPECT_NO_THROW(validate_plan(odd, sp, 1024));
}

}  // namespace
}  // namespace ptdp
