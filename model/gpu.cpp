#include "model/gpu.hpp"


#include "core/units.hpp"

namespace ptdp {
namespace {

using K = GpuFieldKind;

GpuField num(const char* key, const char* member, K kind, double GpuSpec::*m, double lo, double hi, bool open,
             const char* range, const char* help, bool always, double fit_lo = 0, double fit_hi = 0) {
  return {key, member, kind, m, nullptr, nullptr, lo, hi, open, range, help, always, fit_lo, fit_hi};
}
GpuField integer(const char* key, int64_t GpuSpec::*m, double lo, double hi, const char* range, const char* help) {
  return {key, key, K::Integer, nullptr, m, nullptr, lo, hi, false, range, help, false, 0, 0};
}
GpuField flag(const char* key, bool GpuSpec::*m, const char* help) {
  return {key, key, K::Flag, nullptr, nullptr, m, 0, 1, false, "true | false", help, false, 0, 0};
}

std::span<const GpuField> table() {
  static const GpuField fields[] = {
      num("memory", "memory_bytes", K::Bytes, &GpuSpec::memory_bytes, 0, 1e15, true, "(0, 10¹⁵] B", "memory per GPU", true),
      num("peak_flops", "peak_flops", K::Flops, &GpuSpec::peak_flops, 0, 1e18, true, "(0, 10¹⁸]", "dense fp16/bf16 peak", true),
      num("hbm_bandwidth", "hbm_Bps", K::Bandwidth, &GpuSpec::hbm_Bps, 0, 1e18, true, "(0, 10¹⁸] B/s", "memory bandwidth", true),
      num("gemm_max_efficiency", "gemm_max_efficiency", K::Number, &GpuSpec::gemm_max_efficiency, 0, 1, true, "(0, 1]",
          "GEMM efficiency of large shapes", true, 0.01, 1.0),
      num("gemm_half_dim", "gemm_half_dim", K::Number, &GpuSpec::gemm_half_dim, 0, 1e6, false, "[0, 10⁶]",
          "GEMM dimension at half efficiency", true, 0.0, 1e5),
      num("gemm_half_k", "gemm_half_k", K::Number, &GpuSpec::gemm_half_k, 0, 1e6, false, "[0, 10⁶]",
          "inner dimension at half efficiency", true, 0.0, 1e5),
      num("gemm_thin_exponent", "gemm_thin_exponent", K::Number, &GpuSpec::gemm_thin_exponent, 0, 8, true, "(0, 8]",
          "thin-GEMM efficiency exponent", true, 0.2, 8.0),
      integer("sm_count", &GpuSpec::sm_count, 0, 1e6, "[0, 10⁶] (0: no wave quantization)", "SMs"),
      integer("gemm_tile_m", &GpuSpec::gemm_tile_m, 1, 1e6, "1 … 10⁶", "GEMM tile rows"),
      integer("gemm_tile_n", &GpuSpec::gemm_tile_n, 1, 1e6, "1 … 10⁶", "GEMM tile columns"),
      num("elementwise_efficiency", "elementwise_efficiency", K::Number, &GpuSpec::elementwise_efficiency, 0, 1, true,
          "(0, 1]", "fraction of HBM bandwidth", true, 0.01, 1.0),
      num("fp8_peak_flops", "fp8_peak_flops", K::Flops, &GpuSpec::fp8_peak_flops, 0, 1e18, false,
          "[0, 10¹⁸] (0: no FP8 tensor cores)", "dense FP8 peak", false),
      num("fp8_gemm_max_efficiency", "fp8_gemm_max_efficiency", K::Number, &GpuSpec::fp8_gemm_max_efficiency, 0, 1, true,
          "(0, 1]", "FP8 GEMM efficiency of large shapes", false, 0.01, 1.0),
      num("fp8_gemm_half_dim", "fp8_gemm_half_dim", K::Number, &GpuSpec::fp8_gemm_half_dim, 0, 1e6, false, "[0, 10⁶]",
          "FP8 GEMM dimension at half efficiency", false, 0.0, 1e5),
      flag("mx_formats", &GpuSpec::mx_formats, "tensor cores with microscaling formats (MXFP8: Blackwell)"),
      num("fp8_backward_slowdown", "fp8_backward_slowdown", K::Number, &GpuSpec::fp8_backward_slowdown, 1, 10, false,
          "[1, 10]", "quantised dgrad/wgrad time ÷ fprop time", false),
      num("attention_fwd_max_efficiency", "attention_fwd_max_efficiency", K::Number, &GpuSpec::attention_fwd_max_efficiency,
          0, 1, false, "[0, 1] (0: no kernel table, GEMM efficiency)", "flash attention forward, long sequences", false,
          0.01, 1.0),
      num("attention_bwd_max_efficiency", "attention_bwd_max_efficiency", K::Number, &GpuSpec::attention_bwd_max_efficiency,
          0, 1, false, "[0, 1]", "flash attention backward, long sequences", false, 0.01, 1.0),
      num("attention_fwd_seq_half", "attention_fwd_seq_half", K::Number, &GpuSpec::attention_fwd_seq_half, 0, 1e7, false,
          "[0, 10⁷]", "keys walked per query block at half the forward ceiling", false),
      num("attention_bwd_seq_half", "attention_bwd_seq_half", K::Number, &GpuSpec::attention_bwd_seq_half, 0, 1e7, false,
          "[0, 10⁷]", "the same for the backward", false),
      num("attention_head_dim_half", "attention_head_dim_half", K::Number, &GpuSpec::attention_head_dim_half, 0, 1e4,
          false, "[0, 10⁴]", "head dim at half efficiency", false),
      num("attention_block", "attention_block", K::Number, &GpuSpec::attention_block, 1, 1e6, false, "[1, 10⁶]",
          "query/key block of the flash kernel (causal: the diagonal's share)", false),
      num("cudnn_attention_fwd_max_efficiency", "cudnn_attention_fwd_max_efficiency", K::Number,
          &GpuSpec::cudnn_attention_fwd_max_efficiency, 0, 1, false, "[0, 1] (0: no cuDNN table, the flash curve)",
          "cuDNN fused attention (megatron) forward, long sequences", false),
      num("cudnn_attention_bwd_max_efficiency", "cudnn_attention_bwd_max_efficiency", K::Number,
          &GpuSpec::cudnn_attention_bwd_max_efficiency, 0, 1, false, "[0, 1]", "cuDNN fused attention backward, long sequences", false),
      num("cudnn_attention_fwd_seq_half", "cudnn_attention_fwd_seq_half", K::Number, &GpuSpec::cudnn_attention_fwd_seq_half, 0, 1e7,
          false, "[0, 10⁷]", "cuDNN: keys walked per query block at half the forward ceiling", false),
      num("cudnn_attention_bwd_seq_half", "cudnn_attention_bwd_seq_half", K::Number, &GpuSpec::cudnn_attention_bwd_seq_half, 0, 1e7,
          false, "[0, 10⁷]", "the same for the backward", false),
      num("cudnn_attention_causal_factor", "cudnn_attention_causal_factor", K::Number, &GpuSpec::cudnn_attention_causal_factor, 0, 1,
          true, "(0, 1]", "cuDNN's causal kernel against the model's causal curve", false),
      num("fa2_attention_fwd_max_efficiency", "fa2_attention_fwd_max_efficiency", K::Number,
          &GpuSpec::fa2_attention_fwd_max_efficiency, 0, 1, false, "[0, 1] (0: no FlashAttention-2 table, the flash curve)",
          "FlashAttention-2 (PyTorch SDPA's flash backend) forward, long sequences", false),
      num("fa2_attention_bwd_max_efficiency", "fa2_attention_bwd_max_efficiency", K::Number,
          &GpuSpec::fa2_attention_bwd_max_efficiency, 0, 1, false, "[0, 1]", "FlashAttention-2 backward, long sequences", false),
      num("fa2_attention_fwd_seq_half", "fa2_attention_fwd_seq_half", K::Number, &GpuSpec::fa2_attention_fwd_seq_half, 0, 1e7,
          false, "[0, 10⁷]", "FlashAttention-2: keys walked per query block at half the forward ceiling", false),
      num("fa2_attention_bwd_seq_half", "fa2_attention_bwd_seq_half", K::Number, &GpuSpec::fa2_attention_bwd_seq_half, 0, 1e7,
          false, "[0, 10⁷]", "the same for the backward", false),
      num("fa2_attention_head_dim_half", "fa2_attention_head_dim_half", K::Number, &GpuSpec::fa2_attention_head_dim_half, 0, 1e4,
          false, "[0, 10⁴]", "FlashAttention-2: head dim at half efficiency", false),
      num("fp8_cast_time", "fp8_cast_s", K::Time, &GpuSpec::fp8_cast_s, 0, 1e-3, false, "[0, 1 ms] (0: FP8 in hardware)",
          "FP8 emulated on the host: one cast, per element (calibrate --backend cpu)", false),
      num("operand_rounding_time", "operand_rounding_s", K::Time, &GpuSpec::operand_rounding_s, 0, 1e-3, false,
          "[0, 1 ms] (0: bf16/fp16 in hardware)", "bf16/fp16 GEMM operands rounded on the host, per element", false),
      num("adam_step_time", "adam_step_s", K::Time, &GpuSpec::adam_step_s, 0, 1e-3, false,
          "[0, 1 ms] (0: memory-bound element-wise traffic)", "optimizer step per parameter (calibrate --backend cpu)", false),
      num("swiglu_time", "swiglu_s", K::Time, &GpuSpec::swiglu_s, 0, 1e-3, false, "[0, 1 ms] (0: element-wise traffic)",
          "SwiGLU forward computed on the host, per activation element (calibrate --backend cpu)", false),
      num("swiglu_backward_time", "swiglu_backward_s", K::Time, &GpuSpec::swiglu_backward_s, 0, 1e-3, false,
          "[0, 1 ms] (0: element-wise traffic)", "SwiGLU backward computed on the host, per activation element", false),
      num("rotary_time", "rotary_s", K::Time, &GpuSpec::rotary_s, 0, 1e-3, false, "[0, 1 ms] (0: element-wise traffic)",
          "rotary embedding computed on the host, per rotated query/key channel element", false),
      num("context_attention_flops", "context_attention_flops", K::Flops, &GpuSpec::context_attention_flops, 0, 1e18, false,
          "[0, 10¹⁸] (0: the flash curve)", "context-parallel attention blocks computed on the host, forward (calibrate --backend cpu)",
          false),
      num("context_attention_backward_flops", "context_attention_backward_flops", K::Flops, &GpuSpec::context_attention_backward_flops,
          0, 1e18, false, "[0, 10¹⁸] (0: the flash curve)", "the same, backward", false),
      num("speed_probe_gemm_time", "speed_probe_gemm_s", K::Time, &GpuSpec::speed_probe_gemm_s, 0, 1, false,
          "[0, 1 s] (0: not probed)", "the speed probe's GEMM at calibration (calibrate --backend cpu; validate scales by it)", false),
      num("kernel_launch", "kernel_launch_s", K::Time, &GpuSpec::kernel_launch_s, 0, 1, false, "[0, 1 s]", "per kernel",
          true, 0.0, 1e-2),
      num("iteration_overhead", "iteration_overhead_s", K::Time, &GpuSpec::iteration_overhead_s, 0, 3600, false,
          "[0, 3600 s]", "per iteration", true, 0.0, 100.0),
      num("power", "power_w", K::Power, &GpuSpec::power_w, 0, 1e6, false, "[0, 10⁶] W (0: no energy figures)",
          "board power while busy", false),
      num("idle_power", "idle_power_w", K::Power, &GpuSpec::idle_power_w, 0, 1e6, false, "[0, 10⁶] W",
          "board power while waiting", false),
  };
  return fields;
}

}  // namespace

std::span<const GpuField> gpu_fields() { return table(); }

const GpuField* find_gpu_field(const std::string& key) {
  for (const auto& f : gpu_fields())
    if (key == f.key) return &f;
  return nullptr;
}

double gpu_field_value(const GpuSpec& gpu, const GpuField& f) {
  if (f.number) return gpu.*f.number;
  if (f.integer) return static_cast<double>(gpu.*f.integer);
  return gpu.*f.flag ? 1.0 : 0.0;
}

void set_gpu_field(GpuSpec& gpu, const GpuField& f, double value) {
  if (f.number)
    gpu.*f.number = value;
  else if (f.integer)
    gpu.*f.integer = static_cast<int64_t>(value);
  else
    gpu.*f.flag = value != 0;
}

std::string gpu_field_text(const GpuSpec& gpu, const GpuField& f) {
  const double v = gpu_field_value(gpu, f);
  switch (f.kind) {
    case K::Flag: return v != 0 ? "true" : "false";
    case K::Integer: return std::to_string(gpu.*f.integer);
    case K::Bytes: return quantity_text(v, Quantity::Bytes);
    case K::Flops: return quantity_text(v, Quantity::Flops);
    case K::Bandwidth: return quantity_text(v, Quantity::Bandwidth);
    case K::Time: return quantity_text(v, Quantity::Time);
    case K::Power: return quantity_text(v, Quantity::Power);
    case K::Number: break;
  }
  return number_text(v);
}

}  // namespace ptdp
