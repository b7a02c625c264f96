// Zero-bubble pipeline schedules (Qi et al., ICLR 2024; ZB-V: arXiv 2405.15362). The backward of
// each stage is split into I (input gradient, on the critical path) and W (weight gradient,
// deferrable). One list scheduler places every action, given per-stage times of F, I and W, a
// transfer time and a limit on the microbatch-chunks whose activations a rank may hold (F seen,
// W not yet):
//   - an I whose gradient has arrived runs first (it feeds the previous stage);
//   - then an F whose input has arrived, while the rank is under its memory limit, deeper
//     stages first;
//   - then the oldest pending W (it fills what would otherwise be bubble, and frees memory);
//   - else the rank waits for the next arrival.
// zb-h1: the paper's hand-made schedule (below), not the list scheduler;
// zb-h2: limit 2p − 1 (about twice 1F1B's peak; the warm-up fills the pipeline);
// zb-v:  two chunks per rank in a V, limit 2p chunk-activations (= 1F1B's peak, p microbatches
//        of a full stage): the paper's hand-made V order (handmade_zb_v, timed by replaying it
//        with the costs) and the list scheduler under two ways of sharing the limit between the
//        chunks (ChunkShare); the one that finishes first is kept;
// both placed with the costed times when the caller has them (the simulator and the executor
// then run the same schedule: sim/costing make_costed_schedule), else with equal unit times;
// zb-auto: the costed times and the limits of the GPUs' free memory.
#include <algorithm>
#include <deque>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "model/plan.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

struct Placed {
  int stage;
  int mb;
};

// How a rank with several stages (ZB-V) shares its memory limit between them, so that the early
// chunk cannot take all the room the later one needs to turn the pipeline around:
//   Even:   limit / stages each;
//   Greedy: every stage but the last the whole limit minus one slot per later stage.
// Neither wins everywhere (issue 24: at unit times Even leaves about half of ZB-H1's bubble and
// Greedy a third of it; with full recompute's costed times Even is worse than 1F1B), so ZB-V
// places both and keeps the one that finishes first (Greedy on a tie: less idle inside the ranks' windows).
enum class ChunkShare { Even, Greedy };

struct Placement {
  Schedule schedule;
  double makespan = 0;  // the list scheduler's own clock: the last rank's finish
};

Placement list_schedule(int p, int v, int m, std::vector<int> stage_to_rank, const ZeroBubbleCosts& c,
                        ChunkShare share = ChunkShare::Even) {
  const int S = p * v;
  PTDP_ASSERT(static_cast<int>(c.forward_s.size()) == S && static_cast<int>(c.input_s.size()) == S &&
                  static_cast<int>(c.weight_s.size()) == S,
              "zero-bubble costs need one time per stage");
  PTDP_ASSERT(static_cast<int>(c.memory_limit.size()) == p, "zero-bubble costs need one memory limit per rank");
  for (int r = 0; r < p; ++r)
    if (c.memory_limit[r] < 1)
      throw MemoryLimitError("pipeline rank " + std::to_string(r) + " has room for " + std::to_string(c.memory_limit[r]) +
                          " microbatches' activations: no schedule fits the memory limit");
  Schedule s = empty_schedule(p, v, m, std::move(stage_to_rank));
  std::vector<std::vector<int>> stages_of(p);
  for (int st = 0; st < S; ++st) stages_of[s.stage_to_rank[st]].push_back(st);

  const double unknown = -1;
  const size_t cells = static_cast<size_t>(S) * m;
  std::vector<double> f_end(cells, unknown), i_end(cells, unknown);
  auto cell = [&](int st, int mb) { return static_cast<size_t>(st) * m + mb; };
  auto comm = [&](int from, int to) { return s.stage_to_rank[from] == s.stage_to_rank[to] ? 0.0 : c.transfer_s; };
  std::vector<int> next_f(S, 0), next_i(S, 0);
  std::vector<std::deque<Placed>> pending_w(p);
  std::vector<int> inflight(p, 0);
  std::vector<int> stage_inflight(S, 0);
  auto stage_room = [&](int st) {
    const int r = s.stage_to_rank[st];
    const auto& mine = stages_of[r];
    const int later = static_cast<int>(mine.end() - std::find(mine.begin(), mine.end(), st)) - 1;
    const int room = share == ChunkShare::Even ? c.memory_limit[r] / static_cast<int>(mine.size()) : c.memory_limit[r] - later;
    return stage_inflight[st] < std::max(1, room);
  };
  std::vector<double> clock(p, 0);
  std::vector<char> blocked(p, 0);
  int blocked_ranks = 0;  // how many `blocked` flags are set (most placements find none to clear)
  std::vector<int64_t> left(p);
  int64_t remaining = 0;
  for (int r = 0; r < p; ++r) remaining += left[r] = 3 * static_cast<int64_t>(stages_of[r].size()) * m;
  // The unfinished ranks take their turns in the order (clock, blocked, rank): the first is the
  // one furthest behind (ties: not blocked, lowest rank). A scan of the p ranks finds it: cheaper
  // than keeping them in an ordered set, whose nodes are allocated and freed at every placement.

  // When the input of the next F / I of stage st is there (unknown = not yet produced).
  auto f_ready = [&](int st) -> double {
    const int mb = next_f[st];
    if (mb >= m) return unknown;
    if (st == 0) return 0;
    const double e = f_end[cell(st - 1, mb)];
    return e < 0 ? unknown : e + comm(st - 1, st);
  };
  auto i_ready = [&](int st) -> double {
    const int mb = next_i[st];
    if (mb >= m || mb >= next_f[st]) return unknown;  // its F has not run yet
    if (st == S - 1) return f_end[cell(st, mb)];
    const double e = i_end[cell(st + 1, mb)];
    return e < 0 ? unknown : e + comm(st + 1, st);
  };

  // One turn of rank r at its clock t, the furthest behind (ties: not blocked, lowest rank);
  // `later_clock`: the earliest clock past t among the other unfinished ranks, which an idle r
  // waits for (step 4).
  enum class Turn { Placed, Waited, Blocked };
  auto turn = [&](int r, double later_clock) -> Turn {
    const double t = clock[r];
    auto& acts = s.programs[r].actions;
    double next_event = std::numeric_limits<double>::infinity();
    auto consider = [&](double ready) {
      if (ready > t) next_event = std::min(next_event, ready);
    };
    // 1. An I whose gradient has arrived: lowest microbatch, then the deeper stage.
    int best = -1;
    for (int st : stages_of[r]) {
      const double ready = i_ready(st);
      if (ready < 0) continue;
      consider(ready);
      if (ready <= t && (best < 0 || next_i[st] < next_i[best] || (next_i[st] == next_i[best] && st > best))) best = st;
    }
    if (best >= 0) {
      const int mb = next_i[best]++;
      i_end[cell(best, mb)] = t + c.input_s[best];
      clock[r] = t + c.input_s[best];
      acts.push_back(Action{ActionKind::I, best, mb});
      pending_w[r].push_back(Placed{best, mb});
    } else {
      // 2. An F whose input has arrived, under the memory limit: the deeper stage first.
      if (inflight[r] < c.memory_limit[r])
        for (int st : stages_of[r]) {
          const double ready = f_ready(st);
          if (ready < 0 || !stage_room(st)) continue;
          consider(ready);
          if (ready <= t && (best < 0 || st > best)) best = st;
        }
      if (best >= 0) {
        const int mb = next_f[best]++;
        f_end[cell(best, mb)] = t + c.forward_s[best];
        clock[r] = t + c.forward_s[best];
        acts.push_back(Action{ActionKind::F, best, mb});
        ++inflight[r];
        ++stage_inflight[best];
      } else if (!pending_w[r].empty()) {
        // 3. The oldest W: fills the wait and frees its activations.
        const Placed w = pending_w[r].front();
        pending_w[r].pop_front();
        clock[r] = t + c.weight_s[w.stage];
        acts.push_back(Action{ActionKind::W, w.stage, w.mb});
        --inflight[r];
        --stage_inflight[w.stage];
      } else {
        // 4. Nothing to do: wait for the next arrival, or for the others to move (the earliest
        // clock past t among the other unfinished ranks).
        next_event = std::min(next_event, later_clock);
        if (next_event < std::numeric_limits<double>::infinity()) {
          clock[r] = next_event;
          blocked_ranks -= blocked[r];
          blocked[r] = 0;
          return Turn::Waited;
        }
        blocked_ranks += !blocked[r];
        blocked[r] = 1;
        // Every unfinished rank blocked at t (none is behind t: r was the furthest behind).
        bool all_blocked = true;
        for (int q = 0; q < p && all_blocked; ++q)
          if (q != r && left[q] > 0) all_blocked = clock[q] == t && blocked[q];
        if (all_blocked)
          throw MemoryLimitError("no schedule fits the memory limits (every rank waits at t = " + std::to_string(t) +
                              "): raise the limit of the first ranks");
        return Turn::Blocked;
      }
    }
    --left[r];
    --remaining;
    if (blocked_ranks > 0)  // new work may have become available
      std::fill(blocked.begin(), blocked.end(), 0);
    blocked_ranks = 0;
    return Turn::Placed;
  };

  // The ranks at the earliest clock, in turn order (not blocked first, then by rank).
  std::vector<int> tied(static_cast<size_t>(p)), tied_blocked(static_cast<size_t>(p));
  while (remaining > 0) {
    // One scan of the unfinished ranks finds those furthest behind (the earliest clock t), in the
    // order they take their turns, and the earliest clock past t. While they only wait (step 4:
    // each moves to a clock past t, and nothing else changes), the next of them is the furthest
    // behind: they take their turns in that order without another scan, each waiting at most
    // until the earliest clock past t, which counts the clocks of those that moved before it. A
    // turn that places an action (or blocks) ends the run, and the ranks are scanned again.
    double t = std::numeric_limits<double>::infinity(), later_clock = std::numeric_limits<double>::infinity();
    size_t n_tied = 0, n_tied_blocked = 0;
    for (int q = 0; q < p; ++q) {
      if (left[q] <= 0) continue;
      const double cq = clock[q];
      if (cq < t) {
        later_clock = t;
        t = cq;
        n_tied = n_tied_blocked = 0;
      } else if (cq > t) {
        if (cq < later_clock) later_clock = cq;
        continue;
      }
      if (blocked[q]) tied_blocked[n_tied_blocked++] = q;
      else tied[n_tied++] = q;
    }
    for (size_t i = 0; i < n_tied_blocked; ++i) tied[n_tied++] = tied_blocked[i];
    for (size_t i = 0; i < n_tied; ++i) {
      const int r = tied[i];
      if (turn(r, later_clock) != Turn::Waited) break;
      later_clock = std::min(later_clock, clock[r]);
    }
  }
  return Placement{std::move(s), *std::max_element(clock.begin(), clock.end())};
}

// The finish time of a schedule's F/I/W actions run in each rank's order with costs `c`: each
// action starts when its rank is free and its inputs are there (F after the previous stage's F,
// I after its F and the next stage's I, W after its I; a transfer between ranks adds
// c.transfer_s). Infinity when the orders deadlock.
double replay_makespan(const Schedule& s, const ZeroBubbleCosts& c) {
  const int S = s.num_stages(), m = s.m;
  const size_t cells = static_cast<size_t>(S) * m;
  constexpr double kNotYet = -1;
  std::vector<double> f_end(cells, kNotYet), i_end(cells, kNotYet);
  auto cell = [&](int st, int mb) { return static_cast<size_t>(st) * m + mb; };
  auto comm = [&](int from, int to) { return s.stage_to_rank[from] == s.stage_to_rank[to] ? 0.0 : c.transfer_s; };
  std::vector<size_t> next(s.p, 0);
  std::vector<double> clock(s.p, 0);
  size_t left = 0;
  for (const auto& prog : s.programs) left += prog.actions.size();
  for (bool progress = true; progress && left > 0;) {
    progress = false;
    for (int r = 0; r < s.p; ++r) {
      const auto& acts = s.programs[r].actions;
      while (next[r] < acts.size()) {
        const Action& a = acts[next[r]];
        double ready = clock[r];
        if (a.kind == ActionKind::F) {
          if (a.stage > 0) {
            const double e = f_end[cell(a.stage - 1, a.microbatch)];
            if (e < 0) break;
            ready = std::max(ready, e + comm(a.stage - 1, a.stage));
          }
          clock[r] = ready + c.forward_s[a.stage];
          f_end[cell(a.stage, a.microbatch)] = clock[r];
        } else if (a.kind == ActionKind::I) {
          const double own = f_end[cell(a.stage, a.microbatch)];
          if (own < 0) break;
          ready = std::max(ready, own);
          if (a.stage + 1 < S) {
            const double e = i_end[cell(a.stage + 1, a.microbatch)];
            if (e < 0) break;
            ready = std::max(ready, e + comm(a.stage + 1, a.stage));
          }
          clock[r] = ready + c.input_s[a.stage];
          i_end[cell(a.stage, a.microbatch)] = clock[r];
        } else if (a.kind == ActionKind::W) {
          const double e = i_end[cell(a.stage, a.microbatch)];
          if (e < 0) break;
          clock[r] = std::max(ready, e) + c.weight_s[a.stage];
        } else {
          PTDP_ASSERT(false, "replay_makespan: F, I and W only");
        }
        ++next[r];
        --left;
        progress = true;
      }
    }
  }
  return left > 0 ? std::numeric_limits<double>::infinity() : *std::max_element(clock.begin(), clock.end());
}

// ZB-V's hand-made order (arXiv 2405.15362, as PyTorch's ScheduleZBVZeroBubble writes it), for
// n = max(m, 2p − 1) microbatches with those ≥ m left out: rank r runs 2(p − r) − 1 chunk-0
// forwards, r pairs (chunk-1 F, chunk-0 F), p − r triples (chunk-1 F, I, W); the steady state
// (chunk-0 F, I, W; chunk-1 F, I, W); the cool-down: r pairs (chunk-0 I, chunk-1 I), p − r pairs
// (chunk-0 I, W), then the W still owed, chunk 1's first.
Schedule handmade_zb_v(int p, int m) {
  Schedule s = empty_schedule(p, 2, m, v_shape_placement(p));
  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    auto& acts = s.programs[r].actions;
    const int c0 = r, c1 = 2 * p - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](ActionKind k, int stage, int mb) {
      if (mb < m) acts.push_back(Action{k, stage, mb});
    };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) add(ActionKind::F, c0, f0++);
    for (int i = 0; i < r; ++i) add(ActionKind::F, c1, f1++), add(ActionKind::F, c0, f0++);
    for (int i = 0; i < p - r; ++i) add(ActionKind::F, c1, f1), add(ActionKind::I, c1, b1), add(ActionKind::W, c1, b1), ++f1, ++b1;
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(ActionKind::F, c0, f0++);
      add(ActionKind::I, c0, b0), add(ActionKind::W, c0, b0), ++b0;
      add(ActionKind::F, c1, f1), add(ActionKind::I, c1, b1), add(ActionKind::W, c1, b1), ++f1, ++b1;
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) add(ActionKind::I, c0, b0++), add(ActionKind::I, c1, b1++);
    for (int i = 0; i < p - r; ++i) add(ActionKind::I, c0, b0++), add(ActionKind::W, c0, w0++);
    while (w1 < b1) add(ActionKind::W, c1, w1++);
    while (w0 < b0) add(ActionKind::W, c0, w0++);
  }
  return s;
}

ZeroBubbleCosts unit_costs(int p, int v, const std::vector<int>& limit) {
  ZeroBubbleCosts c;
  c.forward_s.assign(static_cast<size_t>(p) * v, 1.0);
  c.input_s = c.forward_s;
  c.weight_s = c.forward_s;
  c.memory_limit = limit;
  return c;
}

std::vector<int> megatron_placement(int p) {
  std::vector<int> out(p);
  for (int st = 0; st < p; ++st) out[st] = st;
  return out;
}

}  // namespace

std::vector<int> v_shape_placement(int p) {
  std::vector<int> out(2 * static_cast<size_t>(p));
  for (int st = 0; st < 2 * p; ++st) out[st] = st < p ? st : 2 * p - 1 - st;
  return out;
}

Schedule make_zb_h1(int p, int m) {
  // The paper's ZB-H1: 1F1B's warm-up (p − r forwards before the first backward), then I, the W
  // that rank r may no longer hold back (it holds back at most r: its 1F1B peak p − r plus r = p,
  // the first rank's, on every rank), then the next F; the held-back W fill the cool-down, where
  // the later ranks of 1F1B idle longest.
  Schedule s = empty_schedule(p, 1, m, megatron_placement(p));
  for (int r = 0; r < p; ++r) {
    auto& acts = s.programs[r].actions;
    int f = 0, i = 0, w = 0;
    for (; f < std::min(p - r, m); ++f) acts.push_back(Action{ActionKind::F, r, f});
    while (i < m) {
      acts.push_back(Action{ActionKind::I, r, i++});
      if (i - w > r) acts.push_back(Action{ActionKind::W, r, w++});
      if (f < m) acts.push_back(Action{ActionKind::F, r, f++});
    }
    while (w < m) acts.push_back(Action{ActionKind::W, r, w++});
  }
  return s;
}

// Unit times unless costed ones are given; the schedule's own memory limits either way.
ZeroBubbleCosts with_limits(const ZeroBubbleCosts* times, int p, int v, int limit) {
  ZeroBubbleCosts c = unit_costs(p, v, std::vector<int>(p, limit));
  if (times) {
    c.forward_s = times->forward_s;
    c.input_s = times->input_s;
    c.weight_s = times->weight_s;
    c.transfer_s = times->transfer_s;
  }
  return c;
}

Schedule make_zb_h2(int p, int m, const ZeroBubbleCosts* times) {
  return list_schedule(p, 1, m, megatron_placement(p), with_limits(times, p, 1, 2 * p - 1)).schedule;
}

Schedule make_zb_v(int p, int m, const ZeroBubbleCosts* times) {
  const ZeroBubbleCosts c = with_limits(times, p, 2, 2 * p);
  std::optional<Placement> best;
  {
    Schedule handmade = handmade_zb_v(p, m);
    const double makespan = replay_makespan(handmade, c);
    if (makespan < std::numeric_limits<double>::infinity()) best = Placement{std::move(handmade), makespan};
  }
  for (ChunkShare share : {ChunkShare::Greedy, ChunkShare::Even}) {
    Placement candidate = list_schedule(p, 2, m, v_shape_placement(p), c, share);
    if (!best || candidate.makespan < best->makespan - 1e-12) best = std::move(candidate);
  }
  return std::move(best->schedule);
}

namespace {

// The program of rank r of DualPipeV over p ranks and m microbatches (see make_dualpipev): its
// chunk c is stage[c], whose k-th microbatch is first_mb[c] + k. DualPipe's ranks run it too.
void dualpipev_program(int p, int m, int r, const int stage[2], const int first_mb[2], std::vector<Action>& acts) {
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<Placed> deferred;  // W of backwards split into I and W, run in order
  auto forward = [&](int c) { acts.push_back(Action{ActionKind::F, stage[c], first_mb[c] + next_f[c]++}); };
  // A backward of chunk c: whole (B), or its I now and its W queued (zero bubble).
  auto backward = [&](int c, bool split) {
    const int mb = first_mb[c] + next_b[c]++;
    acts.push_back(Action{split ? ActionKind::I : ActionKind::B, stage[c], mb});
    if (split) deferred.push_back(Placed{stage[c], mb});
  };
  auto weight = [&] {
    PTDP_ASSERT(!deferred.empty(), "dualpipev: a W with none deferred");
    acts.push_back(Action{ActionKind::W, deferred.front().stage, deferred.front().mb});
    deferred.pop_front();
  };
  // OVERLAP_F_B: a forward of chunk cf with a whole backward of chunk cb (another microbatch).
  auto overlapped = [&](int cf, int cb) {
    Action f{ActionKind::F, stage[cf], first_mb[cf] + next_f[cf]++};
    Action b{ActionKind::B, stage[cb], first_mb[cb] + next_b[cb]++};
    f.overlap = 1, f.overlap_kind = ActionKind::B, f.overlap_stage = b.stage;
    b.overlap = -1, b.overlap_kind = ActionKind::F, b.overlap_stage = f.stage;
    acts.push_back(f);
    acts.push_back(b);
  };
  const int later = p - r - 1;
  for (int i = 0; i < 2 * later; ++i) forward(0);  // warm-up of chunk 0
  for (int i = 0; i <= r; ++i) forward(0), forward(1);
  for (int i = 0; i < later; ++i) backward(1, true), weight(), forward(1);
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // steady state
    if (i == 0 && r == p - 1) {
      // The last rank turns the V around (DualPipe: the middle ranks, where the directions
      // meet): its first chunk-1 backward follows the forward just before it, not overlapped.
      forward(0);
      backward(1, false);
    } else {
      overlapped(0, 1);
    }
    overlapped(1, 0);
  }
  for (int i = 0; i < later; ++i) backward(1, false), overlapped(1, 0);
  // Cool-down: the second half of the backwards defers its W (odd ranks from chunk 1 on, even
  // ranks from chunk 0 on), to fill the waits that follow.
  bool split = false;
  for (int i = 0; i <= r; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) split = true;
    backward(1, split);
    if (i == (r + 1) / 2 && r % 2 == 0) split = true;
    backward(0, split);
  }
  for (int i = 0; i < later; ++i) weight(), backward(0, true);
  while (!deferred.empty()) weight();
}

}  // namespace

Schedule make_dualpipev(int p, int m) {
  PTDP_ASSERT(p >= 1 && m >= 2 * p, "dualpipev needs at least 2 × pipeline microbatches");
  Schedule s = empty_schedule(p, 2, m, v_shape_placement(p));
  for (int r = 0; r < p; ++r) {
    const int stage[2] = {r, 2 * p - 1 - r};  // chunk 0 (down the V), chunk 1 (back up)
    const int first_mb[2] = {0, 0};
    dualpipev_program(p, m, r, stage, first_mb, s.programs[r].actions);
  }
  return s;
}

Schedule make_dualpipe(int p, int m) {
  PTDP_ASSERT(p >= 2 && p % 2 == 0 && m % 2 == 0 && m >= 2 * p, "dualpipe needs an even p and an even m ≥ 2p");
  Schedule s = empty_schedule(p, 2, m, v_shape_placement(p));
  s.lanes = 2;
  for (int r = 0; r < p; ++r) {
    // Lane 0: stage j on rank j; lane 1: stage p + j on rank p − 1 − j (same layers as stage j).
    const int lane0_stage = r, lane1_stage = 2 * p - 1 - r;
    const bool first_half = r < p / 2;
    const int stage[2] = {first_half ? lane0_stage : lane1_stage, first_half ? lane1_stage : lane0_stage};
    const int first_mb[2] = {first_half ? 0 : m / 2, first_half ? m / 2 : 0};
    dualpipev_program(p / 2, m / 2, std::min(r, p - 1 - r), stage, first_mb, s.programs[r].actions);
  }
  return s;
}

Schedule make_zb_auto(int p, int m, const ZeroBubbleCosts& costs) {
  return list_schedule(p, 1, m, megatron_placement(p), costs).schedule;
}

}  // namespace ptdp
