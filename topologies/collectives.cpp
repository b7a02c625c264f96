#include "topologies/collectives.hpp"

#include <algorithm>
#include <cmath>

namespace ptdp {
namespace {

double ring_factor(double n) { return 2 * (n - 1) / n; }

// Reference group of a curve: the intra-node curve was measured on one full node, the
// inter-node one on two full nodes.
double reference_size(const ClusterSpec& c, bool inter) {
  if (inter) return 2.0 * c.inter_node_reference_gpus_per_node;
  return static_cast<double>(c.intra_node_reference_gpus > 0 ? c.intra_node_reference_gpus : c.gpus_per_node);
}
double reference_link_Bps(const ClusterSpec& c, bool inter) {
  return inter ? std::min(c.nvlink.bw_Bps, c.nic.bw_Bps * c.inter_node_reference_gpus_per_node) : c.nvlink.bw_Bps;
}

// Measured bus bandwidth at `bytes`, interpolated linearly in log(size) between points; below the
// smallest point the time falls linearly towards the small-message time.
double curve_busbw(const BandwidthCurve& curve, double n_ref, double bytes) {
  const auto& pts = curve.points;
  if (bytes <= pts.front().first) {
    const double s0 = pts.front().first;
    const double t0 = ring_factor(n_ref) * s0 / pts.front().second;
    const double floor = std::min(curve.small_message_s, t0);
    const double t = floor + (t0 - floor) * (bytes / s0);
    return ring_factor(n_ref) * bytes / t;
  }
  if (bytes >= pts.back().first) return pts.back().second;
  auto hi = std::upper_bound(pts.begin(), pts.end(), bytes, [](double b, const auto& p) { return b < p.first; });
  auto lo = hi - 1;
  const double w = (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return lo->second + w * (hi->second - lo->second);
}

}  // namespace

GroupShape group_shape(const ClusterSpec& c, int64_t size, int64_t stride) {
  GroupShape g;
  g.size = size;
  const int64_t gpn = c.gpus_per_node;
  if (size <= 1) return g;
  if (stride * (size - 1) < gpn) {
    g.nodes = 1;
    g.per_node = size;
  } else if (stride >= gpn) {
    g.nodes = size;
    g.per_node = 1;
  } else {
    // Count the nodes the members land on; the node with the fewest members (fewest NICs)
    // bounds the group's inter-node bandwidth.
    g.nodes = 0;
    g.per_node = size;
    int64_t node = -1, count = 0;
    for (int64_t i = 0; i <= size; ++i) {
      const int64_t n = i < size ? (i * stride) / gpn : -2;
      if (n != node) {
        if (node >= 0) g.per_node = std::min(g.per_node, count);
        if (n >= 0) ++g.nodes;
        node = n;
        count = 0;
      }
      ++count;
    }
  }
  return g;
}

double bandwidth_factor(const ClusterSpec& c, bool inter, double bytes) {
  const BandwidthCurve& curve = inter ? c.inter_node_allreduce : c.intra_node_allreduce;
  if (curve.empty() || bytes <= 0) return 1.0;
  return curve_busbw(curve, reference_size(c, inter), bytes) / reference_link_Bps(c, inter);
}

double p2p_bandwidth_factor(const ClusterSpec& c, bool inter, double bytes) {
  return bandwidth_factor(c, inter, bytes * reference_size(c, inter));
}

double allreduce_busbw_Bps(const ClusterSpec& c, const GroupShape& g, double bytes) {
  const bool inter = g.nodes > 1;
  const double link = inter ? std::min(c.nvlink.bw_Bps, static_cast<double>(g.per_node) * c.nic.bw_Bps) : c.nvlink.bw_Bps;
  return link * bandwidth_factor(c, inter, bytes);
}

double allreduce_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const bool inter = g.nodes > 1;
  const double n = static_cast<double>(g.size);
  double t = ring_factor(n) * bytes / allreduce_busbw_Bps(c, g, bytes);
  // Steps beyond those of the measured reference group each add a hop's latency.
  const BandwidthCurve& curve = inter ? c.inter_node_allreduce : c.intra_node_allreduce;
  const double hop_s = inter ? c.nic.latency_s + 2 * c.fabric.switch_latency_s : c.nvlink.latency_s;
  const double n_ref = curve.empty() ? 1.0 : reference_size(c, inter);
  t += 2 * std::max(0.0, n - n_ref) * hop_s;
  return t;
}

double allgather_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(g.size);
  // An all-gather moves half the data of an all-reduce of the same tensor.
  return (n - 1) / n * bytes / allreduce_busbw_Bps(c, g, bytes);
}

double p2p_time_s(const ClusterSpec& c, bool same_node, double bytes) {
  if (bytes <= 0) return 0;
  const LinkSpec& link = same_node ? c.nvlink : c.nic;
  const BandwidthCurve& curve = same_node ? c.intra_node_allreduce : c.inter_node_allreduce;
  // A measured curve already holds the latency (its small-message floor); without one, α + β.
  if (!curve.empty()) return bytes / (link.bw_Bps * p2p_bandwidth_factor(c, !same_node, bytes));
  const double latency = same_node ? link.latency_s : link.latency_s + 2 * c.fabric.switch_latency_s * c.fabric.levels;
  return latency + bytes / link.bw_Bps;
}

}  // namespace ptdp
