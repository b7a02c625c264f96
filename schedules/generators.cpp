#include "schedules/schedule.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "model/partition.hpp"
#include "model/plan.hpp"
#include "schedules/graph.hpp"

namespace ptdp {
namespace {

Action compute(ActionKind k, int stage, int mb) { return Action{k, stage, mb}; }

}  // namespace

Schedule make_gpipe(int p, int m) {
  Schedule s = empty_schedule(p, 1, m);
  for (int r = 0; r < p; ++r) {
    auto& acts = s.programs[r].actions;
    acts.reserve(2 * static_cast<size_t>(m));
    for (int mb = 0; mb < m; ++mb) acts.push_back(compute(ActionKind::F, r, mb));
    for (int mb = 0; mb < m; ++mb) acts.push_back(compute(ActionKind::B, r, mb));
  }
  return s;
}

Schedule make_1f1b(int p, int m) {
  Schedule s = empty_schedule(p, 1, m);
  for (int r = 0; r < p; ++r) {
    auto& acts = s.programs[r].actions;
    acts.reserve(2 * static_cast<size_t>(m));
    const int warmup = std::min(p - r - 1, m);
    for (int mb = 0; mb < warmup; ++mb) acts.push_back(compute(ActionKind::F, r, mb));
    const int steady = m - warmup;
    for (int i = 0; i < steady; ++i) {
      acts.push_back(compute(ActionKind::F, r, warmup + i));
      acts.push_back(compute(ActionKind::B, r, i));
    }
    for (int mb = steady; mb < m; ++mb) acts.push_back(compute(ActionKind::B, r, mb));
  }
  return s;
}

Schedule make_interleaved(int p, int v, int m, const GeneratorOptions& opts) {
  const int group = opts.microbatch_group > 0 ? opts.microbatch_group : p;
  if (v > 1 && (group < p || group > m || (m % group != 0 && m % group < p)))
    throw ScheduleError("interleaved schedule needs pipeline (" + std::to_string(p) + ") ≤ microbatch group (" +
                        std::to_string(group) + ") ≤ microbatches (" + std::to_string(m) +
                        ") and microbatches mod group = 0 or ≥ pipeline");
  Schedule s = empty_schedule(p, v, m);
  // Megatron's schedule table: for each group of `group` microbatches, chunk 0 of every
  // microbatch of the group, then chunk 1, …; the last group takes the remaining microbatches.
  std::vector<std::pair<int, int>> table;  // (microbatch, chunk)
  table.reserve(static_cast<size_t>(m) * v);
  for (int first = 0; first < m; first += group) {
    const int last = (first + group >= m) ? m : first + group;
    for (int c = 0; c < v; ++c)
      for (int mb = first; mb < last; ++mb) table.emplace_back(mb, c);
    if (last == m) break;
  }
  const int total = m * v;
  for (int r = 0; r < p; ++r) {
    auto& acts = s.programs[r].actions;
    acts.reserve(2 * static_cast<size_t>(total));
    auto fwd = [&](int k) { return compute(ActionKind::F, table[k].second * p + r, table[k].first); };
    auto bwd = [&](int k) { return compute(ActionKind::B, (v - 1 - table[k].second) * p + r, table[k].first); };
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * group, total);
    for (int k = 0; k < warmup; ++k) acts.push_back(fwd(k));
    const int steady = total - warmup;
    for (int k = 0; k < steady; ++k) {
      acts.push_back(fwd(warmup + k));
      acts.push_back(bwd(k));
    }
    for (int k = steady; k < total; ++k) acts.push_back(bwd(k));
  }
  return s;
}

namespace {
// Megatron-Core's --overlap-moe-expert-parallel-comm merges a forward and a backward of two
// microbatches into one step, each one's expert all-to-alls under the other's compute: here
// OVERLAP_F_B pairs. Without pipelining every F is followed by its own B, and Megatron runs F0,
// (F1;B0), (F2;B1), …, B(m−1), holding one more microbatch's activations. In the interleaved
// schedule the steady state's steps are the pairs — the forward of table entry warm-up + k and the
// backward of entry k, both inputs received before the step and both outputs sent after it, as
// Megatron's steady loop does (the warm-up and cool-down stay single; a step whose forward and
// backward belong to one microbatch, which wait on each other through the loss, too).
void pair_expert_overlap(Schedule& s, int group) {
  auto mark = [](Action& f, Action& b) {
    if (f.microbatch == b.microbatch) return;
    f.overlap = 1, f.overlap_kind = ActionKind::B, f.overlap_stage = b.stage;
    b.overlap = -1, b.overlap_kind = ActionKind::F, b.overlap_stage = f.stage;
  };
  const int total = s.m * s.v;
  for (int r = 0; r < s.p; ++r) {
    std::vector<Action>& acts = s.programs[r].actions;
    PTDP_ASSERT(acts.size() == 2 * static_cast<size_t>(total), "pair_expert_overlap runs on the generator's compute-only programs");
    if (s.p == 1) {
      std::vector<Action> fwd, bwd, out;
      for (const Action& a : acts) (a.kind == ActionKind::F ? fwd : bwd).push_back(a);
      out.reserve(acts.size());
      out.push_back(fwd[0]);
      for (size_t i = 1; i < fwd.size(); ++i) out.push_back(fwd[i]), out.push_back(bwd[i - 1]);
      out.push_back(bwd.back());
      acts = std::move(out);
      for (size_t i = 1; i + 1 < acts.size(); i += 2) mark(acts[i], acts[i + 1]);
      continue;
    }
    const int warmup = std::min(2 * (s.p - r - 1) + (s.v - 1) * group, total);
    for (int k = 0; k < total - warmup; ++k) {
      const size_t i = static_cast<size_t>(warmup + 2 * k);
      PTDP_ASSERT(acts[i].kind == ActionKind::F && acts[i + 1].kind == ActionKind::B, "the interleaved steady state alternates F and B");
      mark(acts[i], acts[i + 1]);
    }
  }
}

// torchtitan's FSDP with pipelines (plan.hpp stage_held_unsharded): each stage's parameters are
// gathered before its first compute action and freed after its last (UNSHARD … RESHARD).
void add_unshard_windows(Schedule& s) {
  for (auto& program : s.programs) {
    std::vector<Action>& acts = program.actions;
    std::vector<Action> out;
    out.reserve(acts.size() + 8);
    std::vector<size_t> last(static_cast<size_t>(s.num_stages()), acts.size());
    for (size_t i = 0; i < acts.size(); ++i)
      if (acts[i].stage >= 0) last[static_cast<size_t>(acts[i].stage)] = i;
    std::vector<char> open(static_cast<size_t>(s.num_stages()), 0);
    // An OVERLAP_F_B pair (overlap 1, then its partner) stays adjacent: the windows open before
    // it and close after it.
    for (size_t i = 0; i < acts.size();) {
      const size_t n = acts[i].overlap == 1 && i + 1 < acts.size() ? 2 : 1;
      for (size_t j = i; j < i + n; ++j)
        if (const int st = acts[j].stage; st >= 0 && !open[static_cast<size_t>(st)]) {
          out.push_back(Action{ActionKind::UNSHARD, st, -1});
          open[static_cast<size_t>(st)] = 1;
        }
      for (size_t j = i; j < i + n; ++j) out.push_back(acts[j]);
      for (size_t j = i; j < i + n; ++j)
        if (const int st = acts[j].stage; st >= 0 && last[static_cast<size_t>(st)] == j) out.push_back(Action{ActionKind::RESHARD, st, -1});
      i += n;
    }
    acts = std::move(out);
  }
}
}  // namespace

Schedule make_schedule(const ParallelPlan& plan, bool check_deadlocks, const ZeroBubbleCosts* zb_costs) {
  const int p = static_cast<int>(plan.pipeline), m = static_cast<int>(plan.num_microbatches());
  Schedule s;
  switch (plan.schedule) {
    case ScheduleKind::GPipe: s = make_gpipe(p, m); break;
    case ScheduleKind::OneFOneB: s = make_1f1b(p, m); break;
    case ScheduleKind::Interleaved:
      s = make_interleaved(p, static_cast<int>(plan.virtual_stages), m,
                           GeneratorOptions{static_cast<int>(plan.microbatch_group)});
      break;
    case ScheduleKind::ZeroBubbleH1: s = make_zb_h1(p, m); break;
    case ScheduleKind::ZeroBubbleH2: s = make_zb_h2(p, m, zb_costs); break;
    case ScheduleKind::ZeroBubbleV: s = make_zb_v(p, m, zb_costs); break;
    case ScheduleKind::DualPipeV: s = make_dualpipev(p, m); break;
    case ScheduleKind::DualPipe: s = make_dualpipe(p, m); break;
    case ScheduleKind::ZeroBubbleAuto:
      if (zb_costs) {
        s = make_zb_auto(p, m, *zb_costs);
      } else {
        ZeroBubbleCosts unit;
        unit.forward_s.assign(p, 1.0);
        unit.input_s = unit.weight_s = unit.forward_s;
        unit.memory_limit.assign(p, 2 * p - 1);
        s = make_zb_auto(p, m, unit);
      }
      break;
  }
  if (merges_expert_overlap(plan))
    pair_expert_overlap(s, plan.schedule == ScheduleKind::Interleaved && plan.microbatch_group > 0 ? static_cast<int>(plan.microbatch_group)
                                                                                                   : p);
  if (stage_held_unsharded(plan)) add_unshard_windows(s);
  lower(s, check_deadlocks);
  return s;
}

Schedule adopt_schedule(Schedule s, const ParallelPlan& plan, const std::string& source) {
  const int64_t p = plan.pipeline, v = plan.virtual_stages, m = plan.num_microbatches();
  if (s.p != p || s.v != v || s.m != m || s.lanes != plan.lanes()) {
    std::string diff;
    auto add = [&](const char* what, int64_t got, int64_t want, const char* key) {
      if (got == want) return;
      diff += std::string(diff.empty() ? "" : "; ") + what + " " + std::to_string(got) + " but the scenario has " +
              std::to_string(want) + " (" + key + ")";
    };
    add("pipeline ranks (rows)", s.p, p, "parallel.pipeline");
    add("chunks per rank", s.v, v, "parallel.virtual_stages");
    add("microbatches", s.m, m, "global_batch / (micro_batch × data)");
    add("lanes (directions microbatches enter from)", s.lanes, plan.lanes(), "parallel.schedule: dualpipe has 2");
    throw ScheduleError(source + ": the schedule does not fit the scenario: " + diff);
  }
  // One placement: memory, the tied embedding and pricing all read the plan's (IR-16).
  const std::vector<int> placement = stage_placement(plan);
  if (s.stage_to_rank != placement) {
    size_t st = 0;
    const size_t n = std::min(placement.size(), s.stage_to_rank.size());
    while (st < n && s.stage_to_rank[st] == placement[st]) ++st;
    if (st == n)
      throw ScheduleError(source + ": the schedule has " + std::to_string(s.stage_to_rank.size()) + " stages but the scenario " +
                          std::to_string(placement.size()));
    throw ScheduleError(source + ": the schedule places stage " + std::to_string(st) + " on pipeline rank " +
                        std::to_string(s.stage_to_rank[st]) + " but the scenario's parallel.schedule (" +
                        std::string(to_string(plan.schedule)) + ") places it on rank " + std::to_string(placement[st]) +
                        ": set parallel.schedule to the schedule's shape (a V placement is zb-v or dualpipev)");
  }
  if (!s.lowered) {
    lower(s);
  } else {  // a complete program per rank (e.g. handed over in memory): check it as import does
    validate_lowered(s);
    check_deadlock_free(s);
  }
  return s;
}

}  // namespace ptdp
