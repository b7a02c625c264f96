// Real training: the executor's entry point for `ptdp train`.
//
// Every MPI rank calls train() with the same arguments (launch: `mpirun -np N ptdp train …`,
// N = tensor × pipeline × data; a process started without mpirun is a world of one). MPI must be
// initialised first, e.g. by an exec::MpiSession in main().
//
// Errors: bad input (plan, -np, data file, checkpoint mismatch) is detected collectively: every
// rank throws the same ConfigError / EnvironmentError (print it on rank 0 only, then return the
// exit code normally). A CommunicationError (a peer died or hung; raised after
// TrainOptions::comm_timeout_s without progress) is thrown only where it was seen: print it on
// that rank and call MpiSession::abort().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "exec/model/gpt.hpp"
#include "exec/io/megatron_state.hpp"
#include "exec/runtime/cuda/loss_scaler.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "model/metrics.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "schedules/schedule.hpp"
#include "report/timeline.hpp"

namespace ptdp::exec {

struct TrainOptions {
  std::string backend = "cpu";
  /// Total iterations; a resumed run continues from the checkpoint's step up to this count.
  int64_t steps = 10;
  /// Seeds the initialisation and the data sampling (same seed → same run, whatever t, p, d).
  uint64_t seed = 1234;
  /// Training data (see exec/io/data.hpp); empty = built-in synthetic corpus.
  std::string data_path;
  /// Checkpoint directory (see exec/io/checkpoint.hpp); empty = no checkpoints.
  std::string checkpoint_dir;
  /// Save after every K-th iteration; with a checkpoint_dir the last iteration is always saved.
  int64_t save_every = 0;
  /// Continue from checkpoint_dir's latest checkpoint.
  bool resume = false;
  /// Start from these weights instead of the seed's initialisation: a safetensors state dict in
  /// Megatron-LM's names and shapes (exec/io/megatron_state.hpp; a checkpoint's model.safetensors),
  /// F32, F16 or BF16. The optimizer starts afresh. Not with `resume`.
  std::string init_path;
  /// Start afresh in a checkpoint_dir that holds another run's checkpoint (replaced once this
  /// run's first save is published); without it such a directory is refused.
  bool overwrite = false;
  AdamOptions adam;
  /// fp16 plans (training.precision: fp16): Megatron-LM's dynamic loss scaling — the loss times
  /// the scale before the backward, the step skipped on an inf/NaN gradient, the scale backed off
  /// after `hysteresis` overflows and grown after `growth_interval` clean steps. Unused otherwise.
  cuda::LossScalerOptions loss_scaling;
  /// Seconds a blocking transfer may make no progress before CommunicationError.
  double comm_timeout_s = kDefaultCommTimeout_s;
  /// Run this schedule (compute-only or lowered) instead of generating one from the plan; its
  /// p, v and m must match the plan. The plan's Megatron schedule rules are then not enforced
  /// (e.g. interleaving with pipeline 2, or a zero-bubble schedule with I/W).
  std::optional<Schedule> schedule;
  /// Where `schedule` came from (e.g. the CSV path), for error messages.
  std::string schedule_source;
  /// Called on world rank 0 after each iteration with a one-line summary (loss, tokens/s).
  std::function<void(const std::string&)> progress;
  /// When not null on world rank 0, receives the full trained model (collective; costs a gather).
  ParameterSet* parameters_out = nullptr;
  /// For the report's gpu_hours, energy_kwh and cost_usd (model/metrics.hpp): the token budget
  /// and the devices' power and prices (empty / zero: those figures stay null).
  std::optional<double> train_tokens;
  EnergyAndPrice energy;
  /// When set, every rank writes what its process groups sent during the first iteration run
  /// (exec/runtime/ledger.hpp) to `comm_ledger_path + ".rank<N>.json"`.
  std::string comm_ledger_path;
  /// CPU back end: time the speed probe (exec/speed_probe.hpp) on every rank before the first
  /// iteration and after each, into the report's "speed_probe_gemm_s" (the median): how fast the
  /// host computed over this run, which `validate` sets against the profile's probe. On a device of its own (its buffers are not
  /// the run's memory) with fp32 operands, as calibrate times it.
  bool speed_probe = false;
};

/// Trains and returns the measured Report (fidelity "measured", backend, losses per iteration
/// run, mean iteration time excluding the first iteration, tokens/s, TFLOP/s per rank counted as
/// the paper does, peak device memory, per-pipeline-rank breakdown of the last iteration).
/// When `timeline` is not null it receives the last iteration's events of every rank on world
/// rank 0 (this rank's own events elsewhere), times relative to that iteration's start.
/// Extra figures: report.extra["first_step"], ["grad_norm"] (last iteration), and with
/// post-validation ["optimizer_rollbacks"] (iterations whose speculative step was undone), with
/// fp16 ["skipped_steps"] (gradient overflows, all iterations so far) and ["loss_scale"] (after
/// the last iteration).
Report train(const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& options,
             Timeline* timeline = nullptr);

/// The plan checks `train` makes on every rank before it starts (what the executor runs: a plan
/// it would not run as priced, e.g. an overlap it does not perform, is a ConfigError naming the
/// key), for a caller about to launch it on plan.gpus() ranks: `validate` refuses such a plan
/// before simulating and starting mpirun. `explicit_schedule`: a --schedule CSV replaces the
/// plan's. `backend`: the executor's back end (cpu, cuda).
void check_trainable(const TransformerSpec& spec, const ParallelPlan& plan, bool explicit_schedule, const std::string& backend);

}  // namespace ptdp::exec
