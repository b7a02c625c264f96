// The executor's checkpoints as a training run uses them (exec/io/checkpoint.hpp holds the file
// formats): the run's identity, saving and resuming every rank's part, initial weights from a
// Megatron state dict, FP8 amax histories. Every function taking the world is collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/io/checkpoint.hpp"
#include "exec/io/data.hpp"
#include "exec/model/gpt.hpp"
#include "exec/runtime/communicator.hpp"
#include "exec/runtime/fp8.hpp"
#include "exec/train.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp::exec {

// What a checkpoint must agree with to be resumed by this run (seed, layout, model, data).
nlohmann::json run_identity(const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& o,
                            const TokenCorpus& data);

// Before any rank saves: refuse another run's checkpoints (unless overwriting) and contradictory
// options; creates the directory of a new run.
void prepare_checkpoint_dir(Communicator& world, const TrainOptions& o);

// Starts from the weights of a Megatron-named state dict (TrainOptions::init_path).
void load_initial_weights(ModelShard& model, const TrainOptions& o);

// The model's full states on rank 0: the parameters and, when asked, their Adam moments.
struct FullStates {
  ParameterSet values, adam_m, adam_v;
};

// Rank 0 receives every parameter (and with `moments` its Adam moments) into `out`.
void gather_states(Communicator& world, ModelShard& model, bool moments, FullStates* out);

// FP8 delayed scaling's amax histories as checkpoint entries of this rank, and meta.json's record.
std::vector<ShardEntry> fp8_entries(ModelShard& model, const Fp8Emulation& fp8);
nlohmann::json fp8_meta(const Fp8Emulation& fp8);
void restore_fp8(ModelShard& model, Fp8Emulation& fp8, const std::vector<ShardEntry>& saved, const std::string& dir,
                 const TrainOptions& options, int rank);

// Saves step `step` into a fresh directory under `dir` (shards, state dict, manifest); `state`
// goes into meta.json, `rank_state` into this rank's shard.
void save_checkpoint(Communicator& world, ModelShard& model, const RankCoordinates& c, const std::string& dir,
                     int64_t step, nlohmann::json identity, const nlohmann::json& state = nlohmann::json::object(),
                     const std::vector<ShardEntry>& rank_state = {});

// After resuming: the state dict beside the shards must hold exactly what the shards loaded.
void cross_check_state_dict(Communicator& world, ModelShard& model, const std::string& dir);

// Loads this rank's part of the latest checkpoint under `dir`; returns its step.
int64_t load_checkpoint(Communicator& world, ModelShard& model, const RankCoordinates& c, const std::string& dir,
                        const nlohmann::json& identity, std::vector<ShardEntry>* fp8_state = nullptr);

}  // namespace ptdp::exec
