// α-β costs of the collectives and point-to-point transfers of PTD-P on a ClusterSpec's links,
// scaled by the measured size-dependent bus-bandwidth curves.
#pragma once

#include <cstdint>

#include "topologies/cluster.hpp"

namespace ptdp {

/// Shape of a communication group: how many ranks, spread over how many nodes.
struct GroupShape {
  int64_t size = 1;
  int64_t nodes = 1;           // distinct nodes
  int64_t per_node = 1;        // members on each node (size / nodes)
};

/// Group of `size` ranks with stride `stride` in global-rank order (TP: stride 1, DP: stride t).
GroupShape group_shape(const ClusterSpec& c, int64_t size, int64_t stride);

/// Bus bandwidth (B/s) a ring all-reduce of `bytes` reaches on this group:
/// intra-node groups use NVLink; groups across nodes use per_node NICs in parallel.
double allreduce_busbw_Bps(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Ring all-reduce time: 2(n−1)/n · bytes / busbw (0 for n = 1).
double allreduce_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Ring all-gather of a tensor of `bytes` in total: (n−1)/n · bytes / busbw.
double allgather_time_s(const ClusterSpec& c, const GroupShape& g, double bytes);
/// Point-to-point transfer of `bytes` between two ranks (same node: NVLink, else one NIC).
double p2p_time_s(const ClusterSpec& c, bool same_node, double bytes);
/// Fraction of link bandwidth an all-reduce of `bytes` reaches in a domain (from the curves).
double bandwidth_factor(const ClusterSpec& c, bool inter_node, double bytes);
/// Fraction of link bandwidth a point-to-point transfer of `bytes` reaches: a ring step of the
/// reference all-reduce moves bytes/n per link, so the factor is read at bytes × n.
double p2p_bandwidth_factor(const ClusterSpec& c, bool inter_node, double bytes);

}  // namespace ptdp
