// --auto's candidates in shape groups (search/sweep.hpp SweepCandidates): the groups hold the same
// plans as the enumeration one by one, and the sweep, which bounds a group's members once per
// class of variant and builds only those that can still enter the top, ranks, prunes and counts
// exactly as it does plan by plan.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/plan_fields.hpp"
#include "scenarios/scenario.hpp"
#include "search/sweep.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;

// Spaces whose groups have members of every class: the TP overlap (sequence parallelism), the
// expert overlap (experts on t 1), ZeRO stages and offload, context parallelism.
const std::vector<std::pair<const char*, std::vector<Override>>> kSpaces = {
    {"/scenarios/paper/gpt-3.6b.yaml", {}},
    {"/scenarios/moe/mixtral-8x7b.yaml", {{"cluster.gpus", "32"}, {"training.global_batch", "64"}}},
    {"/scenarios/long-context/llama2-7b-128k.yaml", {{"cluster.gpus", "32"}, {"training.global_batch", "16"}}}};

SimulationInput space_input(const char* path, const std::vector<Override>& sets) {
  return input_of(load_scenario(kRoot + path, sets));
}

TEST(SweepCandidates, GroupsHoldTheEnumerationsPlansInItsOrder) {
  for (const auto& [path, sets] : kSpaces) {
    const SimulationInput in = space_input(path, sets);
    SkipReasons one_by_one_skips, grouped_skips;
    const std::vector<SweepCandidate> one_by_one = auto_candidates(in, {}, one_by_one_skips, 1);
    const SweepCandidates grouped = auto_candidate_groups(in, grouped_skips, 2);
    ASSERT_EQ(grouped.size(), one_by_one.size()) << path;
    EXPECT_LT(grouped.groups(), grouped.size() / 2) << path << ": the sharding and overlap variants of a shape share a group";
    for (size_t i = 0; i < one_by_one.size(); ++i) {
      const SweepCandidate c = grouped.member(i);
      ASSERT_EQ(plan_integers(c.plan), plan_integers(one_by_one[i].plan)) << path << " " << i << " " << plan_label(c.plan);
      ASSERT_EQ(candidate_overrides(c), candidate_overrides(one_by_one[i])) << path << " " << i;
      ASSERT_EQ(c.family, one_by_one[i].family);
    }
    ASSERT_EQ(grouped_skips.size(), one_by_one_skips.size()) << path;
    for (const auto& [reason, s] : one_by_one_skips) {
      EXPECT_EQ(grouped_skips.at(reason).count, s.count) << path << " " << reason;
      EXPECT_EQ(grouped_skips.at(reason).example, s.example) << path << " " << reason;
    }
    EXPECT_EQ(plan_integers(SweepCandidates(grouped).expand().back().plan), plan_integers(one_by_one.back().plan));
  }
}

TEST(SweepCandidates, NoGroupIsPrunedWhoseMemberCouldEnterTheTop) {
  // The sweep bounds a group's members by class of variant and builds only the members it
  // reaches: it must settle every plan as the sweep of the same plans one by one does (the same
  // status, and the same figures: a pruned plan's bound, a ranked plan's time, the memory of one
  // that does not fit, which it reads of the group's shape), prune as many, and find the
  // exhaustive search's top ten.
  SweepOptions options;
  options.top = 10;
  options.refine = Fidelity::Analytic;
  options.jobs = 1;
  options.keep_pruned = true;
  SweepOptions exhaustive = options;
  exhaustive.prune = false;
  for (const auto& [path, sets] : kSpaces) {
    const SimulationInput in = space_input(path, sets);
    SkipReasons skips;
    const SweepResult grouped = run_sweep(auto_candidate_groups(in, skips, 1), options);
    const SweepResult one_by_one = run_sweep(auto_candidates(in, {}, skips, 1), options);
    const SweepResult all = run_sweep(auto_candidates(in, {}, skips, 1), exhaustive);
    ASSERT_EQ(grouped.outcomes.size(), one_by_one.outcomes.size()) << path;
    EXPECT_GT(grouped.pruned, grouped.candidates / 2) << path;
    EXPECT_EQ(grouped.pruned, one_by_one.pruned) << path;
    EXPECT_EQ(grouped.candidates, one_by_one.candidates) << path;
    size_t differ = 0;
    for (size_t i = 0; i < grouped.outcomes.size(); ++i) {
      const SweepOutcome& a = grouped.outcomes[i];
      const SweepOutcome& b = one_by_one.outcomes[i];
      ASSERT_EQ(a.candidate, b.candidate) << path;
      if (a.status != b.status || a.analytic.iteration_time_s != b.analytic.iteration_time_s ||
          a.analytic.peak_memory_bytes != b.analytic.peak_memory_bytes) {
        if (differ++ < 3)
          ADD_FAILURE() << path << " " << plan_label(a.plan) << ": " << a.status << " " << a.analytic.iteration_time_s << " s "
                        << a.analytic.peak_memory_bytes << " B grouped, " << b.status << " " << b.analytic.iteration_time_s
                        << " s " << b.analytic.peak_memory_bytes << " B one by one";
      }
    }
    EXPECT_EQ(differ, 0u) << path;
    ASSERT_GE(grouped.ranking.size(), 10u) << path;
    for (size_t r = 0; r < 10; ++r) {
      const SweepOutcome& a = grouped.outcomes[grouped.ranking[r]];
      const SweepOutcome& b = all.outcomes[all.ranking[r]];
      EXPECT_EQ(plan_label(a.plan), plan_label(b.plan)) << path << " rank " << r + 1;
      EXPECT_EQ(a.analytic.iteration_time_s, b.analytic.iteration_time_s) << path << " rank " << r + 1;
    }
  }
}

TEST(SweepCandidates, WithoutKeptPrunedPlansTheSweepCountsThePlansThatDoNotFitAndKeepsTheClosest) {
  // `ptdp sweep` without --csv: the plans that do not fit are counted, and the table's example
  // (the closest to fitting, the first of equals) is the one the sweep that keeps them all shows.
  SweepOptions options;
  options.top = 10;
  options.refine = Fidelity::Analytic;
  options.jobs = 1;
  SweepOptions kept = options;
  kept.keep_pruned = true;
  options.keep_pruned = false;
  for (const auto& [path, sets] : kSpaces) {
    const SimulationInput in = space_input(path, sets);
    SkipReasons skips;
    const SweepResult counted = run_sweep(auto_candidate_groups(in, skips, 1), options);
    const SweepResult all = run_sweep(auto_candidate_groups(in, skips, 1), kept);
    auto closest = [](const SweepResult& r, size_t& oom) {
      const SweepOutcome* best = nullptr;
      oom = 0;
      for (const SweepOutcome& o : r.outcomes) {
        if (o.status != "oom") continue;
        ++oom;
        if (!best || o.analytic.peak_memory_bytes < best->analytic.peak_memory_bytes) best = &o;
      }
      return best;
    };
    size_t kept_oom = 0, counted_oom = 0;
    const SweepOutcome* a = closest(all, kept_oom);
    const SweepOutcome* b = closest(counted, counted_oom);
    EXPECT_EQ(all.out_of_memory, kept_oom) << path;
    EXPECT_EQ(counted.out_of_memory, kept_oom) << path;
    EXPECT_EQ(counted.pruned, all.pruned) << path;
    ASSERT_GT(kept_oom, 0u) << path;
    EXPECT_LT(counted_oom, kept_oom) << path << ": the plans that do not fit are counted, not kept";
    ASSERT_TRUE(a && b) << path;
    EXPECT_EQ(b->candidate, a->candidate) << path;
    EXPECT_EQ(b->analytic.peak_memory_bytes, a->analytic.peak_memory_bytes) << path;
  }
}

}  // namespace
}  // namespace ptdp
