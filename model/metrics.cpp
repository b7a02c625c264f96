#include "model/metrics.hpp"

#include "core/error.hpp"
#include "model/flops.hpp"

namespace ptdp {

RunMetrics run_metrics(const TransformerSpec& spec, const ParallelPlan& plan, double iteration_time_s, double peak_flops,
                       std::optional<double> train_tokens) {
  PTDP_ASSERT(iteration_time_s > 0, "iteration time must be positive");
  RunMetrics m;
  m.gpus = plan.gpus();
  m.parameters = parameter_count(spec);
  const double n = static_cast<double>(m.gpus);
  m.tflops_per_gpu = reported_iteration_flops(spec, plan) / (iteration_time_s * n) / 1e12;
  if (peak_flops > 0) m.mfu = iteration_flops(spec, plan.global_batch, false) / (iteration_time_s * n * peak_flops);
  m.tokens_per_s = static_cast<double>(plan.global_batch * spec.seq_length) / iteration_time_s;
  if (train_tokens) m.training_days = *train_tokens / m.tokens_per_s / 86400.0;
  return m;
}

}  // namespace ptdp
