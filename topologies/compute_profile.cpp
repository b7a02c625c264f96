#include "topologies/compute_profile.hpp"

namespace ptdp {

double mfu_peak_flops(const ClusterSpec& c, const ParallelPlan& plan) {
  return plan.precision == Precision::FP8 && c.gpu.fp8_peak_flops > 0 ? c.gpu.fp8_peak_flops : c.gpu.peak_flops;
}

}  // namespace ptdp
