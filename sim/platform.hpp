// SimGrid platform of a GPU cluster: per node the GPUs on an NVSwitch; one NIC per GPU to a
// rail-optimised fat tree (leaf switch per rail and group of nodes, leaves joined by a core
// whose uplinks carry the configured oversubscription). Only sim/ sees SimGrid.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "topologies/cluster.hpp"

namespace simgrid::s4u {
class Host;
class Link;
}

namespace ptdp {

struct Platform {
  std::vector<simgrid::s4u::Host*> gpus;  // indexed by global rank
  /// CPU back end (cluster.cpu_host()): per node one host whose cores the node's ranks
  /// share; computation runs there, so ranks that wait leave their share to the others.
  std::vector<simgrid::s4u::Host*> node_cpus;
  int64_t nodes = 0;
  int64_t leaf_groups = 0;
  size_t links = 0;
  size_t routes = 0;
  /// Every link direction of the fabric (each split-duplex link's up and down, SimGrid's
  /// loopback last), indexed by link id.
  std::vector<const simgrid::s4u::Link*> directed_links;
  /// The route between global ranks a → b as link ids (empty: none), link for link what
  /// `gpus[a]->route_to(gpus[b], …)` gives, computed without SimGrid's route lookup (the reduced
  /// engine compares tens of thousands of ring flows' routes). `into` is cleared first.
  std::function<void(int64_t a, int64_t b, std::vector<int32_t>& into)> route;
  /// Registers the routes between the given pairs of global ranks (add_routes).
  std::function<void(const std::vector<std::pair<int64_t, int64_t>>& pairs)> add_pairs;
};

/// Everything SimGrid's hosts and links of a cluster's platform are made of: build_hosts_and_links
/// reads nothing else, so two clusters (and GPU counts) with equal shapes get the same hosts and
/// links, one for one (what lets a SimulationPool build them once for several plans).
struct PlatformShape {
  int64_t gpus = 0;
  int gpus_per_node = 0;
  int64_t leaf_radix = 0;
  double nic_Bps = 0, oversubscription = 1;  // a leaf's uplink: its ports × NIC ÷ oversubscription
  double fabric_latency_s = 0;     // leaf → core → leaf
  double nvlink_Bps = 0, nvlink_latency_s = 0;
  double nic_path_Bps = 0, nic_path_latency_s = 0;  // GPU → leaf: PCIe, NIC and the leaf port
  double cores_per_node = 0;       // CPU back end: a host per node (0: none)
  bool operator==(const PlatformShape&) const = default;
};
PlatformShape platform_shape(const ClusterSpec& cluster, int64_t gpus);

/// Speed of a simulated GPU host: execution amounts are seconds × this (keeps SimGrid's
/// absolute precision thresholds far below our durations).
inline constexpr double kHostSpeed = 1e12;

/// Builds the platform for `gpus` GPUs, with routes between the given pairs of global ranks
/// (the pairs a plan communicates between; routes are explicit, no shortest-path search), and
/// installs size-dependent bandwidth factors from the topology's curves. Call once, after the
/// Engine is created and configured, before actors start.
///   same node:              GPU → NVSwitch → GPU
///   same rail:              NIC → leaf (→ core → leaf) → NIC
///   different rails (PXN):  NVLink to the peer rail's GPU of the source node, then its NIC.
Platform build_platform(const ClusterSpec& cluster, int64_t gpus, const std::vector<std::pair<int64_t, int64_t>>& pairs);

/// build_platform in three steps: the hosts and links (before any route; the zone is sealed),
/// the routes between `pairs` (may follow the seal: the zone computes routes when asked), and the
/// size-dependent bandwidth factors from the cluster's curves (before actors start).
Platform build_hosts_and_links(const PlatformShape& shape);
void add_routes(Platform& pf, const std::vector<std::pair<int64_t, int64_t>>& pairs);
void set_bandwidth_factors(const Platform& pf, const ClusterSpec& cluster);

}  // namespace ptdp
