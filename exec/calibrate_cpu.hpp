// Calibration of this machine for the CPU executor: measures what the simulator's cost model
// needs with the executor's own kernels (Eigen GEMMs by shape, element-wise kernels against
// streaming bandwidth, launch overhead, how many cores the ranks really get) and its MPI
// communicator (ping-pong, all-reduce by size), and turns it into a topology profile in the
// schema of topologies/*.yaml.
//
//   mpirun -np N ptdp calibrate --backend cpu --out PROFILE.yaml   (N: the ranks of the runs to predict)
#pragma once

#include <array>
#include <cstdint>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "exec/speed_probe.hpp"
#include "model/efficiency_fit.hpp"
#include "topologies/cluster.hpp"

namespace ptdp::exec {

/// What calibrate_cpu() measured (complete on world rank 0).
struct CpuCalibration {
  std::vector<GemmSample> gemms;
  double gemm_evict_bytes = 0;        // bytes written between two timed calls of a GEMM (0: warm operands)
  bool gemm_yield = false;            // more ranks than hardware threads: the core yielded before each timed GEMM
  double peak_flops = 0;              // best measured GEMM, FLOP/s per rank
  GemmFit fit;                        // GEMM-efficiency model fitted to `gemms`
  double stream_Bps = 0;              // copy bandwidth (read + write)
  double elementwise_eff = 0;         // GELU / LayerNorm bandwidth ÷ stream
  double launch_s = 0;                // a 16-element kernel
  std::vector<std::pair<double, double>> elementwise_curve;  // (bytes per call, B/s), 16 KiB … 64 MiB
  double fp8_cast_s = 0;              // emulated FP8 cast, per element
  double operand_rounding_s = 0;      // bf16 GEMM operand rounding, per element
  double adam_step_s = 0;             // gradient sum of squares + AdamW, per parameter
  double swiglu_s = 0, swiglu_backward_s = 0;  // SwiGLU kernels, per activation element
  double rotary_s = 0;                // rotary embedding, per rotated query/key element
  // The flash attention kernel's seconds per call at 64 and 256 tokens (4 sequences, 4 heads of
  // 32), and as the cost model's flash curve: ceilings (of peak_flops) and walk lengths at half of
  // them, forward and backward.
  std::array<double, 2> attention_fwd_s{}, attention_bwd_s{};
  double attention_fwd_max_eff = 0, attention_bwd_max_eff = 0;
  double attention_fwd_seq_half = 0, attention_bwd_seq_half = 0;
  // Context parallelism's block kernel (a rank of 2, 64 of 128 tokens), FLOP/s of the cost
  // model's count, forward and backward.
  double context_attention_flops = 0, context_attention_backward_flops = 0;
  SpeedProbe probe;                   // the speed probe before the kernels: the figures are set to its speed
  double concurrent_gemm_share = 1;   // per-rank GEMM speed with every rank busy ÷ alone
  double p2p_Bps = 0, p2p_latency_s = 0;
  std::vector<std::pair<double, double>> allreduce_busbw;  // (bytes, bus bandwidth B/s)
  double allreduce_small_s = 0;
  double wakeup_s = 0;                // a rank that slept in a wait resumes this late
  // The all-reduce again with the waits' sleeping mode (used with more ranks than cores).
  std::vector<std::pair<double, double>> allreduce_busbw_sleeping;
  double allreduce_small_sleeping_s = 0;
  int ranks = 1;
  double cores = 1;                   // ranks computing at full speed at once
};

/// Measures this host with every rank of `world` (collective; the result is complete on rank
/// 0). The kernels are timed on every rank at once, as the executor's ranks run them (with as
/// many ranks as the runs to be predicted use), in CPU seconds of the calling thread; each
/// figure is the median over ranks of each rank's median over rounds. With one rank no communication is measured and `cores` is the hardware thread count.
/// `progress` (rank 0 only, may be empty) receives a line per finished measurement.
/// `gemm_shapes` (m, n, k), when not empty: the GEMMs are timed at these shapes — the ones the
/// runs to be predicted multiply (validate's suite) — and the efficiency model is fitted to
/// them alone, instead of to a grid of m, n 16 … 1024, k 8 … 512. `gemm_evict_bytes` > 0: each
/// timed GEMM call follows a pass over that many other bytes (its operands out of the per-core
/// caches, as a training step's weights are: validate passes the bytes of the rank's weights and
/// gradients); with more ranks than hardware threads each such call also follows a yield of the
/// core (an oversubscribed rank resumes after another ran on it).
CpuCalibration calibrate_cpu(Communicator& world, const std::function<void(const std::string&)>& progress = {},
                             const std::vector<std::array<int64_t, 3>>& gemm_shapes = {}, double gemm_evict_bytes = 0);

/// The measured figures as a topology: every rank is a device of one node sharing its cores;
/// the all-reduce curve is recorded with the links it was measured on.
ClusterSpec cpu_profile(const CpuCalibration& m);

/// cpu_profile() as YAML with a header saying how it was measured.
std::string cpu_profile_yaml(const CpuCalibration& m);

}  // namespace ptdp::exec
