// The figures of a training run that follow from its iteration time: throughput as the paper
// counts it (Eq. 3), model FLOPs utilisation, tokens per second, days to train. Shared by the
// simulator and the executor so that both report the same quantities.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Power draw and prices for the energy and cost of a run (0 / empty: unknown).
/// What a measured run reports (`ptdp calibrate --measured` columns): the iteration time, the
/// TFLOP/s per GPU, or one transformer layer's forward or backward time (one microbatch, one
/// TP rank, TP collectives included; backward with its recompute), seconds; or the tokens per
/// second per GPU, or the model FLOPs utilisation (a fraction), as published tables give them.
enum class RunMetric { IterationTime, TflopsPerGpu, LayerForward, LayerBackward, TokensPerSecondPerGpu, Mfu };
inline constexpr RunMetric kRunMetrics[] = {RunMetric::IterationTime, RunMetric::TflopsPerGpu, RunMetric::LayerForward,
                                            RunMetric::LayerBackward, RunMetric::TokensPerSecondPerGpu, RunMetric::Mfu};
/// "iteration_time_s" | "tflops_per_gpu" | "layer_forward_s" | "layer_backward_s" |
/// "tokens_per_s_per_gpu" | "mfu".
std::string to_string(RunMetric m);

struct EnergyAndPrice {
  double gpu_busy_w = 0;            // per GPU while it computes or communicates (0: no energy figures)
  double gpu_idle_w = 0;            // per GPU while it waits (pipeline bubble)
  double node_w = 0;                // per node besides its GPUs (CPUs, memory, NICs, NVSwitches, fans)
  int gpus_per_node = 1;
  std::optional<double> gpu_hour_usd;  // price of one GPU-hour
  double energy_usd_per_kwh = 0;       // electricity, added to the GPU-hour price
};

/// Cost and energy of a run; the totals are for the token budget (empty without one).
struct CostFigures {
  double iteration_energy_j = 0;       // 0 when power is unknown
  double iteration_gpu_s = 0;          // GPUs × iteration time
  std::optional<double> gpu_hours;     // GPUs × training time
  std::optional<double> energy_kwh;    // when power is known
  std::optional<double> cost_usd;      // when a GPU-hour price is given
};

/// Energy per iteration = T · (GPUs · (f·busy + (1−f)·idle) + nodes · node), f = `busy_fraction`
/// (mean over pipeline ranks of busy ÷ iteration time); totals over `iterations` when given.
/// Cost = GPU-hours · price + kWh · electricity price.
CostFigures cost_figures(const EnergyAndPrice& e, int64_t gpus, double iteration_time_s, double busy_fraction,
                         std::optional<double> iterations);

struct RunMetrics {
  double tflops_per_gpu = 0;  // paper Eq. 3 counting when recompute is full (reported_iteration_flops)
  double mfu = 0;             // model FLOPs without recompute / (time · GPUs · peak); 0 when peak unknown
  double tokens_per_s = 0;
  std::optional<double> training_days;  // for train_tokens, when given
  double parameters = 0;                // Eq. 2
  int64_t gpus = 0;
  EnergyAndPrice energy;                // for the report's cost and energy (complete_report)
  std::optional<double> iterations;     // iterations for train_tokens
};

/// Metrics of one iteration of `iteration_time_s` (> 0) on plan.gpus() devices of
/// `peak_flops` each (≤ 0: unknown, MFU left 0).
/// `energy` (may be null): power and prices for the cost and energy figures.
RunMetrics run_metrics(const TransformerSpec& spec, const ParallelPlan& plan, double iteration_time_s, double peak_flops,
                       std::optional<double> train_tokens, const EnergyAndPrice* energy = nullptr);

}  // namespace ptdp
