#include "model/metrics.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/flops.hpp"

namespace ptdp {

CostFigures cost_figures(const EnergyAndPrice& e, int64_t gpus, double iteration_time_s, double busy_fraction,
                         std::optional<double> iterations) {
  CostFigures c;
  const double n = static_cast<double>(gpus);
  const double nodes = std::ceil(n / std::max(1, e.gpus_per_node));
  const double f = std::clamp(busy_fraction, 0.0, 1.0);
  c.iteration_gpu_s = n * iteration_time_s;
  c.iteration_energy_j = iteration_time_s * (n * (f * e.gpu_busy_w + (1 - f) * e.gpu_idle_w) + nodes * e.node_w);
  if (!iterations) return c;
  c.gpu_hours = c.iteration_gpu_s * *iterations / 3600.0;
  if (e.gpu_busy_w > 0) c.energy_kwh = c.iteration_energy_j * *iterations / 3.6e6;
  if (e.gpu_hour_usd) c.cost_usd = *c.gpu_hours * *e.gpu_hour_usd + c.energy_kwh.value_or(0) * e.energy_usd_per_kwh;
  return c;
}

std::string to_string(RunMetric m) {
  switch (m) {
    case RunMetric::IterationTime: return "iteration_time_s";
    case RunMetric::TflopsPerGpu: return "tflops_per_gpu";
    case RunMetric::LayerForward: return "layer_forward_s";
    case RunMetric::LayerBackward: return "layer_backward_s";
    case RunMetric::TokensPerSecondPerGpu: return "tokens_per_s_per_gpu";
    case RunMetric::Mfu: return "mfu";
  }
  return "";
}

RunMetrics run_metrics(const TransformerSpec& spec, const ParallelPlan& plan, double iteration_time_s, double peak_flops,
                       std::optional<double> train_tokens, const EnergyAndPrice* energy) {
  PTDP_ASSERT(iteration_time_s > 0, "iteration time must be positive");
  RunMetrics m;
  m.gpus = plan.gpus();
  m.parameters = parameter_count(spec);
  const double n = static_cast<double>(m.gpus);
  m.tflops_per_gpu = reported_iteration_flops(spec, plan) / (iteration_time_s * n) / 1e12;
  if (peak_flops > 0) m.mfu = iteration_flops(spec, plan.global_batch, false) / (iteration_time_s * n * peak_flops);
  m.tokens_per_s = static_cast<double>(plan.global_batch * spec.seq_length) / iteration_time_s;
  if (train_tokens) m.training_days = *train_tokens / m.tokens_per_s / 86400.0;
  if (train_tokens) m.iterations = *train_tokens / static_cast<double>(plan.global_batch * spec.seq_length);
  if (energy) m.energy = *energy;
  return m;
}

}  // namespace ptdp
