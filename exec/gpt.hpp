// The GPT model as one rank holds it: its pipeline stages (v chunks), each with a flat buffer
// of this rank's parameter shards, their gradients and Adam moments, and the forward/backward of
// a stage for one microbatch.
//
// Initialisation is a pure function of (seed, global parameter name, global element index)
// (a counter-based generator), so every shard of every (t, p, d) layout holds exactly the values
// of the same elements of the serial model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/layers.hpp"
#include "model/transformer.hpp"

namespace ptdp::exec {

/// Deterministic N(0, 1) value for element `index` of the parameter named `name`.
float init_normal(uint64_t seed, const std::string& name, uint64_t index);

/// How a parameter of the serial model is laid out on this rank.
struct ParamInfo {
  std::string name;       // global name, e.g. "layers.3.attention.qkv.weight"
  int64_t rows = 0, cols = 0;                  // local shape
  int64_t global_rows = 0, global_cols = 0;    // serial shape
  int64_t row_offset = 0, col_offset = 0;      // this shard's position in the serial tensor
  size_t offset = 0;                            // in the stage's flat buffers
  bool weight_decay = false;                    // weights decay, biases and LayerNorm do not
  bool tp_replicated = false;                   // identical on every TP rank (LayerNorm, row-parallel biases, positions)
  bool counted_in_norm = true;                  // false for the last stage's copy of the tied embedding
  size_t count() const { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }
};

/// Where a stage sits in the model: stage s of S = p·v holds layers [first_layer,
/// first_layer + num_layers), the counts of model/partition.hpp (uneven partitions included).
struct StagePlacement {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;
  int num_layers = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
};

/// Optimiser settings (AdamW as in Megatron-LM: no weight decay on biases and LayerNorm).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip_grad = 1.0;  // global-norm clipping threshold; 0 = off
};

/// What a stage keeps between F and B for one microbatch.
struct StageActivations {
  std::vector<Tensor> inputs;            // input of each layer (inputs[0]: the stage input)
  std::vector<LayerActivations> layers;  // empty under full recompute
  Tensor output;                         // output of a non-last stage (until sent)
  HeadActivations head;                  // last stage
  DeferredWeightGrads deferred;          // weight gradients held back by an I (split backward)
  bool backward_done = false;            // B or I ran
};

class ModelShard;

/// One pipeline stage on this rank.
class Stage {
 public:
  const StagePlacement& placement() const { return placement_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  size_t num_values() const { return values_.size(); }
  float* values() { return values_.data(); }
  float* grads() { return grads_.data(); }
  float* adam_m() { return adam_m_.data(); }
  float* adam_v() { return adam_v_.data(); }

 private:
  friend class ModelShard;
  StagePlacement placement_;
  std::vector<ParamInfo> params_;
  Tensor values_, grads_, adam_m_, adam_v_;
  std::vector<LayerWeights> layer_w_, layer_g_;
  EmbeddingWeights emb_w_, emb_g_;
  HeadWeights head_w_, head_g_;
};

enum class RecomputeMode { None, Selective, Full };

/// The rank's part of the model: stages rank, rank + p, … of the p·v stages, sharded 1/t.
class ModelShard {
 public:
  /// Builds and initialises the shards. `stage_layers` has the layer count of each of the p·v
  /// stages (stage_layers() of model/partition.hpp); `stages` lists the stage ids this rank holds.
  /// `sequence_parallel`: stage inputs and outputs hold this rank's s/t of each sequence.
  ModelShard(Device& dev, const TransformerSpec& spec, int micro_batch, int tp_rank, int t,
             const std::vector<int64_t>& stage_layers, const std::vector<int>& stages, uint64_t seed,
             bool sequence_parallel = false);

  Device& device() { return dev_; }
  const LayerShape& shape() const { return shape_; }
  int num_local_stages() const { return static_cast<int>(stages_.size()); }
  /// Local index of global stage id (asserts it is held here).
  Stage& stage(int stage_id);
  std::vector<std::unique_ptr<Stage>>& stages() { return stages_; }
  bool holds_stage(int stage_id) const;

  /// F of `stage_id` for one microbatch. `input` is the stage input [b·s, h] ([b·s/t, h] with
  /// sequence parallelism) (ignored for stage 0,
  /// which embeds `tokens`). Returns the microbatch's mean loss for the last stage, else 0 and the
  /// output in acts.output.
  double forward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor input,
                 StageActivations& acts, RecomputeMode recompute);
  /// B (or I when `split`) of `stage_id`: returns d input [b·s, h] (empty for stage 0). `dout` is the
  /// gradient of the output (ignored for the last stage, which starts from the loss scaled by
  /// loss_scale). Weight gradients accumulate into the stage's grads, or are held in
  /// acts.deferred until weight_backward() when `split`.
  Tensor backward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor dout,
                  StageActivations& acts, float loss_scale, RecomputeMode recompute, bool split);
  /// W: the held-back weight gradients of a split backward.
  void weight_backward(StageActivations& acts) { acts.deferred.run(); }

  void zero_grads();
  /// Gradients of `stage_id`'s TP-replicated parameters (norms, row-parallel biases, positions)
  /// that sequence parallelism leaves partial on each TP rank (to be summed over the TP group);
  /// empty without sequence parallelism.
  std::vector<std::pair<float*, size_t>> sequence_parallel_grads(int stage_id);
  /// Σ grad² over the parameters this rank counts in the global norm (TP-sharded ones, the
  /// replicated ones only on tp rank 0, the tied embedding once).
  double grad_sum_squares();
  /// Gradients of the tied word embedding held here (first stage, or the last stage's tied copy);
  /// empty when this rank holds neither, and always with untied embeddings. With p = 1 both
  /// stages share one tensor.
  std::vector<std::pair<float*, size_t>> tied_embedding_grads();
  /// One AdamW step (`step` counts from 1) with gradients multiplied by grad_scale.
  void adam_step(const AdamOptions& opt, int64_t step, float grad_scale);

 private:
  void build_stage(Stage& st, int stage_id, int num_stages, const std::vector<int>& stages);
  void link_views(Stage& st);
  void initialise(Stage& st, uint64_t seed);

  Device& dev_;
  TransformerSpec spec_;
  LayerShape shape_;
  int tp_rank_, t_;
  int64_t padded_vocab_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace ptdp::exec
