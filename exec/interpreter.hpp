// The RankProgram interpreter: runs this rank's pipeline program of a lowered Schedule for one
// training iteration, each action with the meaning schedules/schedule.hpp defines — F/B/I/W on
// the ModelShard, SEND/RECV as non-blocking transfers posted in program order (the scatter/gather
// all-gather where the data is consumed, booked to the RECV), REDUCE_GRAD and OPTIM as the steps
// of the lowering of communication (schedules/communication.hpp: data-parallel, expert-data,
// sharding, sequence-parallel, tied-embedding and DualPipe-copy reductions; gradient norm,
// clipping, Adam, parameter all-gather) — and times every action into the TimelineEvents every
// engine records. With InterpreterOptions::ledger it books what each process group sends.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "exec/model/gpt.hpp"
#include "exec/runtime/ledger.hpp"
#include "schedules/schedule.hpp"
#include "report/timeline.hpp"

namespace ptdp::exec {

/// Token ids of this data-parallel rank's microbatches for one iteration: inputs[mb] and
/// targets[mb] hold b·s ids each (only read on ranks holding the first / last stage).
struct IterationBatch {
  std::vector<std::vector<int32_t>> inputs;
  std::vector<std::vector<int32_t>> targets;
  /// The iteration's index of each microbatch's first sequence over all data-parallel ranks (the
  /// dropout masks' sample); empty = the microbatch index.
  std::vector<int64_t> first_sample;
};

struct IterationResult {
  double loss_sum = 0;   // Σ over this rank's microbatch mean losses (last stage, else 0)
  double mtp_loss_sum = 0;  // the same of the multi-token-prediction modules' mean losses (model.mtp_layers)
  double grad_norm = 0;  // global gradient norm before clipping
  bool rolled_back = false;  // post-validated step undone and redone (clipping or non-finite norm)
  /// Dynamic loss scaling (InterpreterOptions::loss_scale ≠ 1): the scaled gradients held an inf
  /// or NaN on some rank, and the optimizer step was skipped (the same on every rank).
  bool overflow = false;
  /// CPU seconds of computation (exec/runtime/cpu_time.hpp: communication waits left out) of
  /// each compute action this rank ran, summed per (kind, stage) — OPTIM per pipeline rank — with
  /// how many actions they were.
  std::map<std::pair<ActionKind, int>, std::pair<double, int>> compute_cpu_s;
};

struct InterpreterOptions {
  RecomputeMode recompute = RecomputeMode::None;
  bool scatter_gather = false;  // send 1/t of each boundary tensor and all-gather over TP (train sets it: scatter_gather_applies)
  AdamOptions adam;
  /// parallel.optimizer_sync: post_validate — OPTIM steps speculatively before the gradient-norm
  /// all-reduce and rolls back when it shows clipping or a non-finite norm (schedule.hpp).
  bool post_validate = false;
  /// parallel.overlap_grad_reduce (zero_stage 0 or 1): each stage's gradients are all-reduced
  /// (stage 1: reduce-scattered into the shard) in buckets of about `bucket_elements` started
  /// during its last backward (0 = at REDUCE_GRAD).
  size_t overlap_bucket_elements = 0;
  /// When set, the traffic of the groups it records (exec/runtime/ledger.hpp) is booked to the action
  /// running at the time.
  CommLedger* ledger = nullptr;
  /// fp16's dynamic loss scale (exec/runtime/cuda/loss_scaler.hpp): the backward starts from the loss
  /// times this factor; OPTIM divides the gradients by it, and skips the step when they hold an
  /// inf or NaN (IterationResult::overflow). 1 = no scaling. Set per iteration.
  double loss_scale = 1.0;
  /// Optimizer steps skipped so far (overflows): Adam's step count is the iteration's less these.
  int64_t skipped_steps = 0;
  /// training.precision fp8: the FP8 emulation state of the linear layers (LayerContext::fp8).
  Fp8Emulation* fp8 = nullptr;
  /// The dropout masks' seed (model.dropout > 0; the run's seed).
  uint64_t dropout_seed = 0;
  /// parallel.tp_comm_overlap: LayerContext::tp_comm_overlap.
  bool tp_comm_overlap = false;
  /// parallel.overlap_p2p false: boundary sends are waited for before the rank's next compute
  /// (sim/costing.hpp PlanCosts::p2p_blocking).
  bool blocking_p2p = false;
};

class Interpreter {
 public:
  /// `schedule` must be lowered; its p must equal the pipeline group size.
  Interpreter(ModelShard& model, ProcessGroups& groups, const Schedule& schedule, InterpreterOptions options);

  /// Runs iteration `step` (0-based; Adam's step count is step + 1). Events are appended to
  /// `events` (times relative to `t0_s`) when it is not null.
  IterationResult run(int64_t step, const IterationBatch& batch, std::vector<TimelineEvent>* events, double t0_s);
  /// The dynamic loss scale of the next iterations (InterpreterOptions::loss_scale).
  void set_loss_scale(double scale, int64_t skipped_steps) {
    options_.loss_scale = scale;
    options_.skipped_steps = skipped_steps;
  }

 private:
  ModelShard& model_;
  ProcessGroups& groups_;
  const Schedule& schedule_;
  InterpreterOptions options_;
};

}  // namespace ptdp::exec
