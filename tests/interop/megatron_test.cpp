// Megatron-LM launch lines out (export_megatron): only arguments current Megatron-LM accepts, and
// every one of them read back by the importer.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "interop/interop.hpp"
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

}  // namespace
}  // namespace ptdp
