// Kernel times: what one op takes on a GPU by its shape, precision and kernel (GEMM and
// attention efficiency curves, waves over the SMs, element-wise bandwidth, launch and host
// overheads), and the sum over an op list. The op lists themselves are made in cost.cpp.
#include <algorithm>
#include <cmath>

#include "model/cost.hpp"
#include "model/measured_kernels.hpp"

namespace ptdp {

namespace {
// The shape model of GEMM efficiency with a given ceiling and half-volume cube side.
double shape_efficiency(const GpuSpec& gpu, double max_efficiency, double half_dim, int64_t m, int64_t n, int64_t k) {
  // Two shape effects: the thinnest dimension bounds the data reuse inside a tile (head-dim 32
  // attention products are slow), and small products cannot fill the GPU's SMs (measured by
  // the product's volume m·n·k against a cube of side half_dim).
  auto f = [](double x, double half) { return x / (x + half); };
  const double M = static_cast<double>(m), N = static_cast<double>(n), K = static_cast<double>(k);
  const double q = gpu.gemm_thin_exponent;
  const double thin = std::pow(std::min({M, N, K}), q);
  return max_efficiency * f(thin, std::pow(gpu.gemm_half_k, q)) * f(M * N * K, half_dim * half_dim * half_dim);
}
}  // namespace

double gemm_curve_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k) {
  return shape_efficiency(gpu, gpu.gemm_max_efficiency, gpu.gemm_half_dim, m, n, k);
}

double gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k) {
  return measured_gemm_efficiency(gpu, m, n, k, gemm_curve_efficiency(gpu, m, n, k));
}

double fp8_gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k) {
  return shape_efficiency(gpu, gpu.fp8_gemm_max_efficiency, gpu.fp8_gemm_half_dim, m, n, k);
}

double attention_efficiency(const GpuSpec& gpu, int64_t seq, int64_t head_dim, bool causal, bool backward) {
  return attention_efficiency(gpu, seq, head_dim, causal, backward, AttentionKernel::Flash);
}

double attention_efficiency(const GpuSpec& gpu, int64_t seq, int64_t head_dim, bool causal, bool backward, AttentionKernel kernel) {
  // Another kernel's table: the same model with its own ceilings and walk lengths (cuDNN shares
  // the flash curve's head-dim term, FlashAttention-2 has its own).
  auto table = [&](double fwd_max, double bwd_max, double fwd_half, double bwd_half, double head_dim_half) {
    GpuSpec k = gpu;
    k.attention_fwd_max_efficiency = fwd_max, k.attention_bwd_max_efficiency = bwd_max;
    k.attention_fwd_seq_half = fwd_half, k.attention_bwd_seq_half = bwd_half;
    k.attention_head_dim_half = head_dim_half;
    return attention_efficiency(k, seq, head_dim, causal, backward, AttentionKernel::Flash);
  };
  if (kernel == AttentionKernel::Cudnn && gpu.cudnn_attention_fwd_max_efficiency > 0)
    return table(gpu.cudnn_attention_fwd_max_efficiency, gpu.cudnn_attention_bwd_max_efficiency, gpu.cudnn_attention_fwd_seq_half,
                 gpu.cudnn_attention_bwd_seq_half, gpu.attention_head_dim_half) *
           (causal ? gpu.cudnn_attention_causal_factor : 1.0);
  if (kernel == AttentionKernel::Flash2 && gpu.fa2_attention_fwd_max_efficiency > 0)
    return table(gpu.fa2_attention_fwd_max_efficiency, gpu.fa2_attention_bwd_max_efficiency, gpu.fa2_attention_fwd_seq_half,
                 gpu.fa2_attention_bwd_seq_half, gpu.fa2_attention_head_dim_half);
  const double max = backward ? gpu.attention_bwd_max_efficiency : gpu.attention_fwd_max_efficiency;
  if (!(max > 0)) return gemm_efficiency(gpu, seq, seq, head_dim);
  const double s = static_cast<double>(seq), dh = static_cast<double>(head_dim);
  // A thread block owns a block of queries and walks the keys it may see (all s, or s/2 on
  // average under a causal mask): its fixed work (loading Q, rescaling, writing O) is amortised
  // over that walk, seq_half being the walk length at which it costs as much as the walk.
  const double walk = causal ? s / 2 : s;
  const double half = backward ? gpu.attention_bwd_seq_half : gpu.attention_fwd_seq_half;
  double eff = max * walk / (walk + half);
  // Causal: the blocks on the diagonal are computed whole and half masked away.
  if (causal) eff *= s / (s + gpu.attention_block);
  // Head dim: the inner products' depth bounds the reuse of each loaded tile (relative to 128,
  // the head dim the kernel tables are measured at).
  const double c = gpu.attention_head_dim_half;
  eff *= (dh / (dh + c)) / (128.0 / (128.0 + c));
  return std::min(eff, 1.0);
}

double gemm_wave_efficiency(const GpuSpec& gpu, int64_t batch, int64_t m, int64_t n) {
  if (gpu.sm_count <= 0 || batch <= 0 || m <= 0 || n <= 0) return 1.0;
  const int64_t tm = std::max<int64_t>(1, gpu.gemm_tile_m), tn = std::max<int64_t>(1, gpu.gemm_tile_n);
  const double tiles = static_cast<double>(batch) * static_cast<double>((m + tm - 1) / tm) * static_cast<double>((n + tn - 1) / tn);
  const double sms = static_cast<double>(gpu.sm_count);
  return tiles / (std::ceil(tiles / sms) * sms);
}

double op_time_s(const Op& op, const GpuSpec& gpu) {
  const double memory_s = op.bytes / elementwise_bandwidth(gpu, op.bytes);
  // An eager op whose host dispatch outlasts its kernels leaves the GPU waiting.
  auto with_host = [&op](double gpu_s) { return std::max(gpu_s, op.host_s); };
  switch (op.kind) {
    case OpKind::Gemm: {
      const bool fp8 = op.fp8 && gpu.fp8_peak_flops > 0;
      const double shape = fp8 ? fp8_gemm_efficiency(gpu, op.m, op.n, op.k) : gemm_efficiency(gpu, op.m, op.n, op.k);
      // An FP8 GEMM emulated on the host multiplies the cast operands as any other GEMM: the
      // recipe's kernel factor is a property of FP8 tensor-core kernels.
      const bool emulated = op.fp8 && !fp8 && gpu.fp8_cast_s > 0;
      const double eff = shape * gemm_wave_efficiency(gpu, op.batch, op.m, op.n) * (emulated ? 1.0 : op.kernel_factor);
      double compute_s = op.flops / ((fp8 ? gpu.fp8_peak_flops : gpu.peak_flops) * eff);
      if (fp8 && op.backward_quantised) compute_s *= gpu.fp8_backward_slowdown;
      // Low-precision operands emulated on the host (the CPU executor): FP8 casts or bf16/fp16
      // rounded copies of both operands (m·k and k·n elements), inside the GEMM.
      compute_s += static_cast<double>(op.batch) * (static_cast<double>(op.m) * static_cast<double>(op.k) +
                                                    static_cast<double>(op.k) * static_cast<double>(op.n)) *
                   (emulated ? gpu.fp8_cast_s : op.fp8 ? 0.0 : op.rounded_operands ? gpu.operand_rounding_s : 0.0);
      return with_host(std::max(compute_s, memory_s) + gpu.kernel_launch_s);
    }
    case OpKind::Attention: {
      // Context-parallel blocks computed on the host at their measured rate (the GPU kernels'
      // factors below are properties of GPU kernels).
      if (const double rate = op.backward ? gpu.context_attention_backward_flops : gpu.context_attention_flops; op.causal_blocks && rate > 0)
        return with_host(op.flops / rate + gpu.kernel_launch_s);
      double eff = attention_efficiency(gpu, op.seq, op.head_dim, op.causal, op.backward, op.attention_kernel) * op.kernel_factor;
      // Context-parallel blocks are measured against the causal kernel over the whole sequence:
      // cuDNN's causal kernel is that much slower.
      if (op.attention_kernel == AttentionKernel::Cudnn && op.causal_blocks && gpu.cudnn_attention_fwd_max_efficiency > 0) eff *= gpu.cudnn_attention_causal_factor;
      return with_host(std::max(op.flops / (gpu.peak_flops * eff), memory_s) + gpu.kernel_launch_s);
    }
    case OpKind::Elementwise:
      // Emulated FP8 casts run inside the GEMMs that use them (above), not as kernels of their own.
      if (op.fp8_cast && gpu.fp8_cast_s > 0 && !(gpu.fp8_peak_flops > 0)) return 0;
      // A kernel whose host implementation is bound by its arithmetic (measured per element).
      if (const double per_element_s = host_kernel_time_s(gpu, op.host_kernel); per_element_s > 0)
        return with_host(op.elements * per_element_s + op.kernels * gpu.kernel_launch_s);
      return with_host(memory_s / std::max(op.bandwidth_factor, 1e-3) + op.kernels * gpu.kernel_launch_s);
    case OpKind::AllReduce:
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
    case OpKind::AllToAll:
    case OpKind::RingExchange: return 0;  // communication: timed by the topology (is_communication)
  }
  return 0;
}

OpsCost cost_of(const std::vector<Op>& ops, const GpuSpec& gpu) {
  OpsCost c;
  for (const auto& op : ops) {
    if (is_communication(op.kind)) {
      c.collective_bytes += op.bytes;
      ++c.collectives;
    } else {
      c.compute_s += op_time_s(op, gpu);
      c.flops += op.flops;
    }
  }
  return c;
}

double sustained_clock_factor(double limit_w, double tdp_w) {
  if (!(limit_w > 0) || !(tdp_w > 0) || limit_w >= tdp_w) return 1.0;
  return std::pow(limit_w / tdp_w, 0.9);
}

}  // namespace ptdp
