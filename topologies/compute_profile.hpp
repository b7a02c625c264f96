// The compute side of a cluster's GPU as the cost model (model/cost.hpp) sees it.
#pragma once

#include "model/cost.hpp"
#include "topologies/cluster.hpp"

namespace ptdp {

/// The peak MFU is measured against: the FP8 peak for FP8 training (on GPUs that have one), else
/// the dense bf16/fp16 peak.
double mfu_peak_flops(const ClusterSpec& cluster, const ParallelPlan& plan);

}  // namespace ptdp
