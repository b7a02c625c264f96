// Schedule generators: the Megatron-LM warm-up counts, forward/backward orders, stage placement
// and the activations each schedule keeps in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "model/plan.hpp"
#include "schedules/graph.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

std::vector<Action> compute_only(const RankProgram& prog) {
  std::vector<Action> out;
  for (const auto& a : prog.actions)
    if (is_compute(a.kind)) out.push_back(a);
  return out;
}

// True when a rank's compute actions have the 1F1B shape with `warmup` warm-up forwards (Megatron's
// num_warmup_microbatches): `warmup` forwards, then (F, B) pairs, then the remaining backwards.
// (warmup = n − 1 and warmup = n describe the same program F…F B…B.)
bool has_1f1b_shape(const std::vector<Action>& acts, int warmup) {
  const int total = static_cast<int>(acts.size()) / 2;
  if (warmup < 0 || warmup > total || static_cast<int>(acts.size()) != 2 * total) return false;
  std::vector<ActionKind> want(warmup, ActionKind::F);
  for (int i = 0; i < total - warmup; ++i) {
    want.push_back(ActionKind::F);
    want.push_back(ActionKind::B);
  }
  want.insert(want.end(), warmup, ActionKind::B);
  for (size_t i = 0; i < acts.size(); ++i)
    if (acts[i].kind != want[i]) return false;
  return true;
}

TEST(OneFOneB, WarmupIsMinOfPMinusRMinusOneAndM) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 13, 32}) {
      const Schedule s = make_1f1b(p, m);
      for (int r = 0; r < p; ++r) {
        const auto acts = compute_only(s.programs[r]);
        ASSERT_EQ(acts.size(), 2u * m);
        const int warmup = std::min(p - r - 1, m);
        EXPECT_TRUE(has_1f1b_shape(acts, warmup)) << "p " << p << " m " << m << " rank " << r << ": " << warmup;
        // Tells warm-up counts apart where the shapes differ.
        if (warmup + 1 < m) {
          EXPECT_FALSE(has_1f1b_shape(acts, warmup + 1)) << "p " << p << " m " << m << " rank " << r;
        }
        if (warmup >= 1 && warmup < m) {
          EXPECT_FALSE(has_1f1b_shape(acts, warmup - 1)) << "p " << p << " m " << m;
        }
      }
    }
  }
}

TEST(OneFOneB, MicrobatchesRunInOrderOnEveryRank) {
  const Schedule s = make_1f1b(4, 8);
  for (int r = 0; r < 4; ++r) {
    int next_f = 0, next_b = 0;
    for (const Action& a : s.programs[r].actions) {
      EXPECT_EQ(a.stage, r);
      if (a.kind == ActionKind::F) {
        EXPECT_EQ(a.microbatch, next_f++);
      } else if (a.kind == ActionKind::B) {
        EXPECT_EQ(a.microbatch, next_b++);
      }
    }
  }
}

TEST(OneFOneB, WarmupForwardsReportsMegatronsWarmupCount) {
  // warmup_forwards() feeds the "warm-up F" column of `ptdp schedule show`; Megatron-LM (and
  // ptdp-facts.md) define the warm-up of rank r as min(p − r − 1, m) forwards.
  const int p = 4, m = 8;
  const Schedule s = make_1f1b(p, m);
  std::vector<int> got, want;
  for (int r = 0; r < p; ++r) {
    got.push_back(warmup_forwards(s, r));
    want.push_back(std::min(p - r - 1, m));
  }
  EXPECT_EQ(got, want);
}

TEST(Interleaved, WarmupIsTwoTimesPMinusRMinusOnePlusVMinusOneTimesGCappedAtMV) {
  struct Case {
    int p, v, m, G;
  };
  for (const Case& c : {Case{4, 2, 8, 0}, Case{4, 2, 4, 0}, Case{4, 3, 12, 0}, Case{8, 2, 16, 0}, Case{4, 2, 12, 6},
                        Case{3, 4, 9, 0}, Case{4, 2, 10, 5}, Case{16, 2, 192, 0}}) {
    const Schedule s = make_interleaved(c.p, c.v, c.m, GeneratorOptions{c.G});
    const int G = c.G > 0 ? c.G : c.p;
    for (int r = 0; r < c.p; ++r) {
      const auto acts = compute_only(s.programs[r]);
      ASSERT_EQ(static_cast<int>(acts.size()), 2 * c.m * c.v);
      const int warmup = std::min(2 * (c.p - r - 1) + (c.v - 1) * G, c.m * c.v);
      EXPECT_TRUE(has_1f1b_shape(acts, warmup)) << "p " << c.p << " v " << c.v << " m " << c.m << " G " << G << " rank " << r;
      if (warmup + 1 < c.m * c.v) {
        EXPECT_FALSE(has_1f1b_shape(acts, warmup + 1));
      }
    }
  }
}

TEST(Interleaved, ForwardsWalkMicrobatchGroupsChunkByChunkAndBackwardsReverseTheChunks) {
  // p 4, v 2, m 8, G 4: rank 1 runs chunk 0 (stage 1) for microbatches 0-3, chunk 1 (stage 5) for
  // 0-3, then the same for 4-7; backwards walk the same table with the chunks reversed.
  const Schedule s = make_interleaved(4, 2, 8);
  std::vector<std::string> fwd, bwd;
  for (const Action& a : s.programs[1].actions) (a.kind == ActionKind::F ? fwd : bwd).push_back(a.str());
  EXPECT_EQ(fwd, (std::vector<std::string>{"1F0", "1F1", "1F2", "1F3", "5F0", "5F1", "5F2", "5F3", "1F4", "1F5", "1F6", "1F7",
                                           "5F4", "5F5", "5F6", "5F7"}));
  EXPECT_EQ(bwd, (std::vector<std::string>{"5B0", "5B1", "5B2", "5B3", "1B0", "1B1", "1B2", "1B3", "5B4", "5B5", "5B6", "5B7",
                                           "1B4", "1B5", "1B6", "1B7"}));
}

TEST(Interleaved, StageSOfChunkCLivesOnRankSModP) {
  const Schedule s = make_interleaved(4, 3, 8);
  ASSERT_EQ(s.num_stages(), 12);
  for (int st = 0; st < 12; ++st) {
    EXPECT_EQ(s.stage_to_rank[st], st % 4);
    EXPECT_EQ(s.chunk_of(st), st / 4);
  }
  for (int r = 0; r < 4; ++r)
    for (const Action& a : s.programs[r].actions) EXPECT_EQ(a.stage % 4, r) << a.str();
}

TEST(GPipe, AllForwardsThenAllBackwards) {
  const Schedule s = make_gpipe(3, 5);
  for (int r = 0; r < 3; ++r) {
    const auto acts = compute_only(s.programs[r]);
    ASSERT_EQ(acts.size(), 10u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(acts[i].kind, ActionKind::F);
      EXPECT_EQ(acts[5 + i].kind, ActionKind::B);
    }
  }
}

TEST(Generators, EveryGeneratedScheduleValidates) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 5, 8, 16}) {
      EXPECT_NO_THROW(validate(make_gpipe(p, m))) << "gpipe p " << p << " m " << m;
      EXPECT_NO_THROW(validate(make_1f1b(p, m))) << "1f1b p " << p << " m " << m;
    }
  // Interleaved: every (p, v, m, G) that Megatron-LM's rules allow (p ≤ G ≤ m, m mod G = 0 or ≥ p).
  int checked = 0;
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int m = p; m <= 3 * p + 1; ++m)
        for (int G = p; G <= m; ++G) {
          if (m % G != 0 && m % G < p) continue;
          EXPECT_NO_THROW(validate(make_interleaved(p, v, m, GeneratorOptions{G}))) << p << " " << v << " " << m << " " << G;
          ++checked;
        }
  EXPECT_GT(checked, 100);
}

TEST(PeakInflight, OneFOneBKeepsPMinusRMicrobatchesGPipeKeepsM) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 8, 32}) {
      const auto f1b1 = peak_inflight_activations(make_1f1b(p, m));
      const auto gpipe = peak_inflight_activations(make_gpipe(p, m));
      ASSERT_EQ(static_cast<int>(f1b1.size()), p);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(f1b1[r], std::min(p - r, m)) << "1f1b p " << p << " m " << m << " rank " << r;
        EXPECT_EQ(gpipe[r], m) << "gpipe p " << p << " m " << m << " rank " << r;
      }
    }
  // Lowering (send/recv, REDUCE_GRAD, OPTIM) does not change what is held.
  Schedule lowered = make_1f1b(4, 8);
  lower(lowered);
  EXPECT_EQ(peak_inflight_activations(lowered), (std::vector<int>{4, 3, 2, 1}));
}

TEST(PeakInflight, InterleavedHoldsItsWarmupPlusOneChunks) {
  // Each warm-up forward holds a microbatch-chunk; the steady state adds one more before the
  // first backward frees one.
  const Schedule s = make_interleaved(4, 2, 8);
  const auto peak = peak_inflight_activations(s);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(peak[r], std::min(2 * (4 - r - 1) + 4 + 1, 16)) << "rank " << r;
}

TEST(PeakInflight, ASplitBackwardHoldsTheActivationsUntilW) {
  // A microbatch's activations are held from its F to its W (its I frees nothing). ZB-H1 holds
  // back up to r W's on rank r beside 1F1B's p − r microbatches: p on every rank, the first
  // rank's peak (counted to each I, rank r's would be 1F1B's p − r).
  for (int p : {2, 4, 8}) {
    Schedule s = make_zb_h1(p, 2 * p);
    const auto unlowered = peak_inflight_activations(s);
    lower(s);
    const auto peak = peak_inflight_activations(s);
    EXPECT_EQ(peak, unlowered) << "p " << p;
    for (int r = 0; r < p; ++r) EXPECT_EQ(peak[r], p) << "p " << p << " rank " << r;
  }
}

TEST(BuildSchedule, FollowsThePlan) {
  ParallelPlan plan;
  plan.pipeline = 4;
  plan.data = 2;
  plan.micro_batch = 2;
  plan.global_batch = 64;  // m = 64 / (2·2) = 16
  plan.schedule = ScheduleKind::Interleaved;
  plan.virtual_stages = 3;
  const Schedule s = make_schedule(plan);
  EXPECT_EQ(s.p, 4);
  EXPECT_EQ(s.v, 3);
  EXPECT_EQ(s.m, 16);
  EXPECT_TRUE(s.lowered);
  plan.schedule = ScheduleKind::GPipe;
  plan.virtual_stages = 1;
  EXPECT_EQ(peak_inflight_activations(make_schedule(plan)), (std::vector<int>{16, 16, 16, 16}));
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// Unit times: F, I and W take 1 per chunk, B = I + W = 2, everything else (transfers) nothing.
double unit_duration(const Action& a) {
  switch (a.kind) {
    case ActionKind::F:
    case ActionKind::I:
    case ActionKind::W: return 1.0;
    case ActionKind::B: return 2.0;
    default: return 0.0;
  }
}

// The schedule lowered and timed at unit times.
CriticalPath at_unit_times(Schedule& s) {
  lower(s);
  ActionCosts c;
  c.duration = [](int, const Action& a) { return unit_duration(a); };
  return critical_path(s, c);
}

// The pipeline bubble at unit times: the makespan minus a rank's work, mean per rank (every
// rank of these schedules has the same work).
double idle_per_rank(Schedule s) {
  const CriticalPath cp = at_unit_times(s);
  double work = 0;
  for (const auto& prog : s.programs)
    for (const auto& a : prog.actions) work += unit_duration(a);
  return cp.makespan - work / s.p;
}

// The paper's measure, for an optimizer step without a synchronisation (post-validation): idle
// time inside each rank's busy window (from its first to its last compute action), mean per rank.
double idle_inside_window(Schedule s) {
  const CriticalPath cp = at_unit_times(s);
  double idle = 0;
  for (int r = 0; r < s.p; ++r) {
    double first = 1e300, last = 0, work = 0;
    for (size_t i = 0; i < s.programs[r].actions.size(); ++i) {
      const double d = unit_duration(s.programs[r].actions[i]);
      if (d == 0) continue;
      first = std::min(first, cp.times[r][i].start);
      last = std::max(last, cp.times[r][i].end);
      work += d;
    }
    idle += last - first - work;
  }
  return idle / s.p;
}

TEST(ZeroBubble, H1CutsTheBubbleToAThirdOf1F1BWithEqualTimes) {
  // Qi et al.: with T_F = T_I = T_W, 1F1B idles (p−1)(T_F + T_B) = 3(p−1) per rank, ZB-H1
  // (p−1)(T_F + T_I − T_W) = p−1, with the same peak activation memory (p microbatches).
  for (int p : {2, 4, 8}) {
    const int m = 4 * p;
    const double one_f_one_b = idle_per_rank(make_1f1b(p, m));
    EXPECT_NEAR(one_f_one_b, 3.0 * (p - 1), 1e-9) << p;
    const Schedule h1 = make_zb_h1(p, m);
    EXPECT_NEAR(idle_per_rank(h1), (p - 1), 0.1 * (p - 1)) << "p " << p;
    // The figures docs/ACCURACY.md quotes (ctest -R ZeroBubble -V).
    std::printf("bubble per rank, p %d m %d, unit times: 1f1b %.2f  zb-h1 %.2f  zb-h2 %.2f  zb-v %.2f (chunk units / 2)\n", p,
                m, one_f_one_b, idle_per_rank(h1), idle_per_rank(make_zb_h2(p, m)), idle_per_rank(make_zb_v(p, m)) / 2);
    std::printf("idle inside the busy window, p %d m %d: 1f1b %.2f  zb-h1 %.2f  zb-h2 %.2f  zb-v %.2f\n", p, m,
                idle_inside_window(make_1f1b(p, m)), idle_inside_window(h1), idle_inside_window(make_zb_h2(p, m)),
                idle_inside_window(make_zb_v(p, m)) / 2);
    const auto peak = peak_inflight_activations(h1);
    EXPECT_EQ(*std::max_element(peak.begin(), peak.end()), p) << "p " << p;  // 1F1B's peak (rank 0)
  }
}

TEST(ZeroBubble, H2AndVLeaveAlmostNoBubbleAtLargeM) {
  for (int p : {2, 4, 8}) {
    const int m = 8 * p;
    // Inside each rank's busy window (the paper's bubble, with the optimizer step post-validated):
    // ZB-H2 leaves none; 1F1B idles 1.5(p−1) there. ZB-V (the paper's hand-made V order, with
    // 1F1B's memory) leaves under 1% of the rank's work there at m = 4p and 8p (the rule;
    // the list scheduler's V left p/4 chunk units, 1.04% at m = 4p).
    EXPECT_LE(idle_inside_window(make_zb_h2(p, m)), 0.01) << "zb-h2 p " << p;
    for (int mm : {4 * p, 5 * p, 8 * p})
      EXPECT_LE(idle_inside_window(make_zb_v(p, mm)), 0.01 * 6 * mm) << "zb-v p " << p << " m " << mm;
    EXPECT_NEAR(idle_inside_window(make_1f1b(p, m)), 1.5 * (p - 1), 1e-9) << "1f1b p " << p;
    const double h2 = idle_per_rank(make_zb_h2(p, m));
    EXPECT_LE(h2, 0.05 * 3 * m) << "zb-h2 p " << p;  // under 5% of the work
    const Schedule h2s = make_zb_h2(p, m);
    const auto peak = peak_inflight_activations(h2s);
    EXPECT_EQ(peak[0], 2 * p - 1) << p;  // about twice 1F1B's p
    // ZB-V: chunks of half a stage; the same 1F1B comparison idles 3(p−1) stage-units = 6(p−1) chunk-units.
    const Schedule v = make_zb_v(p, m);
    EXPECT_EQ(v.stage_to_rank, v_shape_placement(p));
    EXPECT_EQ(v.stage_to_rank[0], v.stage_to_rank[2 * p - 1]);  // rank 0 holds the first and the last stage
    EXPECT_LE(idle_per_rank(v), 0.05 * 6 * m) << "zb-v p " << p;
    const auto vpeak = peak_inflight_activations(v);
    EXPECT_LE(*std::max_element(vpeak.begin(), vpeak.end()), 2 * p) << "zb-v keeps 1F1B's memory (2p half-stage chunks)";
  }
}

TEST(ZeroBubble, SchedulesAreValidAndSplitEveryBackward) {
  for (const Schedule& s : {make_zb_h1(4, 6), make_zb_h2(4, 3), make_zb_v(4, 5), make_zb_h1(1, 3), make_zb_v(1, 2)}) {
    Schedule lowered = s;
    EXPECT_NO_THROW(lower(lowered));
    for (const auto& prog : s.programs)
      for (const auto& a : prog.actions) EXPECT_NE(a.kind, ActionKind::B);
  }
}

TEST(ZeroBubble, AutoFollowsTheCostsAndRefusesAMemoryLimitNoScheduleMeets) {
  // With the first rank limited to one microbatch, W follows each I at once there (1F1B-like).
  ZeroBubbleCosts c;
  c.forward_s.assign(4, 1.0);
  c.input_s.assign(4, 1.0);
  c.weight_s.assign(4, 1.0);
  c.memory_limit = {7, 7, 7, 7};
  const double roomy = idle_per_rank(make_zb_auto(4, 16, c));
  c.memory_limit = {1, 7, 7, 7};
  const double tight = idle_per_rank(make_zb_auto(4, 16, c));
  EXPECT_GT(tight, roomy);
  // A slow W is deferred into bubbles; the scheduler still finishes every action.
  c.memory_limit = {7, 7, 7, 7};
  c.weight_s.assign(4, 3.0);
  EXPECT_NO_THROW(make_zb_auto(4, 16, c));
  c.memory_limit = {0, 7, 7, 7};
  try {
    make_zb_auto(4, 16, c);
    FAIL() << "a limit of 0 microbatches was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline rank 0"), std::string::npos) << e.what();
  }
}

TEST(DualPipeV, IsValidDeadlockFreeAndOverlapsItsSteadyState) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {2 * p, 2 * p + 3, 5 * p}) {
      const std::string what = "p " + std::to_string(p) + " m " + std::to_string(m);
      Schedule s = make_dualpipev(p, m);
      EXPECT_EQ(s.stage_to_rank, v_shape_placement(p)) << what;
      Schedule lowered = s;
      ASSERT_NO_THROW(lower(lowered)) << what;  // every F/B/I/W once, in order, no deadlock
      for (int r = 0; r < p; ++r) {
        int pairs = 0, warmup = 0;
        bool seen_backward = false;
        for (const Action& a : s.programs[r].actions) {
          pairs += a.overlap == 1 ? 1 : 0;
          if (a.kind != ActionKind::F) seen_backward = true;
          if (!seen_backward) ++warmup;
        }
        // Steady state: m − 2p + r + 1 rounds of two pairs (the last rank's first round one), then
        // p − r − 1 more pairs.
        const int want = 2 * (m - 2 * p + r + 1) - (r == p - 1 ? 1 : 0) + (p - r - 1);
        EXPECT_EQ(pairs, want) << what << " rank " << r;
        // Warm-up: 2(p − r − 1) forwards of chunk 0, then r + 1 of each chunk (the last rank one
        // more chunk-0 forward, which turns the V around before its first backward).
        EXPECT_EQ(warmup, 2 * (p - r - 1) + 2 * (r + 1) + (r == p - 1 ? 1 : 0)) << what << " rank " << r;
      }
      // The lowered pair: both inputs before it, both outputs after it.
      for (const auto& prog : lowered.programs)
        for (size_t i = 0; i + 1 < prog.actions.size(); ++i)
          if (prog.actions[i].overlap == 1) {
            EXPECT_EQ(prog.actions[i + 1].overlap, -1) << what;
            if (i + 2 < prog.actions.size()) {
              EXPECT_FALSE(is_p2p(prog.actions[i + 2].kind) && prog.actions[i + 2].kind != ActionKind::SEND_F &&
                           prog.actions[i + 2].kind != ActionKind::SEND_B) << what;
            }
          }
    }
}

TEST(DualPipeV, CsvKeepsThePairsBothWays) {
  Schedule s = make_dualpipev(4, 10);
  lower(s);
  const std::string csv = to_csv(s);
  EXPECT_NE(csv.find(")OVERLAP_F_B"), std::string::npos);
  const Schedule back = from_csv(csv, "dualpipev.csv");
  ASSERT_EQ(back.programs.size(), s.programs.size());
  for (size_t r = 0; r < s.programs.size(); ++r) EXPECT_EQ(back.programs[r].actions, s.programs[r].actions) << "rank " << r;
  // The compute-only form lowers to the same program.
  const Schedule compute = from_csv(to_csv(s, true), "dualpipev-compute.csv");
  for (size_t r = 0; r < s.programs.size(); ++r) EXPECT_EQ(compute.programs[r].actions, s.programs[r].actions) << "rank " << r;
  // A pair that does not follow each other is refused, naming it.
  Schedule broken = make_dualpipev(2, 4);
  auto& acts = broken.programs[0].actions;
  for (size_t i = 0; i + 1 < acts.size(); ++i)
    if (acts[i].overlap == 1) {
      std::swap(acts[i], acts[i + 1]);
      break;
    }
  EXPECT_THROW(lower(broken), ScheduleError);
}


TEST(DualPipe, TwoLanesOfMirroredStagesEachRunningHalfTheMicrobatches) {
  for (int p : {2, 4, 6, 8})
    for (int m : {2 * p, 2 * p + 2, 4 * p}) {
      const std::string what = "p " + std::to_string(p) + " m " + std::to_string(m);
      Schedule s = make_dualpipe(p, m);
      EXPECT_EQ(s.lanes, 2) << what;
      EXPECT_EQ(s.stage_to_rank, v_shape_placement(p)) << what;
      Schedule lowered = s;
      ASSERT_NO_THROW(lower(lowered)) << what;  // each lane's microbatches once per stage, no deadlock
      // Lane 0 (stages 0 … p−1) runs microbatches 0 … m/2−1; lane 1 the rest; stage p + j is
      // stage j's copy, entered from rank p − 1.
      for (int r = 0; r < p; ++r)
        for (const Action& a : s.programs[r].actions)
          EXPECT_EQ(a.stage < p, a.microbatch < m / 2) << what << " " << a.str();
      // Rank r and rank p − 1 − r run the same program with the lanes swapped.
      for (int r = 0; r < p; ++r) {
        const auto& mine = s.programs[r].actions;
        const auto& mirror = s.programs[p - 1 - r].actions;
        ASSERT_EQ(mine.size(), mirror.size()) << what;
        for (size_t i = 0; i < mine.size(); ++i) {
          Action a = mine[i];
          a.stage = (a.stage + p) % (2 * p);
          a.microbatch = (a.microbatch + m / 2) % m;
          if (a.overlap != 0) a.overlap_stage = (a.overlap_stage + p) % (2 * p);
          EXPECT_EQ(a, mirror[i]) << what << " rank " << r << " position " << i;
        }
      }
      // The gradient reductions of the two copies of a stage run in the same order on both ranks.
      for (int r = 0; r < p; ++r) {
        std::vector<int> mine, mirror;
        for (const Action& a : lowered.programs[r].actions)
          if (a.kind == ActionKind::REDUCE_GRAD) mine.push_back(a.stage % p);
        for (const Action& a : lowered.programs[p - 1 - r].actions)
          if (a.kind == ActionKind::REDUCE_GRAD) mirror.push_back(a.stage % p);
        EXPECT_EQ(mine, mirror) << what << " rank " << r;
      }
    }
}

TEST(DualPipe, BubbleIsDeepSeeksFormulaAtUnitTimes) {
  // DeepSeek-V3 (table 2): DualPipe's bubble is (p/2 − 1)(T_F&B + T_B − 3 T_W), T_F&B the time of
  // an overlapped forward–backward pair; at T_F = T_I = T_W = 1 (T_B = 2, T_F&B = 3): p − 2, against
  // 1F1B's (p − 1)(T_F + T_B) = 3(p − 1).
  for (int p : {2, 4, 8}) {
    const int m = 4 * p;
    const double dualpipe = idle_per_rank(make_dualpipe(p, m));
    const double onefoneb = idle_per_rank(make_1f1b(p, m));
    std::printf("p %d m %d, unit times, bubble: dualpipe %.2f  1f1b %.2f  (formula %d and %d)\n", p, m, dualpipe, onefoneb, p - 2,
                3 * (p - 1));
    EXPECT_NEAR(onefoneb, 3.0 * (p - 1), 1e-9);
    EXPECT_NEAR(dualpipe, p - 2.0, 1e-9) << "p " << p;
  }
}

TEST(DualPipe, CsvKeepsTheLanesBothWays) {
  Schedule s = make_dualpipe(4, 12);
  lower(s);
  const Schedule back = from_csv(to_csv(s), "dualpipe.csv");
  EXPECT_EQ(back.lanes, 2);
  ASSERT_EQ(back.programs.size(), s.programs.size());
  for (size_t r = 0; r < s.programs.size(); ++r) EXPECT_EQ(back.programs[r].actions, s.programs[r].actions) << "rank " << r;
  const Schedule compute = from_csv(to_csv(s, true), "dualpipe-compute.csv");
  EXPECT_EQ(compute.lanes, 2);
  for (size_t r = 0; r < s.programs.size(); ++r) EXPECT_EQ(compute.programs[r].actions, s.programs[r].actions) << "rank " << r;
  // A lane-0 microbatch on a lane-1 stage is refused, naming both.
  Schedule wrong = make_dualpipe(2, 4);
  for (Action& a : wrong.programs[0].actions)
    if (a.stage == 3 && a.microbatch == 3) a.microbatch = 1;
  try {
    lower(wrong);
    FAIL() << "a microbatch on another lane's stage was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("takes lane 0 and stage 3 is in lane 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// Megatron's --overlap-moe-expert-parallel-comm (parallel.moe_comm_overlap) merges a forward and a
// backward of two microbatches into one step: the schedule pairs each F with the B right after it
// when they belong to different microbatches, lowers without deadlock on every shape, and leaves
// the plans without the flag (or with GPipe, which has no such neighbours) unpaired.
TEST(ExpertOverlapPairs, MergeAForwardWithTheNextMicrobatchsBackwardAndLowerWithoutDeadlock) {
  for (const auto& [p, v, m] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {1, 1, 2}, {1, 1, 8}, {2, 1, 2}, {2, 1, 8}, {4, 1, 4}, {4, 1, 16}, {8, 1, 32}, {4, 2, 8}, {4, 4, 16}, {8, 2, 64}, {3, 2, 6}}) {
    ParallelPlan plan;
    plan.pipeline = p, plan.virtual_stages = v, plan.expert = 2, plan.micro_batch = 1, plan.global_batch = m;
    plan.schedule = v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    plan.overlap_p2p = true;
    plan.moe_comm_overlap = true;
    SCOPED_TRACE(std::to_string(p) + "/" + std::to_string(v) + "/" + std::to_string(m));
    Schedule s;
    ASSERT_NO_THROW(s = make_schedule(plan, true));
    int pairs = 0;
    for (int r = 0; r < p; ++r) {
      const std::vector<Action> acts = compute_only(s.programs[r]);
      for (size_t i = 0; i < acts.size(); ++i) {
        if (acts[i].overlap != 1) continue;
        ASSERT_LT(i + 1, acts.size());
        EXPECT_EQ(acts[i].kind, ActionKind::F);
        EXPECT_EQ(acts[i + 1].kind, ActionKind::B);
        EXPECT_EQ(acts[i + 1].overlap, -1);
        EXPECT_NE(acts[i].microbatch, acts[i + 1].microbatch);  // an F and a B of one microbatch wait on each other
        ++pairs;
      }
    }
    if (p == 1) {
      // Without pipelining: F0, (F1;B0), (F2;B1), …, B(m−1).
      const std::vector<Action> acts = compute_only(s.programs[0]);
      ASSERT_EQ(acts.size(), 2u * static_cast<size_t>(m));
      EXPECT_EQ(pairs, m - 1);
      EXPECT_EQ(acts.front().str(), "0F0");
      EXPECT_EQ(acts.back().str(), "0B" + std::to_string(m - 1));
      if (m >= 2) { EXPECT_EQ(acts[1].str() + ";" + acts[2].str(), "0F1;0B0"); }
    } else if (v == 1) {
      // 1F1B with pipelining: not merged (Megatron-Core refuses it; the plan's check says why).
      EXPECT_EQ(pairs, 0);
    } else {
      EXPECT_GT(pairs, 0);
    }
    plan.moe_comm_overlap = false;
    for (const RankProgram& prog : make_schedule(plan, true).programs)
      for (const Action& a : prog.actions) EXPECT_EQ(a.overlap, 0);
  }
  ParallelPlan gpipe;
  gpipe.pipeline = 4, gpipe.expert = 2, gpipe.global_batch = 8, gpipe.schedule = ScheduleKind::GPipe, gpipe.moe_comm_overlap = true;
  for (const RankProgram& prog : make_schedule(gpipe, true).programs)
    for (const Action& a : prog.actions) EXPECT_EQ(a.overlap, 0);
}

}  // namespace
}  // namespace ptdp
