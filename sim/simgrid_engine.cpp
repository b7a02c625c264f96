// SimGrid fidelities. Actors interpret the lowered Schedule with the meaning the IR gives each
// action (schedules/schedule.hpp): F/B/I/W take the cost model's durations (TP collectives over
// the node's NVSwitch included, α-β costed) — a timed wait on a GPU, which runs one action at a
// time, and an Exec on the node's shared cores on a CPU cluster (run_compute); SEND/RECV → Comms through the
// platform, serialised per (src, dst) stream as NCCL does, with the scatter/gather
// optimisation (the all-gather ends the RECV); REDUCE_GRAD → ring all-reduce flows through the
// fabric, plus the tied-embedding all-reduce between first and last stage; OPTIM → the
// gradient-norm all-reduce (a barrier of the replica's pipeline) and a memory-bound Exec.
//   reduced: one actor per pipeline stage of data-parallel replica 0 (TP and DP symmetry); every
//            replica's ring flows that cross the representatives' links run on the fabric, the
//            others are timed alone on their routes (issue_ring);
//   full:    one actor per GPU (TP rank 0's only when the other TP ranks are exact twins:
//            tensor_twins_).
#include "sim/simgrid_sim.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/metrics.hpp"
#include "topologies/collectives.hpp"

#include <unistd.h>

namespace ptdp {
namespace sgrun {

void SimgridRun::progress() {
  if (!in_.show_progress || ++actions_done_ % 8192 != 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_report_ < std::chrono::seconds(2)) return;
  last_report_ = now;
  const double wall = std::chrono::duration<double>(now - started_).count();
  const double done = static_cast<double>(actions_done_) / static_cast<double>(std::max<int64_t>(1, actions_total_));
  std::fprintf(stderr, "ptdp: simulating (%s): %3.0f%% of actions, %.1f s simulated, %.0f s wall, about %.0f s left\n",
               to_string(fidelity_).c_str(), 100 * done, sg4::Engine::get_clock(), wall,
               done > 0 ? wall * (1 - done) / done : 0.0);
}

void SimgridRun::event(SimRank& d, const Action& a, Stream st, double t0, double t1, int peer, const char* label) {
  if (!d.record) return;
  // Into the breakdown at once; kept only for the trace. The breakdown sums each rank's events in
  // its representative's order, which is the order they happen in, whether fed now or after the
  // run (and sends are matched by key): the same figures without storing 400 000 events, and
  // without making an event (and its label's string) for each but to trace it.
  breakdown_->add(d.id, peer, a, st, RankBreakdownBuilder::part_of(st, a.kind, label), t0, t1);
  if (!d.traced) return;
  TimelineEvent ev;
  ev.device = d.id;
  ev.pipeline_rank = d.coord.pp;
  ev.action = a;
  ev.stream = st;
  ev.start_s = t0;
  ev.end_s = t1;
  ev.peer = peer;
  ev.label = label;
  d.events.push_back(std::move(ev));
}

Msg* SimgridRun::take(SimRank& d, uint64_t key) {
  if (auto it = d.stash.find(key); it != d.stash.end()) {
    Msg* m = it->second;
    d.stash.erase(it);
    return m;
  }
  for (;;) {
    Msg* m = get_msg(d.mbox);
    ++activities_;
    const uint64_t k = key_of(m->type, m->stage, m->mb);
    if (k == key) return m;
    d.stash.emplace(k, m);
  }
}

void SimgridRun::run_compute(SimRank& d, double seconds, double blocked_s) {
  ++activities_;
  if (pf_.node_cpus.empty()) {
    // A GPU runs its rank's compute one action at a time and nothing else computes on it: a
    // timed wait is exact, and SimGrid prices it without a CPU-sharing variable (measured: full
    // fidelity 1T … faster than an Exec).
    sg4::this_actor::sleep_for(seconds);
    return;
  }
  // The node's cores are shared: this device's work (in reduced fidelity: the identical work of
  // those of the t·d ranks it stands for that live on its node; the others compute on their own
  // nodes' cores) runs on them as that many threads. The stage's t·d ranks are contiguous.
  const int64_t gpn = in_.cluster.gpus_per_node;
  const int64_t node = grid_.rank_at(d.coord.tp, d.coord.dp, d.coord.pp) / gpn;
  const int64_t first = grid_.rank_at(0, 0, d.coord.pp), last = first + in_.plan.tensor * replicas_;
  const double stage_ranks = static_cast<double>(std::min(last, (node + 1) * gpn) - std::max(first, node * gpn));
  // The simulated ranks of a stage compute in lockstep, so SimGrid alone would slow each by
  // ranks / cores; real ranks that block in collectives leave their cores to the others
  // (shared_core_slowdown). The work is scaled so that the stage alone on its node computes at
  // that slowdown; other stages on the node still contend dynamically.
  const double cores = in_.cluster.cores_per_node;
  const double scale = shared_core_slowdown(stage_ranks, cores, seconds, blocked_s) / shared_core_slowdown(stage_ranks, cores, 1, 0);
  const int threads = fidelity_ == Fidelity::Reduced ? static_cast<int>(stage_ranks) : 1;
  sg4::this_actor::exec_init(seconds * scale * kHostSpeed)  // SimGrid: the amount of each of the threads
      ->set_host(pf_.node_cpus[node])
      ->set_thread_count(threads)
      ->wait();
}

bool SimgridRun::reduces_during(const SimRank& d, const Action& a) const {
  if (a.kind != ActionKind::B && a.kind != ActionKind::W) return false;
  if (static_cast<size_t>(a.stage) >= costs_.reduce_grad_buckets.size() || costs_.reduce_grad_buckets[a.stage] <= 1) return false;
  const auto& acts = s_.programs[d.coord.pp].actions;
  for (size_t i = d.pc + 1; i < acts.size(); ++i)
    if ((acts[i].kind == ActionKind::B || acts[i].kind == ActionKind::W) && acts[i].stage == a.stage) return false;
  return true;
}

Flows SimgridRun::gradient_flows(const SimRank& d, double bytes) {
  const int64_t dp = replicas_;
  if (in_.plan.zero_stage >= 1) return shard_ring_flows(d, static_cast<double>(shard_n_ - 1) / shard_n_ * bytes);
  std::vector<FlowSpec> comms;
  const int k = rings_.channels;
  const auto ring_bytes = static_cast<uint64_t>(2.0 * static_cast<double>(dp - 1) / static_cast<double>(dp) * bytes / k);
  const int pp = d.coord.pp;
  auto flows_of = [&](int tp, int r, int channels) {
    for (int c = 0; c < channels; ++c) comms.push_back(FlowSpec{gpu(tp, r, pp), gpu(tp, rings_.successor[c][r], pp), ring_bytes});
  };
  if (fidelity_ == Fidelity::Full) {
    flows_of(d.coord.tp, d.coord.dp, k);
  } else {
    return issue_ring(ring_split(Ring::GradientBuckets, pp, 0,
                                 [&](std::vector<HostPair>& flows) {
                                   for (int tp = 0; tp < dp_twins_.tensor; ++tp)
                                     for (int r = 0; r < dp; ++r)
                                       for (int c = 0; c < dp_twins_.channels; ++c)
                                         flows.emplace_back(gpu(tp, r, pp), gpu(tp, rings_.successor[c][r], pp));
                                 }),
                      ring_bytes);
  }
  return issue(comms);
}

void SimgridRun::compute(SimRank& d, const Action& a) {
  if (in_.plan.zero_stage >= 2 && static_cast<size_t>(a.stage) < costs_.units.size() && !costs_.units[a.stage].empty())
    return sharded_compute(d, a);
  double tp = 0;
  const double dur = action_duration_s(costs_, d.coord.pp, a, &tp);
  double t0 = sg4::Engine::get_clock();
  if (pf_.node_cpus.empty() && reduces_during(d, a)) {
    // overlap_grad_reduce (schedule.hpp): the stage's last backward finalises its gradients bucket
    // by bucket; each bucket's reduction leaves as soon as it is final, under the rest of the backward.
    double gathers = 0;
    for (const auto& g : d.pending_gathers) gathers += g.seconds;
    run_compute(d, gathers);
    for (const auto& g : d.pending_gathers) {  // consumed here, once (recorded as the RECV's)
      event(d, g.recv, Stream::PP, t0, t0 + g.seconds, g.peer, kPipelineAllGather);
      t0 += g.seconds;
    }
    d.pending_gathers.clear();
    const int64_t buckets = costs_.reduce_grad_buckets[a.stage];
    auto& pending = d.pending_buckets[a.stage];
    // The buckets on the wire slow the backward (the concurrency model; costing's figure).
    // The backward beside them slows the buckets in turn: their flows carry stretched bytes.
    const double slowed = static_cast<size_t>(a.stage) < costs_.reduce_grad_slowed_s.size() ? costs_.reduce_grad_slowed_s[a.stage] : 0.0;
    const double stretch =
        static_cast<size_t>(a.stage) < costs_.reduce_grad_comm_stretch.size() ? costs_.reduce_grad_comm_stretch[a.stage] : 1.0;
    const double timed = bucketed_timed_s(a.stage, d.coord.pp, buckets, stretch);
    for (int64_t b = 0; b < buckets; ++b) {
      run_compute(d, (dur + slowed) / static_cast<double>(buckets));
      pending.add(gradient_flows(d, bucketed_bytes(a.stage) * stretch / static_cast<double>(buckets)));
      // The bucket's reductions over the groups priced α-β (the routed experts' expert-data
      // group, the shard replicas) follow one another beside the ring's flows.
      if (timed > 0) pending.until = std::max(pending.until, sg4::Engine::get_clock()) + timed;
    }
  } else if (pf_.node_cpus.empty()) {
    double gathers = 0;
    for (const auto& g : d.pending_gathers) gathers += g.seconds;
    run_compute(d, gathers + dur);
    for (const auto& g : d.pending_gathers) {
      event(d, g.recv, Stream::PP, t0, t0 + g.seconds, g.peer, kPipelineAllGather);
      t0 += g.seconds;
    }
    d.pending_gathers.clear();
  } else {
    // Shared CPU cores: only the computation competes for them; a rank waiting in a
    // tensor-parallel all-reduce leaves its core to the others.
    run_compute(d, dur - tp, tp);
    if (tp > 0) sg4::this_actor::sleep_for(tp);
  }
  const double t1 = sg4::Engine::get_clock();
  // The whole action, and its TP collectives (α-β costed inside it) shown at its end.
  event(d, a, Stream::Compute, t0, t1);
  if (tp > 0) event(d, a, Stream::TP, t1 - tp, t1, -1, "tp collectives");
  if (const double rc = recompute_part_s(costs_, a); rc > 0) event(d, a, Stream::Compute, t0, t0 + rc, -1, kRecompute);
}

void SimgridRun::send(SimRank& d, const Action& a) {
  const bool fwd = a.kind == ActionKind::SEND_F;
  const int to_stage = fwd ? a.stage + 1 : a.stage - 1;
  if (s_.stage_to_rank[to_stage] == d.coord.pp) return;  // same pipeline rank: handed over in memory
  const int peer = device_of(d.coord.tp, d.coord.dp, s_.stage_to_rank[to_stage]);
  if (costs_.p2p_blocking) {
    // Not overlapped (sim/costing.hpp PlanCosts::p2p_blocking): the rank waits for the delivery
    // before its next action. The receiver's mailbox takes messages eagerly, so two neighbours
    // sending to each other at once do not wait for each other's RECV.
    const double t0 = sg4::Engine::get_clock();
    put_msg(devices_[peer]->mbox, new Msg{fwd ? MsgType::Forward : MsgType::Backward, a.stage, a.microbatch},
            static_cast<uint64_t>(costs_.p2p_wire_bytes));
    ++activities_;
    event(d, a, Stream::PP, t0, sg4::Engine::get_clock(), peer, kBlockingSend);
    return;
  }
  auto& slot = d.streams[peer];
  if (!slot) slot = std::make_unique<SendStream>();
  SendStream& stream = *slot;
  Job job;
  job.msg = new Msg{fwd ? MsgType::Forward : MsgType::Backward, a.stage, a.microbatch};
  job.to = devices_[peer]->mbox;
  job.bytes = costs_.p2p_wire_bytes;  // 1/t of the tensor per TP rank under scatter/gather
  job.peer = peer;
  job.action = a;
  job.issued_s = sg4::Engine::get_clock();
  if (!stream.helper) {
    stream.helper = true;
    stream.ready = sg4::Semaphore::create(0);
    SendStream* raw = &stream;
    sg4::Actor::create("send-" + std::to_string(d.id) + "-" + std::to_string(peer), d.host,
                       [this, &d, raw] { sender_actor(d, *raw); });
  }
  stream.queue.push_back(job);
  stream.ready->release();
}

void SimgridRun::sender_actor(SimRank& d, SendStream& stream) {
  for (;;) {
    stream.ready->acquire();
    Job job = stream.queue.front();
    stream.queue.pop_front();
    if (!job.msg) return;
    put_msg(job.to, job.msg, static_cast<uint64_t>(job.bytes));
    ++activities_;
    // From the post (queueing behind earlier sends of the stream included) to the delivery.
    event(d, job.action, Stream::PP, job.issued_s, sg4::Engine::get_clock(), job.peer);
  }
}

void SimgridRun::recv(SimRank& d, const Action& a) {
  const bool fwd = a.kind == ActionKind::RECV_F;
  const int from_stage = fwd ? a.stage - 1 : a.stage + 1;
  if (s_.stage_to_rank[from_stage] == d.coord.pp) return;  // same pipeline rank: nothing moves
  const double t0 = sg4::Engine::get_clock();
  delete take(d, key_of(fwd ? MsgType::Forward : MsgType::Backward, from_stage, a.microbatch));
  wake_up_late(t0);
  const double t1 = sg4::Engine::get_clock();
  const int peer = device_of(d.coord.tp, d.coord.dp, s_.stage_to_rank[from_stage]);
  event(d, a, Stream::PP, t0, t1, peer);
  // Scatter/gather: the t slices arrived over t links; the tensor is rebuilt by an all-gather
  // over the TP group, which ends the RECV.
  if (const double gather = recv_completion_s(costs_, s_, a); gather > 0) {
    if (pf_.node_cpus.empty()) {
      d.pending_gathers.push_back(SimRank::Gather{a, peer, gather});
    } else {
      sg4::this_actor::sleep_for(gather);
      event(d, a, Stream::PP, t1, sg4::Engine::get_clock(), peer, kPipelineAllGather);
    }
  }
}

void SimgridRun::ring_flows(SimRank& d, int stage, double member_ring_bytes, int tag, Flows& comms) {
  const int64_t dp = replicas_;
  if (dp <= 1) return;
  const int k = rings_.channels;
  const double per_channel = member_ring_bytes / static_cast<double>(k);
  const int pp = d.coord.pp;
  if (fidelity_ == Fidelity::Full) {
    // Each GPU pushes its share of every ring to its successor and waits for its predecessors'.
    for (int c = 0; c < k; ++c) {
      const int succ = device_of(d.coord.tp, rings_.successor[c][d.coord.dp], pp);
      comms.comms.push_back(devices_[succ]->mbox->put_async(new Msg{MsgType::Reduce, stage, c + 64 * tag}, static_cast<uint64_t>(per_channel)));
    }
    for (int c = 0; c < k; ++c) delete take(d, key_of(MsgType::Reduce, stage, c + 64 * tag));
  } else {
    // Stand-in for the whole stage: every TP rank's rings, every replica's flows (but twins,
    // ring_twins).
    comms.add(issue_ring(ring_split(Ring::GradientSteps, pp, 0,
                                    [&](std::vector<HostPair>& flows) {
                                      for (int tp = 0; tp < dp_twins_.tensor; ++tp)
                                        for (int c = 0; c < dp_twins_.channels; ++c)
                                          for (int r = 0; r < dp; ++r) flows.emplace_back(gpu(tp, r, pp), gpu(tp, rings_.successor[c][r], pp));
                                    }),
                         static_cast<uint64_t>(per_channel)));
  }
}

void SimgridRun::reduce_grad(SimRank& d, const Action& a) {
  flush_gathers(d);
  const double t0 = sg4::Engine::get_clock();
  const int pp = d.coord.pp;
  Flows comms;
  // Overlapped (overlap_grad_reduce): the buckets of the data-parallel steps left during the
  // backward; wait for what is still on the wire, then run the other steps.
  const auto bucketed = d.pending_buckets.find(a.stage);
  const bool overlapped = bucketed != d.pending_buckets.end();
  if (overlapped) {
    comms = std::move(bucketed->second);
    d.pending_buckets.erase(bucketed);
    wait_comms(comms);
  }
  // The lowering's steps (schedules/communication.hpp), one after another as the executor runs
  // them: ring collectives over the data-parallel and sharding groups are flows through the
  // fabric; the pair exchange a transfer between the two ranks; the other groups (TP, expert
  // data, shard replicas) α-β timed waits, priced as the analytic engine prices them.
  const double dp = static_cast<double>(replicas_), n = static_cast<double>(shard_n_);
  int ring_tag = 0, pair_ordinal = 0;
  for (const CommStep& step : costs_.reduce_grad_steps[a.stage]) {
    if (overlapped && step.bucketable) continue;  // in the buckets (compute)
    if (step.kind == StepKind::Wait) {
      comms.add(std::move(d.pending_reduce_scatter));
    } else if (step.group == CommGroup::Gradient) {
      // A ring all-reduce sends 2(d − 1)/d of the buffer per member; a reduce-scatter or an
      // all-gather half of that.
      const double share = (step.kind == StepKind::AllReduce ? 2.0 : 1.0) * (dp - 1) / dp;
      ring_flows(d, a.stage, share * step.bytes, ring_tag++, comms);
    } else if (step.group == CommGroup::Sharding) {
      comms.add(shard_ring_flows(d, (n - 1) / n * step.bytes));
    } else if (step.group == CommGroup::Pair) {
      // Tied embeddings: first and last stage exchange their embedding gradients; DualPipe: a
      // stage and its copy in the other lane exchange their gradients (or a part of them).
      if (s_.stage_to_rank[step.peer_stage] != pp) {
        const int peer = device_of(d.coord.tp, d.coord.dp, s_.stage_to_rank[step.peer_stage]);
        comms.comms.push_back(devices_[peer]->mbox->put_async(new Msg{MsgType::Pair, a.stage, pair_ordinal}, static_cast<uint64_t>(step.bytes)));
        delete take(d, key_of(MsgType::Pair, step.peer_stage, pair_ordinal));
      }
      ++pair_ordinal;
    } else {
      sg4::this_actor::sleep_for(comm_step_time_s(in_.cluster, in_.plan, s_.stage_to_rank, pp, step));
    }
    wait_comms(comms);
  }
  event(d, a, Stream::DP, t0, sg4::Engine::get_clock());
}

Flows SimgridRun::shard_ring_flows(const SimRank& d, double member_bytes) {
  std::vector<FlowSpec> comms;
  if (shard_n_ < 2) return {};
  const int n = shard_n_, k = shard_rings_.channels;
  const auto bytes = static_cast<uint64_t>(member_bytes / k);
  auto flows_of = [&](int tp, int dp, int pp, int channels) {
    const int base = dp / n * n, i = dp - base;
    for (int c = 0; c < channels; ++c)
      comms.push_back(FlowSpec{gpu(tp, dp, pp), gpu(tp, base + shard_rings_.successor[c][i], pp), bytes});
  };
  if (fidelity_ == Fidelity::Full) {
    flows_of(d.coord.tp, d.coord.dp, d.coord.pp, k);
    return issue(comms);
  }
  return issue_ring(ring_split(Ring::Sharding, d.coord.pp, 0,
                               [&](std::vector<HostPair>& flows) {
                                 for (int tp = 0; tp < shard_twins_.tensor; ++tp)
                                   for (int dp = 0; dp < replicas_; ++dp) {
                                     const int base = dp / n * n, i = dp - base;
                                     for (int c = 0; c < shard_twins_.channels; ++c)
                                       flows.emplace_back(gpu(tp, dp, d.coord.pp), gpu(tp, base + shard_rings_.successor[c][i], d.coord.pp));
                                   }
                               }),
                    bytes);
}

Flows SimgridRun::unit_ring_flows(const SimRank& d, double member_bytes, int group) {
  return group > 0 && group < shard_n_ ? subgroup_ring_flows(d, member_bytes, group) : shard_ring_flows(d, member_bytes);
}

Flows SimgridRun::subgroup_ring_flows(const SimRank& d, double member_bytes, int group) {
  // Members i of a sharding group of shard_n_ (consecutive data-parallel ranks) form rings of
  // `group` consecutive members: i sends to the next member of its own ring.
  std::vector<FlowSpec> comms;
  const auto bytes = static_cast<uint64_t>(member_bytes);
  auto flow_of = [&](int tp, int dp, int pp) {
    const int base = dp / group * group;
    comms.push_back(FlowSpec{gpu(tp, dp, pp), gpu(tp, base + (dp - base + 1) % group, pp), bytes});
  };
  if (fidelity_ == Fidelity::Full) {
    flow_of(d.coord.tp, d.coord.dp, d.coord.pp);
    return issue(comms);
  }
  return issue_ring(ring_split(Ring::ShardingSubgroup, d.coord.pp, group,
                               [&](std::vector<HostPair>& flows) {
                                 for (int tp = 0; tp < shard_twins_.tensor; ++tp)
                                   for (int dp = 0; dp < replicas_; ++dp) {
                                     const int base = dp / group * group;
                                     flows.emplace_back(gpu(tp, dp, d.coord.pp), gpu(tp, base + (dp - base + 1) % group, d.coord.pp));
                                   }
                               }),
                    bytes);
}

void SimgridRun::wait_comms(Flows& flows) {
  for (auto& c : flows.comms) {
    c->wait();
    ++activities_;
  }
  flows.comms.clear();
  for (auto& a : flows.issuers) a->join();
  flows.issuers.clear();
  if (flows.until > sg4::Engine::get_clock()) sg4::this_actor::sleep_until(flows.until);
  flows.until = 0;
}

void SimgridRun::sharded_compute(SimRank& d, const Action& a) {
  flush_gathers(d);
  const auto& units = costs_.units[a.stage];
  const size_t n = units.size();
  const bool forward = a.kind == ActionKind::F;
  // The backward re-gathers over the reshard group (plan.hpp reshard_group): the whole sharding
  // group, a subgroup of it, or nothing (reshard_after_forward false).
  const int64_t group = forward ? shard_n_ : std::min<int64_t>(reshard_group(in_.plan), shard_n_);
  const bool gather = in_.plan.zero_stage >= 3 && a.kind != ActionKind::W && group > 1 &&
                      !(d.unsharded.size() > static_cast<size_t>(a.stage) && d.unsharded[a.stage]);
  const bool reduce = (a.kind == ActionKind::B || a.kind == ActionKind::W) && !gradients_reduced_once_per_step(in_.plan);
  const double member = static_cast<double>(shard_n_ - 1) / static_cast<double>(shard_n_);
  const double gather_member = static_cast<double>(group - 1) / static_cast<double>(group);
  auto unit_at = [&](size_t i) -> const PlanCosts::ShardUnit& { return units[forward ? i : n - 1 - i]; };
  // A unit's compute, slowed as the analytic timeline of the same overlap says (the concurrency
  // model, sim/costing.hpp overlapped_s: the SMs the collectives under it take).
  auto compute_of = [&](const PlanCosts::ShardUnit& u) {
    switch (a.kind) {
      case ActionKind::F: return u.forward_s + u.forward_slowed_s;
      case ActionKind::I: return u.input_s + u.input_slowed_s;
      case ActionKind::W: return u.weight_s + u.weight_slowed_s;
      default: return u.input_s + u.weight_s - u.hidden_tp_s + (gather ? u.backward_slowed_s : u.gathered_backward_slowed_s);
    }
  };
  // Its gathers and reduce-scatters, slowed by the compute beside them as the same timeline says:
  // their flows carry their bytes stretched by that factor.
  auto stretch_of = [&](const PlanCosts::ShardUnit& u) -> const PlanCosts::ShardUnit::CommStretch& {
    switch (a.kind) {
      case ActionKind::F: return u.forward_comm_stretch;
      case ActionKind::I: return u.input_comm_stretch;
      case ActionKind::W: return u.weight_comm_stretch;
      default: return gather ? u.backward_comm_stretch : u.gathered_backward_comm_stretch;
    }
  };
  double tp = 0;
  action_duration_s(costs_, d.coord.pp, a, &tp);
  const double t0 = sg4::Engine::get_clock();
  std::vector<Flows> gathers(n), scatters;
  size_t issued = 0;
  // CPU ranks (shared cores) run blocking collectives: nothing overlaps (sim/costing.cpp).
  const bool overlap = pf_.node_cpus.empty();
  const auto in_flight = overlap ? static_cast<size_t>(in_.plan.max_inflight_gathers) : size_t{1};
  for (size_t i = 0; i < n; ++i) {
    const PlanCosts::ShardUnit& u = unit_at(i);
    if (gather) {
      // Prefetch: up to max_inflight_gathers units gathered or being gathered at once.
      // (A unit kept whole since its forward is not gathered again for its backward.)
      for (; issued < n && issued < i + in_flight; ++issued)
        if (forward || !unit_at(issued).kept_whole)
          gathers[issued] = unit_ring_flows(d, gather_member * unit_at(issued).param_bytes * stretch_of(unit_at(issued)).gather,
                                                     static_cast<int>(group));
      const double w0 = sg4::Engine::get_clock();
      wait_comms(gathers[i]);
      if (const double w1 = sg4::Engine::get_clock(); w1 > w0) event(d, a, Stream::DP, w0, w1, -1, kShardWait);
    }
    run_compute(d, compute_of(u));
    if (reduce && !overlap) {
      const double w0 = sg4::Engine::get_clock();
      auto comms = shard_ring_flows(d, member * u.grad_bytes);
      wait_comms(comms);
      event(d, a, Stream::DP, w0, sg4::Engine::get_clock(), -1, kShardWait);
    } else if (reduce) {
      if (i + 1 == n) {
        // All but the last unit's reduce-scatter finish within the action; the last one is left
        // on the wire (REDUCE_GRAD waits for it, as FSDP's end-of-backward callback does).
        const double w0 = sg4::Engine::get_clock();
        for (auto& ring : scatters) wait_comms(ring);
        scatters.clear();
        if (const double w1 = sg4::Engine::get_clock(); w1 > w0) event(d, a, Stream::DP, w0, w1, -1, kShardWait);
        wait_comms(d.pending_reduce_scatter);
        d.pending_reduce_scatter = shard_ring_flows(d, member * u.grad_bytes * stretch_of(u).reduce_scatter);
      } else {
        scatters.push_back(unit_ring_flows(d, member * u.grad_bytes * stretch_of(u).reduce_scatter));
      }
    }
  }
  const double t1 = sg4::Engine::get_clock();
  event(d, a, Stream::Compute, t0, t1);
  if (tp > 0) event(d, a, Stream::TP, t1 - tp, t1, -1, "tp collectives");
  if (const double rc = recompute_part_s(costs_, a); rc > 0) event(d, a, Stream::Compute, t0, t0 + rc, -1, kRecompute);
}

void SimgridRun::flush_gathers(SimRank& d) {
  for (const auto& g : d.pending_gathers) {
    const double t0 = sg4::Engine::get_clock();
    sg4::this_actor::sleep_for(g.seconds);
    event(d, g.recv, Stream::PP, t0, sg4::Engine::get_clock(), g.peer, kPipelineAllGather);
  }
  d.pending_gathers.clear();
}

void SimgridRun::optimizer_step(SimRank& d, const Action& a) {
  flush_gathers(d);
  // The gradient-norm all-reduce over the replica's model-parallel group waits for every
  // pipeline rank: a barrier (idle time, as any wait for a peer), then its latency (part of
  // optim_s) and Adam.
  // Post-validated (schedules/schedule.hpp): the rank steps at once, the check runs behind.
  if (in_.plan.optimizer_sync != OptimizerSync::PostValidate)
    optim_barriers_[fidelity_ == Fidelity::Reduced ? 0 : d.coord.dp]->wait();
  const double t0 = sg4::Engine::get_clock();
  double exposed = 0;
  action_duration_s(costs_, d.coord.pp, a, nullptr, &exposed);
  // Stages 1–2 all-gather the updated parameters over the fabric; offload copies are timed waits.
  const size_t pp = static_cast<size_t>(d.coord.pp);
  const double gather = pp < costs_.optim_gather_s.size() ? costs_.optim_gather_s[pp] : 0.0;
  run_compute(d, costs_.optim_s[d.coord.pp] - exposed);
  if (exposed > 0) {
    const double w0 = sg4::Engine::get_clock();
    if (exposed > gather) sg4::this_actor::sleep_for(exposed - gather);
    if (gather > 0) {
      auto comms = shard_ring_flows(d, static_cast<double>(shard_n_ - 1) / shard_n_ * costs_.optim_gather_bytes[pp]);
      wait_comms(comms);
    }
    event(d, a, Stream::DP, w0, sg4::Engine::get_clock(), -1, kShardWait);
  }
  event(d, a, Stream::Compute, t0, sg4::Engine::get_clock());
}

void SimgridRun::main_actor(SimRank& d) {
  d.mbox->set_receiver(sg4::Actor::self());
  const auto& acts = s_.programs[d.coord.pp].actions;
  for (d.pc = 0; d.pc < acts.size(); ++d.pc) {
    const Action& a = acts[d.pc];
    progress();
    switch (a.kind) {
      case ActionKind::F:
      case ActionKind::B:
      case ActionKind::I:
      case ActionKind::W: compute(d, a); break;
      case ActionKind::SEND_F:
      case ActionKind::SEND_B: send(d, a); break;
      case ActionKind::RECV_F:
      case ActionKind::RECV_B: recv(d, a); break;
      case ActionKind::REDUCE_GRAD: reduce_grad(d, a); break;
      case ActionKind::OPTIM: optimizer_step(d, a); break;
      case ActionKind::UNSHARD:
      case ActionKind::RESHARD:
        if (in_.plan.zero_stage >= 3) {
          // UNSHARD: the stage's parameters gathered once and kept until RESHARD (schedule.hpp).
          if (d.unsharded.size() < static_cast<size_t>(s_.num_stages())) d.unsharded.assign(s_.num_stages(), 0);
          if (a.kind == ActionKind::UNSHARD && !d.unsharded[a.stage]) {
            double bytes = 0;
            for (const CommStep& step : lowering_.steps(d.coord.pp, a)) bytes += step.bytes;
            const double w0 = sg4::Engine::get_clock();
            auto comms = shard_ring_flows(d, static_cast<double>(shard_n_ - 1) / shard_n_ * bytes);
            wait_comms(comms);
            event(d, a, Stream::DP, w0, sg4::Engine::get_clock(), -1, kShardWait);
          }
          d.unsharded[a.stage] = a.kind == ActionKind::UNSHARD;
        }
        break;
    }
  }
  for (auto& [peer, stream] : d.streams) {
    stream->queue.push_back(Job{});  // stops the helper once it has sent everything queued
    stream->ready->release();
  }
  d.done = true;
}

// Every actor must have finished: else the schedule stuck (the first dozen stuck devices named).
void SimgridRun::check_finished() const {
  std::ostringstream stuck;
  int stuck_count = 0;
  for (const auto& d : devices_) {
    if (d->done) continue;
    if (++stuck_count <= 12) {
      const auto& acts = s_.programs[d->coord.pp].actions;
      stuck << "\n  device " << d->id << " (pipeline rank " << d->coord.pp << ") waits in "
            << (d->pc < acts.size() ? acts[d->pc].str() : std::string("(end)")) << " at position " << d->pc;
    }
  }
  if (stuck_count > 0)
    throw ScheduleError("simulation stuck at t = " + std::to_string(sg4::Engine::get_clock()) + " s: " +
                        std::to_string(stuck_count) + " actors never finished:" + stuck.str());

}

namespace {

// Never destroyed: this runs in a forked child that exits right after (sim/simulation_job.cpp),
// and tearing down a platform of thousands of hosts costs about as much as running on it.
sg4::Engine& start_engine() {
  int argc = 2;
  char arg0[] = "ptdp";
  char arg1[] = "--log=root.thres:critical";
  char* argv[] = {arg0, arg1, nullptr};
  sg4::Engine& engine = *new sg4::Engine(&argc, argv);
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:1e18");
  sg4::Engine::set_config("contexts/stack-size:128");
  return engine;
}

struct PreparedPlatform {
  PlatformShape shape;
  Platform platform;
};
PreparedPlatform* prepared_ = nullptr;  // never destroyed, as the engine

}  // namespace

const Platform* prepared_platform(const ClusterSpec& cluster, int64_t gpus) {
  return prepared_ && prepared_->shape == platform_shape(cluster, gpus) ? &prepared_->platform : nullptr;
}

SimulationResult SimgridRun::run() {
  const auto wall0 = std::chrono::steady_clock::now();
  const bool prepared = prepared_platform(in_.cluster, in_.plan.gpus()) != nullptr;
  PTDP_ASSERT(prepared || !sg4::Engine::is_initialized(), "one SimGrid engine per process: the prepared platform has another shape");
  sg4::Engine& engine = prepared ? *sg4::Engine::get_instance() : start_engine();
  const int p = static_cast<int>(in_.plan.pipeline);
  const std::vector<std::pair<int64_t, int64_t>> rep_pairs = build_fabric();
  create_devices(rep_pairs);
  {
    // The breakdown from the representatives' events (one per pipeline rank), as every engine.
    std::vector<int> representative(p, -1);
    for (auto& d : devices_)
      if (d->representative) representative[d->coord.pp] = d->id;
    breakdown_ = std::make_unique<RankBreakdownBuilder>(representative);
    breakdown_->reserve(s_.num_actions() / 2);  // 1F1B: 2 of every 5 actions are transfers
  }
  started_ = last_report_ = std::chrono::steady_clock::now();
  for (const auto& d : devices_) actions_total_ += static_cast<int64_t>(s_.programs[d->coord.pp].actions.size());
  for (auto& d : devices_)
    if (d->traced) d->events.reserve(2 * s_.programs[d->coord.pp].actions.size());
  for (auto& d : devices_) {
    d->mbox = sg4::Mailbox::by_name("gpu-" + std::to_string(d->id));
    SimRank* raw = d.get();
    sg4::Actor::create("rank-" + std::to_string(d->id), d->host, [this, raw] { main_actor(*raw); });
  }
  engine.run();

  check_finished();

  SimulationResult res;  // without the schedule: the parent has it (SimulationJob::finish)
  Report& r = res.report;
  r.fidelity = to_string(fidelity_);
  r.backend = "sim";
  r.iteration_time_s = sg4::Engine::get_clock();
  r.config_json = in_.config_json;
  if (in_.plan.optimizer_sync == OptimizerSync::PostValidate) r.iteration_time_s = breakdown_->longest_rank_window_s();
  r.ranks = breakdown_->finish(r.iteration_time_s);
  const EnergyAndPrice energy = energy_and_price(in_.cluster, in_.gpu_hour_usd, in_.energy_usd_per_kwh);
  complete_report(r, run_metrics(in_.model, in_.plan, r.iteration_time_s, mfu_peak_flops(in_.cluster, in_.plan), in_.train_tokens, &energy));
  add_memory(r, in_, s_, res.warnings);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  r.extra["activities"] = static_cast<double>(activities_);
  r.extra["wall_s"] = wall;
  r.extra["activities_per_s"] = static_cast<double>(activities_) / wall;
  r.extra["actors"] = static_cast<double>(devices_.size());
  if (keep_) {
    for (auto& d : devices_) {
      if (!d->traced) continue;
      std::ostringstream name;
      if (fidelity_ == Fidelity::Reduced)
        name << "stage rank " << d->coord.pp << " (gpu " << grid_.rank_at(0, 0, d->coord.pp) << ")";
      else
        name << "gpu " << d->id << " (tp " << d->coord.tp << ", dp " << d->coord.dp << ", pp " << d->coord.pp << ")";
      res.timeline.device_names[d->id] = name.str();
      for (auto& ev : d->events) res.timeline.events.push_back(std::move(ev));
    }
  }
  for (auto& d : devices_) {
    for (auto& [k, m] : d->stash) delete m;
    d->mbox->set_receiver(nullptr);
  }
  return res;
}

}  // namespace sgrun

void prepare_simgrid_platform(const PlatformShape& shape) {
  PTDP_ASSERT(!sg4::Engine::is_initialized(), "prepare_simgrid_platform: this process already has a SimGrid engine");
  sgrun::start_engine();
  sgrun::prepared_ = new sgrun::PreparedPlatform{shape, build_hosts_and_links(shape)};
}

SimulationResult run_simgrid_here(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs) {
  sgrun::SimgridRun run(in, s, fidelity, keep_timeline, costs);
  return run.run();
}

}  // namespace ptdp
