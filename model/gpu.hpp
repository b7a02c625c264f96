// GpuSpec: one description of a GPU (memory, peaks, bandwidth, the parameters of its efficiency
// model, launch and power), and the table of its fields from which the topology reader, the
// writer of calibrated profiles, the range checks, `ptdp keys`, the report's JSON and
// calibration's fittable parameters are all made. A new GPU field is one member and one row.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ptdp {

/// The compute side of a GPU, with the parameters of its efficiency model (model/cost.hpp).
/// GEMM time  = max(flops / (peak · eff(m, n, k)), bytes / (hbm · elementwise_efficiency)) + launch,
/// eff(m, n, k) = gemm_max_efficiency · xᵠ/(xᵠ + half_kᵠ) · V/(V + half_dim³),
///   x = min(m, n, k) (data reuse of the thinnest side), V = m·n·k (enough tiles for every SM).
/// Element-wise time = bytes / (hbm · elementwise_efficiency) + launch.
struct GpuSpec {
  std::string name = "A100-SXM4-80GB";
  double memory_bytes = 80e9;      // capacity
  double peak_flops = 312e12;      // dense fp16/bf16 FLOP/s
  double hbm_Bps = 2.0e12;         // memory bandwidth
  double gemm_max_efficiency = 0.8;
  double gemm_half_dim = 128;      // cube side: a GEMM of volume half_dim³ runs at half efficiency
  double gemm_half_k = 64;         // thinnest dimension at which efficiency halves
  double gemm_thin_exponent = 1;   // q: how sharply thin GEMMs lose efficiency
  /// Wave quantization: a GEMM's output is cut into tiles of gemm_tile_m × gemm_tile_n that run
  /// sm_count at a time; the last, partial wave leaves SMs idle (0 SMs: not modelled).
  int64_t sm_count = 0;
  int64_t gemm_tile_m = 256;
  int64_t gemm_tile_n = 128;
  double elementwise_efficiency = 0.7;
  /// FP8 tensor cores (Transformer Engine's FP8 GEMMs): dense FP8 peak (0 = the GPU has none) and
  /// the efficiency model's parameters for FP8 GEMMs (same form as above; small FP8 GEMMs lose
  /// more than bf16 ones). Quantised dgrad/wgrad GEMMs run fp8_backward_slowdown × slower than
  /// fprop (TE's GEMM benchmark: 5–13 %).
  double fp8_peak_flops = 0;
  double fp8_gemm_max_efficiency = 0.7;
  double fp8_gemm_half_dim = 128;
  double fp8_backward_slowdown = 1.09;
  bool mx_formats = false;  // tensor cores with microscaling formats (MXFP8: Blackwell)
  /// Fused (flash) attention kernel, forward and backward (model/cost.hpp: attention_efficiency):
  /// efficiency = max · L/(L + seq_half) · s/(s + block) [causal] · hd(d_h), where L is the keys a
  /// query block visits (s, or s/2 causal) and hd = (d/(d + head_dim_half)) / (128/(128 + head_dim_half)).
  /// attention_fwd_max_efficiency 0 = no kernel table: the kernel runs at the GEMM efficiency of
  /// its QKᵀ product.
  double attention_fwd_max_efficiency = 0;
  double attention_bwd_max_efficiency = 0;
  double attention_fwd_seq_half = 256;
  double attention_bwd_seq_half = 256;
  double attention_head_dim_half = 32;
  double attention_block = 128;
  /// cuDNN's fused attention (Transformer Engine's default backend: what training.framework
  /// megatron runs) when its table differs from the flash curve's: the same model with its own
  /// ceilings and walk lengths (the head-dim term shared), and a causal kernel that runs at
  /// cudnn_attention_causal_factor of the model's causal curve (cuDNN loses more to the mask than
  /// FlashAttention-3: 539 against 616 TFLOP/s at 16k on H100). 0 = no cuDNN table: every
  /// framework runs the flash curve.
  double cudnn_attention_fwd_max_efficiency = 0;
  double cudnn_attention_bwd_max_efficiency = 0;
  double cudnn_attention_fwd_seq_half = 256;
  double cudnn_attention_bwd_seq_half = 256;
  double cudnn_attention_causal_factor = 1;
  /// FlashAttention-2 (what PyTorch's scaled_dot_product_attention runs through its flash backend,
  /// and flash-attn 2: training.attention_kernel flash2, the PyTorch frameworks' default) when it
  /// differs from the flash curve (on Hopper: FA2 uses none of its features, ≈ 1/3 of peak): the
  /// same model with its own ceilings, walk lengths and head-dim constant. 0 = the flash curve.
  double fa2_attention_fwd_max_efficiency = 0;
  double fa2_attention_bwd_max_efficiency = 0;
  double fa2_attention_fwd_seq_half = 256;
  double fa2_attention_bwd_seq_half = 256;
  double fa2_attention_head_dim_half = 32;
  /// Measured by `ptdp calibrate --backend cpu` (empty elsewhere): the rate of each GEMM shape
  /// the executor ran at calibration, used by the cost model in place of the efficiency curve at
  /// and near those shapes (model/cost.hpp: gemm_efficiency), and the bandwidth the executor's
  /// element-wise kernels reach by working set (bytes read and written per call: in cache up to
  /// the caches' size, at memory bandwidth beyond), used instead of hbm · elementwise_efficiency.
  struct GemmRate {
    int64_t m = 0, n = 0, k = 0;
    double flops_per_s = 0;
  };
  std::vector<GemmRate> gemm_rates;
  std::vector<std::pair<double, double>> elementwise_bandwidth;  // (working-set bytes, B/s), sizes increasing
  /// FP8 emulated on the host (no FP8 tensor cores): seconds per element of one cast (scale,
  /// round to e4m3/e5m2, amax), which the executor runs on both operands of every FP8 GEMM.
  double fp8_cast_s = 0;
  /// bf16/fp16 GEMM operands on a device without such tensor cores (the CPU executor): seconds per
  /// element of the rounded copy made of both operands of every GEMM.
  double operand_rounding_s = 0;
  /// The optimizer's step measured on the device (calibrate --backend cpu: the gradient norm's
  /// sum of squares and AdamW's update), seconds per parameter; 0 = priced as memory-bound
  /// element-wise traffic (StateBytes::adam_step bytes per parameter).
  double adam_step_s = 0;
  /// Element-wise kernels whose cost on the host is their arithmetic, not their bytes (the CPU
  /// executor's scalar exp and trigonometry), measured by calibrate --backend cpu in seconds per
  /// element: SwiGLU's silu(gate)·up forward and its backward (per activation element), and the
  /// rotary embedding (per rotated query/key channel). 0 = priced as element-wise traffic.
  double swiglu_s = 0;
  double swiglu_backward_s = 0;
  double rotary_s = 0;
  /// Context parallelism's attention blocks on the host (the CPU executor's block kernel, which
  /// computes a block's scores and then each query's visible keys one by one): FLOP/s of the
  /// cost model's count (2·b·h·s_rank·s·head_dim forward, 2.5× that backward), measured by
  /// calibrate --backend cpu. 0 = the flash curve with the GPU kernels' context-parallel factors.
  double context_attention_flops = 0;
  double context_attention_backward_flops = 0;
  /// The speed probe (exec/speed_probe.hpp) as calibrate --backend cpu timed it around its
  /// kernels: seconds of a fixed GEMM. `validate` times the same probe around each run and scales
  /// the profile's F, B, I and W by the ratio (the host's speed at the run's moment against the
  /// calibration's). 0 = not probed.
  double speed_probe_gemm_s = 0;
  double kernel_launch_s = 4e-6;     // fixed cost per kernel
  double iteration_overhead_s = 0;   // fixed cost per iteration (data loading, logging, framework)
  double power_w = 0;                // board power while busy (0: unknown, no energy figures)
  double idle_power_w = 0;           // board power while waiting
};

/// How a field is written in YAML (and which reader reads it): plain numbers, integers, booleans,
/// or quantities with units (80GB, 312TFLOPS, 2TBps, 4us, 700W).
enum class GpuFieldKind { Number, Integer, Flag, Bytes, Flops, Bandwidth, Time, Power };

/// One field of GpuSpec: its YAML key under `gpu:`, its member, range, `ptdp keys` text, when
/// profiles write it, and calibration bounds (fittable when fit_upper > fit_lower).
struct GpuField {
  const char* key;           // YAML key (cluster.topology.gpu.<key>) and calibration's name
  const char* member;        // the C++ member's name: the report's JSON key
  GpuFieldKind kind;
  double GpuSpec::*number;   // exactly one of number / integer / flag is set
  int64_t GpuSpec::*integer;
  bool GpuSpec::*flag;
  double lower, upper;       // valid range
  bool lower_open;           // (lower, upper] instead of [lower, upper]
  const char* range_text;    // as `ptdp keys` shows it (with what the ends mean)
  const char* help;
  bool always_written;       // profiles write it even at its default
  double fit_lower = 0, fit_upper = 0;
};

/// Every numeric field of GpuSpec (the name is the one text field, handled by its readers).
std::span<const GpuField> gpu_fields();
/// The field with this YAML key, or nullptr.
const GpuField* find_gpu_field(const std::string& key);
/// The field's value as a double (integers and flags converted), and setting it.
double gpu_field_value(const GpuSpec& gpu, const GpuField& f);
void set_gpu_field(GpuSpec& gpu, const GpuField& f, double value);
/// The field's value in the YAML form its kind takes ("80GB", "4us", "true", "0.8").
std::string gpu_field_text(const GpuSpec& gpu, const GpuField& f);

}  // namespace ptdp
