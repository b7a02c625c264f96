// `ptdp train` with sharded data parallelism, as users run it: scenario keys through --set, the
// text report's sharding and memory lines, and memory_measured_bytes in --json.
#include <nlohmann/json.hpp>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
using nlohmann::json;

const std::string kRoot = PTDP_SOURCE_DIR;

TEST_F(Cli, TrainWithZeroStagesReportsTheMeasuredDeviceMemory) {
  auto train = [&](const std::string& name, const std::string& sets) {
    const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                            " --oversubscribe --bind-to none -np 4 " + quoted(PTDP_BINARY) + " train " +
                            quoted(kRoot + "/scenarios/tiny-gpt-cpu.yaml") +
                            " --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.data=4 " + sets +
                            " --steps 2 --json " + quoted(file(name + ".json")) + " >" + quoted(file(name + ".out")) +
                            " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(file(name + ".out"));
    return json::parse(slurp(file(name + ".json")));
  };
  const json z0 = train("z0", "");
  const json z3 = train("z3", "--set parallel.fsdp=full_shard");
  const json hybrid = train("hybrid", "--set parallel.fsdp=hybrid_shard --set cluster.topology.node.gpus=2");
  ASSERT_TRUE(z0["memory_measured_bytes"].is_number()) << z0.dump();
  // tiny-gpt-cpu on 4 data-parallel ranks: 23.6 MB unsharded, 16.1 MB under stage 3, 19.4 MB
  // sharded over nodes of 2 (docs/ACCURACY.md).
  EXPECT_LT(z3["memory_measured_bytes"].get<double>(), 0.75 * z0["memory_measured_bytes"].get<double>());
  EXPECT_LT(hybrid["memory_measured_bytes"].get<double>(), z0["memory_measured_bytes"].get<double>());
  EXPECT_GT(hybrid["memory_measured_bytes"].get<double>(), z3["memory_measured_bytes"].get<double>());
  EXPECT_EQ(z3["losses"].size(), 2u);
  EXPECT_NEAR(z3["losses"][1].get<double>(), z0["losses"][1].get<double>(), 1e-4 * z0["losses"][1].get<double>());
  EXPECT_NE(slurp(file("hybrid.out")).find("sharding           zero stage 3 over 2 data-parallel ranks (node group)"),
            std::string::npos)
      << slurp(file("hybrid.out"));
  const json off = train("off", "--set parallel.zero_stage=2 --set parallel.offload=optimizer");
  EXPECT_GT(off["host_memory_measured_bytes"].get<double>(), 0) << off.dump();
  EXPECT_EQ(z3["host_memory_measured_bytes"].get<double>(), 0);
}

// Recompute modules the executor does not re-run separately are said, not hidden: the training
// is the same (the loss equals the default's), the note names the modules.
TEST_F(Cli, TrainSaysWhichRecomputeModulesOnlyTheSimulatorPrices) {
  auto train = [&](const std::string& name, const std::string& sets) {
    const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                            " --oversubscribe --bind-to none -np 1 " + quoted(PTDP_BINARY) + " train " +
                            quoted(kRoot + "/scenarios/tiny-gpt-cpu.yaml") +
                            " --set cluster.gpus=1 --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.recompute=selective " +
                            sets + " --steps 2 --json " + quoted(file(name + ".json")) + " >" + quoted(file(name + ".out")) + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(file(name + ".out"));
    return json::parse(slurp(file(name + ".json")));
  };
  const json core = train("core", "");
  const json mlp = train("mlp", "--set 'parallel.recompute_modules=[core_attn, mlp]'");
  EXPECT_EQ(slurp(file("core.out")).find("recompute_modules"), std::string::npos) << slurp(file("core.out"));
  EXPECT_NE(slurp(file("mlp.out")).find("parallel.recompute_modules [core_attn mlp] is priced by the simulator"), std::string::npos)
      << slurp(file("mlp.out"));
  EXPECT_EQ(mlp["losses"], core["losses"]);
}

}  // namespace
