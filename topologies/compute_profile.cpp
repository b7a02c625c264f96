#include "topologies/compute_profile.hpp"

namespace ptdp {

ComputeProfile compute_profile(const ClusterSpec& c) {
  ComputeProfile p;
  p.name = c.gpu.name;
  p.peak_flops = c.gpu.peak_flops;
  p.hbm_Bps = c.gpu.hbm_Bps;
  p.memory_bytes = c.gpu.memory_bytes;
  p.gemm_max_efficiency = c.gpu.gemm_max_efficiency;
  p.gemm_half_dim = c.gpu.gemm_half_dim;
  p.gemm_half_k = c.gpu.gemm_half_k;
  p.gemm_thin_exponent = c.gpu.gemm_thin_exponent;
  p.sm_count = c.gpu.sm_count;
  p.gemm_tile_m = c.gpu.gemm_tile_m;
  p.gemm_tile_n = c.gpu.gemm_tile_n;
  p.elementwise_efficiency = c.gpu.elementwise_efficiency;
  p.fp8_peak_flops = c.gpu.fp8_peak_flops;
  p.fp8_gemm_max_efficiency = c.gpu.fp8_gemm_max_efficiency;
  p.fp8_gemm_half_dim = c.gpu.fp8_gemm_half_dim;
  p.fp8_backward_slowdown = c.gpu.fp8_backward_slowdown;
  p.attention_fwd_max_efficiency = c.gpu.attention_fwd_max_efficiency;
  p.attention_bwd_max_efficiency = c.gpu.attention_bwd_max_efficiency;
  p.attention_fwd_seq_half = c.gpu.attention_fwd_seq_half;
  p.attention_bwd_seq_half = c.gpu.attention_bwd_seq_half;
  p.attention_head_dim_half = c.gpu.attention_head_dim_half;
  p.kernel_launch_s = c.gpu.kernel_launch_s;
  p.iteration_overhead_s = c.gpu.iteration_overhead_s;
  return p;
}

}  // namespace ptdp

namespace ptdp {

double mfu_peak_flops(const ClusterSpec& c, const ParallelPlan& plan) {
  return plan.precision == Precision::FP8 && c.gpu.fp8_peak_flops > 0 ? c.gpu.fp8_peak_flops : c.gpu.peak_flops;
}

}  // namespace ptdp
