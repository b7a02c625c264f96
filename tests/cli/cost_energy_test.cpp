// Cost and energy in reports and sweeps, as users see them: gpu_hours, energy_kwh, cost_usd in
// `simulate --json` and in sweep CSV rows; sweeps ranked by time, cost or energy.
#include <nlohmann/json.hpp>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
using nlohmann::json;

const std::string kRoot = PTDP_SOURCE_DIR;
const std::string k18 = kRoot + "/scenarios/paper/gpt-18.4b.yaml";

json simulate(const Outcome& r, const std::string& path) {
  EXPECT_EQ(r.status, 0) << r.err;
  return json::parse(slurp(path));
}

TEST_F(Cli, ReportsCarryGpuHoursEnergyAndCostForTheTokenBudget) {
  // p 4: a pipeline bubble, so GPUs spend part of the time at idle power.
  const auto r = ptdp({"simulate", k18, "--set", "training.train_tokens=10B", "--set", "parallel.pipeline=4", "--gpu-hour-price",
                       "2.5", "--json", file("a.json")});
  const json j = simulate(r, file("a.json"));
  ASSERT_TRUE(j["gpu_hours"].is_number()) << j.dump();
  ASSERT_TRUE(j["energy_kwh"].is_number());
  ASSERT_TRUE(j["cost_usd"].is_number());
  const double hours = j["training_days"].get<double>() * 24 * j["gpus"].get<double>();
  EXPECT_NEAR(j["gpu_hours"].get<double>(), hours, 1e-6 * hours);
  EXPECT_NEAR(j["cost_usd"].get<double>(), 2.5 * hours, 1e-6 * hours);
  // Between all GPUs idle and all busy, plus the nodes (dgx-a100: 400 W, 55 W, 3.3 kW per node).
  const double nodes = j["gpus"].get<double>() / 8, h = hours / j["gpus"].get<double>();
  EXPECT_GT(j["energy_kwh"].get<double>(), (j["gpus"].get<double>() * 55 + nodes * 3300) * h / 1000);
  EXPECT_LT(j["energy_kwh"].get<double>(), (j["gpus"].get<double>() * 400 + nodes * 3300) * h / 1000);
  EXPECT_TRUE(contains(r.out, "GPU-hours")) << r.out;
}

TEST_F(Cli, ACostSectionAndPowerKnobsMoveTheFigures) {
  auto run = [&](std::vector<std::string> sets) {
    std::vector<std::string> args = {"simulate", k18, "--set", "training.train_tokens=10B", "--set", "parallel.pipeline=4",
                                     "--json", file("b.json")};
    for (auto& s : sets) args.insert(args.end(), {"--set", s});
    return simulate(ptdp(args), file("b.json"));
  };
  const json base = run({"cost.gpu_hour_price=1"});
  const json energy = run({"cost.gpu_hour_price=1", "cost.energy_price=0.1"});
  EXPECT_NEAR(energy["cost_usd"].get<double>() - base["cost_usd"].get<double>(), 0.1 * base["energy_kwh"].get<double>(),
              1e-6 * base["cost_usd"].get<double>());
  for (const char* knob : {"cluster.topology.gpu.power=500W", "cluster.topology.gpu.idle_power=100W", "cluster.topology.node.power=5kW"})
    EXPECT_GT(run({"cost.gpu_hour_price=1", knob})["energy_kwh"].get<double>(), base["energy_kwh"].get<double>()) << knob;
  EXPECT_TRUE(run({})["cost_usd"].is_null());  // no price, no cost
  const auto bad = ptdp({"simulate", k18, "--set", "cost.gpu_hour_price=cheap"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.err, "cost.gpu_hour_price")) << bad.err;
}

TEST_F(Cli, SweepsRankByTimeCostOrEnergyAndWriteTheColumns) {
  auto sweep = [&](const std::string& by, const std::string& csv) {
    return ptdp({"sweep", k18, "--vary", "parallel.pipeline=1,2,4", "--vary", "training.micro_batch=1,2,8", "--fidelity",
                 "analytic", "--set", "training.train_tokens=10B", "--gpu-hour-price", "2", "--rank-by", by, "--csv", file(csv)});
  };
  for (const std::string by : {"time", "cost", "energy"}) {
    const auto r = sweep(by, by + ".csv");
    ASSERT_EQ(r.status, 0) << r.err;
    const std::string text = slurp(file(by + ".csv"));
    const std::string header = text.substr(0, text.find('\n'));
    for (const char* col : {"gpu_hours", "energy_kwh", "cost_usd"}) EXPECT_TRUE(contains(header, col)) << header;
    if (by != "time") {
      EXPECT_TRUE(contains(r.out, "ranked by " + by)) << r.out;
    }
  }
  // Cost ranking with a GPU-hour price puts the fewest GPU-hours first: the same order as time
  // for a fixed GPU count. Energy can differ (a bigger bubble idles GPUs cheaply).
  const std::string cost = slurp(file("cost.csv")), time = slurp(file("time.csv"));
  auto first_row = [](const std::string& csv) {
    const auto a = csv.find('\n') + 1;
    return csv.substr(a, csv.find('\n', a) - a);
  };
  EXPECT_EQ(first_row(cost).substr(0, 40), first_row(time).substr(0, 40));
  const auto bad = sweep("speed", "x.csv");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.err, "--rank-by")) << bad.err;
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, MeasuredTrainingReportsCarryCostAndEnergyToo) {
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                          " --oversubscribe --bind-to none -np 2 " + quoted(PTDP_BINARY) + " train " +
                          quoted(kRoot + "/scenarios/tiny-gpt-cpu.yaml") +
                          " --set cluster.gpus=2 --set parallel.tensor=1 --set training.train_tokens=1M"
                          " --set cluster.topology.gpu.power=65W --set cost.gpu_hour_price=0.05 --steps 3 --json " +
                          quoted(file("m.json")) + " >" + quoted(file("out")) + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("out"));
  const json j = json::parse(slurp(file("m.json")));
  ASSERT_TRUE(j["gpu_hours"].is_number()) << j.dump();
  EXPECT_NEAR(j["gpu_hours"].get<double>(), j["training_days"].get<double>() * 24 * 2, 1e-9);
  EXPECT_NEAR(j["cost_usd"].get<double>(), 0.05 * j["gpu_hours"].get<double>(), 1e-12);
  EXPECT_GT(j["energy_kwh"].get<double>(), 0.0);
  EXPECT_LE(j["energy_kwh"].get<double>(), j["gpu_hours"].get<double>() * 65 / 1000 * (1 + 1e-9));
}

}  // namespace
