// From measurements to a topology profile (the GEMM-efficiency fit is model/efficiency_fit.hpp's)
// and the profile's YAML. Plain C++ (in every build); the measuring is in calibrate.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "core/error.hpp"
#include "exec/runtime/cuda/calibrate.hpp"
#include "model/cost.hpp"
#include "topologies/cluster_yaml.hpp"

namespace ptdp::exec::cuda {
namespace {

BandwidthCurve curve_of(const std::vector<BandwidthSample>& samples, double small_s) {
  BandwidthCurve c;
  c.small_message_s = small_s;
  for (const BandwidthSample& s : samples)
    if (s.bw_Bps > 0) c.points.emplace_back(s.bytes, s.bw_Bps);
  std::sort(c.points.begin(), c.points.end());
  return c;
}

double best_bandwidth(const std::vector<BandwidthSample>& samples) {
  double best = 0;
  for (const BandwidthSample& s : samples) best = std::max(best, s.bw_Bps);
  return best;
}

}  // namespace

ClusterSpec profile_from(const CalibrationResult& r, const ClusterSpec& base) {
  ClusterSpec c = base;
  c.source.clear();
  c.name = base.name + "-calibrated";
  if (!r.gpu_name.empty()) c.gpu.name = r.gpu_name;
  if (r.memory_bytes > 0) c.gpu.memory_bytes = r.memory_bytes;
  if (r.peak_flops > 0) c.gpu.peak_flops = r.peak_flops;
  if (r.hbm_nominal_Bps > 0) {
    c.gpu.hbm_Bps = r.hbm_nominal_Bps;
    if (r.stream_Bps > 0) c.gpu.elementwise_efficiency = std::min(1.0, r.stream_Bps / r.hbm_nominal_Bps);
  } else if (r.stream_Bps > 0) {  // no nominal figure: the measured one, at efficiency 1
    c.gpu.hbm_Bps = r.stream_Bps;
    c.gpu.elementwise_efficiency = 1.0;
  }
  if (r.kernel_launch_s > 0) c.gpu.kernel_launch_s = r.kernel_launch_s;
  if (!r.gemm.empty() && c.gpu.peak_flops > 0) {
    // The cost model adds kernel_launch to every GEMM: fit the efficiency of the time without it.
    std::vector<GemmSample> busy;
    for (const GemmSample& g : r.gemm) {
      const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
      const double seconds = flops / g.flops_per_s - c.gpu.kernel_launch_s;
      if (seconds > 0) busy.push_back({g.m, g.n, g.k, flops / seconds});
    }
    if (busy.size() < 4)
      throw EnvironmentError("calibration: fewer than 4 GEMM shapes took longer than a kernel launch; nothing to fit");
    const GemmFit f = fit_gemm_efficiency(busy, c.gpu.peak_flops);
    c.gpu.gemm_max_efficiency = f.max_efficiency;
    c.gpu.gemm_half_dim = f.half_dim;
    c.gpu.gemm_half_k = f.half_k;
    c.gpu.gemm_thin_exponent = f.thin_exponent;
  }
  if (r.gpus_per_node > 1 || r.nodes > 1) c.gpus_per_node = r.gpus_per_node;
  if (const double bw = best_bandwidth(r.intra_p2p); bw > 0) {
    c.nvlink.bw_Bps = bw;
    c.nvlink.latency_s = r.intra_p2p_latency_s;
  }
  if (const double bw = best_bandwidth(r.inter_p2p); bw > 0) {
    c.nic.bw_Bps = bw;
    c.nic.latency_s = r.inter_p2p_latency_s;
  }
  // The curves are efficiencies of the links they were measured on: record those links.
  if (!c.measured_on.recorded) c.measured_on = CalibrationLinks{c.nvlink, c.nic, c.pcie, c.fabric.switch_latency_s, true};
  if (!r.intra_allreduce.empty()) {
    c.intra_node_allreduce = curve_of(r.intra_allreduce, r.intra_small_s);
    c.intra_node_reference_gpus = r.gpus_per_node;
    c.measured_on.nvlink = c.nvlink;
  }
  if (!r.inter_allreduce.empty()) {
    c.inter_node_allreduce = curve_of(r.inter_allreduce, r.inter_small_s);
    c.inter_node_reference_gpus_per_node = r.gpus_per_node;
    c.measured_on.nic = c.nic;
    c.measured_on.pcie = c.pcie;
    c.measured_on.switch_latency_s = c.fabric.switch_latency_s;
  }
  validate_cluster(c);
  return c;
}


std::string calibrate_topology(Communicator& world, const ClusterSpec& base, const CalibrationOptions& options) {
  const CalibrationResult r = calibrate_cuda(world, options);
  if (world.rank() != 0) return "";
  const ClusterSpec c = profile_from(r, base);
  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
  std::ostringstream note;
  note << "Measured by `ptdp calibrate --backend cuda` on " << date << ": " << r.nodes << " node(s) x "
       << r.gpus_per_node << " " << r.gpu_name << ".\n"
       << "peak_flops: " << r.peak_source << ".\n"
       << "Measured: GEMM efficiency (fit to " << r.gemm.size() << " bf16 shapes), HBM stream bandwidth, kernel launch";
  if (!r.intra_p2p.empty()) note << ", NVLink p2p";
  if (!r.intra_allreduce.empty()) note << ", intra-node all-reduce";
  if (!r.inter_p2p.empty()) note << ", NIC p2p, inter-node all-reduce";
  note << ".\nKept from '" << base.name << "': iteration_overhead, nics_per_node, fabric"
       << (r.inter_allreduce.empty() ? ", nic and inter-node all-reduce (one node measured)" : "") << ".";
  if (!r.ib_devices.empty()) {
    note << "\nInfiniBand devices on rank 0's node:";
    for (const std::string& d : r.ib_devices) note << " " << d;
    note << " (set network.nics_per_node to the compute NICs among them).";
  }
  return to_yaml(c, note.str());
}

}  // namespace ptdp::exec::cuda
