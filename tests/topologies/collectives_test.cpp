// α-β collective costs on the DGX A100 preset against the NCCL calibration table of
// ptdp-facts.md (nccl-tests all-reduce, A100-SXM4 + NVSwitch + one HDR NIC per GPU).
#include "topologies/collectives.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <functional>
#include <set>

#include "core/error.hpp"

#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

constexpr double kMiB = 1048576.0;

const ClusterSpec& dgx_a100() {
  static const ClusterSpec c = load_topology("dgx-a100");
  return c;
}

struct Row {
  double bytes, one_node_us, two_nodes_us;
};
// message size, 8 GPUs in one node, 16 GPUs on two nodes.
constexpr Row kNccl[] = {
    {1 * kMiB, 72.5, 100},    {4 * kMiB, 106, 147},       {16 * kMiB, 236, 367},
    {64 * kMiB, 566, 1124},   {256 * kMiB, 2096, 4159},   {1024 * kMiB, 8139, 16170},
};

TEST(AllReduce, EightGpusInOneDgxNodeReproduceTheNcclTable) {
  const GroupShape node = group_shape(dgx_a100(), 8, 1);
  ASSERT_EQ(node.nodes, 1);
  EXPECT_NEAR(allreduce_time_s(dgx_a100(), node, 1024 * kMiB) * 1e6, 8139, 0.02 * 8139);
  EXPECT_NEAR(allreduce_time_s(dgx_a100(), node, 64 * kMiB) * 1e6, 566, 0.02 * 566);
  for (const Row& r : kNccl)
    EXPECT_NEAR(allreduce_time_s(dgx_a100(), node, r.bytes) * 1e6, r.one_node_us, 0.02 * r.one_node_us)
        << r.bytes / kMiB << " MiB";
}

TEST(AllReduce, SixteenGpusOnTwoDgxNodesReproduceTheNcclTable) {
  const GroupShape two = group_shape(dgx_a100(), 16, 1);
  ASSERT_EQ(two.nodes, 2);
  ASSERT_EQ(two.per_node, 8);
  EXPECT_NEAR(allreduce_time_s(dgx_a100(), two, 1024 * kMiB) * 1e6, 16170, 0.02 * 16170);
  for (const Row& r : kNccl)
    EXPECT_NEAR(allreduce_time_s(dgx_a100(), two, r.bytes) * 1e6, r.two_nodes_us, 0.02 * r.two_nodes_us)
        << r.bytes / kMiB << " MiB";
}

TEST(AllReduce, TinyMessagesCostTheMeasuredLatencyFloor) {
  // ptdp-facts.md: small-message time ≈ 31 µs in a node, ≈ 35 µs across two nodes.
  EXPECT_NEAR(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 8, 1), 4) * 1e6, 31, 0.5);
  EXPECT_NEAR(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 16, 1), 4) * 1e6, 35, 0.5);
  // …and time never decreases with size.
  double last = 0;
  for (double bytes = 1; bytes < 4e9; bytes *= 1.7) {
    const double t = allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 16, 1), bytes);
    EXPECT_GE(t, last) << bytes;
    last = t;
  }
}

TEST(AllReduce, RingOverEightNodesWithOneGpuEachUsesOneNic) {
  // A data-parallel group at t = 8: stride 8, one GPU per node, each on its own 25 GB/s NIC.
  const ClusterSpec& c = dgx_a100();
  const GroupShape g = group_shape(c, 8, 8);
  ASSERT_EQ(g.nodes, 8);
  ASSERT_EQ(g.per_node, 1);
  // The inter-node curve was measured with 8 NICs per node (200 GB/s): its efficiency at 1 GB is
  // the table's time (log-size interpolation between 256 MiB (121.0) and 1 GiB (124.5 GB/s))
  // minus the 35 µs floor, against 200 GB/s.
  const double S = 1e9;
  const double w = std::log(S / (256 * kMiB)) / std::log(4.0);
  const double measured_s = 2.0 * 15 / 16 * S / (121.0e9 + w * (124.5e9 - 121.0e9));
  const double efficiency = 2.0 * 15 / 16 * S / ((measured_s - 35e-6) * 8 * 25e9);
  EXPECT_NEAR(bandwidth_factor(c, true, S), efficiency, 1e-9);
  EXPECT_NEAR(allreduce_time_s(c, g, S) - allreduce_latency_s(c, g), 2.0 * 7 / 8 * S / (25e9 * efficiency), 1e-9);
  // About 112 ms: 8 × slower than the NIC-rich two-node case per byte on the wire.
  EXPECT_NEAR(allreduce_time_s(c, g, S), 0.1124, 0.002);
}

TEST(GroupShape, ClosedFormCountsTheNodesAndTheFewestMembersOfEveryLayout) {
  // group_shape computes the nodes and the fewest members per node from the grid's closed form;
  // here each member's node is counted one by one for every layout of up to 40 members on nodes
  // of 4, 6 and 8 GPUs.
  for (int64_t gpn : {4, 6, 8}) {
    ClusterSpec c = dgx_a100();
    c.gpus_per_node = gpn;
    for (int64_t size = 2; size <= 40; ++size)
      for (int64_t stride = 1; stride <= 20; ++stride)
        for (int64_t first = 0; first < 2 * gpn; ++first) {
          std::map<int64_t, int64_t> members;  // node → members
          for (int64_t i = 0; i < size; ++i) ++members[(first + i * stride) / gpn];
          int64_t fewest = size;
          for (const auto& [node, count] : members) fewest = std::min(fewest, count);
          const GroupShape g = group_shape(c, size, stride, first);
          ASSERT_EQ(g.nodes, static_cast<int64_t>(members.size())) << gpn << " " << size << " " << stride << " " << first;
          ASSERT_EQ(g.per_node, fewest) << gpn << " " << size << " " << stride << " " << first;
        }
  }
}

TEST(AllReduce, SingleRankOrEmptyMessageIsFree) {
  EXPECT_EQ(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 1, 1), 1e9), 0.0);
  EXPECT_EQ(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 8, 1), 0), 0.0);
}

TEST(AllReduce, RingCostGrowsAsTwoTimesNMinusOneOverN) {
  // Same node, same message: 2 GPUs move 2·1/2, 8 GPUs 2·7/8 of the data per GPU.
  const ClusterSpec& c = dgx_a100();
  // (The latency floor aside, which the ring pays once per all-reduce.)
  const GroupShape g2 = group_shape(c, 2, 1), g8 = group_shape(c, 8, 1);
  const double two = allreduce_time_s(c, g2, 1024 * kMiB) - allreduce_latency_s(c, g2);
  const double eight = allreduce_time_s(c, g8, 1024 * kMiB) - allreduce_latency_s(c, g8);
  EXPECT_NEAR(eight / two, (2.0 * 7 / 8) / (2.0 * 1 / 2), 1e-9);
}

TEST(AllGather, MovesHalfTheDataOfAnAllReduce) {
  const ClusterSpec& c = dgx_a100();
  const GroupShape g = group_shape(c, 8, 1);
  EXPECT_NEAR(allgather_time_s(c, g, 256 * kMiB) / allreduce_time_s(c, g, 256 * kMiB), 0.5, 1e-9);
  EXPECT_GT(allgather_time_s(c, g, 4), 0.0);
}

TEST(PointToPoint, NvlinkIsFasterThanOneNicAndLargeTransfersApproachTheNicRate) {
  const ClusterSpec& c = dgx_a100();
  const double bytes = 2.0 * 2048 * 12288;  // one GPT-3 activation, b = 1, fp16 (50 MB)
  EXPECT_LT(p2p_time_s(c, true, bytes), p2p_time_s(c, false, bytes));
  // A large transfer over one NIC gets at most 25 GB/s and at least half of it.
  const double t = p2p_time_s(c, false, 1e9);
  EXPECT_GT(t, 1e9 / 25e9);
  EXPECT_LT(t, 1e9 / (25e9 * 0.5));
  EXPECT_EQ(p2p_time_s(c, false, 0), 0.0);
  EXPECT_GT(p2p_time_s(c, false, 4), c.nic.latency_s);
}

TEST(PointToPoint, SmallTransfersAcrossNodesCostLessThanAnAllReduce) {
  // A p2p send is one step over one NIC; a 16-GPU ring all-reduce is 30 steps. Measured (facts):
  // the all-reduce floor is ~35 µs and a 1 MiB all-reduce on 16 GPUs takes 100 µs, so a 4-byte
  // p2p must cost less than 35 µs and a 1 MiB p2p (42 µs at 25 GB/s) less than 100 µs.
  const ClusterSpec& c = dgx_a100();
  const double tiny = p2p_time_s(c, false, 4);
  const double mib = p2p_time_s(c, false, kMiB);
  const double floor = allreduce_time_s(c, group_shape(c, 16, 1), 4);
  EXPECT_LT(tiny, floor);
  EXPECT_LT(mib, 100e-6);
}

ClusterSpec with(const std::function<void(ClusterSpec&)>& edit) {
  ClusterSpec c = dgx_a100();
  edit(c);
  return c;
}

TEST(LinkWhatIf, BandwidthPartScalesWithTheLinkItRunsOn) {
  // The curves are efficiencies of the links they were measured on: halving a link doubles the
  // bandwidth part of a collective on it, exactly; the latency floor stays.
  const double S = 256 * kMiB;
  const ClusterSpec& c = dgx_a100();
  const ClusterSpec half_nic = with([](ClusterSpec& x) { x.nic.bw_Bps /= 2; });
  const ClusterSpec half_nvlink = with([](ClusterSpec& x) { x.nvlink.bw_Bps /= 2; });
  const GroupShape dp = group_shape(c, 8, 8), tp = group_shape(c, 8, 1);
  auto wire = [&](const ClusterSpec& x, const GroupShape& g) { return allreduce_time_s(x, g, S) - allreduce_latency_s(x, g); };
  EXPECT_NEAR(wire(half_nic, dp) / wire(c, dp), 2.0, 1e-9);
  EXPECT_NEAR(wire(half_nvlink, tp) / wire(c, tp), 2.0, 1e-9);
  EXPECT_DOUBLE_EQ(allreduce_time_s(half_nic, tp, S), allreduce_time_s(c, tp, S));  // NVLink only
  // The links the curve was measured on are the reference: had it been measured on NICs twice
  // as fast (50 GB/s, behind the same 32 GB/s PCIe), the same busbw means 25/32 of the
  // efficiency, so the same cluster is slower by 32/25.
  const ClusterSpec faster_reference = with([](ClusterSpec& x) { x.measured_on.nic.bw_Bps *= 2; });
  EXPECT_NEAR(wire(faster_reference, dp) / wire(c, dp), 32.0 / 25.0, 1e-9);
  // Point to point: the bandwidth part doubles too.
  const double p2p = p2p_time_s(c, false, S) - p2p_latency_s(c, false);
  EXPECT_NEAR((p2p_time_s(half_nic, false, S) - p2p_latency_s(half_nic, false)) / p2p, 2.0, 1e-9);
}

TEST(LinkWhatIf, LatencyShiftsTheMeasuredFloorByTheRingsHops) {
  // 8 GPUs in a node: the 31 µs floor holds 14 NVLink hops of 1 µs; at 3 µs a hop it is 59 µs.
  const ClusterSpec slow = with([](ClusterSpec& x) { x.nvlink.latency_s = 3e-6; });
  EXPECT_NEAR(allreduce_latency_s(slow, group_shape(slow, 8, 1)) * 1e6, 31 + 14 * 2, 1e-6);
  // Across nodes (hop = NIC 2 + PCIe 0.5 + 2 × 0.3 µs switch), a slower NIC raises the floor.
  const ClusterSpec far = with([](ClusterSpec& x) { x.nic.latency_s = 10e-6; });
  EXPECT_GT(allreduce_latency_s(far, group_shape(far, 16, 1)), allreduce_latency_s(dgx_a100(), group_shape(dgx_a100(), 16, 1)) + 50e-6);
  const ClusterSpec hops = with([](ClusterSpec& x) { x.fabric.switch_latency_s = 5e-6; });
  EXPECT_GT(p2p_time_s(hops, false, 4), p2p_time_s(dgx_a100(), false, 4) + 10e-6);
}

TEST(LinkWhatIf, PcieBelowTheNicAndOversubscribedUplinksLimitTrafficBetweenNodes) {
  const double S = 256 * kMiB;
  const ClusterSpec& c = dgx_a100();
  const ClusterSpec narrow = with([](ClusterSpec& x) { x.pcie.bw_Bps = 12.5e9; });
  const GroupShape dp = group_shape(c, 8, 8);
  EXPECT_GT(allreduce_time_s(narrow, dp, S), 1.9 * allreduce_time_s(c, dp, S) - allreduce_latency_s(c, dp));
  EXPECT_DOUBLE_EQ(nic_path_Bps(narrow), 12.5e9);
  // Oversubscription only matters for groups spanning leaf switches.
  const ClusterSpec over = with([](ClusterSpec& x) {
    x.fabric.oversubscription = 4;
    x.fabric.leaf_radix = 4;
  });
  const GroupShape inside = group_shape(over, 4, 8, 0), across = group_shape(over, 8, 8, 0);
  EXPECT_FALSE(inside.crosses_leaf);
  EXPECT_TRUE(across.crosses_leaf);
  EXPECT_DOUBLE_EQ(allreduce_time_s(over, inside, S), allreduce_time_s(c, group_shape(c, 4, 8), S));
  EXPECT_GT(allreduce_time_s(over, across, S), 3.5 * allreduce_time_s(c, dp, S) - 4 * allreduce_latency_s(c, dp));
  EXPECT_GT(p2p_time_s(over, false, S, true), 3.5 * p2p_time_s(over, false, S, false) - 4 * p2p_latency_s(c, false));
}

TEST(LinkWhatIf, ACurveWithoutTheLinksItWasMeasuredOnIsRejected) {
  ClusterSpec c = dgx_a100();
  c.measured_on.recorded = false;
  try {
    validate_cluster(c);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("calibration.measured_on"), std::string::npos) << e.what();
  }
}

// Nodes spanned by ranks 0, stride, 2·stride, … (Megatron groups start on a node boundary).
GroupShape brute_force(int64_t size, int64_t stride, int gpus_per_node) {
  std::set<int64_t> nodes;
  for (int64_t i = 0; i < size; ++i) nodes.insert(node_of(i * stride, gpus_per_node));
  GroupShape g;
  g.size = size;
  g.nodes = static_cast<int64_t>(nodes.size());
  g.per_node = size / g.nodes;
  return g;
}

TEST(GroupShape, TensorGroupsAreContiguousAndDataGroupsStrideByT) {
  const ClusterSpec& c = dgx_a100();
  // TP groups: stride 1.
  for (int64_t t : {2, 4, 8, 16, 32}) {
    const GroupShape g = group_shape(c, t, 1), want = brute_force(t, 1, 8);
    EXPECT_EQ(g.nodes, want.nodes) << "t " << t;
    EXPECT_EQ(g.per_node, want.per_node) << "t " << t;
  }
  // DP groups: stride t.
  for (int64_t t : {1, 2, 4, 8})
    for (int64_t d : {2, 4, 8, 16, 64}) {
      const GroupShape g = group_shape(c, d, t), want = brute_force(d, t, 8);
      EXPECT_EQ(g.nodes, want.nodes) << "t " << t << " d " << d;
      EXPECT_EQ(g.per_node, want.per_node) << "t " << t << " d " << d;
    }
  // Spot values users reason with: t = 8 → one node; d = 8 at t = 8 → 8 nodes × 1 GPU.
  EXPECT_EQ(group_shape(c, 8, 1).nodes, 1);
  EXPECT_EQ(group_shape(c, 8, 8).nodes, 8);
  EXPECT_EQ(group_shape(c, 32, 2).per_node, 4);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(GroupShape, StridesThatDoNotDivideTheNodeCountTheNodesActuallySpanned) {
  // t = 3 (legal: 24 heads) on 8-GPU nodes: the DP group of tp rank 0 is global ranks 0, 3, …, 21,
  // i.e. nodes 0, 0, 0, 1, 1, 1, 2, 2 — 3 nodes.
  const ClusterSpec& c = dgx_a100();
  const GroupShape g = group_shape(c, 8, 3), want = brute_force(8, 3, 8);
  ASSERT_EQ(want.nodes, 3);
  EXPECT_EQ(g.nodes, want.nodes);
}

}  // namespace
}  // namespace ptdp
