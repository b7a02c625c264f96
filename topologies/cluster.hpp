// ClusterSpec: the GPUs, nodes, links and fabric of a cluster, and where each rank runs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gpu.hpp"

namespace ptdp {

/// One direction of a link: bandwidth and latency.
struct LinkSpec {
  double bw_Bps = 0;
  double latency_s = 0;
};

/// Measured collective bus bandwidth by message size (nccl-tests busbw), for one domain.
/// Interpolated in log(size). The curve is turned into an efficiency of the links it was
/// measured on (ClusterSpec::measured_on), so that other links scale it (collectives.hpp).
struct BandwidthCurve {
  std::vector<std::pair<double, double>> points;  // (message bytes, busbw B/s), sorted by size
  double small_message_s = 0;                      // time of a tiny collective (latency floor)
  bool empty() const { return points.empty(); }
};

/// The links the bus-bandwidth curves were measured on (the `calibration.measured_on` section of
/// a preset). Collective costs on the cluster's own links are these measurements rescaled.
struct CalibrationLinks {
  LinkSpec nvlink;
  LinkSpec nic;
  LinkSpec pcie;                   // bandwidth 0: the GPU–NIC path did not limit
  double switch_latency_s = 0;
  bool recorded = false;           // the section was given
};

enum class FabricKind { FatTree };

struct FabricSpec {
  FabricKind kind = FabricKind::FatTree;
  int levels = 3;
  double oversubscription = 1.0;   // leaf uplink bandwidth = downlink / oversubscription
  int leaf_radix = 32;             // NIC ports per leaf (rail) switch downstream
  double switch_latency_s = 0.3e-6;
};

struct ClusterSpec {
  std::string name = "cluster";
  std::string source;              // file it was loaded from (for messages)
  GpuSpec gpu;
  int gpus_per_node = 8;
  /// CPU back end: cores the node's ranks share (0 = each device computes on its own, as GPUs
  /// do). With r ranks on c < r cores each rank computes at c / r of its speed.
  double cores_per_node = 0;
  /// The devices are a host's CPU cores (cores_per_node given): collectives block the core that
  /// computes, so nothing overlaps them; GPUs otherwise.
  bool cpu_host() const { return cores_per_node > 0; }
  /// Communication runs beside compute (a GPU's own streams and copy engines), so an overlap can
  /// hide it; on a CPU host the collective blocks the core and hides nothing. Every overlap the
  /// engines price asks this.
  bool overlaps_communication() const { return !cpu_host(); }
  /// CPU back end: how late a rank that slept in a blocking wait resumes after its data arrived
  /// (measured by calibrate). Charged to every pipeline receive when a node has more ranks than
  /// cores (the executor then sleeps instead of polling; exec/runtime/mpi_communicator.cpp).
  double wakeup_latency_s = 0;
  int max_nodes = 0;               // 0 = as many as needed
  double node_power_w = 0;         // per node besides its GPUs (CPUs, memory, NICs, switches, fans)
  /// GPU ↔ host memory path for offloading (PCIe), per GPU and direction.
  LinkSpec host_link{25e9, 1e-6};
  double host_memory_bytes = 0;     // per node; 0 = unknown (not checked)
  double host_memory_Bps = 200e9;   // per node, all CPU sockets (the host optimizer step is bound by it)
  LinkSpec nvlink;                 // per GPU, per direction, to the NVSwitch
  LinkSpec nic;                    // per NIC, per direction
  /// GPU ↔ NIC path (PCIe switch, GPUDirect RDMA), per GPU and direction; bandwidth 0 = not a
  /// limit. Inter-node traffic flows at min(NIC, PCIe) and pays both latencies.
  LinkSpec pcie;
  int nics_per_node = 8;           // compute NICs, one per GPU on DGX (rail-optimised)
  FabricSpec fabric;
  BandwidthCurve intra_node_allreduce;  // e.g. 8 GPUs on NVSwitch
  BandwidthCurve inter_node_allreduce;  // e.g. 16 GPUs on 2 nodes, one NIC per GPU
  /// Inside a node whose all-reduce curve is NVLink SHARP's (NVLS): the ring collectives' curve,
  /// which all-gathers, reduce-scatters and all-reduces of ≤ 4 GPUs follow (collectives.cpp).
  /// Empty: everything follows intra_node_allreduce.
  BandwidthCurve intra_node_ring;
  /// CPU back end: the intra-node curve as measured with the executor's waits in their sleeping
  /// mode, which they use when a node has more ranks than cores (exec/runtime/mpi_communicator.cpp);
  /// plans that oversubscribe the cores are costed with it (sim/costing.hpp: cluster_for_plan).
  BandwidthCurve oversubscribed_allreduce;
  int inter_node_reference_gpus_per_node = 8;  // GPUs per node in the inter-node measurement
  int intra_node_reference_gpus = 0;           // GPUs in the intra-node measurement (0 = a full node)
  CalibrationLinks measured_on;                // links under both curves (required with curves)
};

/// Checks bandwidths > 0, latencies ≥ 0, sizes ≥ 1; throws ConfigError with the key path
/// ("cluster.topology.nvlink.bandwidth").
void validate_cluster(const ClusterSpec& c);
/// Also checks `gpus` fit (≤ max_nodes × gpus_per_node when max_nodes is set).
void validate_cluster_for(const ClusterSpec& c, int64_t gpus);

inline int64_t node_of(int64_t rank, int gpus_per_node) { return rank / gpus_per_node; }

}  // namespace ptdp
