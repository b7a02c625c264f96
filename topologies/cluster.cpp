#include "topologies/cluster.hpp"

#include <cmath>
#include <cstdio>

#include "core/error.hpp"
#include "core/units.hpp"

namespace ptdp {
namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// v in [lo, hi] and finite.
void in_range(const char* key, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi) || !std::isfinite(v))
    throw ConfigError::rule(key, "must be between " + num(lo) + " and " + num(hi) + " (got " + num(v) + ")");
}
// v in (0, hi] and finite.
void positive_at_most(const char* key, double v, double hi) {
  if (!(v > 0) || !std::isfinite(v)) throw ConfigError::rule(key, "must be positive (got " + num(v) + ")");
  if (v > hi) throw ConfigError::rule(key, "must be at most " + num(hi) + " (got " + num(v) + ")");
}
void check_curve(const char* key, const BandwidthCurve& curve) {
  double last = 0;
  for (const auto& [size, bw] : curve.points) {
    if (!(size > last)) throw ConfigError::rule(key, "message sizes must be positive and increasing");
    if (!(size <= 1e15)) throw ConfigError::rule(key, "message sizes must be at most 1e15 bytes (got " + num(size) + ")");
    if (!(bw > 0) || !(bw <= 1e18)) throw ConfigError::rule(key, "bus bandwidths must be in (0, 1e18] B/s (got " + num(bw) + ")");
    last = size;
  }
  in_range(key, curve.small_message_s, 0, 1);
}

}  // namespace

void validate_cluster(const ClusterSpec& c) {
  // Every number has a documented range (README, "Ranges of numeric inputs"): beyond it the
  // cost model's arithmetic (powers, products of sizes) could overflow into inf or NaN.
  // The GPU's fields by their table (model/gpu.hpp): ranges beyond which the cost model's
  // arithmetic could overflow.
  for (const auto& f : gpu_fields()) {
    if (f.kind == GpuFieldKind::Flag) continue;
    const std::string key = std::string("cluster.topology.gpu.") + f.key;
    const double v = gpu_field_value(c.gpu, f);
    if (f.lower_open)  // (0, upper]
      positive_at_most(key.c_str(), v, f.upper);
    else
      in_range(key.c_str(), v, f.lower, f.upper);
  }
  in_range("cluster.topology.node.gpus", c.gpus_per_node, 1, 1024);
  in_range("cluster.topology.node.cores", c.cores_per_node, 0, 1e6);
  in_range("cluster.topology.node.wakeup_latency", c.wakeup_latency_s, 0, 1);
  in_range("cluster.topology.nodes", c.max_nodes, 0, 1e7);
  positive_at_most("cluster.topology.node.nvlink.bandwidth", c.nvlink.bw_Bps, 1e18);
  in_range("cluster.topology.node.nvlink.latency", c.nvlink.latency_s, 0, 1);
  positive_at_most("cluster.topology.network.nic.bandwidth", c.nic.bw_Bps, 1e18);
  in_range("cluster.topology.network.nic.latency", c.nic.latency_s, 0, 1);
  in_range("cluster.topology.network.nics_per_node", c.nics_per_node, 1, 1024);
  in_range("cluster.topology.network.fabric.levels", c.fabric.levels, 1, 8);
  in_range("cluster.topology.network.fabric.oversubscription", c.fabric.oversubscription, 1, 1024);
  in_range("cluster.topology.network.fabric.leaf_radix", c.fabric.leaf_radix, 1, 1e6);
  in_range("cluster.topology.network.fabric.switch_latency", c.fabric.switch_latency_s, 0, 1);
  in_range("cluster.topology.node.power", c.node_power_w, 0, 1e6);
  in_range("cluster.topology.network.pcie.bandwidth", c.pcie.bw_Bps, 0, 1e18);
  positive_at_most("cluster.topology.node.host_link.bandwidth", c.host_link.bw_Bps, 1e18);
  in_range("cluster.topology.node.host_link.latency", c.host_link.latency_s, 0, 1);
  in_range("cluster.topology.node.host_memory", c.host_memory_bytes, 0, 1e18);
  positive_at_most("cluster.topology.node.host_memory_bandwidth", c.host_memory_Bps, 1e18);
  in_range("cluster.topology.network.pcie.latency", c.pcie.latency_s, 0, 1);
  for (size_t i = 0; i < c.gpu.gemm_rates.size(); ++i) {
    const auto& g = c.gpu.gemm_rates[i];
    const std::string at = "cluster.topology.gpu.gemm_rates[" + std::to_string(i) + "]";
    for (int64_t side : {g.m, g.n, g.k}) in_range(at.c_str(), side, 1, 65536);
    positive_at_most(at.c_str(), g.flops_per_s, 1e18);
  }
  for (size_t i = 0; i < c.gpu.elementwise_bandwidth.size(); ++i) {
    const auto& [bytes, bw] = c.gpu.elementwise_bandwidth[i];
    const std::string at = "cluster.topology.gpu.elementwise_bandwidth[" + std::to_string(i) + "]";
    positive_at_most(at.c_str(), bytes, 1e15);
    positive_at_most(at.c_str(), bw, 1e18);
    if (i > 0 && !(bytes > c.gpu.elementwise_bandwidth[i - 1].first))
      throw ConfigError::rule(at, "sizes must increase (" + quantity_text(bytes, Quantity::Bytes) + " after " +
                                      quantity_text(c.gpu.elementwise_bandwidth[i - 1].first, Quantity::Bytes) + ")");
  }
  check_curve("cluster.topology.calibration.intra_node_allreduce", c.intra_node_allreduce);
  check_curve("cluster.topology.calibration.inter_node_allreduce", c.inter_node_allreduce);
  check_curve("cluster.topology.calibration.oversubscribed_allreduce", c.oversubscribed_allreduce);
  check_curve("cluster.topology.calibration.intra_node_ring", c.intra_node_ring);
  if (c.intra_node_allreduce.empty() && c.inter_node_allreduce.empty()) return;
  // Curves are efficiencies of the links they were measured on: without those links a what-if
  // on the cluster's links could not be told apart from the measurement.
  if (!c.measured_on.recorded)
    throw ConfigError::rule("cluster.topology.calibration.measured_on",
                            "required with bus-bandwidth curves: the links they were measured on, e.g. "
                            "{nvlink: {bandwidth: 300GBps, latency: 1us}, nic: {bandwidth: 25GBps, latency: 2us}, "
                            "switch_latency: 0.3us}");
  positive_at_most("cluster.topology.calibration.measured_on.nvlink.bandwidth", c.measured_on.nvlink.bw_Bps, 1e18);
  in_range("cluster.topology.calibration.measured_on.nvlink.latency", c.measured_on.nvlink.latency_s, 0, 1);
  if (!c.inter_node_allreduce.empty())
    positive_at_most("cluster.topology.calibration.measured_on.nic.bandwidth", c.measured_on.nic.bw_Bps, 1e18);
  in_range("cluster.topology.calibration.measured_on.nic.latency", c.measured_on.nic.latency_s, 0, 1);
  in_range("cluster.topology.calibration.measured_on.pcie.bandwidth", c.measured_on.pcie.bw_Bps, 0, 1e18);
  in_range("cluster.topology.calibration.measured_on.pcie.latency", c.measured_on.pcie.latency_s, 0, 1);
  in_range("cluster.topology.calibration.measured_on.switch_latency", c.measured_on.switch_latency_s, 0, 1);
}

void validate_cluster_for(const ClusterSpec& c, int64_t gpus) {
  validate_cluster(c);
  if (c.max_nodes > 0 && gpus > static_cast<int64_t>(c.max_nodes) * c.gpus_per_node)
    throw ConfigError::rule("cluster.gpus", "the topology '" + c.name + "' holds at most " + std::to_string(c.max_nodes) + " nodes × " +
                                          std::to_string(c.gpus_per_node) + " GPUs = " +
                                          std::to_string(static_cast<int64_t>(c.max_nodes) * c.gpus_per_node) + " GPUs (got " +
                                          std::to_string(gpus) + ")");
}

}  // namespace ptdp
