// Passes: validate (rejects malformed schedules, naming the action), add REDUCE_GRAD/OPTIM, add
// send/recv so that every SEND has exactly one matching RECV on the consumer's rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

Action act(ActionKind k, int stage, int mb) { return Action{k, stage, mb}; }
constexpr auto F = ActionKind::F;
constexpr auto B = ActionKind::B;

// A 2-rank, 2-microbatch schedule written by hand: rank 0 holds stage 0, rank 1 stage 1.
Schedule hand(std::vector<Action> rank0, std::vector<Action> rank1, int m = 2) {
  Schedule s;
  s.p = 2;
  s.v = 1;
  s.m = m;
  s.stage_to_rank = {0, 1};
  s.programs = {RankProgram{std::move(rank0)}, RankProgram{std::move(rank1)}};
  return s;
}

std::string rejection(const Schedule& s) {
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

TEST(Validate, AcceptsAHandWrittenOneFOneB) {
  EXPECT_EQ(rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                           {act(F, 1, 0), act(B, 1, 0), act(F, 1, 1), act(B, 1, 1)})),
            "");
}

TEST(Validate, RejectsABackwardBeforeItsForward) {
  const std::string e = rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                                       {act(B, 1, 0), act(F, 1, 0), act(F, 1, 1), act(B, 1, 1)}));
  EXPECT_NE(e.find("1B0"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  EXPECT_NE(e.find("before the forward"), std::string::npos) << e;
}

TEST(Validate, RejectsAMissingBackward) {
  const std::string e = rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                                       {act(F, 1, 0), act(B, 1, 0), act(F, 1, 1)}));
  EXPECT_NE(e.find("never runs 1B1"), std::string::npos) << e;
}

TEST(Validate, RejectsAMissingForward) {
  const std::string e = rejection(hand({act(F, 0, 0), act(B, 0, 0)}, {act(F, 1, 0), act(B, 1, 0)}));  // m = 2
  EXPECT_NE(e.find("never runs 0F1"), std::string::npos) << e;
}

TEST(Validate, RejectsAStageOnTheWrongRank) {
  const std::string e = rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1), act(F, 1, 0)},
                                       {act(B, 1, 0), act(F, 1, 1), act(B, 1, 1)}));
  EXPECT_NE(e.find("1F0"), std::string::npos) << e;
  EXPECT_NE(e.find("belongs to rank 1"), std::string::npos) << e;
}

TEST(Validate, RejectsDuplicatesOutOfRangeAndWBeforeI) {
  EXPECT_NE(rejection(hand({act(F, 0, 0), act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                           {act(F, 1, 0), act(B, 1, 0), act(F, 1, 1), act(B, 1, 1)}))
                .find("appears twice"),
            std::string::npos);
  EXPECT_NE(rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1), act(F, 0, 2)},
                           {act(F, 1, 0), act(B, 1, 0), act(F, 1, 1), act(B, 1, 1)}))
                .find("microbatch out of range"),
            std::string::npos);
  const std::string e = rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                                       {act(F, 1, 0), act(ActionKind::W, 1, 0), act(ActionKind::I, 1, 0), act(F, 1, 1),
                                        act(B, 1, 1)}));
  EXPECT_NE(e.find("W before its I"), std::string::npos) << e;
  // A split backward (I then W) is a valid backward.
  EXPECT_EQ(rejection(hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0), act(B, 0, 1)},
                           {act(F, 1, 0), act(ActionKind::I, 1, 0), act(ActionKind::W, 1, 0), act(F, 1, 1), act(B, 1, 1)})),
            "");
}

// Checks a lowered schedule's p2p: each SEND has exactly one RECV for the same (direction,
// microbatch) at the neighbouring stage, on that stage's rank, placed before the compute that
// consumes it; each SEND follows the compute that produced it.
void expect_paired_p2p(const Schedule& s, const std::string& what) {
  using Key = std::tuple<int, int, int>;  // direction, receiving stage, microbatch
  std::map<Key, int> sends, recvs;
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
        const bool fwd = a.kind == ActionKind::SEND_F;
        ++sends[Key{fwd ? 0 : 1, fwd ? a.stage + 1 : a.stage - 1, a.microbatch}];
        ASSERT_GT(i, 0u) << what;
        EXPECT_EQ(acts[i - 1], (Action{fwd ? F : B, a.stage, a.microbatch})) << what << ": " << a.str() << " on rank " << r;
      }
      if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
        const bool fwd = a.kind == ActionKind::RECV_F;
        ++recvs[Key{fwd ? 0 : 1, a.stage, a.microbatch}];
        EXPECT_EQ(s.stage_to_rank[a.stage], r) << what << ": " << a.str();
        ASSERT_LT(i + 1, acts.size()) << what;
        EXPECT_EQ(acts[i + 1], (Action{fwd ? F : B, a.stage, a.microbatch})) << what << ": " << a.str() << " on rank " << r;
      }
    }
  }
  EXPECT_EQ(sends, recvs) << what;
  for (const auto& [key, n] : sends) EXPECT_EQ(n, 1) << what;
  // Every stage boundary carries m forward and m backward transfers.
  EXPECT_EQ(static_cast<int>(sends.size()), 2 * (s.num_stages() - 1) * s.m) << what;
}

TEST(Lower, PairsEverySendWithOneReceive) {
  for (int p : {2, 3, 4})
    for (int m : {1, 4, 8}) {
      Schedule g = make_gpipe(p, m), f = make_1f1b(p, m);
      lower(g);
      lower(f);
      expect_paired_p2p(g, "gpipe p " + std::to_string(p) + " m " + std::to_string(m));
      expect_paired_p2p(f, "1f1b p " + std::to_string(p) + " m " + std::to_string(m));
    }
  for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{3, 3, 6}, std::tuple{8, 2, 16}, std::tuple{2, 4, 4}}) {
    Schedule s = make_interleaved(p, v, m);
    lower(s);
    expect_paired_p2p(s, "interleaved p " + std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
  }
}

TEST(Lower, ReducesEachStagesGradientsAfterItsLastBackwardThenStepsTheOptimizer) {
  Schedule s = make_interleaved(4, 2, 8);
  lower(s);
  EXPECT_TRUE(s.lowered);
  for (int r = 0; r < 4; ++r) {
    const auto& acts = s.programs[r].actions;
    ASSERT_FALSE(acts.empty());
    EXPECT_EQ(acts.back().kind, ActionKind::OPTIM) << "rank " << r;
    std::map<int, size_t> last_backward, reduce;
    for (size_t i = 0; i < acts.size(); ++i) {
      if (acts[i].kind == B) last_backward[acts[i].stage] = i;
      if (acts[i].kind == ActionKind::REDUCE_GRAD) {
        EXPECT_EQ(reduce.count(acts[i].stage), 0u);
        reduce[acts[i].stage] = i;
      }
    }
    EXPECT_EQ(reduce.size(), 2u) << "one REDUCE_GRAD per stage of the rank";
    for (const auto& [stage, at] : reduce) {
      EXPECT_EQ(stage % 4, r);
      EXPECT_GT(at, last_backward.at(stage));
    }
  }
}

TEST(Lower, IsIdempotent) {
  Schedule once = make_1f1b(4, 8);
  lower(once);
  Schedule twice = once;
  lower(twice);
  ASSERT_EQ(once.programs.size(), twice.programs.size());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(once.programs[r].actions, twice.programs[r].actions) << "rank " << r;
}

TEST(Lower, RejectsAnInvalidSchedule) {
  Schedule s = hand({act(F, 0, 0), act(F, 0, 1), act(B, 0, 0)}, {act(F, 1, 0), act(B, 1, 0), act(F, 1, 1), act(B, 1, 1)});
  EXPECT_THROW(lower(s), ScheduleError);
}

TEST(ValidateLowered, AcceptsEveryGeneratorsLoweredSchedule) {
  std::vector<Schedule> all = {make_gpipe(4, 6),          make_1f1b(4, 8),  make_1f1b(1, 3), make_interleaved(4, 2, 8),
                               make_interleaved(3, 4, 9), make_zb_h1(4, 8), make_zb_h2(4, 8), make_zb_v(4, 8)};
  for (Schedule& s : all) {
    lower(s);
    EXPECT_NO_THROW(validate_lowered(s)) << to_csv(s);
  }
}

// Edits rank `r`'s lowered 1F1B program (p 2, m 2) and returns validate_lowered's message.
template <class Edit>
std::string lowered_rejection(int r, Edit edit) {
  Schedule s = make_1f1b(2, 2);
  lower(s);
  edit(s.programs[r].actions);
  try {
    validate_lowered(s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

TEST(ValidateLowered, EachRankRunsACompleteProgram) {
  auto drop = [](ActionKind k) {
    return [k](std::vector<Action>& a) { std::erase_if(a, [k](const Action& x) { return x.kind == k; }); };
  };
  EXPECT_EQ(lowered_rejection(1, drop(ActionKind::REDUCE_GRAD)),
            "rank 1: stage 1 has no 1REDUCE_GRAD (its data-parallel gradient reduction)");
  EXPECT_EQ(lowered_rejection(0, drop(ActionKind::OPTIM)), "rank 0 has no optimizer step (OPTIM) at the end of its program");
  // The optimizer step before the backward.
  EXPECT_EQ(lowered_rejection(1, [](std::vector<Action>& a) { std::rotate(a.begin(), a.end() - 1, a.end()); }),
            "rank 1, position 0 (OPTIM): the optimizer step must be the rank's last action (1RECV_F0 follows it)");
  EXPECT_EQ(lowered_rejection(0, [](std::vector<Action>& a) { a.push_back(Action{ActionKind::OPTIM, -1, -1}); }),
            "rank 0, position 10 (OPTIM): a second optimizer step on this rank (one per iteration)");
  // REDUCE_GRAD moved before the last backward.
  const std::string early = lowered_rejection(0, [](std::vector<Action>& a) {
    auto it = std::find_if(a.begin(), a.end(), [](const Action& x) { return x.kind == ActionKind::REDUCE_GRAD; });
    const Action rg = *it;
    a.erase(it);
    a.insert(a.begin() + 1, rg);
  });
  EXPECT_NE(early.find("0REDUCE_GRAD at position 1 comes before the stage's last backward"), std::string::npos) << early;
  EXPECT_EQ(lowered_rejection(1, [](std::vector<Action>& a) { a.insert(a.end() - 1, Action{ActionKind::REDUCE_GRAD, 0, -1}); }),
            "rank 1, position 9 (0REDUCE_GRAD): stage 0 belongs to rank 0");
  // A transfer the data needs, missing on both ends.
  const std::string missing = lowered_rejection(1, [](std::vector<Action>& a) {
    std::erase_if(a, [](const Action& x) { return x.kind == ActionKind::RECV_F && x.microbatch == 1; });
  });
  EXPECT_EQ(missing, "rank 1: 1RECV_F1 is missing (1F1 needs it)");
  EXPECT_EQ(lowered_rejection(0, [](std::vector<Action>& a) { a.insert(a.begin(), Action{ActionKind::RECV_F, 0, 0}); }),
            "rank 0, position 0 (0RECV_F0): stage 0 has no neighbour in that direction");
}

TEST(ValidateLowered, UnshardAndReshardPairUp) {
  // An UNSHARD holds the stage's parameters until its RESHARD: a RESHARD of nothing, or a second
  // UNSHARD of a stage already whole, is refused (the executor asserted on the first and
  // reference-counted the second; SimGrid overwrote a flag).
  EXPECT_EQ(lowered_rejection(0, [](std::vector<Action>& a) { a.insert(a.begin(), Action{ActionKind::RESHARD, 0, -1}); }),
            "rank 0, position 0 (0RESHARD): no 0UNSHARD before it (nothing to reshard)");
  EXPECT_EQ(lowered_rejection(0,
                              [](std::vector<Action>& a) {
                                a.insert(a.begin(), Action{ActionKind::UNSHARD, 0, -1});
                                a.insert(a.begin() + 2, Action{ActionKind::UNSHARD, 0, -1});
                              }),
            "rank 0, position 2 (0UNSHARD): stage 0 is already unsharded (by 0UNSHARD at position 0; RESHARD it first)");
  // A window around the stage's compute is accepted.
  EXPECT_EQ(lowered_rejection(0,
                              [](std::vector<Action>& a) {
                                a.insert(a.begin(), Action{ActionKind::UNSHARD, 0, -1});
                                a.insert(a.end() - 1, Action{ActionKind::RESHARD, 0, -1});
                              }),
            "");
}

TEST(ValidateLowered, TwoLanesReduceInLayerOrderOnEveryRank) {
  // DualPipe: a rank and its mirror sum the copies' gradients pair by pair inside REDUCE_GRAD, so
  // both reduce in layer order; another order would hang the executor's mirror all-reduces.
  Schedule s = make_dualpipe(4, 8);
  if (!s.lowered) lower(s);
  validate_lowered(s);
  auto& acts = s.programs[0].actions;
  std::vector<size_t> at;
  for (size_t i = 0; i < acts.size(); ++i)
    if (acts[i].kind == ActionKind::REDUCE_GRAD) at.push_back(i);
  ASSERT_EQ(at.size(), 2u);
  std::swap(acts[at[0]], acts[at[1]]);
  try {
    validate_lowered(s);
    ADD_FAILURE() << "a swapped reduction order was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("with two lanes each rank reduces its stages in layer order"), std::string::npos) << e.what();
    EXPECT_EQ(e.rank, 0);
  }
}

TEST(Actions, StringFormIsPyTorchs) {
  EXPECT_EQ((Action{ActionKind::F, 2, 0}).str(), "2F0");
  EXPECT_EQ((Action{ActionKind::SEND_B, 1, 3}).str(), "1SEND_B3");
  EXPECT_EQ((Action{ActionKind::REDUCE_GRAD, 0, -1}).str(), "0REDUCE_GRAD");
  EXPECT_EQ((Action{ActionKind::OPTIM, -1, -1}).str(), "OPTIM");
  for (const char* text : {"2F0", "13B127", "1SEND_B3", "4RECV_F9", "0REDUCE_GRAD", "OPTIM", "3I2", "3W2"})
    EXPECT_EQ(parse_action(text).str(), text);
  for (const char* bad : {"0X1", "F0", "0F", "OPTIM3", "0REDUCE_GRAD1", "0F1x", ""})
    EXPECT_ANY_THROW(parse_action(bad)) << bad;
}

}  // namespace
}  // namespace ptdp
