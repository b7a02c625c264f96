#include "topologies/cluster_yaml.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

namespace ptdp {
namespace {

// "12.5GBps"-style quantities in units that core/units.hpp parses.
std::string quantity(double v, const std::vector<std::pair<double, const char*>>& units) {
  for (const auto& [scale, suffix] : units)
    if (std::fabs(v) >= scale || scale == units.back().first) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g%s", v / scale, suffix);
      return buf;
    }
  return std::to_string(v);
}
std::string bytes_text(double b) {
  for (int p : {40, 30, 20, 10}) {  // exact binary sizes read best as MiB / GiB (not 7812500KiB)
    const double u = std::ldexp(1.0, p);
    if (b >= u && std::fmod(b, u) == 0 && b / u < 1024) {
      const char* names[] = {"KiB", "MiB", "GiB", "TiB"};
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f%s", b / u, names[p / 10 - 1]);
      return buf;
    }
  }
  return quantity(b, {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}, {1, "B"}});
}
std::string bw_text(double v) { return quantity(v, {{1e12, "TBps"}, {1e9, "GBps"}, {1e6, "MBps"}, {1e3, "KBps"}, {1, "Bps"}}); }
std::string time_text(double s) { return quantity(s, {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}}); }
std::string flops_text(double f) { return quantity(f, {{1e15, "PFLOPS"}, {1e12, "TFLOPS"}, {1e9, "GFLOPS"}, {1, "FLOPS"}}); }
std::string link_text(const LinkSpec& l) {
  return "{bandwidth: " + bw_text(l.bw_Bps) + ", latency: " + time_text(l.latency_s) + "}";
}
std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
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
    << "  name: " << quoted(c.gpu.name) << "\n"
    << "  memory: " << bytes_text(c.gpu.memory_bytes) << "\n"
    << "  peak_flops: " << flops_text(c.gpu.peak_flops) << "\n"
    << "  hbm_bandwidth: " << bw_text(c.gpu.hbm_Bps) << "\n"
    << "  gemm_max_efficiency: " << number(c.gpu.gemm_max_efficiency) << "\n"
    << "  gemm_half_dim: " << number(c.gpu.gemm_half_dim) << "\n"
    << "  gemm_half_k: " << number(c.gpu.gemm_half_k) << "\n"
    << "  gemm_thin_exponent: " << number(c.gpu.gemm_thin_exponent) << "\n";
  if (c.gpu.sm_count > 0)
    y << "  sm_count: " << c.gpu.sm_count << "\n"
      << "  gemm_tile_m: " << c.gpu.gemm_tile_m << "\n"
      << "  gemm_tile_n: " << c.gpu.gemm_tile_n << "\n";
  if (c.gpu.fp8_peak_flops > 0)
    y << "  fp8_peak_flops: " << flops_text(c.gpu.fp8_peak_flops) << "\n"
      << "  fp8_gemm_max_efficiency: " << number(c.gpu.fp8_gemm_max_efficiency) << "\n"
      << "  fp8_gemm_half_dim: " << number(c.gpu.fp8_gemm_half_dim) << "\n"
      << "  fp8_backward_slowdown: " << number(c.gpu.fp8_backward_slowdown) << "\n";
  if (c.gpu.mx_formats) y << "  mx_formats: true\n";
  if (c.gpu.attention_fwd_max_efficiency > 0)
    y << "  attention_fwd_max_efficiency: " << number(c.gpu.attention_fwd_max_efficiency) << "\n"
      << "  attention_bwd_max_efficiency: " << number(c.gpu.attention_bwd_max_efficiency) << "\n"
      << "  attention_fwd_seq_half: " << number(c.gpu.attention_fwd_seq_half) << "\n"
      << "  attention_bwd_seq_half: " << number(c.gpu.attention_bwd_seq_half) << "\n"
      << "  attention_head_dim_half: " << number(c.gpu.attention_head_dim_half) << "\n";
  y
    << "  elementwise_efficiency: " << number(c.gpu.elementwise_efficiency) << "\n"
    << "  kernel_launch: " << time_text(c.gpu.kernel_launch_s) << "\n"
    << "  iteration_overhead: " << time_text(c.gpu.iteration_overhead_s) << "\n";
  if (c.gpu.power_w > 0) y << "  power: " << number(c.gpu.power_w) << "W\n  idle_power: " << number(c.gpu.idle_power_w) << "W\n";
  y << "node:\n"
    << "  gpus: " << c.gpus_per_node << "\n";
  if (c.cores_per_node > 0) y << "  cores: " << number(c.cores_per_node) << "\n";
  if (c.cores_per_node > 0 || c.wakeup_latency_s > 0) y << "  wakeup_latency: " << time_text(c.wakeup_latency_s) << "\n";
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
