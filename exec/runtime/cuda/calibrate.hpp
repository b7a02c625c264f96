// Calibration on real hardware: measures what the simulator's cost model needs — GEMM
// efficiency by shape, HBM bandwidth, kernel launch time, NCCL all-reduce bus bandwidth and
// point-to-point bandwidth by message size, inside a node and across nodes — and turns it into
// a topology profile (the schema of topologies/*.yaml) that `ptdp simulate` accepts.
//
//   mpirun -np 16 --map-by ppr:8:node ptdp calibrate --backend cuda --out PROFILE.yaml
//
// Measuring needs CUDA (a build without it throws EnvironmentError); fitting and writing the
// profile are plain C++ and work everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "model/efficiency_fit.hpp"
#include "topologies/cluster.hpp"

namespace ptdp::exec::cuda {

/// One message size of a collective or transfer: time per operation and bandwidth
/// (all-reduce: bus bandwidth algbw·2(n−1)/n as nccl-tests; p2p: bytes / time, one direction).
struct BandwidthSample {
  double bytes = 0;
  double seconds = 0;
  double bw_Bps = 0;
};

/// What calibrate_cuda() measured. GPU figures are world rank 0's; collective times are those
/// of the slowest rank.
struct CalibrationResult {
  std::string gpu_name;
  int compute_capability = 0;   // 80, 90, …
  double memory_bytes = 0;
  double peak_flops = 0;        // dense bf16 tensor-core peak
  std::string peak_source;      // how peak_flops was obtained (for the profile's comment)
  double hbm_nominal_Bps = 0;   // memory clock × bus width (0 when the driver does not say)
  double stream_Bps = 0;        // measured element-wise bandwidth (read + write)
  double kernel_launch_s = 0;   // back-to-back empty kernels
  /// bf16 GEMMs (fp32 accumulation), FLOP/s of back-to-back calls (launch included).
  std::vector<GemmSample> gemm;
  int nodes = 1;
  int gpus_per_node = 1;        // ranks on world rank 0's node
  std::vector<std::string> ib_devices;  // /sys/class/infiniband on rank 0 (reported, not counted)
  double intra_small_s = 0, inter_small_s = 0;  // 8-byte all-reduce
  std::vector<BandwidthSample> intra_allreduce, inter_allreduce;
  double intra_p2p_latency_s = 0, inter_p2p_latency_s = 0;  // one way, 8 bytes
  std::vector<BandwidthSample> intra_p2p, inter_p2p;
};

struct CalibrationOptions {
  /// GEMM shapes {m, n, k}; empty: transformer-like shapes (h 1024–12288 with 2048–8192 tokens,
  /// attention-like thin products, small cubes).
  std::vector<std::array<int64_t, 3>> gemm_shapes;
  /// Message sizes in bytes; empty: 1 MiB, 4 MiB, … 1 GiB (as topologies/dgx-a100.yaml).
  std::vector<double> message_sizes;
  int warmup = 5;
  int repeats = 20;
  /// Dense bf16 peak FLOP/s to use; 0: known GPU table, else SMs × clock × tensor rate, else
  /// the best measured GEMM.
  double peak_flops = 0;
  /// Rank 0 receives a line per finished measurement.
  std::function<void(const std::string&)> progress;
};

/// Measures on this rank's GPU (node-local rank → GPU, as make_cuda_device) together with every
/// rank of `world` (the MPI world: one rank per GPU; several nodes for the inter-node figures).
/// Collective; the result is complete on world rank 0. Throws EnvironmentError without CUDA or
/// GPU, CommunicationError when NCCL fails.
CalibrationResult calibrate_cuda(Communicator& world, const CalibrationOptions& options = {});

/// `base` with the measured figures in place: gpu (name, memory, peak, HBM, GEMM efficiency
/// fitted by model/efficiency_fit.hpp to the samples with the launch time taken out,
/// element-wise efficiency, kernel launch), node.gpus, nvlink and NIC bandwidth and
/// latency from the point-to-point runs, and the all-reduce curves. What was not measured keeps
/// base's value (iteration overhead, NICs per node, fabric; inter-node figures on one node).
ClusterSpec profile_from(const CalibrationResult& r, const ClusterSpec& base);

/// calibrate_cuda(), profile_from(base) and to_yaml() (topologies/cluster_yaml.hpp): the profile text on world rank 0
/// ("" on the others), with a comment saying what was measured where. Collective.
std::string calibrate_topology(Communicator& world, const ClusterSpec& base, const CalibrationOptions& options = {});

}  // namespace ptdp::exec::cuda
