#include "topologies/cluster_yaml.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

#include "core/units.hpp"

namespace ptdp {
namespace {

std::string bytes_text(double b) { return quantity_text(b, Quantity::Bytes); }
std::string bw_text(double v) { return quantity_text(v, Quantity::Bandwidth); }
std::string time_text(double s) { return quantity_text(s, Quantity::Time); }
std::string link_text(const LinkSpec& l) {
  return "{bandwidth: " + bw_text(l.bw_Bps) + ", latency: " + time_text(l.latency_s) + "}";
}
std::string number(double v) { return number_text(v); }
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

void write_curve(std::ostringstream& y, const char* key, const BandwidthCurve& c, int gpus_per_node) {
  if (c.empty()) return;
  y << "  " << key << ":\n";
  if (gpus_per_node > 0) y << "    gpus_per_node: " << gpus_per_node << "\n";
  y << "    small_message_time: " << time_text(c.small_message_s) << "\n";
  y << "    busbw: [";
  for (size_t i = 0; i < c.points.size(); ++i)
    y << (i ? ", " : "") << "[" << bytes_text(c.points[i].first) << ", " << bw_text(c.points[i].second) << "]";
  y << "]\n";
}

}  // namespace

std::string to_yaml(const ClusterSpec& c, const std::string& comment) {
  std::ostringstream y;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) y << "# " << line << "\n";
  y << "name: " << quoted(c.name) << "\n";
  if (c.max_nodes > 0) y << "nodes: " << c.max_nodes << "\n";
  y << "gpu:\n"
    << "  name: " << quoted(c.gpu.name) << "\n";
  // Every field of the table that is always written or differs from a default GpuSpec's (those
  // read back as the default): the reader's keys, so a profile round-trips.
  const GpuSpec defaults;
  for (const auto& f : gpu_fields())
    if (f.always_written || gpu_field_value(c.gpu, f) != gpu_field_value(defaults, f))
      y << "  " << f.key << ": " << gpu_field_text(c.gpu, f) << "\n";
  if (!c.gpu.gemm_rates.empty()) {
    y << "  gemm_rates: [";
    for (size_t i = 0; i < c.gpu.gemm_rates.size(); ++i) {
      const auto& g = c.gpu.gemm_rates[i];
      y << (i ? ", " : "") << "[" << g.m << ", " << g.n << ", " << g.k << ", " << quantity_text(g.flops_per_s, Quantity::Flops) << "]";
    }
    y << "]\n";
  }
  if (!c.gpu.elementwise_bandwidth.empty()) {
    y << "  elementwise_bandwidth: [";
    for (size_t i = 0; i < c.gpu.elementwise_bandwidth.size(); ++i)
      y << (i ? ", " : "") << "[" << bytes_text(c.gpu.elementwise_bandwidth[i].first) << ", "
        << bw_text(c.gpu.elementwise_bandwidth[i].second) << "]";
    y << "]\n";
  }
  y << "node:\n"
    << "  gpus: " << c.gpus_per_node << "\n";
  if (c.cpu_host()) y << "  cores: " << number(c.cores_per_node) << "\n";
  if (c.cpu_host() || c.wakeup_latency_s > 0) y << "  wakeup_latency: " << time_text(c.wakeup_latency_s) << "\n";
  if (c.node_power_w > 0) y << "  power: " << number(c.node_power_w) << "W\n";
  y << "  nvlink: " << link_text(c.nvlink) << "\n";
  // Offloading's paths: kept, so that a profile written from a preset predicts an offload plan as
  // the preset does (they are never fitted).
  y << "  host_link: " << link_text(c.host_link) << "\n";
  if (c.host_memory_bytes > 0) y << "  host_memory: " << bytes_text(c.host_memory_bytes) << "\n";
  y << "  host_memory_bandwidth: " << bw_text(c.host_memory_Bps) << "\n";
  y << "network:\n"
    << "  nics_per_node: " << c.nics_per_node << "\n"
    << "  nic: " << link_text(c.nic) << "\n";
  if (c.pcie.bw_Bps > 0) y << "  pcie: " << link_text(c.pcie) << "\n";
  y
    << "  fabric: {kind: fat_tree, levels: " << c.fabric.levels
    << ", oversubscription: " << number(c.fabric.oversubscription) << ", leaf_radix: " << c.fabric.leaf_radix
    << ", switch_latency: " << time_text(c.fabric.switch_latency_s) << "}\n";
  if (!c.intra_node_allreduce.empty() || !c.inter_node_allreduce.empty()) {
    y << "calibration:\n";
    // The links under the curves: what-ifs on the links above rescale the curves by these.
    const CalibrationLinks& m = c.measured_on;
    y << "  measured_on: {nvlink: " << link_text(m.nvlink) << ", nic: " << link_text(m.nic);
    if (m.pcie.bw_Bps > 0) y << ", pcie: " << link_text(m.pcie);
    y << ", switch_latency: " << time_text(m.switch_latency_s) << "}\n";
    write_curve(y, "intra_node_allreduce", c.intra_node_allreduce, c.intra_node_reference_gpus);
    write_curve(y, "inter_node_allreduce", c.inter_node_allreduce, c.inter_node_reference_gpus_per_node);
    write_curve(y, "oversubscribed_allreduce", c.oversubscribed_allreduce, 0);
    write_curve(y, "intra_node_ring", c.intra_node_ring, 0);
  }
  return y.str();
}

}  // namespace ptdp
