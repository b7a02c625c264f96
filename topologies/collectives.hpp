// α-β costs of the collectives and point-to-point transfers of PTD-P on a ClusterSpec's links.
//
// A measured bus-bandwidth curve (nccl-tests) is split into a latency floor (its small-message
// time) and a size-dependent efficiency of the links it was measured on (ClusterSpec::
// measured_on). Costs on the cluster's own links use its bandwidths with that efficiency and
// shift the floor by the change in hop latency, so NVLink, NIC and PCIe bandwidth and latency,
// switch latency, oversubscription and GPUs per node all move the result; on the measured links
// the curve is reproduced exactly.
#pragma once

#include <cstdint>

#include "topologies/cluster.hpp"

namespace ptdp {

/// Shape of a communication group: how many ranks, spread over how many nodes.
struct GroupShape {
  int64_t size = 1;
  int64_t nodes = 1;           // distinct nodes
  int64_t per_node = 1;        // members on each node (size / nodes)
  bool crosses_leaf = false;   // members under different leaf switches (oversubscribed uplinks)
};

/// Group of `size` ranks with stride `stride` in global-rank order (TP: stride 1, DP: stride t),
/// whose first member is global rank `first_rank` (decides which leaf switches it spans).
GroupShape group_shape(const ClusterSpec& c, int64_t size, int64_t stride, int64_t first_rank = 0);

/// Whether the nodes of global ranks a and b sit under different leaf switches.
bool crosses_leaf(const ClusterSpec& c, int64_t rank_a, int64_t rank_b);

/// Bus bandwidth (B/s) a ring all-reduce of `bytes` reaches on this group, latency floor left
/// out: intra-node groups use NVLink; groups across nodes use per_node NICs in parallel (each
/// limited by its PCIe path, and by the oversubscribed uplinks when crossing leaf switches).
double allreduce_busbw_Bps(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Latency part of a ring all-reduce on this group (the measured floor, shifted by the hop
/// latencies of the cluster's links against the measured ones and by the extra ring steps).
double allreduce_latency_s(const ClusterSpec& c, const GroupShape& g);
/// Ring all-reduce time: latency + 2(n−1)/n · bytes / busbw (0 for n = 1).
double allreduce_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Ring all-gather of a tensor of `bytes` in total: half the latency + (n−1)/n · bytes / busbw.
double allgather_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Ring reduce-scatter of a tensor of `bytes` in total (the other half of a ring all-reduce):
/// the same time as the all-gather of that tensor.
double reduce_scatter_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// All-to-all in which every rank sends `bytes` in total, an equal part to each member
/// (itself included): (per_node − 1)/n of it over NVLink and (n − per_node)/n through the rank's
/// own NIC, at the same time; all-to-all cannot aggregate a node's NICs (one NIC's bandwidth per
/// GPU once traffic leaves the node, modern-training-facts §4). Latency as an all-gather's.
double alltoall_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// DeepEP's dispatch or combine (Megatron-Core's flex dispatcher) of `bytes` per rank holding
/// `copies` copies of each token (top-k): a token travels once to each other rank that holds one
/// of its experts (expected under uniform routing), inside an NVLink domain at DeepEP's share of
/// the link; across nodes once per other node at one NIC's rate, forwarded over NVLink there at
/// the same time. GPUs only (a CPU host prices NCCL's all-to-all).
double deepep_alltoall_time_s(const ClusterSpec& c, const GroupShape& g, double bytes, int64_t copies);
/// Expected number of groups other than the sender's that `copies` uniformly routed copies of a
/// token reach among `groups` equal groups (ranks or nodes holding equal shares of the experts).
double expected_other_groups(int64_t groups, int64_t copies);
/// Point-to-point transfer of `bytes` between two ranks (same node: NVLink, else one NIC behind
/// its PCIe path; `across_leaves`: through the oversubscribed leaf uplinks).
double p2p_time_s(const ClusterSpec& c, bool same_node, double bytes, bool across_leaves = false);
/// Latency of one point-to-point transfer: the links of the route (up and down).
double p2p_latency_s(const ClusterSpec& c, bool same_node);
/// Efficiency (0–1 for sane curves) of the measured links that a collective of `bytes` reaches,
/// latency floor removed: measured busbw-time minus floor, against the measured link bandwidth.
/// 1 without a curve.
double bandwidth_factor(const ClusterSpec& c, bool inter_node, double bytes);
/// Efficiency a point-to-point transfer of `bytes` reaches: a ring step of the reference
/// all-reduce moves bytes/n per link, so the efficiency is read at bytes × n.
double p2p_bandwidth_factor(const ClusterSpec& c, bool inter_node, double bytes);
/// Bandwidth of a GPU's path to the network: min(NIC, PCIe when given).
double nic_path_Bps(const ClusterSpec& c);

}  // namespace ptdp
