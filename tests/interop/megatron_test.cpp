// Megatron-LM launch lines out (export_megatron): only arguments current Megatron-LM accepts, and
// every one of them read back by the importer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "interop/interop.hpp"
#include "model/memory.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

std::vector<std::string> flags_of(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream words(line);
  for (std::string w; words >> w;)
    if (w.rfind("--", 0) == 0) out.push_back(w.substr(2));
  return out;
}

TEST(ExportMegatron, EveryPresetWritesNoRemovedFlagAndImportsBackWithNothingUnknown) {
  int exported = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(std::string(PTDP_SOURCE_DIR) + "/scenarios")) {
    if (entry.path().extension() != ".yaml") continue;
    for (const std::vector<Override>& sets :
         {std::vector<Override>{}, std::vector<Override>{{"parallel.overlap_p2p", "true"}}, std::vector<Override>{{"parallel.overlap_p2p", "false"}}}) {
      std::optional<Scenario> loaded;
      try {
        loaded.emplace(load_scenario(entry.path().string(), sets));
      } catch (const ConfigError&) {
        continue;  // a variant the preset does not allow
      }
      const Scenario& sc = *loaded;
      const std::string line = export_megatron(sc);
      for (const auto& flag : flags_of(line))
        for (const auto& removed : removed_megatron_flags())
          EXPECT_NE(flag, removed.flag) << entry.path() << ": current Megatron-LM refuses --" << flag << "\n" << line;
      const std::vector<std::string> args = shell_words(line, "export.sh");  // a script with FILL IN arrays
      ImportOptions options;
      options.gpus = sc.gpus;
      options.topology = sc.topology_ref;
      const ImportResult back = import_megatron(args, entry.path().string(), options);
      EXPECT_TRUE(back.unknown.empty()) << entry.path() << ": " << back.unknown.front();
      // The interleaved schedule's p2p overlap survives the round trip (Megatron's default is on).
      const Scenario again = load_scenario_text(back.yaml, "back");
      EXPECT_EQ(again.plan.overlap_p2p, sc.plan.overlap_p2p && sc.plan.schedule == ScheduleKind::Interleaved) << entry.path() << "\n" << line;
      // Multi-head latent attention and multi-token prediction (DeepSeek-V3's preset) come back whole.
      EXPECT_EQ(again.model.mtp_layers, sc.model.mtp_layers) << entry.path();
      EXPECT_EQ(again.model.has_mla(), sc.model.has_mla()) << entry.path();
      if (sc.model.has_mla()) {
        EXPECT_EQ(again.model.mla.q_lora_rank, sc.model.mla.q_lora_rank);
        EXPECT_EQ(again.model.mla.kv_lora_rank, sc.model.mla.kv_lora_rank);
        EXPECT_EQ(again.model.qk_dim(), sc.model.qk_dim());
        EXPECT_EQ(again.model.v_dim(), sc.model.v_dim());
      }
      ++exported;
    }
  }
  EXPECT_GE(exported, 20);
}

TEST(ImportMegatron, RemovedSpellingsAreReadAndSaidToBeOld) {
  const ImportResult r = import_megatron({"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
                                          "--checkpoint-activations", "--activations-checkpoint-method", "uniform"},
                                         "old.sh", ImportOptions{});
  const Scenario sc = load_scenario_text(r.yaml, "old");
  EXPECT_EQ(sc.plan.recompute, Recompute::Full);
  bool said = false;
  for (const auto& n : r.notes) said = said || n.find("--checkpoint-activations: an older spelling") != std::string::npos;
  EXPECT_TRUE(said);
  // The 2021 spelling means full recomputation of every layer (what the SC'21 runs did), not partial.
  bool meant = false;
  for (const auto& n : r.notes) meant = meant || n.find("--activations-checkpoint-method uniform (2021 spelling): full recomputation") != std::string::npos;
  EXPECT_TRUE(meant);
  EXPECT_TRUE(r.unsupported.empty()) << r.unsupported.front();
  const ImportResult alone = import_megatron({"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length",
                                              "128", "--activations-checkpoint-method", "uniform"},
                                             "sc21.sh", ImportOptions{});
  EXPECT_EQ(load_scenario_text(alone.yaml, "sc21").plan.recompute, Recompute::Full);
}

TEST(ImportMegatron, VocabularyPaddingAndMegatronDeepSpeedsPartitionMethod) {
  auto import = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
                                     "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--tokenizer-type",
                                     "NullTokenizer", "--vocab-size", "50000"};
    args.insert(args.end(), extra.begin(), extra.end());
    ImportResult r = import_megatron(args, "launch.sh", ImportOptions{});
    return std::make_pair(r, load_scenario_text(r.yaml, "imported"));
  };
  // Megatron pads to a multiple of 128 × t by default; --make-vocab-size-divisible-by changes N,
  // Megatron-DeepSpeed's --pad-vocab-size-to gives the size.
  EXPECT_EQ(import({}).second.model.padded_vocab(2), 50176);
  const Scenario coarse = import({"--make-vocab-size-divisible-by", "1024"}).second;
  EXPECT_EQ(coarse.model.padded_vocab(2), 51200);
  // The padding is weights and logits too: the first stage's embedding shard grows.
  const Scenario fine = import({}).second;
  EXPECT_NEAR(rank_parameter_count(coarse.model, coarse.plan, 0) - rank_parameter_count(fine.model, fine.plan, 0), (51200 - 50176) * 256 / 2, 1);
  EXPECT_EQ(import({"--pad-vocab-size-to", "65536"}).second.model.padded_vocab(2), 65536);
  try {
    import({"--pad-vocab-size-to", "1000"});
    ADD_FAILURE() << "a padded vocabulary below the vocabulary accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "--pad-vocab-size-to") << e.what();
  }
  // --pp-partition-method: parameters (Megatron-DeepSpeed's default) balances, uniform does not.
  EXPECT_EQ(import({"--pp-partition-method", "parameters"}).second.plan.partition, Partition::Balanced);
  EXPECT_EQ(import({"--pp-partition-method", "type:transformer"}).second.plan.partition, Partition::Uniform);
  const ImportResult odd = import({"--pp-partition-method", "regex:attn"}).first;
  bool listed = false;
  for (const auto& u : odd.unsupported) listed = listed || u.find("--pp-partition-method regex:attn: not modelled") != std::string::npos;
  EXPECT_TRUE(listed);
}


// --mtp-loss-scaling-factor: the MTP losses' weight, model.mtp_loss_scale (Megatron's default 0.1);
// a value out of range names the key.
TEST(ImportMegatron, MtpLossScalingFactorBecomesTheMtpLossScale) {
  auto with = [](const std::string& scale) {
    const std::vector<std::string> args = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
                                           "128", "--vocab-size", "1000", "--tokenizer-type", "NullTokenizer", "--mtp-num-layers", "1",
                                           "--micro-batch-size", "1", "--global-batch-size", "8", "--mtp-loss-scaling-factor", scale};
    return load_scenario_text(import_megatron(args, "launch.sh", ImportOptions{}).yaml, "imported");
  };
  EXPECT_DOUBLE_EQ(with("0.3").model.mtp_loss_scale, 0.3);
  try {
    with("-1");
    ADD_FAILURE() << "a negative scale was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.mtp_loss_scale"), std::string::npos) << e.what();
  }
}

// --pipeline-model-parallel-layout (Megatron-Core): read into parallel.pipeline_layout, its stage
// count over the pipeline size giving the virtual stages; written back by the exporter; a bad
// layout names the flag and the position in the string.
TEST(ImportMegatron, PipelineLayoutIsReadWrittenAndCheckedWhereItIsWrong) {
  const std::vector<std::string> base = {"--num-layers", "6", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
                                         "--vocab-size", "1000", "--tokenizer-type", "NullTokenizer", "--mtp-num-layers", "1",
                                         "--pipeline-model-parallel-size", "4", "--micro-batch-size", "1", "--global-batch-size", "8"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return import_megatron(args, "launch.sh", ImportOptions{});
  };
  const ImportResult r = with({"--pipeline-model-parallel-layout", "Et|(t|)*5,m|L"});
  const Scenario sc = load_scenario_text(r.yaml, "imported");
  EXPECT_EQ(sc.plan.virtual_stages, 2);
  EXPECT_EQ(sc.plan.schedule, ScheduleKind::Interleaved);
  EXPECT_EQ(sc.plan.layout_layers, (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(sc.plan.layout_mtp, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 0}));
  EXPECT_EQ(sc.plan.mtp_stage(), 6);
  const std::string line = export_megatron(sc);
  EXPECT_NE(line.find("--pipeline-model-parallel-layout \"Et|(t|)*5m|L\""), std::string::npos) << line;
  EXPECT_EQ(line.find("--num-layers-per-virtual-pipeline-stage"), std::string::npos) << line;
  const Scenario again = load_scenario_text(import_megatron(shell_words(line, "export.sh"), "export.sh", ImportOptions{}).yaml, "again");
  EXPECT_EQ(again.plan.layout_layers, sc.plan.layout_layers);
  EXPECT_EQ(again.plan.layout_mtp, sc.plan.layout_mtp);
  EXPECT_EQ(again.plan.virtual_stages, 2);
  auto refusal = [&](std::vector<std::string> extra) {
    try {
      with(extra);
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key_path(), "--pipeline-model-parallel-layout") << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  EXPECT_NE(refusal({"--pipeline-model-parallel-layout", "Et|t|t|tq|t|t|m|L"}).find("position 9 of \"Et|t|t|tq|t|t|m|L\": 'q' is not a layout symbol"),
            std::string::npos);
  EXPECT_NE(refusal({"--pipeline-model-parallel-layout", "Et|t|t|t|t|tmL"}).find("has 6 stages, not a multiple of --pipeline-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(refusal({"--pipeline-model-parallel-layout", "Et|t|t|t|t|t|m|L", "--num-virtual-stages-per-pipeline-rank", "4"})
                .find("2 per pipeline rank, but --num-virtual-stages-per-pipeline-rank is 4"),
            std::string::npos);
  // Against the model: seven decoder layers for six, refused by the import's check of the plan (naming the key).
  try {
    with({"--pipeline-model-parallel-layout", "Et|t|t|t|t|t|tm|L"});
    ADD_FAILURE() << "seven layers for six accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "parallel.pipeline_layout") << e.what();
    EXPECT_NE(std::string(e.what()).find("places 7 decoder layers (t) but num_layers is 6"), std::string::npos) << e.what();
  }
}

TEST(ImportMegatron, RecomputeMethodUniformIsFullRecomputeAndBlockIsPartial) {
  const std::vector<std::string> base = {"--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
                                         "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--global-batch-size", "8",
                                         "--recompute-granularity", "full"};
  ImportOptions options;
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return import_megatron(args, "t", options);
  };
  // Every layer recomputed, one checkpoint per layer: exactly ptdp's full recompute.
  ImportResult r = with({"--recompute-method", "uniform", "--recompute-num-layers", "1"});
  EXPECT_TRUE(r.unsupported.empty()) << r.unsupported.front();
  EXPECT_NE(r.yaml.find("recompute: full"), std::string::npos) << r.yaml;
  // Block over 4 of the 12 layers per stage: partial, listed as not modelled (and in not_modelled).
  r = with({"--recompute-method", "block", "--recompute-num-layers", "4"});
  ASSERT_EQ(r.unsupported.size(), 1u);
  EXPECT_NE(r.unsupported[0].find("partial recomputation (4 of about 12"), std::string::npos) << r.unsupported[0];
  EXPECT_NE(r.yaml.find("not_modelled:"), std::string::npos) << r.yaml;
  // Block over all 12: every layer.
  EXPECT_TRUE(with({"--recompute-method", "block", "--recompute-num-layers", "12"}).unsupported.empty());
  EXPECT_THROW(with({"--recompute-method", "chunked"}), ConfigError);
}

TEST(ImportMegatron, TheFlashBackendRunsFlashAttention2AndTheDefaultCudnn) {
  const std::vector<std::string> base = {"--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
                                         "--micro-batch-size", "1", "--global-batch-size", "8"};
  ImportOptions options;
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return import_megatron(args, "t", options).yaml;
  };
  EXPECT_NE(with({"--attention-backend", "flash"}).find("attention_kernel: flash2"), std::string::npos);
  EXPECT_NE(with({"--use-flash-attn"}).find("attention_kernel: flash2"), std::string::npos);
  // fused / auto / nothing: Transformer Engine's default, cuDNN (the framework's auto).
  for (const char* b : {"fused", "auto"}) EXPECT_EQ(with({"--attention-backend", b}).find("attention_kernel"), std::string::npos) << b;
  EXPECT_EQ(with({}).find("attention_kernel"), std::string::npos);
}

TEST(ExportDeepSpeed, ZeroPlansWriteAConfigAndALaunchScriptThatImportBack) {
  const std::string yaml =
      "model: {name: m, num_layers: 24, hidden_size: 2048, num_attention_heads: 16, seq_length: 2048, vocab_size: 51200}\n"
      "cluster: {topology: dgx-a100, gpus: 64}\n"
      "parallel: {tensor: 2, pipeline: 1, zero_stage: 3, sharding_group: node, overlap_grad_reduce: true, offload: optimizer}\n"
      "training: {global_batch: 256, micro_batch: 2, precision: bf16}\n";
  const std::string path = ::testing::TempDir() + "/z3.yaml";
  {
    std::ofstream(path) << yaml;
  }
  const Scenario sc = load_scenario(path);
  std::vector<std::string> caveats;
  const std::string script = export_deepspeed(sc, &caveats);
  EXPECT_NE(script.find("deepspeed --num_nodes 8 --num_gpus 8 pretrain_gpt.py"), std::string::npos) << script;
  EXPECT_EQ(script.find("use-distributed-optimizer"), std::string::npos) << script;
  // The config the script writes is the one deepspeed_config_json gives, and imports back.
  const std::string config = deepspeed_config_json(sc);
  EXPECT_NE(script.find("<<'EOF'\n" + config + "EOF\n"), std::string::npos) << script;
  ImportOptions options;
  options.base_scenario = path;
  const Scenario from_json = load_scenario_text(import_deepspeed(config, "ds_config.json", options).yaml, "back");
  EXPECT_EQ(from_json.plan.zero_stage, 3);
  EXPECT_EQ(from_json.plan.sharding_group, ShardingGroup::Node);  // MiCS over a node's 4 data-parallel ranks
  EXPECT_EQ(from_json.plan.offload, Offload::Optimizer);
  EXPECT_EQ(from_json.plan.global_batch, 256);
  EXPECT_EQ(from_json.plan.micro_batch, 2);
  EXPECT_EQ(from_json.plan.precision, Precision::BF16);
  // The launch script imports back as the same layout, with ZeRO from --zero-stage.
  options = ImportOptions{};
  const ImportResult back = import_megatron(shell_words(script, "ds.sh"), "ds.sh", options);
  EXPECT_TRUE(back.unknown.empty()) << back.unknown.front();
  const Scenario from_script = load_scenario_text(back.yaml, "back");
  EXPECT_EQ(from_script.gpus, 64);
  EXPECT_EQ(from_script.plan.tensor, 2);
  EXPECT_EQ(from_script.plan.zero_stage, 3);
  EXPECT_EQ(from_script.model.num_layers, 24);
}

TEST(ImportDeepSpeed, Bf16WithoutZeroIsTheBf16OptimizersShardedState) {
  // DeepSpeed trains bf16 at stage 0 with its BF16 optimizer, which partitions the fp32 state.
  ImportOptions options;
  ImportResult r = import_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 0}})", "ds.json", options);
  EXPECT_EQ(load_scenario_text(r.yaml, "r").plan.zero_stage, 1) << r.yaml;
  r = import_deepspeed(R"({"fp16": {"enabled": true}})", "ds.json", options);
  EXPECT_EQ(load_scenario_text(r.yaml, "r").plan.zero_stage, 0) << r.yaml;
}

}  // namespace
}  // namespace ptdp
