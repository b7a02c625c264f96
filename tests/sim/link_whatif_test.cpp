// What-ifs on the links (NVLink, NIC, PCIe bandwidth and latency, switch latency,
// oversubscription, GPUs per node) move the prediction in the direction physics says, in every
// fidelity. The bus-bandwidth curves of the preset are efficiencies of the links they were
// measured on, so changing a link must not cancel out (issue 13).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;
constexpr Fidelity kAll[] = {Fidelity::Analytic, Fidelity::Reduced, Fidelity::Full};

double iteration_s(const std::string& file, std::vector<Override> sets, Fidelity f) {
  const Scenario sc = load_scenario(kRoot + "/" + file, sets);
  return simulate(input_of(sc), make_schedule(sc.plan), f, false)
      .report.iteration_time_s;
}

// 18.4B, t 8 p 4 d 4 on 128 GPUs (16 nodes): pipeline and data-parallel traffic between nodes.
std::vector<Override> across_nodes(std::vector<Override> extra = {}) {
  std::vector<Override> sets = {{"cluster.gpus", "128"},          {"parallel.pipeline", "4"},  {"parallel.data", "4"},
                                {"training.global_batch", "128"}, {"training.micro_batch", "1"}};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return sets;
}
const char* kBig = "scenarios/paper/gpt-18.4b.yaml";

// 1.7B, t 1 p 1 d 8 on one DGX node: data parallel over NVLink only.
std::vector<Override> one_node(std::vector<Override> extra = {}) {
  std::vector<Override> sets = {{"cluster.gpus", "8"}, {"parallel.data", "8"}, {"training.global_batch", "128"}};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return sets;
}
const char* kSmall = "scenarios/paper/gpt-1.7b.yaml";

// `changed` slows `base` by at least `min_ratio` − 1 and at most `max_ratio` − 1.
void expect_slower(double base, double changed, double min_ratio, double max_ratio, const std::string& what) {
  EXPECT_GT(changed, base * min_ratio) << what << ": " << base << " s → " << changed << " s";
  EXPECT_LT(changed, base * max_ratio) << what << ": " << base << " s → " << changed << " s";
}

TEST(LinkWhatIf, HalvingNicBandwidthSlowsAPlanAcrossNodesInEveryFidelity) {
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes(), f);
    const double slow = iteration_s(kBig, across_nodes({{"cluster.topology.network.nic.bandwidth", "12.5GBps"}}), f);
    // The DP all-reduce (≈ 0.1 s of ≈ 3 s) and the pipeline transfers double; compute does not.
    expect_slower(base, slow, 1.01, 1.5, "nic 25 → 12.5 GB/s, " + to_string(f));
    const double fast = iteration_s(kBig, across_nodes({{"cluster.topology.network.nic.bandwidth", "50GBps"}}), f);
    EXPECT_LT(fast, base) << "a faster NIC (PCIe still 32 GB/s), " << to_string(f);
  }
}

TEST(LinkWhatIf, NicBandwidthLeavesAOneNodePlanUnchanged) {
  for (Fidelity f : kAll) {
    const double base = iteration_s(kSmall, one_node(), f);
    const double slow = iteration_s(kSmall, one_node({{"cluster.topology.network.nic.bandwidth", "12.5GBps"}}), f);
    EXPECT_DOUBLE_EQ(slow, base) << to_string(f);
    // …while NVLink carries its data-parallel all-reduce.
    const double thin = iteration_s(kSmall, one_node({{"cluster.topology.node.nvlink.bandwidth", "150GBps"}}), f);
    expect_slower(base, thin, 1.001, 1.5, "nvlink 300 → 150 GB/s on one node, " + to_string(f));
  }
}

TEST(LinkWhatIf, HalvingNvlinkSlowsATensorParallelPlanInEveryFidelity) {
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes(), f);
    const double slow = iteration_s(kBig, across_nodes({{"cluster.topology.node.nvlink.bandwidth", "150GBps"}}), f);
    // t = 8: four all-reduces of 25 MB per layer and microbatch go over NVLink.
    expect_slower(base, slow, 1.02, 1.5, "nvlink 300 → 150 GB/s at t = 8, " + to_string(f));
  }
}

TEST(LinkWhatIf, LatenciesOfEveryLinkMoveThePrediction) {
  // (key, value, most it may add): the t = 8 all-reduces (6 per layer and microbatch, 14 hops
  // each, 10 layers × 35 microbatch slots on the critical path) make NVLink latency weigh most.
  struct Knob {
    std::string key, value;
    double max_added_s;
  };
  const std::vector<Knob> knobs = {{"cluster.topology.node.nvlink.latency", "20us", 1.0},
                                   {"cluster.topology.network.nic.latency", "40us", 0.05},
                                   {"cluster.topology.network.pcie.latency", "40us", 0.05},
                                   {"cluster.topology.network.fabric.switch_latency", "20us", 0.05}};
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes(), f);
    for (const auto& [key, value, max_added_s] : knobs) {
      // Latency is paid per transfer on the critical path: the 2(p−1) pipeline crossings and
      // the hops of the DP ring (≈ 14 × 20–40 µs) — a fraction of a millisecond, not more.
      const double slow = iteration_s(kBig, across_nodes({{key, value}}), f);
      EXPECT_GT(slow - base, 1e-4) << key << " = " << value << ", " << to_string(f);
      EXPECT_LT(slow - base, max_added_s) << key << " = " << value << ", " << to_string(f);
    }
  }
}

TEST(LinkWhatIf, APcieBottleneckBelowTheNicSlowsTrafficBetweenNodes) {
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes(), f);
    const double slow = iteration_s(kBig, across_nodes({{"cluster.topology.network.pcie.bandwidth", "12.5GBps"}}), f);
    expect_slower(base, slow, 1.01, 1.5, "pcie 32 → 12.5 GB/s, " + to_string(f));
    // PCIe faster than the NIC does not help: the NIC stays the bottleneck.
    const double wide = iteration_s(kBig, across_nodes({{"cluster.topology.network.pcie.bandwidth", "64GBps"}}), f);
    EXPECT_DOUBLE_EQ(wide, base) << to_string(f);
  }
}

TEST(LinkWhatIf, OversubscribedLeafUplinksSlowEveryFidelity) {
  // One node per leaf switch and 8:1 oversubscription: every transfer between nodes squeezes
  // through a leaf uplink of 25/8 GB/s.
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes({{"cluster.topology.network.fabric.leaf_radix", "1"}}), f);
    const double thin = iteration_s(kBig,
                                    across_nodes({{"cluster.topology.network.fabric.leaf_radix", "1"},
                                                  {"cluster.topology.network.fabric.oversubscription", "8"}}),
                                    f);
    expect_slower(base, thin, 1.05, 3.0, "oversubscription 8, " + to_string(f));
  }
  // With every node under one leaf switch, oversubscription of the uplinks does not matter.
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes(), f);
    const double thin = iteration_s(
        kBig, across_nodes({{"cluster.topology.network.fabric.leaf_radix", "16"}, {"cluster.topology.network.fabric.oversubscription", "8"}}),
        f);
    EXPECT_NEAR(thin / base, 1.0, 1e-9) << to_string(f);
  }
}

TEST(LinkWhatIf, FewerGpusPerNodeKeepTensorParallelismInsideTheNode) {
  // t = 8 on 4-GPU nodes would spread each TP group over two nodes' NICs: refused, naming the key
  // and the NVLink domain (an NVL72 rack is the same rule at 72 GPUs).
  try {
    iteration_s(kBig, across_nodes({{"cluster.topology.node.gpus", "4"}}), Fidelity::Analytic);
    FAIL() << "t 8 on 4-GPU nodes accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "parallel.tensor");
    EXPECT_NE(std::string(e.what()).find("NVLink domain of 4 GPUs"), std::string::npos) << e.what();
  }
  // Fewer GPUs per node at t = 4 puts more data-parallel and pipeline traffic on the network.
  for (Fidelity f : kAll) {
    const double base = iteration_s(kBig, across_nodes({{"parallel.tensor", "4"}, {"parallel.data", "8"}}), f);
    const double split =
        iteration_s(kBig, across_nodes({{"parallel.tensor", "4"}, {"parallel.data", "8"}, {"cluster.topology.node.gpus", "4"}}), f);
    expect_slower(base, split, 1.0001, 3.0, "4 GPUs per node at t = 4, " + to_string(f));
  }
}

}  // namespace
}  // namespace ptdp
