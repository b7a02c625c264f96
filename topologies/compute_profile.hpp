// The compute side of a cluster's GPU as the cost model (model/cost.hpp) sees it.
#pragma once

#include "model/cost.hpp"
#include "topologies/cluster.hpp"

namespace ptdp {

/// The cluster's GPU as a ComputeProfile (peak, bandwidth, efficiency model, launch cost).
ComputeProfile compute_profile(const ClusterSpec& cluster);

}  // namespace ptdp
