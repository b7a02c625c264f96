// Durations of every action of a plan's schedule on a cluster: the cost model (model/) for
// compute, α-β collectives on the topology's links (topologies/) for communication.
// Shared by the analytic critical path and the SimGrid actors.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/thread_scope.hpp"
#include "model/cost.hpp"
#include "model/metrics.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "schedules/communication.hpp"
#include "schedules/schedule.hpp"
#include "topologies/cluster.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {

/// Power of the cluster's GPUs and nodes and the given prices, for the report's energy and cost.
EnergyAndPrice energy_and_price(const ClusterSpec& cluster, std::optional<double> gpu_hour_usd, double energy_usd_per_kwh);

/// Time of a communication op of a layer (model/cost.hpp OpKind: all-reduce, reduce-scatter,
/// all-gather, all-to-all, the context ring's transfers) over its group's ranks under the plan
/// (tensor, context, expert, expert-tensor; members placed in Megatron-Core's rank order) on
/// this cluster, not counting any overlap; 0 for compute ops.
double comm_op_time_s(const ClusterSpec& cluster, const ParallelPlan& plan, const Op& op);

/// One layer's exposed communication inside F, recompute and B (no weight-gradient hiding), by
/// group: "tp", "cp" (context ring / all-gather), "ep" (expert dispatch and combine). The
/// engines time all of them on the TP stream; reports split that stream's time by these shares.
std::map<std::string, double> layer_comm_by_group(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster);

/// Per-microbatch and per-iteration costs of a plan, per stage (index = stage).
struct PlanCosts {
  std::vector<double> forward_s;        // F of one microbatch, TP all-reduces included
  std::vector<double> backward_s;       // B of one microbatch (recompute and TP included) = I + W − backward_hidden_tp_s
  std::vector<double> forward_tp_s;     // TP all-reduce part of forward_s
  std::vector<double> backward_tp_s;    // TP collectives of the backward (all of them in I)
  /// Part of backward_tp_s that a whole B hides: Megatron runs the TP collective of a
  /// column-parallel layer's input gradient (all-reduce, or reduce-scatter with sequence
  /// parallelism) asynchronously, under that layer's weight-gradient GEMM. A split backward has
  /// no weight gradient in its I to hide it under (W comes later), so I pays it in full.
  std::vector<double> backward_hidden_tp_s;
  /// The expert all-to-alls (dispatch and combine) in forward_tp_s / backward_tp_s: what one
  /// action of a pair of Megatron's --overlap-moe-expert-parallel-comm hides under the other's
  /// compute (its other collectives stay on the compute stream).
  std::vector<double> forward_ep_s, backward_ep_s;
  /// OVERLAP_F_B pairs hide all of each action's TP-stream communication (DualPipe's pairs), or
  /// only its expert all-to-alls (Megatron's merged forward/backward steps).
  bool pairs_hide_tp_stream = true;
  std::vector<double> input_backward_s;   // I: recompute + input-gradient ops + their TP all-reduces
  std::vector<double> recompute_s;        // part of input_backward_s re-running the forward (recompute)
  std::vector<double> weight_backward_s;  // W: weight-gradient ops (no communication)
  std::vector<double> forward_flops;    // per TP rank
  std::vector<double> backward_flops;
  std::vector<double> send_forward_s;   // stage → stage+1 activation transfer (last: 0)
  std::vector<double> send_backward_s;  // stage → stage−1 gradient transfer (first: 0)
  std::vector<bool> boundary_same_node;  // stage → stage+1 inside one node
  double p2p_bytes = 0;                 // boundary tensor b·s·h elements × bytes
  // Communication runs beside compute (GPUs: its own streams); false on a CPU cluster, whose
  // executor runs each collective on the core that computes (OVERLAP_F_B hides nothing there).
  bool overlaps_communication = true;
  bool scatter_gather = false;          // transfers between pipeline ranks are split over the t ranks
  double p2p_wire_bytes = 0;            // bytes each device puts on its link (÷t with scatter/gather)
  double p2p_allgather_s = 0;           // TP all-gather that ends a scatter/gather RECV (0 without)
  /// parallel.overlap_p2p false: each SEND holds its rank until its transfer is done — Megatron's
  /// p2p without overlap (and always in its non-interleaved 1F1B): the batched send/recv of the
  /// boundary is waited for before the next compute. true: the transfer runs beside the rank's
  /// next actions.
  bool p2p_blocking = false;
  /// REDUCE_GRAD of the stage: its steps (schedules/communication.hpp, the one lowering every
  /// engine and the executor follow) and their priced sum (what outlasts the backward under
  /// overlap_grad_reduce).
  std::vector<double> reduce_grad_s;
  /// reduce_grad_s with the cheaper of the stage's two possible last backwards (a whole B or a W)
  /// under its buckets: what holds whichever the program has (the sweep's lower bounds, which
  /// price plans without their programs). Equal to reduce_grad_s without buckets, and when
  /// priced with the program (which says which backward is last).
  std::vector<double> reduce_grad_least_s;
  std::vector<std::vector<CommStep>> reduce_grad_steps;
  std::vector<double> grad_bytes;       // local gradient bytes of the stage
  /// overlap_grad_reduce: buckets the stage's gradients reduce in during its last backward (1 =
  /// one reduction after the backward); reduce_grad_s is then only what outlasts the backward.
  std::vector<int64_t> reduce_grad_buckets;
  /// With buckets: how much longer the stage's last backward runs because its buckets reduce under
  /// it (the concurrency model, overlapped_s); part of reduce_grad_s, which the SimGrid engine
  /// moves onto that backward (it runs the buckets as flows under it).
  std::vector<double> reduce_grad_slowed_s;
  /// With buckets: the factor the buckets' reduction takes longer than their own time, slowed by
  /// the backward beside them (the SimGrid engine stretches the buckets' bytes by it).
  std::vector<double> reduce_grad_comm_stretch;
  /// Part of reduce_grad_s: the Pair steps — gradients summed with one other stage's rank (the
  /// tied embedding's two copies on different ranks; DualPipe's copy of the stage in the other lane).
  std::vector<double> pair_reduce_s;
  std::vector<int> pair_stage;          // that other stage (-1: none)
  std::vector<double> pair_bytes;       // bytes each side sends
  std::vector<double> unshard_s;        // per stage: UNSHARD's parameter all-gather (stage 3; else 0)
  /// F, B and I of a stage between its UNSHARD and RESHARD: its parameters are already gathered.
  std::vector<double> forward_gathered_s, backward_gathered_s, input_gathered_s;
  std::vector<double> optim_s;          // per pipeline rank: Adam + grad-norm all-reduce
  double grad_norm_allreduce_s = 0;     // part of optim_s: the model-parallel norm all-reduce
  double layer_forward_s = 0;           // one transformer layer's F (TP collectives included)
  double layer_backward_s = 0;          // one layer's B: recompute + backward, hidden TP time out
  double tp_allreduce_bytes = 0;        // one TP all-reduce message (b·s·h elements)
  bool sequence_parallel = false;       // boundary tensors already in sequence shards (no all-gather)
  double tp_allreduce_s = 0;            // one TP all-reduce
  double wakeup_s = 0;                  // CPU back end, more ranks than cores: per pipeline receive
  double compute_slowdown = 1;          // > 1 when ranks share fewer CPU cores than they are

  // Sharded data parallelism (schedules/schedule.hpp). The exposed sharding communication of an
  // action is part of its duration above; these say how much of it (per stage, per rank).
  std::vector<double> forward_shard_s, backward_shard_s, input_shard_s, weight_shard_s;
  std::vector<double> optim_shard_s;    // per pipeline rank: parameter all-gather, offload copies
  std::vector<double> optim_gather_s;   // per pipeline rank: the stage 1–2 parameter all-gather (part of optim_shard_s)
  std::vector<double> optim_gather_bytes;  // its tensor: the rank's parameters, all shards
  /// One FSDP unit of a stage (a layer; the embedding; the output layer), per TP rank.
  struct ShardUnit {
    double forward_s = 0, input_s = 0, weight_s = 0;  // compute (TP collectives included)
    double hidden_tp_s = 0;                           // of a whole B: TP time under its wgrad GEMMs
    double param_bytes = 0, grad_bytes = 0;           // the whole unit (all shards)
    double gather_s = 0;                              // parameter all-gather (+ host copy when offloaded)
    /// The backward's re-gather: over the reshard group (plan.hpp reshard_group), 0 when the
    /// forward kept the parameters whole (reshard_after_forward false).
    double backward_gather_s = 0;
    /// Not resharded after its forward (torchtitan's last unit: plan.hpp last_unit_kept_whole):
    /// the backward gathers nothing for it.
    bool kept_whole = false;
    /// Gradient reduce-scatter after each microbatch's backward; 0 when the gradients are
    /// reduced once per step (torchtitan's FSDP with pipelines: REDUCE_GRAD's step).
    double reduce_scatter_s = 0;
    /// How much longer the unit's compute runs in F, B, I, W (and B between UNSHARD and RESHARD)
    /// because a gather or reduce-scatter is on the wire meanwhile (overlapped_units_s).
    double forward_slowed_s = 0, backward_slowed_s = 0, input_slowed_s = 0, weight_slowed_s = 0, gathered_backward_slowed_s = 0;
    /// The same for the unit's gather and its reduce-scatter in each pass, as the factor each one's
    /// time stretches by (≥ 1) because the compute beside it slows it too (the SimGrid engine
    /// stretches their flows' bytes by it).
    struct CommStretch {
      double gather = 1, reduce_scatter = 1;
    };
    CommStretch forward_comm_stretch, backward_comm_stretch, input_comm_stretch, weight_comm_stretch, gathered_backward_comm_stretch;
  };
  std::vector<std::vector<ShardUnit>> units;  // per stage, in forward order (zero_stage ≥ 2)
  int64_t sharding_degree = 1;                // N
  double host_copy_Bps = 0;                   // offload: GPU ↔ host link
};

/// One model of concurrency, used wherever communication runs under computation (both engines):
/// a collective that runs on the GPU's SMs (NCCL) and the compute beside it share the SMs and the
/// memory bandwidth, so while both run each progresses at 1/(1 + contention) —
/// kernel-and-framework facts §4: overlapped GEMMs/layers are 18.9 % slower on average (A100/H100,
/// GPT and LLaMA layers); Megatron-Bridge's expert all-to-all overlap gains 1.317× where its
/// all-to-all outlasts the compute ([MB-ovl]), which a collective keeping its speed under the
/// compute would put near 1.5×. Copy-engine transfers (async TP's symmetric memory, Transformer
/// Engine's userbuffers) slow it by nearly nothing. Whichever outlasts the other then runs alone
/// at full speed.
constexpr double kCollectiveContention = 0.189;
constexpr double kCopyEngineContention = 0.0;
/// Time of `compute_s` of computation with `comm_s` of communication started with it:
/// max(comm, compute) + κ · min(comm, compute) (both progress at 1/(1 + κ) while both run).
double overlapped_s(double compute_s, double comm_s, double contention);
/// The communication the overlap takes off the critical path, compute + comm − overlapped_s:
/// (1 − κ) · min(compute, comm). With κ = 0 the free overlap, min(compute, comm).
double hidden_s(double compute_s, double comm_s, double contention);

/// Two streams under the concurrency model: an in-order compute stream and an in-order
/// communication stream; a job may wait for a job of the other stream (`after`, its index there;
/// -1: none). While both streams run a job each progresses at 1/(1 + contention), else at full
/// speed. Returns each job's start and end (a job starts once its stream's previous job ended and
/// what it waits for ended).
struct StreamJob {
  double work_s = 0;
  int64_t after = -1;
};
struct TwoStreamTimes {
  std::vector<double> compute_start, compute_end, comm_start, comm_end;
};
TwoStreamTimes run_two_streams(const std::vector<StreamJob>& compute, const std::vector<StreamJob>& comm, double contention);

/// Asynchronous tensor parallelism's price (tp_comm_overlap): a GEMM run as `chunks` pieces of
/// m/chunks rows (each at its own shape's efficiency, each launched) so that the transfers of the
/// next piece hide under it.
double async_tp_chunks_s(const Op& gemm, const GpuSpec& gpu, int64_t chunks);

/// Time to run `compute[u]` for units u = 0… in order while their parameters are all-gathered
/// (`gather[u]`) on a communication stream that may hold at most `in_flight` gathered units: the
/// gather of unit u starts once unit u − in_flight finished computing (its buffer is free).
/// With `reduce_scatter`, each unit's gradient reduce-scatter follows its compute on the same
/// communication stream (the same links carry them), in issue order; `*tail_s` receives how long
/// the last one outlasts the end returned (which includes all but the last reduce-scatter). Empty
/// `gather` = parameters already whole. With `contention` > 0 the two streams slow each other while
/// both run (run_two_streams); `*slowed_s`, if given, receives per unit how much longer its compute
/// took than `compute[u]`, `*gather_stretch` and `*rs_stretch` per unit the factor its gather and
/// its reduce-scatter took longer than their own time (1 when it has none).
double overlapped_units_s(const std::vector<double>& gather, const std::vector<double>& compute, int64_t in_flight,
                          const std::vector<double>* reduce_scatter = nullptr, double* tail_s = nullptr,
                          double contention = 0, std::vector<double>* slowed_s = nullptr,
                          std::vector<double>* gather_stretch = nullptr, std::vector<double>* rs_stretch = nullptr);

/// Megatron's bucketed gradient reduction: K buckets of `bucket_s` each, bucket k ready at
/// (k + 1)/K of a backward of `backward_s`, reduced one after another: the time the last one ends
/// after the backward (0 when the backward hides them all). With `contention` the backward and the
/// bucket on the wire slow each other (run_two_streams): `*slowed_s`, if given, receives how much
/// longer the backward took, `*comm_stretch` the factor the buckets took longer than K · bucket_s,
/// and the tail is counted from the backward's later end.
double bucketed_reduction_tail_s(double bucket_s, int64_t buckets, double backward_s, double contention = 0,
                                 double* slowed_s = nullptr, double* comm_stretch = nullptr);
/// Megatron's overlapped parameter all-gather: K bucket gathers of `bucket_s` run back to back from
/// the step's end while the next forward (`forward_s`) needs bucket k at k/K of its length: how
/// long that forward stalls (at least the first bucket's gather).
double bucketed_gather_stall_s(double bucket_s, int64_t buckets, double forward_s);

/// Slowdown of computation when `ranks` ranks share `cores` CPU cores and each blocks for
/// `blocked_s` in collectives (sleeping, its core free) per `compute_s` it computes. Ranks that
/// wait leave their cores to the others (measured: 4 tensor-parallel ranks on 2 cores compute at
/// nearly full speed), so the node is work-conserving: one cycle of a rank lasts
/// max(compute + blocked, ranks · compute / cores), i.e. the slowdown is
/// max(1, ranks / cores − blocked / compute). Without waits: ranks / cores.
double shared_core_slowdown(double ranks, double cores, double compute_s, double blocked_s);

/// CPU back end: true when the plan puts more ranks on a node than it has whole cores. The
/// executor's waits then sleep instead of polling (exec/runtime/mpi_communicator.cpp), which makes its
/// collectives slower and its pipeline receives wake up late.
bool oversubscribes_cores(const ClusterSpec& c, const ParallelPlan& plan);
/// The cluster as `plan` sees it, when that differs from `c`: a plan that oversubscribes the cores
/// of a profile with a curve measured with sleeping waits (calibration.oversubscribed_allreduce)
/// sees that curve as the intra-node one. Empty otherwise (every GPU cluster): use `c`, no copy.
/// plan_costs and simulate apply it.
std::optional<ClusterSpec> cluster_for_plan(const ClusterSpec& c, const ParallelPlan& plan);

/// `static_core_sharing`: with cluster.cores_per_node, scale compute by ranks / cores (the
/// analytic path); SimGrid passes false and shares the node's cores dynamically instead.
/// `stage_to_rank`: the schedule's placement of stages on pipeline ranks (null: the plan's,
/// model/partition.hpp stage_rank — s mod p, or the V); it decides which boundaries cross ranks and nodes, and whether the
/// first and last stage (tied embedding) sit on different ranks.
/// Duration of a compute or collective action (F, B, I, W, REDUCE_GRAD, OPTIM) of `pipeline_rank`
/// as the IR defines it (schedules/schedule.hpp); 0 for SEND/RECV (their transfer is
/// transfer_s) and UNSHARD/RESHARD. `tp_s`, when not null, receives the TP-collective part,
/// `shard_s` the exposed sharding-communication part.
/// `gathered`: the action runs between an UNSHARD and a RESHARD of its stage (stage 3: no per-unit
/// gathers).
double action_duration_s(const PlanCosts& c, int pipeline_rank, const Action& a, double* tp_s = nullptr,
                         double* shard_s = nullptr, bool gathered = false);
/// For each action of each rank's program: whether it runs between an UNSHARD and a RESHARD of
/// its stage (validate_lowered guarantees the pairs).
std::vector<std::vector<char>> gathered_windows(const Schedule& s);
/// The same, one action at a time: `inside(rank, a)` for each rank's actions in program order
/// (ranks may interleave) says what gathered_windows says of that action, with no table of all
/// actions.
class GatheredWindows {
 public:
  explicit GatheredWindows(const Schedule& s)
      : stages_(s.num_stages()), open_(static_cast<size_t>(s.p) * static_cast<size_t>(s.num_stages()), 0) {}
  bool inside(int rank, const Action& a) {
    char* open = open_.data() + static_cast<size_t>(rank) * static_cast<size_t>(stages_);
    if (a.kind == ActionKind::UNSHARD) open[a.stage] = 1;
    if (a.kind == ActionKind::RESHARD) open[a.stage] = 0;
    return a.stage >= 0 && a.stage < stages_ && is_compute(a.kind) && open[a.stage] != 0;
  }

 private:
  int stages_;
  std::vector<char> open_;  // per (rank, stage): between its UNSHARD and its RESHARD
};
/// α-β time of one communication step of pipeline rank `pipeline_rank`'s devices on this cluster,
/// its group placed by the ProcessGrid (model/grid.hpp) — no overlap. A Wait costs 0 here (what
/// it waits for was priced where it started). `stage_to_rank` places a Pair's other stage.
double comm_step_time_s(const ClusterSpec& cluster, const ParallelPlan& plan, const std::vector<int>& stage_to_rank,
                        int pipeline_rank, const CommStep& step);
/// Wire time of the transfer behind a SEND (stage → stage ± 1), without the scatter/gather
/// all-gather (which is part of the RECV).
double transfer_s(const PlanCosts& c, const Action& send);
/// The part of that transfer the sending rank waits for (PlanCosts::p2p_blocking: all of it; else
/// none); the rest runs on the SEND → RECV edge.
double send_wait_s(const PlanCosts& c, const Action& send);
/// Time a RECV takes once its data arrived: the scatter/gather all-gather when it applies.
double recv_completion_s(const PlanCosts& c, const Schedule& s, const Action& recv);

/// Layer prices (plan_costs' one transformer layer: forward, input and weight gradients,
/// recompute, hidden TP communication) shared by the plan_costs calls a LayerPriceScope covers,
/// on any thread. Whoever opens the scope vouches that every call in it prices the same model on
/// the same cluster, its plans differing at most in their layout, micro batch, schedule,
/// partition, recompute, sequence parallelism, sharding and overlaps (an --auto family of the
/// sweep): the memo is keyed by those the layer's ops and their communication read (not the
/// schedule, partition, sharding or the data-parallel overlaps), so such plans share a price.
class LayerPriceMemo {
 public:
  LayerPriceMemo();
  ~LayerPriceMemo();
  LayerPriceMemo(const LayerPriceMemo&) = delete;
  LayerPriceMemo& operator=(const LayerPriceMemo&) = delete;
  struct Prices;
  std::unique_ptr<Prices> prices;
};
/// The calling thread's plan_costs use `memo` (nullptr: none) while the scope lives.
using LayerPriceScope = ThreadScope<LayerPriceMemo>;

PlanCosts plan_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster,
                     bool static_core_sharing = true, const Schedule* schedule = nullptr);
/// plan_costs (the plan's own placement, static core sharing) without the gradient reductions
/// and the optimizer step: reduce_grad_s and reduce_grad_least_s (per stage) and optim_s (per
/// pipeline rank) are zeros, the other REDUCE_GRAD and OPTIM columns empty; every other figure is
/// plan_costs'. What the sweep's compute bound reads (search/sweep.hpp compute_bound_costs), at
/// a fraction of the cost.
PlanCosts plan_compute_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster);
/// One transformer layer's F and B as plan_costs prices them (its layer_forward_s and
/// layer_backward_s), and the TP-stream parts an OVERLAP_F_B pair may hide, without costing the
/// stages: the sweep's layer bound needs only these.
struct LayerCosts {
  double forward_s = 0, backward_s = 0;  // F; a whole B = input_s + weight_s − hidden_tp_s
  double input_s = 0, weight_s = 0;      // I and W of a split backward
  double forward_tp_s = 0, backward_tp_s = 0;  // TP-stream time of F; of I + W
  double hidden_tp_s = 0;                // of backward_tp_s, what a whole B hides under its wgrad GEMMs
  double forward_ep_s = 0, backward_ep_s = 0;  // the expert all-to-alls in forward_tp_s / backward_tp_s
};
LayerCosts layer_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster,
                       bool static_core_sharing = true);

/// The recompute part of a B or I action of `stage` (0 for other actions).
double recompute_part_s(const PlanCosts& c, const Action& a);

/// The zero-bubble list scheduler's inputs for zb-auto: per stage the costed F, I and W, the
/// pipeline transfer, and per rank how many microbatches' activations fit in the GPU's memory
/// after the model states (capped at 2p, where more in flight no longer helps).
ZeroBubbleCosts zero_bubble_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster);

/// make_schedule(plan) with the zero-bubble schedules placed from this model's costed times on
/// this cluster (the schedule every command, the sweep and the executor run for a plan). Throws
/// ScheduleError like make_schedule.
Schedule make_costed_schedule(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster,
                              bool check_deadlocks = true);


}  // namespace ptdp
