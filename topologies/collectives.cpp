#include "topologies/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ptdp {
namespace {

double ring_factor(double n) { return 2 * (n - 1) / n; }

// The links a cost is computed on: the cluster's own, or those its curves were measured on.
struct Links {
  LinkSpec nvlink, nic, pcie;
  double switch_latency_s = 0;
};
Links own_links(const ClusterSpec& c) { return {c.nvlink, c.nic, c.pcie, c.fabric.switch_latency_s}; }
Links measured_links(const ClusterSpec& c) {
  if (!c.measured_on.recorded) return own_links(c);
  const CalibrationLinks& m = c.measured_on;
  return {m.nvlink, m.nic, m.pcie, m.switch_latency_s};
}
double nic_path(const Links& l) { return l.pcie.bw_Bps > 0 ? std::min(l.nic.bw_Bps, l.pcie.bw_Bps) : l.nic.bw_Bps; }
// Latency of one ring step: NVLink inside a node; across nodes NIC, PCIe and the two switch
// hops of a rail (leaf down and up).
double hop_s(const Links& l, bool inter) {
  return inter ? l.nic.latency_s + l.pcie.latency_s + 2 * l.switch_latency_s : l.nvlink.latency_s;
}
// Bandwidth a ring gets per member: NVLink inside a node; across nodes the node's NICs in
// parallel (per_node of them), never more than NVLink.
double ring_link_Bps(const Links& l, bool inter, double per_node, double uplink_share) {
  return inter ? std::min(l.nvlink.bw_Bps, per_node * nic_path(l) * uplink_share) : l.nvlink.bw_Bps;
}

const BandwidthCurve& curve_of(const ClusterSpec& c, bool inter) { return inter ? c.inter_node_allreduce : c.intra_node_allreduce; }

// What a collective reads inside a node: with a separate ring curve (NVSwitch gen 3+: the
// all-reduce curve is NVLink SHARP's), all-gathers and reduce-scatters, and all-reduces of at most
// 4 GPUs (NCCL gives no multicast to ≤ 4-GPU partitions), run at the ring's bandwidth.
const BandwidthCurve& curve_for(const ClusterSpec& c, bool inter, bool allreduce, int64_t size) {
  if (inter || c.intra_node_ring.empty()) return curve_of(c, inter);
  return allreduce && size > 4 ? c.intra_node_allreduce : c.intra_node_ring;
}

// Reference group of a curve: the intra-node curve was measured on one full node, the
// inter-node one on two full nodes.
double reference_size(const ClusterSpec& c, bool inter) {
  if (inter) return 2.0 * c.inter_node_reference_gpus_per_node;
  return static_cast<double>(c.intra_node_reference_gpus > 0 ? c.intra_node_reference_gpus : c.gpus_per_node);
}
double reference_link_Bps(const ClusterSpec& c, bool inter) {
  return ring_link_Bps(measured_links(c), inter, c.inter_node_reference_gpus_per_node, 1.0);
}

// Measured all-reduce time at `bytes` on the reference group: busbw interpolated linearly in
// log(size) between points; below the smallest point the time falls linearly towards the
// small-message time.
double curve_time_s(const BandwidthCurve& curve, double n_ref, double bytes) {
  const auto& pts = curve.points;
  if (bytes <= pts.front().first) {
    const double s0 = pts.front().first;
    const double t0 = ring_factor(n_ref) * s0 / pts.front().second;
    const double floor = std::min(curve.small_message_s, t0);
    return floor + (t0 - floor) * (bytes / s0);
  }
  double busbw = pts.back().second;
  if (bytes < pts.back().first) {
    auto hi = std::upper_bound(pts.begin(), pts.end(), bytes, [](double b, const auto& p) { return b < p.first; });
    auto lo = hi - 1;
    const double w = (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
    busbw = lo->second + w * (hi->second - lo->second);
  }
  return ring_factor(n_ref) * bytes / busbw;
}

// The measured floor: never more than the time of the smallest measured message.
double curve_floor_s(const BandwidthCurve& curve, double n_ref) {
  const auto& p0 = curve.points.front();
  return std::min(curve.small_message_s, ring_factor(n_ref) * p0.first / p0.second);
}

}  // namespace

double nic_path_Bps(const ClusterSpec& c) { return nic_path(own_links(c)); }

bool crosses_leaf(const ClusterSpec& c, int64_t a, int64_t b) {
  const int64_t radix = std::max(1, c.fabric.leaf_radix);
  return node_of(a, c.gpus_per_node) / radix != node_of(b, c.gpus_per_node) / radix;
}

GroupShape group_shape(const ClusterSpec& c, int64_t size, int64_t stride, int64_t first_rank) {
  GroupShape g;
  g.size = size;
  const int64_t gpn = c.gpus_per_node;
  if (size <= 1) return g;
  g.crosses_leaf = crosses_leaf(c, first_rank, first_rank + stride * (size - 1));
  const int64_t offset = first_rank % gpn;  // where in its node the group starts
  if (offset + stride * (size - 1) < gpn) {
    g.nodes = 1;
    g.per_node = size;
  } else if (stride >= gpn) {  // one member per node
    g.nodes = size;
    g.per_node = 1;
  } else {
    // Member i sits at offset + i·stride of the nodes from the group's first one. With stride <
    // gpn every node between the first and the last holds a member: the nodes are the span. The
    // node with the fewest members (fewest NICs) bounds the group's inter-node bandwidth. Node k
    // holds the members at positions [k·gpn, (k + 1)·gpn): the first node those below gpn, the
    // last those from last·gpn on, the nodes between gpn / stride each when stride divides gpn
    // (else counted per node, not per member).
    const int64_t last = offset + stride * (size - 1);
    const int64_t last_node = last / gpn;
    auto before = [&](int64_t position) {  // members at positions below `position`
      return position <= offset ? int64_t{0} : std::min(size, (position - offset + stride - 1) / stride);
    };
    g.nodes = last_node + 1;
    g.per_node = std::min(before(gpn), size - before(last_node * gpn));
    if (last_node >= 2) {
      if (gpn % stride == 0) {
        g.per_node = std::min(g.per_node, gpn / stride);
      } else {
        for (int64_t k = 1; k < last_node; ++k) g.per_node = std::min(g.per_node, before((k + 1) * gpn) - before(k * gpn));
      }
    }
  }
  return g;
}

double curve_factor(const ClusterSpec& c, const BandwidthCurve& curve, bool inter, double bytes);

double bandwidth_factor(const ClusterSpec& c, bool inter, double bytes) { return curve_factor(c, curve_of(c, inter), inter, bytes); }

double curve_factor(const ClusterSpec& c, const BandwidthCurve& curve, bool inter, double bytes) {
  if (curve.empty() || bytes <= 0) return 1.0;
  const double n_ref = reference_size(c, inter);
  const double total = curve_time_s(curve, n_ref, std::max(bytes, curve.points.front().first));
  const double wire = std::max(total - curve_floor_s(curve, n_ref), 1e-3 * total);
  return ring_factor(n_ref) * std::max(bytes, curve.points.front().first) / (wire * reference_link_Bps(c, inter));
}

double p2p_bandwidth_factor(const ClusterSpec& c, bool inter, double bytes) {
  return bandwidth_factor(c, inter, bytes * reference_size(c, inter));
}

namespace {
double busbw_Bps(const ClusterSpec& c, const GroupShape& g, double bytes, bool allreduce) {
  const bool inter = g.nodes > 1;
  const double uplink = g.crosses_leaf ? 1.0 / c.fabric.oversubscription : 1.0;
  return ring_link_Bps(own_links(c), inter, static_cast<double>(g.per_node), uplink) *
         curve_factor(c, curve_for(c, inter, allreduce, g.size), inter, bytes);
}

double latency_s(const ClusterSpec& c, const GroupShape& g, bool allreduce) {
  if (g.size <= 1) return 0;
  const bool inter = g.nodes > 1;
  const double n = static_cast<double>(g.size);
  const double hop_now = hop_s(own_links(c), inter);
  const BandwidthCurve& curve = curve_for(c, inter, allreduce, g.size);
  if (curve.empty()) return 2 * (n - 1) * hop_now;
  // The measured floor holds the hop latencies of the reference ring (2(n_ref−1) steps, fewer
  // when the floor is smaller than that: NCCL pipelines small messages) plus software time;
  // only the hop part follows the links. Steps beyond the reference ring add a hop each.
  const double n_ref = reference_size(c, inter);
  const double hop_ref = hop_s(measured_links(c), inter);
  const double floor = curve_floor_s(curve, n_ref);
  const double steps = hop_ref > 0 ? std::min(2 * (n_ref - 1), floor / hop_ref) : 2 * (n_ref - 1);
  const double t = floor + steps * (hop_now - hop_ref) + 2 * std::max(0.0, n - n_ref) * hop_now;
  return std::max(0.0, t);
}
}  // namespace

double allreduce_busbw_Bps(const ClusterSpec& c, const GroupShape& g, double bytes) { return busbw_Bps(c, g, bytes, true); }

double allreduce_latency_s(const ClusterSpec& c, const GroupShape& g) { return latency_s(c, g, true); }

double allreduce_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(g.size);
  return allreduce_latency_s(c, g) + ring_factor(n) * bytes / allreduce_busbw_Bps(c, g, bytes);
}

double allgather_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(g.size);
  // An all-gather is one half of a ring all-reduce: half the steps, half the data (at the ring's
  // bandwidth: NVLink SHARP serves all-reduces only).
  return 0.5 * latency_s(c, g, false) + (n - 1) / n * bytes / busbw_Bps(c, g, bytes, false);
}

double reduce_scatter_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) { return allgather_time_s(c, g, bytes); }

double alltoall_time_s(const ClusterSpec& c, const GroupShape& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(g.size), local = static_cast<double>(std::min(g.per_node, g.size));
  const Links l = own_links(c);
  // Each peer's part travels as one point-to-point message of bytes/n: its efficiency is read there.
  const double part = bytes / n;
  if (!c.cpu_host()) {
    // GPUs: NCCL's all-to-all has a bandwidth curve of its own (kernel-and-framework facts §3,
    // nccl-tests busbw at large sizes). Inside an NVLink domain 0.71 of the link's nominal
    // bandwidth (A100 210 of 300, H100 320 of 450, B200 640 of 900 GB/s); across nodes all of a
    // rank's (n − 1)/n leaves at one NIC's rate, its node peers' share included ("alltoall cannot
    // aggregate the bandwidth of multiple NICs": 8×400G DGX H100 48 GB/s, 8×200G DGX A100 24 GB/s),
    // at the NIC's point-to-point efficiency. Messages below the curve's plateau run slower.
    constexpr double kAllToAllNvlinkShare = 0.711;
    const double out = (n - 1) / n * bytes;
    if (g.nodes <= 1)
      return 0.5 * latency_s(c, g, false) +
             out / (l.nvlink.bw_Bps * std::min(1.0, p2p_bandwidth_factor(c, false, part)) * kAllToAllNvlinkShare);
    const double uplink = g.crosses_leaf ? 1.0 / c.fabric.oversubscription : 1.0;
    return 0.5 * latency_s(c, g, false) +
           out / (std::min(l.nvlink.bw_Bps, nic_path_Bps(c) * uplink) * std::min(1.0, p2p_bandwidth_factor(c, true, part)));
  }
  const double intra_s = (local - 1) / n * bytes / (l.nvlink.bw_Bps * p2p_bandwidth_factor(c, false, part));
  double inter_s = 0;
  if (g.nodes > 1) {
    const double uplink = g.crosses_leaf ? 1.0 / c.fabric.oversubscription : 1.0;
    inter_s = (n - local) / n * bytes / (std::min(l.nvlink.bw_Bps, nic_path_Bps(c) * uplink) * p2p_bandwidth_factor(c, true, part));
  }
  return 0.5 * latency_s(c, g, false) + std::max(intra_s, inter_s);
}

double expected_other_groups(int64_t groups, int64_t copies) {
  if (groups <= 1 || copies <= 0) return 0;
  const double N = static_cast<double>(groups);
  // Each copy lands in a given group with probability 1/N: another group is reached unless all
  // copies miss it.
  return (N - 1) * (1 - std::pow(1 - 1 / N, static_cast<double>(copies)));
}

double deepep_alltoall_time_s(const ClusterSpec& c, const GroupShape& g, double bytes, int64_t copies) {
  if (g.size <= 1 || bytes <= 0) return 0;
  if (c.cpu_host() || copies <= 0) return alltoall_time_s(c, g, bytes);
  // DeepEP sends a token once to each other rank that holds one of its experts (the rank expands
  // it), where Megatron's NCCL all-to-all sends each of its k copies. Its NVLink kernels
  // (kernel-and-framework facts §3, 4096 tokens per rank, h 7168, top 8) move those bytes at a
  // share of the link fitted to both published figures with the latency floor below included:
  // SM100 EP 8 dispatch / combine 726 / 740 GB/s on B200 (900 GB/s links) → model 706; H800
  // (NVLink cut to 200 GB/s) 153 / 158 → model 165. Measured at one size: no size curve.
  constexpr double kDeepEpNvlinkShare = 0.84;
  const Links l = own_links(c);
  const double per_node = static_cast<double>(std::min(g.per_node, g.size));
  const double token_bytes = bytes / static_cast<double>(copies);
  const double ranks = expected_other_groups(g.size, copies);  // other ranks a token reaches
  const double nvlink_Bps = l.nvlink.bw_Bps * kDeepEpNvlinkShare;
  if (g.nodes <= 1) return 0.5 * latency_s(c, g, false) + token_bytes * ranks / nvlink_Bps;
  // Across nodes: one RDMA copy per other node a token reaches (to the GPU of the same index
  // there), at one NIC's rate (DeepEP V1 internode EP 16 / 32 / 64: 43 / 58 / 51 GB/s on 400 Gb/s
  // CX7); that GPU forwards it over NVLink to the node's ranks that hold its experts, the copies
  // to the sender's own node likewise, all at the same time.
  const double uplink = g.crosses_leaf ? 1.0 / c.fabric.oversubscription : 1.0;
  const double rdma_bytes = token_bytes * expected_other_groups(g.nodes, copies);
  const double rdma_Bps = std::min(l.nvlink.bw_Bps, nic_path_Bps(c) * uplink);
  const double nvlink_bytes = token_bytes * ranks * (per_node - 1) / per_node;
  return 0.5 * latency_s(c, g, false) + std::max(rdma_bytes / rdma_Bps, nvlink_bytes / nvlink_Bps);
}

double p2p_latency_s(const ClusterSpec& c, bool same_node) {
  const Links l = own_links(c);
  return same_node ? 2 * l.nvlink.latency_s : 2 * (l.nic.latency_s + l.pcie.latency_s) + 2 * l.switch_latency_s * c.fabric.levels;
}

double p2p_time_s(const ClusterSpec& c, bool same_node, double bytes, bool across_leaves) {
  if (bytes <= 0) return 0;
  const double uplink = across_leaves && !same_node ? 1.0 / c.fabric.oversubscription : 1.0;
  const double link = same_node ? c.nvlink.bw_Bps : std::min(c.nvlink.bw_Bps, nic_path_Bps(c) * uplink);
  return p2p_latency_s(c, same_node) + bytes / (link * p2p_bandwidth_factor(c, !same_node, bytes));
}

}  // namespace ptdp
