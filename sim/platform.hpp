// SimGrid platform of a GPU cluster: per node the GPUs on an NVSwitch; one NIC per GPU to a
// rail-optimised fat tree (leaf switch per rail and group of nodes, leaves joined by a core
// whose uplinks carry the configured oversubscription). Only sim/ sees SimGrid.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "topologies/cluster.hpp"

namespace simgrid::s4u {
class Host;
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
};

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

}  // namespace ptdp
