// The figures of a training run that follow from its iteration time: throughput as the paper
// counts it (Eq. 3), model FLOPs utilisation, tokens per second, days to train. Shared by the
// simulator and the executor so that both report the same quantities.
#pragma once

#include <cstdint>
#include <optional>

#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

struct RunMetrics {
  double tflops_per_gpu = 0;  // paper Eq. 3 counting when recompute is full (reported_iteration_flops)
  double mfu = 0;             // model FLOPs without recompute / (time · GPUs · peak); 0 when peak unknown
  double tokens_per_s = 0;
  std::optional<double> training_days;  // for train_tokens, when given
  double parameters = 0;                // Eq. 2
  int64_t gpus = 0;
};

/// Metrics of one iteration of `iteration_time_s` (> 0) on plan.gpus() devices of
/// `peak_flops` each (≤ 0: unknown, MFU left 0).
RunMetrics run_metrics(const TransformerSpec& spec, const ParallelPlan& plan, double iteration_time_s, double peak_flops,
                       std::optional<double> train_tokens);

}  // namespace ptdp
