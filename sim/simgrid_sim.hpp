// The SimGrid engine's simulation of one plan (SimgridRun), shared by its two source files:
// sim/simgrid_engine.cpp (the actors: compute, pipeline transfers, reductions, the optimizer)
// and sim/simgrid_fabric.cpp (the platform, the devices, the ring collectives' flows). Internal
// to sim/; callers use sim/simgrid_run.hpp.
#pragma once

#include <simgrid/s4u.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "sim/costing.hpp"
#include "sim/platform.hpp"
#include "sim/simgrid_run.hpp"
#include "sim/simulate.hpp"
#include "model/grid.hpp"

namespace sg4 = simgrid::s4u;

namespace ptdp::sgrun {

/// This process's platform built ahead by prepare_simgrid_platform when it has the shape of
/// `cluster` and `gpus` (then the engine exists too), else nullptr.
const Platform* prepared_platform(const ClusterSpec& cluster, int64_t gpus);

enum class MsgType : uint8_t { Forward, Backward, Reduce, Pair };

struct Msg {
  MsgType type;
  int stage;  // sender's stage
  int mb;
};

inline uint64_t key_of(MsgType type, int stage, int mb) {
  return (static_cast<uint64_t>(type) << 56) | (static_cast<uint64_t>(stage) << 28) | static_cast<uint64_t>(mb + 1);
}

// A whole blocking transfer of a Msg in one simcall: SimGrid 3.32's Comm::send / Comm::recv run
// the comm's start and its wait in one kernel call, where Mailbox::put / get make two simcalls
// (put_init()->start(), then wait()), each a switch to SimGrid's kernel and back. The same comm,
// the same times; the message's pointer is the payload, as put / get carry it.
inline void put_msg(sg4::Mailbox* to, Msg* m, uint64_t bytes) {
  sg4::Comm::send(sg4::Actor::self()->get_impl(), to, static_cast<double>(bytes), /*rate: none*/ -1, m, sizeof(void*),
                  nullptr, nullptr, nullptr, /*timeout: none*/ -1);
}
inline Msg* get_msg(sg4::Mailbox* from) {
  Msg* m = nullptr;
  size_t size = sizeof(void*);
  sg4::Comm::recv(sg4::Actor::self()->get_impl(), from, &m, &size, nullptr, nullptr, nullptr, /*timeout: none*/ -1,
                  /*rate: none*/ -1);
  return m;
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
// n·kFlowsPerIssuer/2. A helper actor costs more than 32 steps of that scan (its stack, its
// start and end: 64 instead of 16 took a reduced DeepSeek-V3 ZeRO-2 run, whose rings keep 38
// flows each, from 2.05 to 1.58 s of CPU).
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
constexpr size_t kFlowsPerIssuer = 64;
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

RingPlan ring_plan(const ClusterSpec& cluster, int64_t d, int64_t stride);

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
  void event(SimRank& d, const Action& a, Stream st, double t0, double t1, int peer = -1, const char* label = "");
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
  // Seconds one bucket of the stage's other bucketable REDUCE_GRAD steps takes (the groups timed
  // α-β rather than as flows: expert data, shard replicas), its bytes stretched by `stretch`.
  double bucketed_timed_s(int stage, int pp, int64_t buckets, double stretch) const {
    double s = 0;
    for (CommStep step : costs_.reduce_grad_steps[stage])
      if (step.bucketable && step.group != CommGroup::Gradient && step.group != CommGroup::Sharding) {
        step.bytes *= stretch / static_cast<double>(buckets);
        s += comm_step_time_s(in_.cluster, in_.plan, s_.stage_to_rank, pp, step);
      }
    return s;
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
  // the representatives meets only its ring neighbours' flows, one per link. The kept flows of
  // one GPU pair (NCCL's channels between two GPUs of a node: the same route) are one flow of
  // their summed bytes: alone, and beside flows of the same ring or of rings over the same
  // channels, it ends when they would; beside a single flow on the same link it takes one share
  // where they took one each (tens of thousands fewer SimGrid activities for a ZeRO-2 plan's
  // per-microbatch reduce-scatters; reduced fidelity against full: docs/ACCURACY.md).
  // The split of a ring collective's flows (kept ones in issue order; the routes of the others)
  // depends on the ring and the stage rank, not on the bytes: made once per run for each
  // (ring, pipeline rank, group) — `flows` lists them, in issue order — and reused by every
  // collective over it (a sharded stage's units each reduce-scatter over the same ring).
  enum class Ring : uint8_t { GradientBuckets, GradientSteps, Sharding, ShardingSubgroup };
  using HostPair = std::pair<sg4::Host*, sg4::Host*>;
  struct RingSplit {
    std::vector<HostPair> kept;  // distinct GPU pairs
    std::vector<uint32_t> copies;  // flows of each kept pair
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
  // A unit's ring collective issued now and waited for later (wait_comms): its flows, or the
  // actors that issue them where a ring has more than kFlowsPerIssuer (issue: kept off the device
  // actor's list of pending activities, which SimGrid searches linearly at every completion).
  // `group` < shard_n_: a ring over the `group` consecutive members of the sharding group that
  // hold d (the backward re-gather of reshard_after_forward N).
  Flows unit_ring_flows(const SimRank& d, double member_bytes, int group = 0);
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


}  // namespace ptdp::sgrun
