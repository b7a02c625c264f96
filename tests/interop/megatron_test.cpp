// Megatron-LM launch lines out (export_megatron): only arguments current Megatron-LM accepts, and
// every one of them read back by the importer.
#include <gtest/gtest.h>

#include <filesystem>
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
      std::vector<std::string> args;
      std::istringstream words(line);
      for (std::string w; words >> w;)
        if (w != "\\") args.push_back(w);
      ImportOptions options;
      options.gpus = sc.gpus;
      options.topology = sc.topology_ref;
      const ImportResult back = import_megatron(args, entry.path().string(), options);
      EXPECT_TRUE(back.unknown.empty()) << entry.path() << ": " << back.unknown.front();
      // The interleaved schedule's p2p overlap survives the round trip (Megatron's default is on).
      const Scenario again = load_scenario_text(back.yaml, "back");
      EXPECT_EQ(again.plan.overlap_p2p, sc.plan.overlap_p2p && sc.plan.schedule == ScheduleKind::Interleaved) << entry.path() << "\n" << line;
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
  bool listed = false;
  for (const auto& u : r.unsupported) listed = listed || u.find("--activations-checkpoint-method uniform") != std::string::npos;
  EXPECT_TRUE(listed);
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

}  // namespace
}  // namespace ptdp
