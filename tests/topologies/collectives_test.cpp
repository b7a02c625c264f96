// α-β collective costs on the DGX A100 preset against the NCCL calibration table of
// ptdp-facts.md (nccl-tests all-reduce, A100-SXM4 + NVSwitch + one HDR NIC per GPU).
#include "topologies/collectives.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

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
  // The inter-node curve was measured with 8 NICs per node (200 GB/s): its factor at 1 GB, read
  // off the table by log-size interpolation between 256 MiB (121.0) and 1 GiB (124.5 GB/s).
  const double S = 1e9;
  const double w = std::log(S / (256 * kMiB)) / std::log(4.0);
  const double factor = (121.0e9 + w * (124.5e9 - 121.0e9)) / (8 * 25e9);
  EXPECT_NEAR(bandwidth_factor(c, true, S), factor, 1e-9);
  const double bw = 25e9 * factor;
  EXPECT_NEAR(allreduce_time_s(c, g, S) / (2.0 * 7 / 8 * S / bw), 1.0, 1e-9);
  // About 112 ms: 8 × slower than the NIC-rich two-node case per byte on the wire.
  EXPECT_NEAR(allreduce_time_s(c, g, S), 0.1124, 0.002);
}

TEST(AllReduce, SingleRankOrEmptyMessageIsFree) {
  EXPECT_EQ(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 1, 1), 1e9), 0.0);
  EXPECT_EQ(allreduce_time_s(dgx_a100(), group_shape(dgx_a100(), 8, 1), 0), 0.0);
}

TEST(AllReduce, RingCostGrowsAsTwoTimesNMinusOneOverN) {
  // Same node, same message: 2 GPUs move 2·1/2, 8 GPUs 2·7/8 of the data per GPU.
  const ClusterSpec& c = dgx_a100();
  const double two = allreduce_time_s(c, group_shape(c, 2, 1), 1024 * kMiB);
  const double eight = allreduce_time_s(c, group_shape(c, 8, 1), 1024 * kMiB);
  EXPECT_NEAR(eight / two, (2.0 * 7 / 8) / (2.0 * 1 / 2), 1e-9);
}

TEST(AllGather, MovesHalfTheDataOfAnAllReduce) {
  const ClusterSpec& c = dgx_a100();
  const GroupShape g = group_shape(c, 8, 1);
  EXPECT_NEAR(allgather_time_s(c, g, 256 * kMiB) / allreduce_time_s(c, g, 256 * kMiB), 0.5, 1e-9);
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
