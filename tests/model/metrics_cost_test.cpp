// Cost and energy of a run (model/metrics.hpp): GPU-hours for the token budget, energy from GPU
// busy/idle power and node power, cost from a GPU-hour price plus electricity.
#include <gtest/gtest.h>

#include "model/cost.hpp"
#include "model/metrics.hpp"

namespace ptdp {
namespace {

EnergyAndPrice dgx() {
  EnergyAndPrice e;
  e.gpu_busy_w = 400;
  e.gpu_idle_w = 55;
  e.node_w = 3300;
  e.gpus_per_node = 8;
  return e;
}

TEST(CostFigures, GpuHoursEnergyAndCostFollowTheirDefinitions) {
  EnergyAndPrice e = dgx();
  e.gpu_hour_usd = 2.0;
  // 16 GPUs (2 nodes), 10 s per iteration, 90% busy, 3600 iterations (10 hours).
  const CostFigures c = cost_figures(e, 16, 10.0, 0.9, 3600.0);
  ASSERT_TRUE(c.gpu_hours && c.energy_kwh && c.cost_usd);
  EXPECT_DOUBLE_EQ(*c.gpu_hours, 160.0);
  const double watts = 16 * (0.9 * 400 + 0.1 * 55) + 2 * 3300;
  EXPECT_NEAR(*c.energy_kwh, watts * 10 / 1000.0, 1e-9);
  EXPECT_NEAR(*c.cost_usd, 320.0, 1e-9);
  EXPECT_NEAR(c.iteration_energy_j, watts * 10.0, 1e-9);
}

TEST(CostFigures, EveryPowerAndPriceKnobMovesTheResultUp) {
  const CostFigures base = cost_figures(dgx(), 16, 10.0, 0.8, 100.0);
  auto energy = [&](EnergyAndPrice e, double busy = 0.8) { return *cost_figures(e, 16, 10.0, busy, 100.0).energy_kwh; };
  EnergyAndPrice e = dgx();
  e.gpu_busy_w = 500;
  EXPECT_GT(energy(e), *base.energy_kwh);
  e = dgx();
  e.gpu_idle_w = 100;
  EXPECT_GT(energy(e), *base.energy_kwh);
  e = dgx();
  e.node_w = 5000;
  EXPECT_GT(energy(e), *base.energy_kwh);
  // A bigger bubble (less busy) draws less power per second.
  EXPECT_LT(energy(dgx(), 0.5), *base.energy_kwh);
  // Electricity adds to the GPU-hour price.
  e = dgx();
  e.gpu_hour_usd = 1.0;
  const double gpu_only = *cost_figures(e, 16, 10.0, 0.8, 100.0).cost_usd;
  e.energy_usd_per_kwh = 0.2;
  EXPECT_NEAR(*cost_figures(e, 16, 10.0, 0.8, 100.0).cost_usd - gpu_only, 0.2 * *base.energy_kwh, 1e-9);
}

TEST(CostFigures, UnknownPowerOrPriceOrBudgetLeavesTheFigureOut) {
  EnergyAndPrice none;
  const CostFigures c = cost_figures(none, 8, 1.0, 1.0, 10.0);
  EXPECT_TRUE(c.gpu_hours.has_value());
  EXPECT_FALSE(c.energy_kwh.has_value());
  EXPECT_FALSE(c.cost_usd.has_value());
  const CostFigures no_budget = cost_figures(dgx(), 8, 1.0, 1.0, std::nullopt);
  EXPECT_FALSE(no_budget.gpu_hours.has_value());
  EXPECT_GT(no_budget.iteration_energy_j, 0.0);
}

TEST(WaveQuantization, APartialLastWaveCostsItsIdleSms) {
  GpuSpec gpu;
  gpu.sm_count = 108;
  gpu.gemm_tile_m = 256;
  gpu.gemm_tile_n = 128;
  // 145B at t 8, b 1: QKV output 2048 × 4608 = 8 × 36 = 288 tiles → 3 waves of 108: 89%.
  EXPECT_NEAR(gemm_wave_efficiency(gpu, 1, 2048, 4608), 288.0 / 324.0, 1e-12);
  // Exactly 4 waves: no loss.
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(gpu, 1, 256 * 4, 128 * 108), 1.0);
  // More SMs with the same tiles: 288 tiles on 132 SMs = 3 waves of 132: 73%.
  gpu.sm_count = 132;
  EXPECT_NEAR(gemm_wave_efficiency(gpu, 1, 2048, 4608), 288.0 / 396.0, 1e-12);
  // sm_count 0: not modelled.
  gpu.sm_count = 0;
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(gpu, 1, 2048, 4608), 1.0);
  // …and the GEMM's time follows it.
  Op qkv;
  qkv.kind = OpKind::Gemm;
  qkv.m = 2048;
  qkv.n = 4608;
  qkv.k = 12288;
  qkv.flops = 2.0 * 2048 * 4608 * 12288;
  const double off = op_time_s(qkv, gpu);
  gpu.sm_count = 108;
  EXPECT_NEAR(op_time_s(qkv, gpu) - gpu.kernel_launch_s, (off - gpu.kernel_launch_s) * 324.0 / 288.0, 1e-12);
}

}  // namespace
}  // namespace ptdp
