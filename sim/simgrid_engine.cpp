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
#include <simgrid/s4u.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.hpp"
#include "sim/costing.hpp"
#include "sim/platform.hpp"
#include "sim/simgrid_run.hpp"
#include "sim/simulate.hpp"
#include "model/grid.hpp"
#include "model/metrics.hpp"
#include "topologies/collectives.hpp"

namespace sg4 = simgrid::s4u;

namespace ptdp {
namespace {

enum class MsgType : uint8_t { Forward, Backward, Reduce, Pair };

struct Msg {
  MsgType type;
  int stage;  // sender's stage
  int mb;
};

uint64_t key_of(MsgType type, int stage, int mb) {
  return (static_cast<uint64_t>(type) << 56) | (static_cast<uint64_t>(stage) << 28) | static_cast<uint64_t>(mb + 1);
}

struct Job {
  Msg* msg = nullptr;  // nullptr: stop
  sg4::Mailbox* to = nullptr;
  double bytes = 0;
  int peer = -1;
  Action action;
  double issued_s = 0;  // when the SEND action posted it (the producer's data was ready)
};

// Sends to one peer go out one at a time, in order (one NCCL channel): the rank's actor queues
// them for a helper actor that issues them in turn. (Issuing sends on an idle stream from the
// rank's actor itself was measured 8× slower on GPT-3 175B full fidelity: SimGrid 3.32 keeps
// such comms on the actor's activity list, whose removal is a linear search.)
struct SendStream {
  std::deque<Job> queue;
  sg4::SemaphorePtr ready;
  bool helper = false;  // helper actor started
};

// Flows of a collective that the caller waits for: comms it issued, and helper actors that issued
// the others and wait for them. SimGrid 3.32 takes a finished activity off its issuing actor's
// list by a linear scan, so one actor issuing the n flows of a reduced-fidelity ring (every
// replica's, n = t·d·channels) pays ~n²/2 steps as they end (a fifth of a reduced Llama 3 70B
// ZeRO-2 run); issued kFlowsPerIssuer per helper the same flows start at the same time and cost
// n·kFlowsPerIssuer/2.
// Reduced fidelity simulates a ring's flows only where they meet the representatives' traffic;
// the others end by `until` (issue_ring), which waiting for the flows includes.
struct Flows {
  std::vector<sg4::CommPtr> comms;
  std::vector<sg4::ActorPtr> issuers;
  double until = 0;
  void add(Flows&& o) {
    for (auto& c : o.comms) comms.push_back(std::move(c));
    for (auto& a : o.issuers) issuers.push_back(std::move(a));
    until = std::max(until, o.until);
    o.comms.clear();
    o.issuers.clear();
    o.until = 0;
  }
};
constexpr size_t kFlowsPerIssuer = 16;
struct FlowSpec {
  sg4::Host* from;
  sg4::Host* to;
  uint64_t bytes;
};

// A simulated GPU's place: tensor rank, index in the gradient (data × context) group, pipeline
// rank; its global rank is the process grid's (rank_at).
struct SimRankCoord {
  int tp = 0, dp = 0, pp = 0;
};

// One simulated rank (an actor's GPU or CPU rank; in reduced fidelity it stands for its stage's
// t·d ranks) — not exec::Device, the executor's compute device.
struct SimRank {
  int id = 0;
  SimRankCoord coord;
  sg4::Host* host = nullptr;
  sg4::Mailbox* mbox = nullptr;
  std::unordered_map<uint64_t, Msg*> stash;
  std::map<int, std::unique_ptr<SendStream>> streams;  // by destination device
  bool record = false;          // events go to the timeline (the trace, or the breakdown)
  bool traced = false;          // events go to the trace the caller asked for
  bool representative = false;  // its figures stand for its pipeline rank
  std::vector<TimelineEvent> events;
  size_t pc = 0;
  bool done = false;
  // GPU nodes: the scatter/gather all-gather of the last RECV, run as the first part of the
  // next compute (one timed wait instead of two; its event still belongs to the RECV).
  struct Gather {
    Action recv;
    int peer;
    double seconds;
  };
  std::vector<Gather> pending_gathers;
  // Sharding: the last unit's gradient reduce-scatter, still on the wire after its action.
  Flows pending_reduce_scatter;
  // overlap_grad_reduce: the gradient buckets launched during a stage's last backward, per stage,
  // waited for by its REDUCE_GRAD.
  std::map<int, Flows> pending_buckets;
  std::vector<char> unsharded;  // per stage: parameters gathered by an UNSHARD until RESHARD
};

// NCCL runs an all-reduce over several rings (channels) at once. When a data-parallel group has
// k members per node, ring c walks each node's members starting at local index c and leaves the
// node from local index c − 1 towards the next node's member c, so the k rings leave every node
// over k different NICs (k = 1 when the group is inside one node or has one GPU per node).
struct RingPlan {
  int channels = 1;
  // successor[c][i]: ring-c successor of member i (data-parallel index).
  std::vector<std::vector<int>> successor;
};

RingPlan ring_plan(const ClusterSpec& cluster, int64_t d, int64_t stride) {
  RingPlan rp;
  const GroupShape g = group_shape(cluster, d, stride);
  const int k = (g.nodes > 1 && g.per_node > 1 && d % g.per_node == 0 && g.nodes * g.per_node == d) ? static_cast<int>(g.per_node) : 1;
  rp.channels = k;
  rp.successor.assign(k, std::vector<int>(d));
  for (int c = 0; c < k; ++c)
    for (int i = 0; i < d; ++i) {
      const int block = i / k, local = i % k;
      const int pos = ((local - c) % k + k) % k;
      rp.successor[c][i] = pos < k - 1 ? block * k + (local + 1) % k : static_cast<int>(((block + 1) % (d / k)) * k + c);
    }
  return rp;
}

class SimgridRun {
 public:
  SimgridRun(const SimulationInput& in, const Schedule& s, Fidelity f, bool keep_timeline, const PlanCosts* costs)
      : in_(in),
        s_(s),
        fidelity_(f),
        keep_(keep_timeline),
        costs_(costs ? *costs : plan_costs(in.model, in.plan, in.cluster, /*static_core_sharing=*/false, &s)) {}

  SimulationResult run();

 private:
  std::vector<std::pair<int64_t, int64_t>> build_fabric();
  void create_devices(const std::vector<std::pair<int64_t, int64_t>>& rep_pairs);
  void check_finished() const;
  int device_of(int tp, int dp, int pp) const {
    if (fidelity_ == Fidelity::Reduced) return pp;
    if (tensor_twins_) return static_cast<int>(dp + replicas_ * pp);  // TP rank 0's actors only, in the grid's order
    return static_cast<int>(grid_.rank_at(tp, dp, pp));
  }
  sg4::Host* gpu(int tp, int dp, int pp) const { return pf_.gpus[grid_.rank_at(tp, dp, pp)]; }
  void main_actor(SimRank& d);
  void sender_actor(SimRank& d, SendStream& stream);
  Msg* take(SimRank& d, uint64_t key);
  void event(SimRank& d, const Action& a, Stream st, double t0, double t1, int peer = -1, std::string label = {});
  void compute(SimRank& d, const Action& a);
  void run_compute(SimRank& d, double seconds, double blocked_s = 0);
  void send(SimRank& d, const Action& a);
  void recv(SimRank& d, const Action& a);
  void reduce_grad(SimRank& d, const Action& a);
  void optimizer_step(SimRank& d, const Action& a);
  void flush_gathers(SimRank& d);  // pending all-gathers that no compute consumed (GPU nodes)
  // Sharded data parallelism (schedule.hpp): ring flows of one collective over the sharding
  // group of `d`'s stage, each member sending `member_bytes` per channel to its successor;
  // issued for d alone (full) or for every device it stands for (reduced).
  Flows shard_ring_flows(const SimRank& d, double member_bytes);
  Flows subgroup_ring_flows(const SimRank& d, double member_bytes, int group);
  // Data-parallel gradient flows of `d`'s stage for a reduction of `bytes` (all-reduce rings, or
  // the sharding group's reduce-scatter), without waiting for peers: issued for d alone (full) or
  // for every device it stands for (reduced). Used by bucketed (overlapped) reductions.
  Flows gradient_flows(const SimRank& d, double bytes);
  // One ring collective over the data-parallel group of `d`'s stage: `member_ring_bytes` leave
  // each member over the ring's channels (full: d's own flows, matched with its predecessors'
  // by mailbox; reduced: every replica's flows). `tag` tells apart several rings of one action.
  void ring_flows(SimRank& d, int stage, double member_ring_bytes, int tag, Flows& comms);
  // True when `a` (at d.pc) is the last backward (B, or W) of its stage in d's program and the
  // stage's gradients reduce in buckets during it (overlap_grad_reduce).
  bool reduces_during(const SimRank& d, const Action& a) const;
  // Bytes of the stage's REDUCE_GRAD steps that overlap_grad_reduce launches in buckets (the
  // data-parallel all-reduce, or the sharding group's reduce-scatter).
  double bucketed_bytes(int stage) const {
    double bytes = 0;
    for (const CommStep& step : costs_.reduce_grad_steps[stage])
      if (step.bucketable && (step.group == CommGroup::Gradient || step.group == CommGroup::Sharding)) bytes += step.bytes;
    return bytes;
  }
  void sharded_compute(SimRank& d, const Action& a);
  void wait_comms(Flows& flows);
  // Issues `specs` (Flows): by the calling actor when they are few, else by helper actors.
  Flows issue(const std::vector<FlowSpec>& specs);
  // Reduced fidelity: the flows of a ring collective (every replica's, every twin left out) as
  // flows where they cross a link the representatives' own traffic uses (rep_links_: their
  // pipeline, pair and ring hops), and the rest as the time each would take alone on its route
  // (latency + bytes at the route's narrowest bandwidth and the size's bandwidth factor), the
  // collective ending no earlier than the slowest of them. Rings are symmetric: a flow away from
  // the representatives meets only its ring neighbours' flows, one per link.
  // The split of a ring collective's flows (kept ones in issue order; the routes of the others)
  // depends on the ring and the stage rank, not on the bytes: made once per run for each
  // (ring, pipeline rank, group) — `flows` lists them, in issue order — and reused by every
  // collective over it (a sharded stage's units each reduce-scatter over the same ring).
  enum class Ring : uint8_t { GradientBuckets, GradientSteps, Sharding, ShardingSubgroup };
  using HostPair = std::pair<sg4::Host*, sg4::Host*>;
  struct RingSplit {
    std::vector<HostPair> kept;
    struct Alone {
      double latency = 0, bandwidth = 0;
      bool inter = false;
      bool operator==(const Alone& o) const { return latency == o.latency && bandwidth == o.bandwidth && inter == o.inter; }
    };
    std::vector<Alone> alone;  // the distinct routes of the flows timed alone
  };
  const RingSplit& ring_split(Ring ring, int pp, int group, const std::function<void(std::vector<HostPair>&)>& flows);
  std::unordered_map<uint64_t, RingSplit> ring_splits_;
  Flows issue_ring(const RingSplit& split, uint64_t bytes);
  struct RouteInfo {
    bool kept = false;  // crosses a representative link
    bool inter = false;
    double latency = 0, bandwidth = 0;
  };
  const RouteInfo& route_info(const sg4::Host* from, const sg4::Host* to);
  std::unordered_map<uint64_t, RouteInfo> routes_;
  std::unordered_map<const sg4::Host*, int64_t> gpu_index_;
  std::vector<char> rep_links_;  // by link id (Platform::directed_links)
  // shard_ring_flows issued and waited for by an actor of their own, which the caller joins: the
  // same flows at the same time, kept off the device actor's list of pending activities (SimGrid
  // searches it linearly at every completion; a unit's ring has t·d flows).
  // `group` < shard_n_: a ring over the `group` consecutive members of the sharding group that
  // hold d (the backward re-gather of reshard_after_forward N).
  sg4::ActorPtr shard_ring_in_background(const SimRank& d, double member_bytes, int group = 0);
  // CPU back end with more ranks than cores: a rank that had to wait for a pipeline message
  // since `since` slept, and resumes costs_.wakeup_s late (sim/costing.cpp).
  void wake_up_late(double since) const {
    if (costs_.wakeup_s > 0 && sg4::Engine::get_clock() > since) sg4::this_actor::sleep_for(costs_.wakeup_s);
  }

  const SimulationInput& in_;
  // The ranks holding the same weights in each (tensor, pipeline) position: d, times cp with
  // context parallelism (Megatron's order: tensor, context, data, pipeline) — the placement's
  // second axis and the gradient rings' members.
  const int64_t replicas_ = in_.plan.gradient_ranks();
  const ProcessGrid grid_{in_.plan};
  const Schedule& s_;
  const Lowering lowering_{s_, in_.plan, in_.model};
  Fidelity fidelity_;
  bool keep_;
  PlanCosts costs_;
  RingPlan rings_;
  RingPlan shard_rings_;  // over the N members of a sharding group (local indices)
  int shard_n_ = 1;
  // Reduced fidelity: which flows of a ring collective need simulating (ring_twins).
  struct Twins {
    int tensor = 1;    // TP ranks 0 … tensor − 1 (1: the others' rings are TP rank 0's twins)
    int channels = 1;  // channels 0 … channels − 1 (1: the others are channel 0's twins)
  };
  Twins dp_twins_, shard_twins_;
  Twins ring_twins(const RingPlan& rp, int group) const;
  // allow_idle_shared: classes may also share links that can never limit a flow (no other
  // traffic on the fabric: one pipeline stage).
  bool isomorphic(const std::vector<std::vector<std::pair<int64_t, int64_t>>>& classes, bool allow_idle_shared) const;
  Platform pf_;
  // Full fidelity on GPUs: the t TP ranks of each (replica, stage) run the same program with the
  // same durations (their collectives are α-β timed inside compute); when the flows each TP rank
  // puts on the fabric (pipeline transfers both ways, pair exchanges, ring hops) are twins of TP
  // rank 0's (isomorphic: their own links, the same network), every TP rank's actor would do what
  // TP rank 0's does at the same times, so only TP rank 0's actors run (exact; not with a trace,
  // which shows every GPU).
  bool tensor_twins_ = false;
  std::vector<std::unique_ptr<SimRank>> devices_;
  std::unique_ptr<RankBreakdownBuilder> breakdown_;  // fed by event() as the run goes
  std::vector<sg4::BarrierPtr> optim_barriers_;  // per data-parallel replica: the grad-norm all-reduce
  int64_t activities_ = 0;
  // Progress on stderr for long runs.
  int64_t actions_done_ = 0, actions_total_ = 0;
  std::chrono::steady_clock::time_point started_, last_report_;
  void progress();
};

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

void SimgridRun::event(SimRank& d, const Action& a, Stream st, double t0, double t1, int peer, std::string label) {
  if (!d.record) return;
  // Into the breakdown at once; kept only for the trace. The breakdown sums each rank's events in
  // its representative's order, which is the order they happen in, whether fed now or after the
  // run (and sends are matched by key): the same figures without storing 400 000 events.
  TimelineEvent ev;
  ev.device = d.id;
  ev.pipeline_rank = d.coord.pp;
  ev.action = a;
  ev.stream = st;
  ev.start_s = t0;
  ev.end_s = t1;
  ev.peer = peer;
  ev.label = std::move(label);
  breakdown_->add(ev);
  if (d.traced) d.events.push_back(std::move(ev));
}

Msg* SimgridRun::take(SimRank& d, uint64_t key) {
  if (auto it = d.stash.find(key); it != d.stash.end()) {
    Msg* m = it->second;
    d.stash.erase(it);
    return m;
  }
  for (;;) {
    Msg* m = d.mbox->get<Msg>();
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
    for (int64_t b = 0; b < buckets; ++b) {
      run_compute(d, (dur + slowed) / static_cast<double>(buckets));
      pending.add(gradient_flows(d, bucketed_bytes(a.stage) * stretch / static_cast<double>(buckets)));
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
    devices_[peer]->mbox->put(new Msg{fwd ? MsgType::Forward : MsgType::Backward, a.stage, a.microbatch},
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
    job.to->put(job.msg, static_cast<uint64_t>(job.bytes));
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
    const bool flows_group = step.group == CommGroup::Gradient || step.group == CommGroup::Sharding;
    if (overlapped && step.bucketable && flows_group) continue;
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

bool SimgridRun::isomorphic(const std::vector<std::vector<std::pair<int64_t, int64_t>>>& classes, bool allow_idle_shared) const {
  // classes[j][f]: the GPUs (source, destination) of flow f of class j. The classes are twins
  // when, for each class j, one map of class 0's links onto class j's links (one-to-one, equal
  // bandwidth and latency) takes the route of every flow f of class 0 onto the route of flow f
  // of class j, and no link that could limit a flow carries flows of two classes: then the
  // classes are the same network with the same flows, their flows share their links alike, and
  // under SimGrid's max-min bandwidth sharing flow f ends at the same time in every class.
  //
  // With allow_idle_shared, classes may share links that never limit the collective: a shared
  // link L crossed by n flows (all classes) with capacity ≥ n · r_min, r_min the narrowest route
  // bandwidth of any flow, gives every flow crossing it at least r_min under max-min sharing,
  // so the slowest flows (which end the collective) are limited by their own links alone, and
  // the others, whose share of L changes without the twins, still run at least as fast as them.
  // This holds only while nothing else (pipeline transfers) uses the fabric.
  // Link ids (Platform::directed_links) index plain arrays: tens of thousands of flows (16 384
  // GPUs), a few links each.
  const size_t ids = pf_.directed_links.size();
  constexpr int64_t kNone = -1;
  std::vector<int64_t> owner(ids, kNone), crossing(ids, 0);  // first class crossing each link; flows crossing it, all classes
  std::vector<char> shared(ids, 0);
  std::vector<int32_t> image(ids, -1), preimage(ids, -1);  // this class's map, reset per class
  std::vector<int32_t> touched;                            // the entries set in it
  double r_min = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int32_t>> first;
  std::vector<int32_t> links;
  auto link = [&](int32_t id) { return pf_.directed_links[static_cast<size_t>(id)]; };
  for (size_t j = 0; j < classes.size(); ++j) {
    for (int32_t id : touched) image[static_cast<size_t>(id)] = preimage[static_cast<size_t>(id)] = -1;
    touched.clear();
    for (size_t f = 0; f < classes[j].size(); ++f) {
      pf_.route(classes[j][f].first, classes[j][f].second, links);
      for (int32_t id : links) {
        const auto l = static_cast<size_t>(id);
        if (owner[l] == kNone) {
          owner[l] = static_cast<int64_t>(j);
          r_min = std::min(r_min, link(id)->get_bandwidth());  // the least over every link crossed
        } else if (owner[l] != static_cast<int64_t>(j)) {
          if (!allow_idle_shared) return false;
          shared[l] = 1;
        }
        ++crossing[l];
      }
      if (j == 0) {
        first.push_back(links);
        continue;
      }
      const auto& base = first[f];
      if (base.size() != links.size()) return false;
      for (size_t i = 0; i < links.size(); ++i) {
        const auto b = static_cast<size_t>(base[i]), l = static_cast<size_t>(links[i]);
        const bool new_image = image[b] < 0;
        if (new_image) {
          image[b] = links[i];
          touched.push_back(base[i]);
        }
        if (preimage[l] < 0) {
          preimage[l] = base[i];
          touched.push_back(links[i]);
        }
        if (image[b] != links[i] || preimage[l] != base[i]) return false;
        if (new_image && (link(base[i])->get_bandwidth() != link(links[i])->get_bandwidth() ||
                          link(base[i])->get_latency() != link(links[i])->get_latency()))
          return false;
      }
    }
  }
  for (size_t l = 0; l < ids; ++l)
    if (shared[l] && pf_.directed_links[l]->get_sharing_policy() != sg4::Link::SharingPolicy::FATPIPE &&
        static_cast<double>(crossing[l]) * r_min > pf_.directed_links[l]->get_bandwidth())
      return false;
  return true;
}

SimgridRun::Twins SimgridRun::ring_twins(const RingPlan& rp, int group) const {
  // The flows the reduced engine puts on the fabric for one collective over rings of `group`
  // members: every TP rank, replica, stage and channel. TP rank 0's GPUs also carry the actors'
  // pipeline transfers, so the flows kept are TP rank 0's: the flows of the other TP ranks are
  // left out when they are twins of TP rank 0's (their own links, the same network), and with
  // one pipeline stage (no transfers) the channels 1 … k − 1 when they are twins of channel 0.
  // Kept flows meet exactly the flows they met before; a ring collective ends with its last flow,
  // which a twin shares.
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);
  const int k = rp.channels;
  auto g = [&](int tp, int r, int pp) { return grid_.rank_at(tp, r, pp); };
  // Channel c's member i plays the part channel 0's member ((i mod k) − c) mod k of its node plays.
  auto member = [&](int base_member, int c) { return base_member / k * k + (base_member % k + c) % k; };
  auto flows = [&](int tp, int c, bool as_channel_0) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int pp = 0; pp < p; ++pp)
      for (int r = 0; r < dp; ++r) {
        const int base = r / group * group, i = as_channel_0 ? member(r - base, c) : r - base;
        out.emplace_back(g(tp, base + i, pp), g(tp, base + rp.successor[c][i], pp));
      }
    return out;
  };
  Twins tw{t, k};
  std::vector<std::vector<std::pair<int64_t, int64_t>>> classes;
  if (t > 1) {
    for (int tp = 0; tp < t; ++tp) {
      std::vector<std::pair<int64_t, int64_t>> all;
      for (int c = 0; c < k; ++c)
        for (auto& f : flows(tp, c, false)) all.push_back(f);
      classes.push_back(std::move(all));
    }
    if (isomorphic(classes, p == 1)) tw.tensor = 1;
  }
  if (k > 1 && p == 1) {
    classes.clear();
    for (int c = 0; c < k; ++c) classes.push_back(flows(0, c, true));
    if (isomorphic(classes, true)) tw.channels = 1;
  }
  return tw;
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

sg4::ActorPtr SimgridRun::shard_ring_in_background(const SimRank& d, double member_bytes, int group) {
  return sg4::Actor::create("ring-" + std::to_string(d.id), d.host, [this, &d, member_bytes, group] {
    auto comms = group > 0 && group < shard_n_ ? subgroup_ring_flows(d, member_bytes, group) : shard_ring_flows(d, member_bytes);
    wait_comms(comms);
  });
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

const SimgridRun::RouteInfo& SimgridRun::route_info(const sg4::Host* from, const sg4::Host* to) {
  const int64_t a = gpu_index_.at(from), b = gpu_index_.at(to);
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  auto [it, fresh] = routes_.try_emplace(key);
  if (!fresh) return it->second;
  RouteInfo& info = it->second;
  std::vector<int32_t> links;
  pf_.route(a, b, links);  // as route_to, whose latency is the links' in route order
  info.bandwidth = std::numeric_limits<double>::infinity();
  for (int32_t id : links) {
    const sg4::Link* l = pf_.directed_links[static_cast<size_t>(id)];
    info.latency += l->get_latency();
    info.bandwidth = std::min(info.bandwidth, l->get_bandwidth());
    if (rep_links_[static_cast<size_t>(id)]) info.kept = true;
  }
  info.inter = a / in_.cluster.gpus_per_node != b / in_.cluster.gpus_per_node;
  return info;
}

const SimgridRun::RingSplit& SimgridRun::ring_split(Ring ring, int pp, int group,
                                                     const std::function<void(std::vector<HostPair>&)>& flows) {
  const uint64_t key = (static_cast<uint64_t>(ring) << 56) | (static_cast<uint64_t>(group) << 28) | static_cast<uint64_t>(pp);
  auto [it, fresh] = ring_splits_.try_emplace(key);
  RingSplit& split = it->second;
  if (!fresh) return split;
  std::vector<HostPair> all;
  flows(all);
  for (const auto& [from, to] : all) {
    if (from == to) continue;
    const RouteInfo& r = route_info(from, to);
    if (r.kept) {
      split.kept.emplace_back(from, to);
      continue;
    }
    const RingSplit::Alone alone{r.latency, r.bandwidth, r.inter};
    if (std::find(split.alone.begin(), split.alone.end(), alone) == split.alone.end()) split.alone.push_back(alone);
  }
  return split;
}

Flows SimgridRun::issue_ring(const RingSplit& split, uint64_t bytes) {
  std::vector<FlowSpec> kept;
  kept.reserve(split.kept.size());
  for (const auto& [from, to] : split.kept) kept.push_back(FlowSpec{from, to, bytes});
  // Every flow carries the same bytes: the slowest alone is that of the slowest distinct route.
  const double b = static_cast<double>(bytes);
  double alone_s = 0;
  for (const RingSplit::Alone& r : split.alone)
    alone_s = std::max(alone_s, r.latency + b / (r.bandwidth * p2p_bandwidth_factor(in_.cluster, r.inter, b)));
  Flows out = issue(kept);
  if (alone_s > 0) out.until = sg4::Engine::get_clock() + alone_s;
  return out;
}

Flows SimgridRun::issue(const std::vector<FlowSpec>& specs) {
  Flows out;
  if (specs.size() <= kFlowsPerIssuer) {
    for (const FlowSpec& f : specs) out.comms.push_back(sg4::Comm::sendto_async(f.from, f.to, f.bytes));
    return out;
  }
  for (size_t first = 0; first < specs.size(); first += kFlowsPerIssuer) {
    std::vector<FlowSpec> part(specs.begin() + static_cast<long>(first),
                               specs.begin() + static_cast<long>(std::min(specs.size(), first + kFlowsPerIssuer)));
    sg4::Host* host = part.front().from;
    out.issuers.push_back(sg4::Actor::create("flows", host, [this, part = std::move(part)] {
      std::vector<sg4::CommPtr> comms;
      for (const FlowSpec& f : part) comms.push_back(sg4::Comm::sendto_async(f.from, f.to, f.bytes));
      for (auto& c : comms) {
        c->wait();
        ++activities_;
      }
    }));
  }
  return out;
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
  std::vector<sg4::ActorPtr> gathers(n), scatters;
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
          gathers[issued] = shard_ring_in_background(d, gather_member * unit_at(issued).param_bytes * stretch_of(unit_at(issued)).gather,
                                                     static_cast<int>(group));
      const double w0 = sg4::Engine::get_clock();
      if (gathers[i]) gathers[i]->join();
      gathers[i] = nullptr;
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
        for (auto& ring : scatters) ring->join();
        scatters.clear();
        if (const double w1 = sg4::Engine::get_clock(); w1 > w0) event(d, a, Stream::DP, w0, w1, -1, kShardWait);
        wait_comms(d.pending_reduce_scatter);
        d.pending_reduce_scatter = shard_ring_flows(d, member * u.grad_bytes * stretch_of(u).reduce_scatter);
      } else {
        scatters.push_back(shard_ring_in_background(d, member * u.grad_bytes * stretch_of(u).reduce_scatter));
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

// The platform of the GPUs that exchange data (pipeline neighbours, DP and sharding rings, the
// pairs of stages that sum gradients) and, at full fidelity, whether tensor ranks are twins;
// returns those pairs.
std::vector<std::pair<int64_t, int64_t>> SimgridRun::build_fabric() {
  const int64_t n = in_.plan.gpus();
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);
  // The pairs of GPUs that exchange data: pipeline neighbours, DP ring neighbours, and the
  // stages that sum gradients pairwise (costs_.pair_stage: the tied embedding's first/last
  // stage, DualPipe's copies) (reduced: pipeline traffic of replica 0 only).
  rings_ = ring_plan(in_.cluster, dp, t);
  shard_n_ = static_cast<int>(in_.plan.sharding_degree());
  shard_rings_ = ring_plan(in_.cluster, shard_n_, t);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  auto g = [&](int tp, int r, int pp) { return grid_.rank_at(tp, r, pp); };
  const bool all = fidelity_ == Fidelity::Full;
  // Full fidelity: per TP rank, the flows its actors would put on the fabric (tensor_twins_).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> tp_flows(static_cast<size_t>(t));
  const bool try_twins = all && t > 1 && !keep_ && !in_.cluster.cpu_host();
  auto both_ways = [&](int tp, int64_t a, int64_t b) {
    pairs.emplace_back(a, b);
    if (try_twins) {
      tp_flows[tp].emplace_back(a, b);
      tp_flows[tp].emplace_back(b, a);
    }
  };
  auto ring_hop = [&](int tp, int64_t a, int64_t b) {
    pairs.emplace_back(a, b);
    if (try_twins) tp_flows[tp].emplace_back(a, b);
  };
  for (int tp = 0; tp < t; ++tp)
    for (int r = 0; r < dp; ++r) {
      const bool rep = tp == 0 && r == 0;
      for (int st = 0; st + 1 < s_.num_stages(); ++st)
        if (all || rep) both_ways(tp, g(tp, r, s_.stage_to_rank[st]), g(tp, r, s_.stage_to_rank[st + 1]));
      for (int st = 0; st < s_.num_stages(); ++st) {  // the tied embedding's copies, DualPipe's lanes
        const int other = costs_.pair_stage[st];
        if (other > st && s_.stage_to_rank[st] != s_.stage_to_rank[other] && (all || rep))
          both_ways(tp, g(tp, r, s_.stage_to_rank[st]), g(tp, r, s_.stage_to_rank[other]));
      }
      for (int pp = 0; pp < p; ++pp) {
        for (const auto& succ : rings_.successor)
          if (dp > 1) ring_hop(tp, g(tp, r, pp), g(tp, succ[r], pp));
        if (shard_n_ > 1)  // the sharding group's rings (over the data-parallel group's when it is that)
          for (const auto& succ : shard_rings_.successor)
            if (shard_n_ < dp || try_twins) ring_hop(tp, g(tp, r, pp), g(tp, r / shard_n_ * shard_n_ + succ[r % shard_n_], pp));
      }
    }
  pf_ = build_platform(in_.cluster, n, pairs);
  if (try_twins) {
    for (auto& flows : tp_flows)  // flows between a GPU and itself put nothing on the fabric
      flows.erase(std::remove_if(flows.begin(), flows.end(), [](const auto& f) { return f.first == f.second; }), flows.end());
    tensor_twins_ = isomorphic(tp_flows, false);
  }
  return pairs;
}

// The actors' devices: one per pipeline rank (reduced: the representatives, and the links their
// traffic crosses), else one per GPU (one per tensor group when the tensor ranks are twins).
void SimgridRun::create_devices(const std::vector<std::pair<int64_t, int64_t>>& rep_pairs) {
  const int64_t n = in_.plan.gpus();
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);

  if (fidelity_ == Fidelity::Reduced) {
    for (size_t r = 0; r < pf_.gpus.size(); ++r) gpu_index_[pf_.gpus[r]] = static_cast<int64_t>(r);
    // The links the representatives' traffic crosses: every route from or to one of their GPUs.
    std::set<int64_t> reps;
    for (int pp = 0; pp < p; ++pp) reps.insert(grid_.rank_at(0, 0, pp));
    rep_links_.assign(pf_.directed_links.size(), 0);
    std::vector<int32_t> links;
    for (auto [a, b] : rep_pairs) {
      if (!reps.count(a) && !reps.count(b)) continue;
      for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
        pf_.route(x, y, links);
        for (int32_t l : links) rep_links_[static_cast<size_t>(l)] = 1;
      }
    }
    if (dp > 1) dp_twins_ = ring_twins(rings_, dp);
    // A sharding group that is the whole data-parallel group has the same rings (ring_plan of the
    // same group), so the same twins.
    if (shard_n_ > 1) shard_twins_ = shard_n_ == dp ? dp_twins_ : ring_twins(shard_rings_, shard_n_);
    for (int pp = 0; pp < p; ++pp) {
      auto d = std::make_unique<SimRank>();
      d->id = pp;
      d->coord = SimRankCoord{0, 0, pp};
      d->host = gpu(0, 0, pp);
      d->traced = keep_;
      d->representative = true;
      d->record = true;
      devices_.push_back(std::move(d));
    }
  } else {
    devices_.resize(tensor_twins_ ? n / t : n);
    for (int64_t r = 0; r < n; ++r) {
      const GridCoord at = grid_.coord(r);
      if (tensor_twins_ && at.tp != 0) continue;
      auto d = std::make_unique<SimRank>();
      d->coord = SimRankCoord{static_cast<int>(at.tp), static_cast<int>(grid_.index_in(CommGroup::Gradient, r)), static_cast<int>(at.pp)};
      d->id = device_of(d->coord.tp, d->coord.dp, d->coord.pp);
      d->host = pf_.gpus[r];
      d->traced = keep_ && d->coord.dp == 0;  // the trace shows data-parallel replica 0
      d->representative = d->coord.tp == 0 && d->coord.dp == 0;
      d->record = d->traced || d->representative;
      devices_[d->id] = std::move(d);
    }
  }
  if (fidelity_ == Fidelity::Reduced)
    optim_barriers_.push_back(sg4::Barrier::create(static_cast<unsigned>(p)));
  else
    for (int r = 0; r < dp; ++r) optim_barriers_.push_back(sg4::Barrier::create(static_cast<unsigned>((tensor_twins_ ? 1 : t) * p)));
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

SimulationResult SimgridRun::run() {
  const auto wall0 = std::chrono::steady_clock::now();
  int argc = 2;
  char arg0[] = "ptdp";
  char arg1[] = "--log=root.thres:critical";
  char* argv[] = {arg0, arg1, nullptr};
  // Never destroyed: this runs in a forked child that exits right after (sim/simulation_job.cpp),
  // and tearing down a platform of thousands of hosts costs about as much as running on it.
  sg4::Engine& engine = *new sg4::Engine(&argc, argv);
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:1e18");
  sg4::Engine::set_config("contexts/stack-size:128");
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

}  // namespace

SimulationResult run_simgrid_here(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs) {
  SimgridRun run(in, s, fidelity, keep_timeline, costs);
  return run.run();
}

}  // namespace ptdp
