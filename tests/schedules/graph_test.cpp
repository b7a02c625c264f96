// Dependency graph: deadlock detection and the cost-weighted critical path. With equal action
// costs the critical path must give the textbook pipeline bubble.
#include "schedules/graph.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

// F = 1 and B = 2 per microbatch on the whole rank, i.e. 1/v and 2/v per chunk; transfers,
// REDUCE_GRAD and OPTIM free.
ActionCosts unit_costs(int v) {
  ActionCosts c;
  c.duration = [v](int, const Action& a) -> double {
    if (a.kind == ActionKind::F) return 1.0 / v;
    if (a.kind == ActionKind::B) return 2.0 / v;
    return 0.0;
  };
  return c;
}

// Bubble as a fraction of wall time on rank r: 1 − busy / makespan.
double bubble_fraction(const Schedule& s, int v, double makespan) {
  const double busy = 3.0 * s.m;  // m microbatches × (F + B) on every rank
  (void)v;
  return 1.0 - busy / makespan;
}

double textbook(int p, int v, int m) { return static_cast<double>(p - 1) / (v * m + p - 1); }

TEST(CriticalPath, GPipeAndOneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 2, 4, 7, 16, 64}) {
      for (bool gpipe : {true, false}) {
        Schedule s = gpipe ? make_gpipe(p, m) : make_1f1b(p, m);
        lower(s);
        const CriticalPath cp = critical_path(s, unit_costs(1));
        EXPECT_NEAR(cp.makespan, 3.0 * (m + p - 1), 1e-9) << (gpipe ? "gpipe" : "1f1b") << " p " << p << " m " << m;
        EXPECT_NEAR(bubble_fraction(s, 1, cp.makespan), textbook(p, 1, m), 1e-12)
            << (gpipe ? "gpipe" : "1f1b") << " p " << p << " m " << m;
      }
    }
}

TEST(CriticalPath, InterleavedBubbleIsPMinusOneOverVMPlusPMinusOne) {
  // Exact (to rounding) for every m Megatron-LM accepts with the default group G = p, i.e. m a
  // multiple of p. (The generator also accepts other m; those schedules are not the ones the
  // formula describes and are rejected by validate_plan.)
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int k : {1, 2, 3, 8}) {
        const int m = k * p;
        Schedule s = make_interleaved(p, v, m);
        lower(s);
        const CriticalPath cp = critical_path(s, unit_costs(v));
        EXPECT_NEAR(cp.makespan, 3.0 * (v * m + p - 1) / v, 1e-9) << "p " << p << " v " << v << " m " << m;
        EXPECT_NEAR(bubble_fraction(s, v, cp.makespan), textbook(p, v, m), 1e-12) << "p " << p << " v " << v << " m " << m;
      }
  // Other group sizes allowed by the newer rule (p ≤ G ≤ m, m mod G = 0 or ≥ p) are exact too.
  for (auto [p, v, m, G] : {std::tuple{4, 2, 10, 5}, std::tuple{4, 3, 12, 6}, std::tuple{4, 2, 9, 5}, std::tuple{8, 2, 24, 12}}) {
    Schedule s = make_interleaved(p, v, m, GeneratorOptions{G});
    lower(s);
    EXPECT_NEAR(critical_path(s, unit_costs(v)).makespan, 3.0 * (v * m + p - 1) / v, 1e-9)
        << "p " << p << " v " << v << " m " << m << " G " << G;
  }
  // The paper's headline: interleaving with v = 2 halves the bubble time of 1F1B.
  Schedule one = make_1f1b(8, 16), two = make_interleaved(8, 2, 16);
  lower(one);
  lower(two);
  const double bubble1 = critical_path(one, unit_costs(1)).makespan - 48, bubble2 = critical_path(two, unit_costs(2)).makespan - 48;
  EXPECT_NEAR(bubble2 / bubble1, 0.5, 1e-9);
}

TEST(CriticalPath, AddsTransferTimesAlongTheChain) {
  // p 2, m 1: 0F0 → (transfer) → 1F0 → 1B0 → (transfer) → 0B0.
  Schedule s = make_1f1b(2, 1);
  lower(s);
  ActionCosts c = unit_costs(1);
  c.transfer = [](int, const Action&) { return 0.25; };
  const CriticalPath cp = critical_path(s, c);
  EXPECT_NEAR(cp.makespan, 1 + 0.25 + 1 + 2 + 0.25 + 2, 1e-12);
  // The chain starts at rank 0's first action and ends at its last; times are consistent.
  ASSERT_FALSE(cp.path.empty());
  EXPECT_EQ(cp.path.front().first, 0);
  EXPECT_EQ(cp.path.back().first, 0);
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < cp.times[r].size(); ++i) {
      EXPECT_LE(cp.times[r][i].start, cp.times[r][i].end);
      if (i > 0) {
        EXPECT_GE(cp.times[r][i].start, cp.times[r][i - 1].end);
      }
    }
}

TEST(CriticalPath, UsesPerStageCosts) {
  // A slow last stage (cost ×2) stretches 1F1B to (m + p − 1) steps of the slowest stage, roughly:
  // here exactly m·3·2 plus the fill and drain of the faster stages before and after it.
  Schedule s = make_1f1b(2, 4);
  lower(s);
  ActionCosts c;
  c.duration = [](int rank, const Action& a) -> double {
    const double k = rank == 1 ? 2.0 : 1.0;
    return a.kind == ActionKind::F ? k : a.kind == ActionKind::B ? 2 * k : 0.0;
  };
  EXPECT_NEAR(critical_path(s, c).makespan, 1 + 4 * 6 + 2, 1e-12);
}

// The hand-broken schedule of the issue: rank 1 runs microbatch 1 first, rank 0 microbatch 0.
Schedule broken() {
  Schedule s;
  s.p = 2;
  s.v = 1;
  s.m = 2;
  s.stage_to_rank = {0, 1};
  s.programs = {RankProgram{{{ActionKind::F, 0, 0}, {ActionKind::B, 0, 0}, {ActionKind::F, 0, 1}, {ActionKind::B, 0, 1}}},
                RankProgram{{{ActionKind::F, 1, 1}, {ActionKind::B, 1, 1}, {ActionKind::F, 1, 0}, {ActionKind::B, 1, 0}}}};
  return s;
}

TEST(Deadlock, CycleIsReportedNamingTheStuckActions) {
  Schedule s = broken();
  EXPECT_NO_THROW(validate(s));  // each stage on its own is fine: F before B
  try {
    lower(s);
    FAIL() << "a deadlocking schedule was lowered";
  } catch (const ScheduleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    // Rank 0 waits for 1's gradient of microbatch 0; rank 1 waits for 0's activation of microbatch 1.
    EXPECT_NE(msg.find("0RECV_B0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1RECV_F1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  }
}

TEST(Deadlock, ReceiveWithoutSendIsNamed) {
  Schedule s = make_1f1b(2, 2);
  lower(s);
  // Drop rank 0's SEND_F of microbatch 1: rank 1 would wait forever in 1RECV_F1.
  auto& acts = s.programs[0].actions;
  std::erase(acts, Action{ActionKind::SEND_F, 0, 1});
  try {
    check_deadlock_free(s);
    FAIL() << "a receive without a send was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("1RECV_F1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(critical_path(s, unit_costs(1)), ScheduleError);
}

// As many receives as sends, every receive able to run, yet one send is never received: a
// doubled receive takes its place. Refused, naming the doubled receive.
TEST(Deadlock, ADoubledReceiveIsNotTakenForTheMissingOne) {
  Schedule s = make_1f1b(2, 2);
  lower(s);
  auto& acts = s.programs[1].actions;
  *std::find(acts.begin(), acts.end(), Action{ActionKind::RECV_F, 1, 1}) = Action{ActionKind::RECV_F, 1, 0};
  try {
    check_deadlock_free(s);
    FAIL() << "a doubled receive with a send nobody receives was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("1RECV_F0 appears twice"), std::string::npos) << e.what();
  }
}

// A send twice and its receive twice: every count matches, each receive finds a send before it.
TEST(Deadlock, ATransferSentTwiceIsRefused) {
  Schedule s = make_1f1b(2, 2);
  lower(s);
  for (int r : {0, 1}) {
    auto& acts = s.programs[r].actions;
    const Action a = r == 0 ? Action{ActionKind::SEND_F, 0, 0} : Action{ActionKind::RECV_F, 1, 0};
    acts.insert(std::find(acts.begin(), acts.end(), a) + 1, a);
  }
  EXPECT_THROW(check_deadlock_free(s), ScheduleError);
}

TEST(Deadlock, GeneratedSchedulesAreDeadlockFree) {
  for (int p : {2, 4, 8})
    for (int m : {1, 3, 8}) {
      Schedule g = make_gpipe(p, m), f = make_1f1b(p, m);
      lower(g);
      lower(f);
      EXPECT_NO_THROW(check_deadlock_free(g));
      EXPECT_NO_THROW(check_deadlock_free(f));
    }
}

}  // namespace
}  // namespace ptdp
