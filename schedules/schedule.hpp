// The shared pipeline-schedule IR: what every pipeline rank does in one training iteration.
// The schedule is the program: every simulator fidelity (analytic, reduced, full) and the
// executor (CPU, CUDA) take a lowered Schedule as their input and give each action the one
// meaning written below. What the communication actions move (SEND/RECV, REDUCE_GRAD, OPTIM,
// UNSHARD) is lowered once into typed steps (schedules/communication.hpp, over the groups of
// model/grid.hpp's ProcessGrid): the costing (sim/costing) prices those steps, SimGrid turns them
// into flows, and the executor's ledger of what it really sent is checked against them
// (`ctest -R Conformance`).
//
// What each action contains (per device of the pipeline rank, i.e. per tensor-parallel rank of
// every data-parallel replica):
//   F  s mb   forward of stage s (its layers; the embedding on the first stage; the final norm,
//             output layer and cross-entropy on the last) for microbatch mb, with the tensor-
//             parallel collectives inside the layers (2 all-reduces per layer, Megatron).
//   B  s mb   full backward: recompute (per the plan), input gradients and weight gradients,
//             with their tensor-parallel all-reduces. B = I + W, except that a whole B runs the
//             all-reduce of each column-parallel layer's input gradient under that layer's
//             weight-gradient GEMM (Megatron's asynchronous all-reduce), which I alone cannot.
//   I  s mb   input-gradient part of B (zero-bubble "B"): recompute, every backward operation on
//             the path to the stage's input gradient (dgrad GEMMs, both gradients of the
//             attention products, element-wise backwards) and the TP all-reduces of dgrad.
//   W  s mb   weight-gradient part of B: the wgrad GEMMs of the stage's weight matrices (QKV,
//             projection, FC1, FC2, output layer) and the embedding's gradient accumulation.
//             Needs the activations kept since F; runs after I of the same (s, mb).
//   SEND_F s mb / RECV_F s mb   activation of microbatch mb from stage s to stage s+1 (the SEND
//             names the sender's stage, the RECV the receiver's: RECV_F s+1 mb). The peer is
//             the device of the other stage's pipeline rank with the same (tp, dp) coordinates.
//   SEND_B s mb / RECV_B s mb   gradient of stage s's input, from stage s to stage s−1.
//             Sends are asynchronous (the program goes on); a RECV waits for the data. Between
//             stages on the same pipeline rank (interleaving with p = 1) nothing is transferred.
//             Scatter/gather (Megatron): when the plan enables it and t > 1, every transfer
//             between different pipeline ranks moves 1/t of the tensor per TP rank (each over
//             its own link), and the receiver all-gathers the parts over the TP group; that
//             all-gather is part of the RECV (traced as "pp all-gather").
//   Sequence parallelism (plan.sequence_parallel, t > 1): inside F, B and I each TP all-reduce
//             is a reduce-scatter into sequence shards plus an all-gather out of them; norms,
//             dropouts and residual adds work on s/t of each sequence; recompute (selective: the
//             attention core, full: the layer forward) is the first part of B / I (traced as
//             "recompute"). Transfers carry each TP rank's own sequence shard (no scatter/gather
//             on top), and REDUCE_GRAD also sums the replicated parameters' gradients (norms,
//             row-parallel biases, positions), partial per TP rank, over the TP group (after
//             the data-parallel reduction: the sum is the same either way).
//   Experts (model.moe, parallel.expert = ep, expert_tensor = etp): the F of an MoE layer
//             routes the rank's tokens, sends each token's k copies to the ranks of their experts
//             (all-to-all over the ep ranks, then an all-gather over the etp ranks; or, with the
//             allgather dispatcher, one all-gather over the etp·ep ranks), runs the rank's E/ep
//             experts as grouped GEMMs and returns the outputs the same way (reduce-scatter,
//             all-to-all). Its B / I holds the two all-to-alls of the gradients in reverse (they
//             are on the input-gradient path, never in W); W holds the experts' wgrad GEMMs.
//             REDUCE_GRAD reduces the experts' gradients over their expert-data ranks
//             (t·cp·d / (etp·ep)), the rest over d·cp.
//   Context parallelism (parallel.context = cp): every action works on s/cp tokens of each
//             sequence. The attention of F passes K/V around the cp ranks (cp − 1 transfers,
//             each overlapped with the attention block in hand), or all-gathers them first; B / I
//             passes K/V with dK/dV around again (or re-gathers K/V and reduce-scatters dK/dV).
//             The d·cp ranks holding the same weights are the replicas of REDUCE_GRAD and of the
//             sharding below (Megatron's data-parallel group with context).
//   REDUCE_GRAD s   data-parallel gradient reduction of stage s after its last backward: an
//             all-reduce (sum, then divide by d) of the stage's gradients over its d replicas;
//             on the first and the last stage, when they are different stages of a model with
//             tied embeddings or with multi-token-prediction layers on the last stage (whose
//             modules read the word embedding), also the all-reduce (sum) of the word-embedding
//             gradient between the two (the first stage's and the last stage's copies). With lanes (DualPipe),
//             also the sum with the stage's copy in the other lane, on the mirror rank, folded
//             into the data-parallel reduction: reduce-scatter over the d replicas, the pair
//             sums its 1/d part, all-gather (sharded states: the pair sums the gradient shard);
//             each rank runs its REDUCE_GRADs in the order reduction_order() gives, the same on
//             both ranks of a pair (the tied embedding's copies are summed this way too: every
//             rank holding a first stage holds a last stage).
//   OPTIM     optimizer step of the pipeline rank, once, after its last action: the gradient-
//             norm all-reduce over the model-parallel group (all t·p ranks of the replica; it
//             also detects inf/NaN, so it is a synchronisation point of the whole pipeline),
//             clipping, and the Adam update of the rank's parameters. With routed experts the
//             experts' part of the norm is first summed over the expert-parallel group (each
//             member holds different experts). With
//             parallel.optimizer_sync: post_validate (zero-bubble schedules only) the rank does
//             not wait: it keeps a copy of its parameters and optimizer state, runs the Adam
//             update at once with unclipped gradients, then takes part in the same all-reduce;
//             when the global norm is non-finite or above the clipping threshold it restores the
//             copy and steps again as with the barrier, so the result is the barrier's exactly.
//             The engines predict the case without roll-back: the all-reduce runs behind the
//             next iteration, whose ranks start one rank-window apart (RankBreakdownBuilder::
//             longest_rank_window_s). PyTorch's schedules have
//             no such action: CSV export leaves it out and import adds it after each rank's last
//             action.
//   UNSHARD s / RESHARD s   all-gather / free the parameters of stage s (sharded data
//             parallelism, PyTorch FSDP names). Accepted in imported schedules and validated;
//             without parameter sharding the parameters are already whole, so both cost nothing
//             and do nothing in every engine. With zero_stage 3, UNSHARD s gathers the whole
//             stage's parameters (unit by unit) and keeps them until RESHARD s, so the F/B/I of
//             stage s in between gather nothing (PyTorch's pipelining with FSDP does this).
//
// Sharded data parallelism (ZeRO / FSDP; plan.zero_stage z, sharding group = the N data-parallel
// ranks that share one copy of the model states: the whole data-parallel group, or the ranks of
// one node, replicated across nodes). A *unit* is one transformer layer, and the embedding (first
// stage) and the output layer + final norm (last stage) are one unit each; each rank owns 1/N of
// every unit's parameters, gradients and optimizer state as z says. On top of the above:
//   F   z = 3: before each unit's forward its parameters are all-gathered over the sharding
//       group (UNSHARD of the unit) on the DP stream; at most plan.max_inflight_gathers units
//       are gathered at once, the computing one included (FSDP's limit), so the gathers of the
//       next max_inflight_gathers − 1 units are issued before a unit computes (forward prefetch)
//       and overlap its compute; the gathered parameters are freed after the unit's forward
//       (RESHARD). With offload
//       optimizer_and_params each shard is first copied host → device over PCIe.
//   B/I z = 3: the same gathers again before each unit's backward, in reverse order (backward
//       prefetch: the next unit's gather is issued before the current unit's gradient
//       computation). z ≥ 2: once a unit's weight gradients are complete (in B, or in W under a
//       zero-bubble split), they are reduce-scattered (sum) over the sharding group on the DP
//       stream (the per-unit REDUCE_SCATTER), each rank accumulates its shard and frees the full
//       gradient; every microbatch does this. (The executor, under a split, reduce-scatters at a
//       W once no other I of the rank still awaits its W — later I's add to the same full
//       gradients — and a tied word embedding read by the head of the same rank is complete
//       only after the embedding's backward; the sums are the same.)
//   REDUCE_GRAD s   z = 0: the all-reduce above. z = 1: a reduce-scatter (sum) of the stage's
//       gradients over the sharding group instead. z ≥ 2: nothing is left to reduce inside the
//       group (it waits for the last unit's reduce-scatter). With a node sharding group (hybrid),
//       then an all-reduce of the gradient shard across the replicas (the ranks of the other
//       nodes holding the same shard). Gradients are divided by d as before; the tied-embedding
//       all-reduce acts on what the rank holds: the whole embedding gradient (z = 0), or its
//       shard (z ≥ 1).
//   OPTIM   z ≥ 1: the gradient-norm all-reduce also sums over the sharding group (each rank
//       holds a different part); Adam updates the local shard only; z = 1, 2 then all-gather the
//       updated parameters over the sharding group; z = 3 keeps them sharded. Offload: the
//       gradient shard goes device → host over PCIe, Adam runs on the host CPU, and the updated
//       parameter shard comes back host → device (stays on the host when parameters are
//       offloaded too).
//
// OVERLAP_F_B pairs (DualPipe / DualPipeV, Action::overlap): an F of one microbatch-chunk and a B
// or I of another, on the same rank, run together: both inputs are received before the pair
// (lowering puts the partner's RECV before the F) and both outputs sent after it (the F's SEND
// after the partner). The two share the device's compute, so their compute times add up, and
// each one's communication inside the action (TP collectives, expert all-to-alls, the context
// exchange) runs under the other's compute: each action of the pair pays its compute and only the
// part of its communication that the partner's compute cannot hide. The engines run the pair as
// its two actions back to back with those durations; the executor (CPU) runs F then B.
//
// Megatron's overlapped communication (plan.overlap_grad_reduce / overlap_param_gather /
// tp_comm_overlap) changes when, not what, the actions above communicate:
//   B/W (the last backward of a stage on a pipeline rank, on the first pipeline rank's stages)
//       with overlap_grad_reduce and z ≤ 1: the stage's gradients are reduced in buckets of
//       plan.bucket_parameters() parameters, each launched (all-reduce, or reduce-scatter with
//       z = 1) as soon as that bucket is final during this backward; REDUCE_GRAD then waits for
//       the buckets still on the wire (its duration is what outlasts the backward) and does the
//       rest as above. Other pipeline ranks reduce in one bucket (Megatron switches bucketing
//       off there). The executor launches the same non-blocking all-reduces (z = 0) on the
//       first pipeline rank; z = 1 with the overlap is refused by `train`. On a CPU cluster
//       nothing overlaps (the collectives block the core), in the engines as in the executor.
//   OPTIM with overlap_param_gather (z = 1, 2): the parameter all-gather runs per bucket after the
//       step and the next iteration's first forward waits for each bucket as it needs it; OPTIM
//       is charged the stall that forward would see.
//   F/B/I with tp_comm_overlap (sequence parallelism): each all-gather feeding a GEMM and each
//       reduce-scatter after one is split into t chunks pipelined with that GEMM; the action
//       pays the first chunk, or what the GEMM is too short to hide.
//   The executor does not run overlap_param_gather, tp_comm_overlap or moe_comm_overlap: `train`
//   and `validate` refuse such plans naming the key, so that no measurement is compared with an
//   overlap that did not happen. A whole B's dgrad collective under the wgrad GEMM is hidden on
//   GPUs only (a CPU rank's blocking collective holds its core).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ptdp {

enum class ActionKind : uint8_t {
  F,            // forward of a stage for one microbatch
  B,            // full backward (input and weight gradients)
  I,            // input-gradient backward (zero-bubble split)
  W,            // weight-gradient backward (zero-bubble split)
  SEND_F,       // stage sends its forward output of microbatch to stage+1
  RECV_F,       // stage receives its forward input of microbatch from stage-1
  SEND_B,       // stage sends the gradient of its input to stage-1
  RECV_B,       // stage receives the gradient of its output from stage+1
  REDUCE_GRAD,  // the stage's gradient reduction after its last backward (steps: schedules/communication.hpp)
  OPTIM,        // optimizer step of the pipeline rank (after all its REDUCE_GRADs)
  UNSHARD,      // all-gather the stage's parameters (no-op without sharding)
  RESHARD,      // free the gathered parameters (no-op without sharding)
};

std::string_view to_string(ActionKind k);
// Inline: the engines ask these once per action (200 000 actions in a 1T plan).
inline bool is_compute(ActionKind k) {  // F, B, I, W
  return k == ActionKind::F || k == ActionKind::B || k == ActionKind::I || k == ActionKind::W;
}
inline bool is_p2p(ActionKind k) {  // SEND_*, RECV_*
  return k == ActionKind::SEND_F || k == ActionKind::RECV_F || k == ActionKind::SEND_B || k == ActionKind::RECV_B;
}
/// Stage-level actions without a microbatch: REDUCE_GRAD, UNSHARD, RESHARD.
inline bool is_stage_action(ActionKind k) {
  return k == ActionKind::REDUCE_GRAD || k == ActionKind::UNSHARD || k == ActionKind::RESHARD;
}

/// One step of a rank's program. `microbatch` is -1 for REDUCE_GRAD, UNSHARD, RESHARD and OPTIM.
/// For SEND_* the stage is the sender's, for RECV_* the receiver's (PyTorch convention).
/// OVERLAP_F_B (DualPipe, PyTorch's `(F;B)OVERLAP_F_B`): an F and a B or I of two microbatches
/// (or chunks) of the same rank marked as one pair — `overlap` +1 on the F, which comes first,
/// −1 on its partner, the next compute action; each names the other's kind and stage. See the
/// meaning at the top of this file.
struct Action {
  ActionKind kind = ActionKind::F;
  int32_t stage = 0;
  int32_t microbatch = -1;
  int8_t overlap = 0;
  ActionKind overlap_kind = ActionKind::F;
  int32_t overlap_stage = -1;

  /// PyTorch pipelining string form: "2F0", "1SEND_B3", "0REDUCE_GRAD", "OPTIM".
  std::string str() const;
  bool operator==(const Action&) const = default;
};

/// Parses the PyTorch string form; throws ConfigError (message names the text) when malformed.
Action parse_action(std::string_view text);

/// One pipeline rank's ordered list of actions.
struct RankProgram {
  std::vector<Action> actions;
};

/// A schedule for p pipeline ranks, v chunks each, m microbatches.
/// Stage s (0 ≤ s < p·v) lives on pipeline rank stage_to_rank[s] (Megatron: s mod p).
/// Lanes (DualPipe, ParallelPlan::lanes): the stages form `lanes` pipelines of p·v / lanes
/// stages each, every one holding the whole model (stage k·L + j holds the layers of stage j,
/// L = lane_stages()); microbatch mb takes lane ⌊mb · lanes / m⌋ only — with two lanes the first
/// half of the microbatches runs on stages 0 … L − 1, the second half on L … 2L − 1. Transfers go
/// from a stage to the next of its lane (s → s + 1) and back; every lane has its own first stage
/// (embedding) and last stage (output layer and loss). One lane: every microbatch, every stage.
struct Schedule {
  int p = 1;
  int v = 1;
  int m = 1;
  int lanes = 1;
  std::vector<int> stage_to_rank;
  std::vector<RankProgram> programs;  // one per pipeline rank
  bool lowered = false;               // send/recv and REDUCE_GRAD/OPTIM added

  int num_stages() const { return p * v; }
  /// Stages of one lane (the stages a microbatch passes through).
  int lane_stages() const { return num_stages() / lanes; }
  bool first_stage(int stage) const { return stage % lane_stages() == 0; }
  bool last_stage(int stage) const { return stage % lane_stages() == lane_stages() - 1; }
  int lane_of_stage(int stage) const { return stage / lane_stages(); }
  int lane_of_microbatch(int mb) const { return static_cast<int>(static_cast<int64_t>(mb) * lanes / m); }
  /// Whether microbatch mb passes through stage `stage` (always, with one lane).
  bool runs(int stage, int mb) const { return lanes == 1 || lane_of_stage(stage) == lane_of_microbatch(mb); }
  /// Chunk index of a stage on its rank (0 … v−1).
  int chunk_of(int stage) const { return stage / p; }
  size_t num_actions() const;
};

/// The kind of the last backward action (B, or W of a split backward) stage `stage` runs in its
/// rank's program: the one that finalises the stage's gradients (overlap_grad_reduce launches
/// its buckets during it). B when the stage runs no backward at all. Pricing, SimGrid and the
/// executor read the program, not the schedule's name (IR-17).
ActionKind last_backward_kind(const Schedule& s, int stage);

/// A schedule of p ranks, v chunks and m microbatches with no actions yet: stage s on rank
/// `stage_to_rank[s]` (empty: s mod p, Megatron's placement). Asserts the sizes are positive.
Schedule empty_schedule(int p, int v, int m, std::vector<int> stage_to_rank = {});

/// Options that generators take besides (p, v, m).
struct GeneratorOptions {
  int microbatch_group = 0;  // interleaved group size G; 0 = p
};

/// GPipe: all forwards, then all backwards (reverse order).
Schedule make_gpipe(int p, int m);
/// 1F1B (PipeDream-Flush): min(p−r−1, m) warm-up forwards, then 1F/1B, then cool-down.
Schedule make_1f1b(int p, int m);
/// Megatron interleaved 1F1B with v chunks per rank and microbatch groups of G (default p).
Schedule make_interleaved(int p, int v, int m, const GeneratorOptions& opts = {});

/// Inputs of the zero-bubble list scheduler (schedules/zero_bubble.cpp): per stage the times of
/// F, I and W, the time of a transfer between ranks, and per pipeline rank how many
/// microbatch-chunks' activations it may hold at once (F run, W not yet).
struct ZeroBubbleCosts {
  std::vector<double> forward_s, input_s, weight_s;
  double transfer_s = 0;
  std::vector<int> memory_limit;
};
/// ZB-H1: 1F1B's peak activation memory, bubble ≈ (p−1)(T_F + T_I − T_W) (a third of 1F1B's when
/// the three are equal).
Schedule make_zb_h1(int p, int m);
/// ZB-H2: up to 2p − 1 microbatches in flight, bubble ≈ 0 before the optimizer step. Placed
/// with `times` (their memory limits are ignored) when given, else with equal unit times.
Schedule make_zb_h2(int p, int m, const ZeroBubbleCosts* times = nullptr);
/// ZB-V: two chunks per rank in a V (rank r holds stages r and 2p − 1 − r), 1F1B's memory: the
/// paper's hand-made order or a list-scheduled one, whichever finishes first with `times` (unit
/// times when absent); nothing idle inside a rank's busy window at unit times.
Schedule make_zb_v(int p, int m, const ZeroBubbleCosts* times = nullptr);
/// DualPipeV (DeepSeek-V3's DualPipe cut in half, PyTorch's ScheduleDualPipeV): ZB-V's placement;
/// rank r runs 2(p−r−1) chunk-0 forwards, r+1 pairs of both chunks' forwards, p−r−1 times
/// (I, W, F) of chunk 1, then the steady state of OVERLAP_F_B pairs (a chunk-0 F with a chunk-1 B,
/// a chunk-1 F with a chunk-0 B), then the cool-down of backwards whose W are deferred (zero
/// bubble) and the W's. Needs m ≥ 2p.
Schedule make_dualpipev(int p, int m);
/// DualPipe (DeepSeek-V3, bidirectional): p even, two lanes (Schedule::lanes) placed as the V
/// (stage j on rank j, its copy p + j on rank p − 1 − j), m/2 microbatches entering at each end.
/// Rank r runs DualPipeV's program for p/2 ranks and m/2 microbatches as rank min(r, p − 1 − r),
/// its chunk 0 being its stage in the lane where it comes first (the half nearer that lane's
/// start) and chunk 1 its stage in the other lane. Needs m ≥ 2p, m even.
Schedule make_dualpipe(int p, int m);
/// Stage placement of ZB-V: stage s on rank s for s < p, on rank 2p − 1 − s after.
std::vector<int> v_shape_placement(int p);
/// zb-auto: W placed by the list scheduler from costed times and memory limits. Throws
/// ScheduleError when a limit leaves no room for a single microbatch.
Schedule make_zb_auto(int p, int m, const ZeroBubbleCosts& costs);

struct ParallelPlan;
/// The one place a Schedule is built from a plan: its generator (gpipe, 1f1b, interleaved with
/// its v and group size, the zero-bubble ones, DualPipe(V)), lowered. Throws ScheduleError when the generator's rules fail.
/// zb-h2, zb-v and zb-auto are placed with `zb_costs` (sim: zero_bubble_costs) when given, else
/// with unit times (zb-auto then with ZB-H2's limits).
Schedule make_schedule(const ParallelPlan& plan, bool check_deadlocks = true, const ZeroBubbleCosts* zb_costs = nullptr);

/// Checks that a schedule from elsewhere (e.g. `--schedule FILE.csv`) fits a plan: same p, v and
/// microbatch count m = B/(b·d). Lowers it when it is compute-only. Throws ScheduleError naming
/// the difference (`source` names the file).
Schedule adopt_schedule(Schedule s, const ParallelPlan& plan, const std::string& source);

/// Number of warm-up forwards of pipeline rank r before its first backward (from the program).
int warmup_forwards(const Schedule& s, int rank);

/// Validation pass: every stage runs a forward and a backward (B, or I and W) of each microbatch
/// of its lane (all m with one lane) and nothing of another lane's, F before its backward, I
/// before W, stages on the ranks stage_to_rank says. Throws ScheduleError.
void validate(const Schedule& s);

/// Validation of a lowered schedule (a complete program per rank, e.g. an imported CSV): what
/// validate() checks, plus every stage's REDUCE_GRAD once, on its rank, after its last backward;
/// exactly one OPTIM per rank, its last action; each transfer a stage needs (RECV_F before
/// every F of a stage > 0, SEND_F after every F of a stage before the last, likewise RECV_B /
/// SEND_B around backwards) present once, on the rank holding the stage; UNSHARD/RESHARD of a
/// stage alternating (no RESHARD without an open UNSHARD, no second UNSHARD before it); with
/// lanes, each rank's REDUCE_GRADs in reduction_order() (its mirror reduces in the same order).
/// Pairing of SENDs with RECVs across ranks and deadlocks are check_deadlock_free's. Throws
/// ScheduleError.
void validate_lowered(const Schedule& s);

/// The stages of pipeline rank `rank` in the order their REDUCE_GRADs run: by the layers they
/// hold (stage order with one lane; with lanes, the two ranks holding copies of the same stages
/// reduce them in the same order, as the executor sums the copies' gradients there).
std::vector<int> reduction_order(const Schedule& s, int rank);
/// Lowering pass 1: append REDUCE_GRAD for each stage after its last backward, then OPTIM.
void add_reduce_and_optim(Schedule& s);
/// Lowering pass 2: after each F/B that feeds another stage, a SEND; the sender places the
/// matching RECV on the consumer's list right before the action that consumes it.
void add_send_recv(Schedule& s);
/// validate → add_reduce_and_optim → add_send_recv → check_deadlock_free (skipped when
/// `check_deadlocks` is false, for callers that run critical_path, which detects cycles itself).
/// Input: a compute-only schedule. Throws ScheduleError on any violation.
void lower(Schedule& s, bool check_deadlocks = true);

/// Peak number of microbatch-chunks whose activations are held at once on each pipeline rank
/// (F seen, its B/W not yet): 1F1B rank r: p − r, GPipe: m.
std::vector<int> peak_inflight_activations(const Schedule& s);

/// A malformed or deadlocking schedule. The message names the offending actions; `rank` and
/// `position` (index in that rank's program), when known (≥ 0), locate the first of them so
/// that a CSV import can point at its row and cell.
class ScheduleError : public std::runtime_error {
 public:
  explicit ScheduleError(const std::string& message, int rank = -1, int64_t position = -1)
      : std::runtime_error(message), rank(rank), position(position) {}
  int rank = -1;
  int64_t position = -1;
};

/// A schedule that cannot be placed within the GPUs' memory (zb-auto's limits): the plan does
/// not fit, rather than being wrong.
class MemoryLimitError : public ScheduleError {
 public:
  using ScheduleError::ScheduleError;
};

/// Text grid, one line per pipeline rank ("rank 0 | 0F0 0F1 …").
std::string format_grid(const Schedule& s);

/// PyTorch-compatible CSV: one row per pipeline rank, one action per cell, in the
/// `{stage}{TYPE}{microbatch}` form PyTorch's loader reads; OPTIM is left out (implied).
/// `compute_only`: only the compute actions (F, B, I, W) of each rank, in order — the form
/// PyTorch's `load_csv` reads by default, which it lowers itself.
std::string to_csv(const Schedule& s, bool compute_only = false);
/// The lowered CSV of current PyTorch (torch.distributed.pipelining's runtime, 2.15): every
/// asynchronous operation is issued and then waited by name — `1WAIT_RECV_F3` just before the
/// compute that uses the receive, the sends' `WAIT_SEND_F/B` before the row's gradient reductions
/// (PyTorch waits its sends at the end of the step), `0WAIT_REDUCE_GRAD` after them — and two
/// stages on the same rank (zb-v's and dualpipev's V) hand activations and gradients over locally,
/// with no SEND/RECV. Lowers a copy when `s` is not lowered. Throws ConfigError for DualPipe's
/// two lanes, which PyTorch's single-direction runtime cannot run.
std::string to_pytorch_csv(const Schedule& s);
/// Parses CSV written by to_csv, to_pytorch_csv or PyTorch; infers p, v, m. WAIT_* cells are
/// checked (each waits for an operation its row issued before, a receive is waited before the
/// compute that uses it, and in a file with waits every send, receive and reduction is waited)
/// and then dropped: ptdp's interpreters order communication themselves. Transfers between two
/// stages of one rank that a lowered file leaves out (PyTorch's local hand-over) are put back
/// where ptdp's lowering places them. `source` names the file in errors
/// ("file.csv:3:5: bad action 'XF0'"). Lowered (OPTIM appended to each row, and the row's
/// REDUCE_GRADs just before it when the row has none, as PyTorch's lowering writes none) when it
/// contains send/recv actions, else lowered by lower(). PyTorch's old `BW` spelling is refused
/// with the W it means. Accepts UNSHARD, RESHARD and PyTorch's
/// `(0F1;0B0)OVERLAP_F_B` cells (their sub-actions, run in order). Validation errors name the
/// row (line) and the action's column.
Schedule from_csv(std::string_view text, const std::string& source);

}  // namespace ptdp
