// `ptdp validate` as a new user runs it: it calibrates this machine once and caches the profile,
// refuses plans this machine cannot run, and never leaves mpirun or ranks behind when it is
// interrupted or times out.
#include <csignal>
#include <thread>
#include <tuple>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;

const std::string kRoot = PTDP_SOURCE_DIR;
const std::string kTiny = kRoot + "/scenarios/tiny-gpt-cpu.yaml";

// Processes whose command line mentions `marker` (e.g. a test's unique folder), from /proc.
int processes_mentioning(const std::string& marker) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = slurp((e.path() / "cmdline").string());
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (contains(cmdline, marker) && std::stoi(name) != ::getpid()) ++n;
  }
  return n;
}

TEST_F(Cli, ValidateWithoutAProfileCalibratesOnceAndSaysWhere) {
  ::setenv("PTDP_CACHE_DIR", file("cache").c_str(), 1);  // a fresh cache for this test
  const std::vector<std::string> args = {"validate", kTiny, "--set", "cluster.gpus=2", "--set", "parallel.tensor=1",
                                         "--set", "parallel.pipeline=2", "--steps", "3", "--out-dir", file("v")};
  const auto first = ptdp(args);
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_TRUE(contains(first.err, "calibrating this machine once for 2-rank runs (mpirun -np 2 ")) << first.err;
  EXPECT_TRUE(contains(first.err, file("cache"))) << first.err;
  auto profiles = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(file("cache"))) n += e.path().extension() == ".yaml";
    return n;
  };
  EXPECT_EQ(profiles(), 1u);
  const auto second = ptdp(args);
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_TRUE(contains(second.err, "using this machine's calibrated profile")) << second.err;
  EXPECT_FALSE(contains(second.err, "calibrating")) << second.err;
  // A run of another rank count is priced with kernels timed at that many ranks at once: a
  // profile of its own.
  const auto one = ptdp({"validate", kTiny, "--set", "cluster.gpus=1", "--set", "parallel.tensor=1", "--set", "parallel.pipeline=1",
                         "--steps", "3", "--out-dir", file("v1")});
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_TRUE(contains(one.err, "calibrating this machine once for 1-rank runs (mpirun -np 1 ")) << one.err;
  EXPECT_EQ(profiles(), 2u);
  ::unsetenv("PTDP_CACHE_DIR");
}

TEST_F(Cli, ValidateRefusesAPlanWithMoreRanksThanTheMachineCanRun) {
  // GPT-3 175B on 1024 GPUs would be mpirun -np 1024 on this machine.
  const auto r = ptdp({"validate", kRoot + "/scenarios/gpt3-175b.yaml", "--profile", kRoot + "/profiles/dev-machine.yaml"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "cluster.gpus")) << r.err;
  EXPECT_TRUE(contains(r.err, "1024 ranks")) << r.err;
  EXPECT_TRUE(contains(r.err, "--force")) << r.err;
}

TEST_F(Cli, ValidateRefusesAnOverlapTheExecutorDoesNotRunBeforeStartingIt) {
  // The prediction credits these overlaps; the executor does not perform them, so comparing the
  // two would compare an overlap that did not happen: exit 2 naming the key, nothing launched.
  // (The expert all-to-all overlap hides nothing on a CPU profile and trains there: refused when
  // the prediction's topology hides it, or on the CUDA back end.)
  const std::vector<std::tuple<std::vector<std::string>, std::string, std::string>> cases = {
      {{"parallel.moe_comm_overlap=true", "parallel.pipeline=1"}, "/topologies/dgx-h100.yaml", "parallel.moe_comm_overlap: the prediction on"},
      {{"parallel.moe_comm_overlap=true", "parallel.pipeline=1", "--backend", "cuda"}, "/profiles/dev-machine.yaml",
       "parallel.moe_comm_overlap: the executor (back end cuda) does not hide"},
  };
  for (const auto& [sets, profile, message] : cases) {
    const bool moe = contains(sets.front(), "moe");
    std::vector<std::string> args = {"validate", moe ? kRoot + "/scenarios/tiny-moe-cpu.yaml" : kTiny, "--profile",
                                     kRoot + profile, "--out-dir", file("v")};
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i].rfind("--", 0) == 0) {  // a flag and its value
        args.insert(args.end(), {sets[i], sets[i + 1]});
        ++i;
      } else {
        args.insert(args.end(), {"--set", sets[i]});
      }
    }
    if (!moe)
      for (const char* s : {"parallel.pipeline=1", "parallel.data=2", "parallel.sequence_parallel=true", "parallel.zero_stage=1",
                            "parallel.overlap_grad_reduce=true"})
        args.insert(args.end(), {"--set", s});
    const auto r = ptdp(args);
    EXPECT_EQ(r.status, 2) << sets.front() << ": " << r.err;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    EXPECT_FALSE(contains(r.err, "mpirun")) << "refused after launching: " << r.err;
  }
}

TEST_F(Cli, ValidateKillsMpirunAndItsRanksOnTimeout) {
  const std::string out = file("timeout-run");
  const auto r = ptdp({"validate", kTiny, "--profile", kRoot + "/profiles/dev-machine.yaml", "--steps", "100000",
                       "--timeout", "3", "--out-dir", out});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "process group was killed")) << r.err;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(processes_mentioning(out), 0);  // no mpirun, no rank left running
}

TEST_F(Cli, AnInterruptedValidateLeavesNoProcessBehind) {
  const std::string out = file("interrupted-run");
  const std::string cmd = "timeout --foreground -s INT 4 " + quoted(PTDP_BINARY) + " validate " + quoted(kTiny) + " --profile " +
                          quoted(kRoot + "/profiles/dev-machine.yaml") + " --steps 100000 --out-dir " + quoted(out) +
                          " >" + quoted(file("o")) + " 2>&1";
  const int raw = std::system(cmd.c_str());
  EXPECT_NE(raw, 0) << slurp(file("o"));
  EXPECT_TRUE(contains(slurp(file("o")), "interrupted")) << slurp(file("o"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(processes_mentioning(out), 0) << slurp(file("o"));
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, AStoppedSweepLeavesNoSimulationBehind) {
  // Full-fidelity simulations of the 1T model take ~3 s each on a quiet machine since TP twins run
  // once (docs/BENCHMARKS.md): six of them, larger batches longer, two at a time, outlast the 6 s
  // timeout with room to spare. Stop the sweep while its SimGrid child processes run; they must
  // die with it.
  const std::string csv = file("stopped-sweep.csv");
  const std::string cmd = "timeout --foreground -s TERM 6 " + quoted(PTDP_BINARY) + " sweep " + quoted(kRoot + "/scenarios/gpt-1t.yaml") +
                          " --vary training.micro_batch=1,2 --vary training.global_batch=3072,6144,12288 --fidelity full --jobs 2 --refine-budget 0 --csv " + quoted(csv) + " >" +
                          quoted(file("o")) + " 2>&1";
  const int raw = std::system(cmd.c_str());
  EXPECT_NE(raw, 0) << slurp(file("o"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(processes_mentioning(csv), 0) << slurp(file("o"));
}

}  // namespace
