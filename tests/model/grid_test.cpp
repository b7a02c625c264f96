// The process grid against the definitions of its groups: Megatron-Core's rank order (tensor
// fastest, then context, data, pipeline; experts: expert-tensor, expert, expert-data over a
// stage's ranks) and each group as "the ranks that differ only in these coordinates".
#include "model/grid.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

namespace ptdp {
namespace {

TEST(ProcessGrid, RankOrderIsTensorThenContextThenDataThenPipeline) {
  const ProcessGrid g(8, 2, 4, 3);
  EXPECT_EQ(g.rank(3, 1, 2, 1), 3 + 8 * (1 + 2 * (2 + 4 * 1)));
  EXPECT_EQ(g.rank(0, 0, 0, 2), 8 * 2 * 4 * 2);
  for (auto [t, cp, d, p] : {std::tuple{8, 1, 8, 16}, std::tuple{2, 2, 3, 4}, std::tuple{1, 1, 32, 1}, std::tuple{4, 4, 1, 6}}) {
    const ProcessGrid grid(t, cp, d, p);
    std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> seen;
    for (int64_t r = 0; r < grid.world(); ++r) {
      const GridCoord c = grid.coord(r);
      EXPECT_EQ(grid.rank(c.tp, c.cp, c.dp, c.pp), r);
      EXPECT_EQ(grid.rank_at(c.tp, c.cp + cp * c.dp, c.pp), r) << "the gradient-group index is cp + cp·dp";
      EXPECT_EQ(grid.index_in(CommGroup::Gradient, r), c.cp + cp * c.dp);
      seen.insert({c.tp, c.cp, c.dp, c.pp});
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), grid.world()) << "coordinates are a bijection";
  }
}

// Megatron-LM's initialize_model_parallel example: 16 GPUs, tensor 2, pipeline 4, data 2.
TEST(ProcessGrid, MegatronsSixteenGpuExample) {
  const ProcessGrid g(2, 1, 2, 4);
  EXPECT_EQ(g.members(CommGroup::Tensor, 5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(g.members(CommGroup::Gradient, 5), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(g.members(CommGroup::Pipeline, 5), (std::vector<int64_t>{1, 5, 9, 13}));
  EXPECT_EQ(g.members(CommGroup::Pipeline, 2), (std::vector<int64_t>{2, 6, 10, 14}));
  EXPECT_EQ(g.members(CommGroup::Model, 2), (std::vector<int64_t>{2, 3, 6, 7, 10, 11, 14, 15}));
}

// Every group is the set of ranks that agree on the coordinates it does not span.
TEST(ProcessGrid, EveryGroupIsTheRanksThatDifferOnlyInItsOwnCoordinates) {
  for (auto [t, cp, d, p, ep, etp, n, rn] :
       {std::tuple{2, 2, 2, 2, 2, 1, 2, 1}, std::tuple{4, 1, 4, 2, 4, 2, 4, 2}, std::tuple{2, 1, 6, 1, 3, 2, 3, 3},
        std::tuple{1, 2, 4, 3, 8, 1, 1, 1}, std::tuple{1, 2, 8, 1, 1, 1, 8, 4}}) {
    const ProcessGrid grid(t, cp, d, p, ep, etp, n, rn);
    // The key a group's members share (the coordinates the group does not span).
    const std::map<CommGroup, std::function<std::vector<int64_t>(const GridCoord&)>> key = {
        {CommGroup::Tensor, [](const GridCoord& c) { return std::vector<int64_t>{c.cp, c.dp, c.pp}; }},
        {CommGroup::Context, [](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.dp, c.pp}; }},
        {CommGroup::Pipeline, [](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.cp, c.dp}; }},
        {CommGroup::Gradient, [](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.pp}; }},
        {CommGroup::Sharding, [&, n = n, cp = cp](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.pp, (c.cp + cp * c.dp) / n}; }},
        {CommGroup::ShardReplicas, [&, n = n, cp = cp](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.pp, (c.cp + cp * c.dp) % n}; }},
        // reshard_after_forward N: N consecutive members of the sharding group.
        {CommGroup::Reshard, [&, rn = rn, cp = cp](const GridCoord& c) { return std::vector<int64_t>{c.tp, c.pp, (c.cp + cp * c.dp) / rn}; }},
        {CommGroup::Expert, [](const GridCoord& c) { return std::vector<int64_t>{c.pp, c.etp, c.edp}; }},
        {CommGroup::ExpertTensor, [](const GridCoord& c) { return std::vector<int64_t>{c.pp, c.ep, c.edp}; }},
        {CommGroup::ExpertModel, [](const GridCoord& c) { return std::vector<int64_t>{c.pp, c.edp}; }},
        {CommGroup::ExpertData, [](const GridCoord& c) { return std::vector<int64_t>{c.pp, c.etp, c.ep}; }},
        {CommGroup::Model, [](const GridCoord& c) { return std::vector<int64_t>{c.cp, c.dp}; }},
    };
    for (const auto& [group, key_of] : key) {
      std::map<std::vector<int64_t>, std::vector<int64_t>> expected;  // key → its ranks, ascending
      for (int64_t r = 0; r < grid.world(); ++r) expected[key_of(grid.coord(r))].push_back(r);
      for (int64_t r = 0; r < grid.world(); ++r) {
        std::vector<int64_t> got = grid.members(group, r);
        EXPECT_EQ(static_cast<int64_t>(got.size()), grid.size(group)) << to_string(group);
        EXPECT_EQ(got[static_cast<size_t>(grid.index_in(group, r))], r) << to_string(group) << ": the rank's own index";
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, expected[key_of(grid.coord(r))]) << to_string(group) << " of rank " << r << " (t " << t << " cp " << cp
                                                        << " d " << d << " p " << p << " ep " << ep << " etp " << etp << ")";
        for (int64_t m : got) EXPECT_EQ(grid.color(group, m), grid.color(group, r)) << to_string(group) << ": one colour per group";
      }
    }
  }
}

}  // namespace
}  // namespace ptdp
