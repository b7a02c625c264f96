#include "topologies/cluster.hpp"

#include <cmath>
#include <cstdio>

#include "core/error.hpp"

namespace ptdp {
namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

void positive(const char* key, double v) {
  if (!(v > 0) || !std::isfinite(v)) throw ConfigError::rule(key, "must be positive (got " + num(v) + ")");
}
void non_negative(const char* key, double v) {
  if (!(v >= 0) || !std::isfinite(v)) throw ConfigError::rule(key, "must not be negative (got " + num(v) + ")");
}
void check_curve(const char* key, const BandwidthCurve& curve) {
  double last = 0;
  for (const auto& [size, bw] : curve.points) {
    if (!(size > last)) throw ConfigError::rule(key, "message sizes must be positive and increasing");
    if (!(bw > 0)) throw ConfigError::rule(key, "bus bandwidths must be positive (got " + num(bw) + ")");
    last = size;
  }
  non_negative(key, curve.small_message_s);
}

}  // namespace

void validate_cluster(const ClusterSpec& c) {
  positive("cluster.topology.gpu.memory", c.gpu.memory_bytes);
  positive("cluster.topology.gpu.peak_flops", c.gpu.peak_flops);
  positive("cluster.topology.gpu.hbm_bandwidth", c.gpu.hbm_Bps);
  positive("cluster.topology.gpu.gemm_max_efficiency", c.gpu.gemm_max_efficiency);
  if (c.gpu.gemm_max_efficiency > 1)
    throw ConfigError::rule("cluster.topology.gpu.gemm_max_efficiency", "must be at most 1 (got " + num(c.gpu.gemm_max_efficiency) + ")");
  non_negative("cluster.topology.gpu.gemm_half_dim", c.gpu.gemm_half_dim);
  non_negative("cluster.topology.gpu.gemm_half_k", c.gpu.gemm_half_k);
  positive("cluster.topology.gpu.gemm_thin_exponent", c.gpu.gemm_thin_exponent);
  non_negative("cluster.topology.gpu.sm_count", static_cast<double>(c.gpu.sm_count));
  positive("cluster.topology.gpu.gemm_tile_m", static_cast<double>(c.gpu.gemm_tile_m));
  positive("cluster.topology.gpu.gemm_tile_n", static_cast<double>(c.gpu.gemm_tile_n));
  positive("cluster.topology.gpu.elementwise_efficiency", c.gpu.elementwise_efficiency);
  non_negative("cluster.topology.gpu.kernel_launch", c.gpu.kernel_launch_s);
  non_negative("cluster.topology.gpu.iteration_overhead", c.gpu.iteration_overhead_s);
  non_negative("cluster.topology.gpu.power", c.gpu.power_w);
  non_negative("cluster.topology.gpu.idle_power", c.gpu.idle_power_w);
  non_negative("cluster.topology.node.power", c.node_power_w);
  if (c.gpus_per_node < 1) throw ConfigError::rule("cluster.topology.node.gpus", "must be at least 1 (got " + std::to_string(c.gpus_per_node) + ")");
  non_negative("cluster.topology.node.cores", c.cores_per_node);
  if (c.max_nodes < 0) throw ConfigError::rule("cluster.topology.nodes", "must not be negative (got " + std::to_string(c.max_nodes) + ")");
  positive("cluster.topology.node.nvlink.bandwidth", c.nvlink.bw_Bps);
  non_negative("cluster.topology.node.nvlink.latency", c.nvlink.latency_s);
  positive("cluster.topology.network.nic.bandwidth", c.nic.bw_Bps);
  non_negative("cluster.topology.network.nic.latency", c.nic.latency_s);
  if (c.nics_per_node < 1) throw ConfigError::rule("cluster.topology.network.nics_per_node", "must be at least 1");
  if (c.fabric.levels < 1) throw ConfigError::rule("cluster.topology.network.fabric.levels", "must be at least 1");
  if (!(c.fabric.oversubscription >= 1))
    throw ConfigError::rule("cluster.topology.network.fabric.oversubscription", "must be at least 1 (got " + num(c.fabric.oversubscription) + ")");
  if (c.fabric.leaf_radix < 1) throw ConfigError::rule("cluster.topology.network.fabric.leaf_radix", "must be at least 1");
  non_negative("cluster.topology.network.fabric.switch_latency", c.fabric.switch_latency_s);
  non_negative("cluster.topology.network.pcie.bandwidth", c.pcie.bw_Bps);
  non_negative("cluster.topology.network.pcie.latency", c.pcie.latency_s);
  check_curve("cluster.topology.calibration.intra_node_allreduce", c.intra_node_allreduce);
  check_curve("cluster.topology.calibration.inter_node_allreduce", c.inter_node_allreduce);
  if (c.intra_node_allreduce.empty() && c.inter_node_allreduce.empty()) return;
  // Curves are efficiencies of the links they were measured on: without those links a what-if
  // on the cluster's links could not be told apart from the measurement.
  if (!c.measured_on.recorded)
    throw ConfigError::rule("cluster.topology.calibration.measured_on",
                            "required with bus-bandwidth curves: the links they were measured on, e.g. "
                            "{nvlink: {bandwidth: 300GBps, latency: 1us}, nic: {bandwidth: 25GBps, latency: 2us}, "
                            "switch_latency: 0.3us}");
  positive("cluster.topology.calibration.measured_on.nvlink.bandwidth", c.measured_on.nvlink.bw_Bps);
  non_negative("cluster.topology.calibration.measured_on.nvlink.latency", c.measured_on.nvlink.latency_s);
  if (!c.inter_node_allreduce.empty()) positive("cluster.topology.calibration.measured_on.nic.bandwidth", c.measured_on.nic.bw_Bps);
  non_negative("cluster.topology.calibration.measured_on.nic.latency", c.measured_on.nic.latency_s);
  non_negative("cluster.topology.calibration.measured_on.pcie.bandwidth", c.measured_on.pcie.bw_Bps);
  non_negative("cluster.topology.calibration.measured_on.pcie.latency", c.measured_on.pcie.latency_s);
  non_negative("cluster.topology.calibration.measured_on.switch_latency", c.measured_on.switch_latency_s);
}

void validate_cluster_for(const ClusterSpec& c, int64_t gpus) {
  validate_cluster(c);
  if (c.max_nodes > 0 && gpus > static_cast<int64_t>(c.max_nodes) * c.gpus_per_node)
    throw ConfigError::rule("cluster.gpus", "the topology '" + c.name + "' holds at most " + std::to_string(c.max_nodes) + " nodes × " +
                                          std::to_string(c.gpus_per_node) + " GPUs = " +
                                          std::to_string(static_cast<int64_t>(c.max_nodes) * c.gpus_per_node) + " GPUs (got " +
                                          std::to_string(gpus) + ")");
}

int64_t global_rank(const RankCoord& c, int64_t t, int64_t d) { return c.tp + t * (c.dp + d * c.pp); }

RankCoord rank_coord(int64_t rank, int64_t t, int64_t d) {
  RankCoord c;
  c.tp = static_cast<int>(rank % t);
  c.dp = static_cast<int>((rank / t) % d);
  c.pp = static_cast<int>(rank / (t * d));
  return c;
}

}  // namespace ptdp
