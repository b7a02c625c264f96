#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "schedules/graph.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

std::string where(int rank, size_t index, const Action& a) {
  return "rank " + std::to_string(rank) + ", position " + std::to_string(index) + " (" + a.str() + ")";
}

// OVERLAP_F_B pairs (Action::overlap): an F marked +1 immediately followed by its partner, a B or
// I marked −1, of another (stage, microbatch) on the same rank, each naming the other.
void check_overlap_pairs(const Schedule& s) {
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      const auto at = static_cast<int64_t>(i);
      if (a.overlap == 0) continue;
      if (a.overlap == -1) {
        if (i == 0 || acts[i - 1].overlap != 1)
          throw ScheduleError(where(r, i, a) + ": the second action of an OVERLAP_F_B pair without its F just before it", r, at);
        continue;
      }
      if (a.overlap != 1 || a.kind != ActionKind::F)
        throw ScheduleError(where(r, i, a) + ": OVERLAP_F_B pairs an F (first) with a B or I", r, at);
      if (i + 1 == acts.size())
        throw ScheduleError(where(r, i, a) + ": an OVERLAP_F_B pair without its backward after it", r, at);
      const Action& b = acts[i + 1];
      if (b.overlap != -1 || (b.kind != ActionKind::B && b.kind != ActionKind::I) || b.stage != a.overlap_stage ||
          b.kind != a.overlap_kind || b.overlap_stage != a.stage || b.overlap_kind != ActionKind::F)
        throw ScheduleError(where(r, i, a) + ": its OVERLAP_F_B partner must follow it: " + std::to_string(a.overlap_stage) +
                                std::string(to_string(a.overlap_kind)) + " (got " + b.str() + ")",
                            r, at);
      if (a.stage == b.stage && a.microbatch == b.microbatch)
        throw ScheduleError(where(r, i, a) + ": cannot overlap with its own backward", r, at);
    }
  }
}

}  // namespace

void validate(const Schedule& s) {
  if (s.p < 1 || s.v < 1 || s.m < 1)
    throw ScheduleError("schedule sizes must be positive (p " + std::to_string(s.p) + ", v " + std::to_string(s.v) +
                        ", m " + std::to_string(s.m) + ")");
  const int stages = s.num_stages();
  if (s.lanes < 1 || stages % s.lanes != 0 || s.m % s.lanes != 0)
    throw ScheduleError("a schedule's " + std::to_string(s.lanes) + " lanes must divide its " + std::to_string(stages) +
                        " stages and its " + std::to_string(s.m) + " microbatches");
  if (static_cast<int>(s.stage_to_rank.size()) != stages || static_cast<int>(s.programs.size()) != s.p)
    throw ScheduleError("schedule has " + std::to_string(s.programs.size()) + " rank programs and " +
                        std::to_string(s.stage_to_rank.size()) + " stage placements for p " + std::to_string(s.p) +
                        ", v " + std::to_string(s.v));
  check_overlap_pairs(s);
  // Per (stage, microbatch): position of F, B, I, W (-1 = not seen).
  const size_t cells = static_cast<size_t>(stages) * s.m;
  std::vector<int64_t> pos_f(cells, -1), pos_b(cells, -1), pos_i(cells, -1), pos_w(cells, -1);
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      const auto at = static_cast<int64_t>(i);
      if (is_stage_action(a.kind) || is_p2p(a.kind)) {
        if (a.stage < 0 || a.stage >= stages)
          throw ScheduleError(where(r, i, a) + ": stage out of range 0.." + std::to_string(stages - 1), r, at);
        if (is_stage_action(a.kind) && s.stage_to_rank[a.stage] != r)
          throw ScheduleError(where(r, i, a) + ": stage " + std::to_string(a.stage) + " belongs to rank " +
                                  std::to_string(s.stage_to_rank[a.stage]),
                              r, at);
      }
      if (!is_compute(a.kind)) continue;
      if (a.stage < 0 || a.stage >= stages)
        throw ScheduleError(where(r, i, a) + ": stage out of range 0.." + std::to_string(stages - 1), r, at);
      if (a.microbatch < 0 || a.microbatch >= s.m)
        throw ScheduleError(where(r, i, a) + ": microbatch out of range 0.." + std::to_string(s.m - 1), r, at);
      if (s.stage_to_rank[a.stage] != r)
        throw ScheduleError(where(r, i, a) + ": stage " + std::to_string(a.stage) + " belongs to rank " +
                                std::to_string(s.stage_to_rank[a.stage]),
                            r, at);
      if (!s.runs(a.stage, a.microbatch))
        throw ScheduleError(where(r, i, a) + ": microbatch " + std::to_string(a.microbatch) + " takes lane " +
                                std::to_string(s.lane_of_microbatch(a.microbatch)) + " and stage " + std::to_string(a.stage) +
                                " is in lane " + std::to_string(s.lane_of_stage(a.stage)),
                            r, at);
      const size_t cell = static_cast<size_t>(a.stage) * s.m + a.microbatch;
      auto& slot = a.kind == ActionKind::F ? pos_f : a.kind == ActionKind::B ? pos_b : a.kind == ActionKind::I ? pos_i : pos_w;
      if (slot[cell] >= 0) throw ScheduleError(where(r, i, a) + ": appears twice", r, at);
      slot[cell] = static_cast<int64_t>(i);
      if (a.kind != ActionKind::F && pos_f[cell] < 0)
        throw ScheduleError(where(r, i, a) + ": backward before the forward " + std::to_string(a.stage) + "F" +
                                std::to_string(a.microbatch),
                            r, at);
      if (a.kind == ActionKind::W && pos_i[cell] < 0)
        throw ScheduleError(where(r, i, a) + ": W before its I", r, at);
    }
  }
  for (int st = 0; st < stages; ++st) {
    for (int mb = 0; mb < s.m; ++mb) {
      if (!s.runs(st, mb)) continue;
      const size_t cell = static_cast<size_t>(st) * s.m + mb;
      auto missing = [&](const char* kind) {
        throw ScheduleError("stage " + std::to_string(st) + " (rank " + std::to_string(s.stage_to_rank[st]) +
                                ") never runs " + std::to_string(st) + kind + std::to_string(mb),
                            s.stage_to_rank[st]);
      };
      if (pos_f[cell] < 0) missing("F");
      const bool full = pos_b[cell] >= 0, split = pos_i[cell] >= 0 || pos_w[cell] >= 0;
      if (full && split)
        throw ScheduleError("stage " + std::to_string(st) + " microbatch " + std::to_string(mb) + " has both B and I/W",
                            s.stage_to_rank[st], pos_b[cell]);
      if (!full && !split) missing("B");
      if (split && pos_i[cell] < 0) missing("I");
      if (split && pos_w[cell] < 0) missing("W");
    }
  }
}

void validate_lowered(const Schedule& s) {
  validate(s);
  const int stages = s.num_stages(), last = stages - 1;
  const size_t cells = static_cast<size_t>(stages) * s.m;
  // Per (stage, microbatch): positions of the computes and of the four transfers (-1 = none).
  enum Slot { kF, kBackIn, kBackDone, kSendF, kRecvF, kSendB, kRecvB, kSlots };
  std::vector<std::array<int64_t, kSlots>> pos(cells);
  for (auto& p : pos) p.fill(-1);
  std::vector<int64_t> last_backward(stages, -1), reduce_at(stages, -1);
  std::vector<int64_t> unsharded(static_cast<size_t>(s.p) * stages, -1);  // per (rank, stage): the open UNSHARD
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    const auto optims = std::count_if(acts.begin(), acts.end(), [](const Action& a) { return a.kind == ActionKind::OPTIM; });
    for (size_t i = 0, seen = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      const auto at = static_cast<int64_t>(i);
      if (a.kind == ActionKind::UNSHARD || a.kind == ActionKind::RESHARD) {
        // Stage and rank: validate() checked them. Pairing: an UNSHARD gathers a stage's
        // parameters until its RESHARD; the executor keeps one gathered copy per stage, so a
        // second UNSHARD before the RESHARD, or a RESHARD with nothing gathered, has no meaning.
        auto& open = unsharded[static_cast<size_t>(r) * stages + a.stage];
        if (a.kind == ActionKind::UNSHARD && open >= 0)
          throw ScheduleError(where(r, i, a) + ": stage " + std::to_string(a.stage) + " is already unsharded (by " +
                                  std::to_string(a.stage) + "UNSHARD at position " + std::to_string(open) +
                                  "; RESHARD it first)",
                              r, at);
        if (a.kind == ActionKind::RESHARD && open < 0)
          throw ScheduleError(where(r, i, a) + ": no " + std::to_string(a.stage) + "UNSHARD before it (nothing to reshard)", r, at);
        open = a.kind == ActionKind::UNSHARD ? at : -1;
        continue;
      }
      if (a.kind == ActionKind::OPTIM) {
        if (++seen > 1)
          throw ScheduleError(where(r, i, a) + ": a second optimizer step on this rank (one per iteration)", r, at);
        if (optims > 1) continue;  // reported at the second one
        if (i + 1 != acts.size())
          throw ScheduleError(where(r, i, a) + ": the optimizer step must be the rank's last action (" + acts[i + 1].str() +
                                  " follows it)",
                              r, at);
        continue;
      }
      if (a.stage < 0 || a.stage >= stages)
        throw ScheduleError(where(r, i, a) + ": stage out of range 0.." + std::to_string(last), r, at);
      if (s.stage_to_rank[a.stage] != r)
        throw ScheduleError(where(r, i, a) + ": stage " + std::to_string(a.stage) + " belongs to rank " +
                                std::to_string(s.stage_to_rank[a.stage]),
                            r, at);
      if (a.kind == ActionKind::REDUCE_GRAD) {
        if (reduce_at[a.stage] >= 0) throw ScheduleError(where(r, i, a) + ": appears twice", r, at);
        reduce_at[a.stage] = at;
        continue;
      }
      if (a.microbatch < 0 || a.microbatch >= s.m)
        throw ScheduleError(where(r, i, a) + ": microbatch out of range 0.." + std::to_string(s.m - 1), r, at);
      auto& cell = pos[static_cast<size_t>(a.stage) * s.m + a.microbatch];
      int slot = -1;
      switch (a.kind) {
        case ActionKind::F: slot = kF; break;
        case ActionKind::B: cell[kBackIn] = cell[kBackDone] = at; break;
        case ActionKind::I: cell[kBackIn] = at; break;
        case ActionKind::W: cell[kBackDone] = at; break;
        case ActionKind::SEND_F: slot = kSendF; break;
        case ActionKind::RECV_F: slot = kRecvF; break;
        case ActionKind::SEND_B: slot = kSendB; break;
        case ActionKind::RECV_B: slot = kRecvB; break;
        default: break;
      }
      if (a.kind == ActionKind::B || a.kind == ActionKind::W) last_backward[a.stage] = std::max(last_backward[a.stage], at);
      if (slot < 0) continue;
      const bool no_peer = ((a.kind == ActionKind::SEND_F || a.kind == ActionKind::RECV_B) && s.last_stage(a.stage)) ||
                           ((a.kind == ActionKind::RECV_F || a.kind == ActionKind::SEND_B) && s.first_stage(a.stage));
      if (no_peer)
        throw ScheduleError(where(r, i, a) + ": stage " + std::to_string(a.stage) + " has no neighbour in that direction", r, at);
      if (cell[slot] >= 0) throw ScheduleError(where(r, i, a) + ": appears twice", r, at);
      cell[slot] = at;
    }
    if (optims == 0)
      throw ScheduleError("rank " + std::to_string(r) + " has no optimizer step (OPTIM) at the end of its program", r);
    if (s.lanes > 1) {
      // DualPipe: a rank and its mirror sum the copies' gradients inside their REDUCE_GRADs, pair
      // by pair, so both must reduce their stages in the same (layer) order.
      std::vector<int> order;
      std::vector<int64_t> at;
      for (size_t i = 0; i < acts.size(); ++i)
        if (acts[i].kind == ActionKind::REDUCE_GRAD) order.push_back(acts[i].stage), at.push_back(static_cast<int64_t>(i));
      const std::vector<int> expected = reduction_order(s, r);
      for (size_t k = 0; k < order.size() && k < expected.size(); ++k)
        if (order[k] != expected[k])
          throw ScheduleError(where(r, static_cast<size_t>(at[k]), Action{ActionKind::REDUCE_GRAD, order[k], -1}) +
                                  ": with two lanes each rank reduces its stages in layer order, the same as its mirror rank (" +
                                  std::to_string(expected[k]) + "REDUCE_GRAD comes here)",
                              r, at[k]);
    }
  }
  for (int st = 0; st < stages; ++st) {
    const int r = s.stage_to_rank[st];
    const std::string rank = "rank " + std::to_string(r) + ": ";
    if (reduce_at[st] < 0)
      throw ScheduleError(rank + "stage " + std::to_string(st) + " has no " + std::to_string(st) +
                              "REDUCE_GRAD (its data-parallel gradient reduction)",
                          r);
    if (reduce_at[st] < last_backward[st])
      throw ScheduleError(rank + std::to_string(st) + "REDUCE_GRAD at position " + std::to_string(reduce_at[st]) +
                              " comes before the stage's last backward (position " + std::to_string(last_backward[st]) + ")",
                          r, reduce_at[st]);
    for (int mb = 0; mb < s.m; ++mb) {
      if (!s.runs(st, mb)) continue;
      const auto& cell = pos[static_cast<size_t>(st) * s.m + mb];
      const std::string sm = std::to_string(st), mbs = std::to_string(mb);
      auto need = [&](bool needed, int slot, bool before, int64_t anchor, const std::string& what, const std::string& of) {
        if (!needed) return;
        if (cell[slot] < 0) throw ScheduleError(rank + sm + what + mbs + " is missing (" + sm + of + mbs + " needs it)", r, anchor);
        if (before ? cell[slot] > anchor : cell[slot] < anchor)
          throw ScheduleError(rank + sm + what + mbs + " must come " + (before ? "before " : "after ") + sm + of + mbs, r,
                              cell[slot]);
      };
      const bool first = s.first_stage(st), final = s.last_stage(st);
      need(!first, kRecvF, true, cell[kF], "RECV_F", "F");
      need(!final, kSendF, false, cell[kF], "SEND_F", "F");
      need(!final, kRecvB, true, cell[kBackIn], "RECV_B", cell[kBackIn] == cell[kBackDone] ? "B" : "I");
      need(!first, kSendB, false, cell[kBackIn], "SEND_B", cell[kBackIn] == cell[kBackDone] ? "B" : "I");
    }
  }
}

std::vector<int> reduction_order(const Schedule& s, int rank) {
  std::vector<int> held;
  for (int st = 0; st < s.num_stages(); ++st)
    if (s.stage_to_rank[st] == rank) held.push_back(st);
  const int L = s.lane_stages();
  std::stable_sort(held.begin(), held.end(), [L](int a, int b) { return a % L < b % L; });
  return held;
}

void add_reduce_and_optim(Schedule& s) {
  // Megatron reduces gradients after the last microbatch's backward; the reduction of each
  // stage follows all compute of its rank, then the optimizer step.
  for (int r = 0; r < s.p; ++r) {
    auto& acts = s.programs[r].actions;
    std::erase_if(acts, [](const Action& a) { return a.kind == ActionKind::REDUCE_GRAD || a.kind == ActionKind::OPTIM; });
    for (int st : reduction_order(s, r)) acts.push_back(Action{ActionKind::REDUCE_GRAD, st, -1});
    acts.push_back(Action{ActionKind::OPTIM, -1, -1});
  }
}

void add_send_recv(Schedule& s) {
  // The sender of each transfer places the matching receive just before the consumer's action.
  // Inserting into the consumer's list is done by building each rank's list once, in order:
  // a RECV precedes the compute action that needs it; a SEND follows the one that produced it.
  // Each list is counted first and written in place (200 000 actions in a 1T plan: no growth,
  // no copy per action).
  for (int r = 0; r < s.p; ++r) {
    auto& acts = s.programs[r].actions;
    std::erase_if(acts, [](const Action& a) { return is_p2p(a.kind); });
    // The transfers around a compute action: its input (F: from the previous stage; B, I: from
    // the next) and its output (the other way); none at the pipeline's ends.
    auto receives = [&](const Action& a) {
      const bool backward_in = a.kind == ActionKind::B || a.kind == ActionKind::I;
      return (a.kind == ActionKind::F && !s.first_stage(a.stage)) || (backward_in && !s.last_stage(a.stage));
    };
    auto sends = [&](const Action& a) {
      const bool backward_in = a.kind == ActionKind::B || a.kind == ActionKind::I;
      return (a.kind == ActionKind::F && !s.last_stage(a.stage)) || (backward_in && !s.first_stage(a.stage));
    };
    size_t n = acts.size();
    for (const Action& a : acts) n += static_cast<size_t>(receives(a)) + static_cast<size_t>(sends(a));
    std::vector<Action> out(n);
    Action* o = out.data();
    auto receive = [&](const Action& a) {
      if (receives(a)) *o++ = Action{a.kind == ActionKind::F ? ActionKind::RECV_F : ActionKind::RECV_B, a.stage, a.microbatch};
    };
    auto send = [&](const Action& a) {
      if (sends(a)) *o++ = Action{a.kind == ActionKind::F ? ActionKind::SEND_F : ActionKind::SEND_B, a.stage, a.microbatch};
    };
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.overlap == 1 && i + 1 < acts.size()) {
        // OVERLAP_F_B: both inputs before the pair, both outputs after it.
        const Action& b = acts[i + 1];
        receive(a), receive(b);
        *o++ = a, *o++ = b;
        send(a), send(b);
        ++i;
        continue;
      }
      receive(a);
      *o++ = a;
      send(a);
    }
    PTDP_ASSERT(o == out.data() + out.size(), "add_send_recv counted its actions");
    acts = std::move(out);
  }
  s.lowered = true;
}

void lower(Schedule& s, bool check_deadlocks) {
  validate(s);
  add_reduce_and_optim(s);
  add_send_recv(s);
  if (check_deadlocks) check_deadlock_free(s);
}

}  // namespace ptdp
