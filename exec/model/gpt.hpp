// The GPT model as one rank holds it: its pipeline stages (v chunks), each with a flat buffer
// of this rank's parameter shards, their gradients and Adam moments, and the forward/backward of
// a stage for one microbatch.
//
// Sharded data parallelism (ZeRO; schedules/schedule.hpp defines each action's meaning): a
// stage's flat layout is cut into pieces — the word embedding, the position embedding, each
// layer, the final norm with the untied output layer, the last stage's copy of the tied
// embedding — each padded to a multiple of the sharding group size N; member r owns block r of
// every piece (its shard). A unit (what stage 3 gathers at once) is the embedding (word and
// position pieces), one layer, or the head (final norm/output piece, and the word embedding it
// reads when tied). Stage ≥ 1 keeps Adam moments (and the offloaded master) for the shard only;
// stage ≥ 2 holds a piece's full gradient only while a backward accumulates it, then reduce-
// scatters it into the gradient shard; stage 3 holds only the parameter shard and all-gathers a
// unit around each use (reference counted, so UNSHARD … RESHARD keeps a stage gathered).
//
// Initialisation is a pure function of (seed, global parameter name, global element index)
// (a counter-based generator), so every shard of every (t, p, d) layout holds exactly the values
// of the same elements of the serial model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/model/layers.hpp"
#include "exec/model/mtp.hpp"
#include "model/tensors.hpp"
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
  bool sequence_partial = true;                 // tp_replicated: its gradient covers this rank's sequence part only (SP)
  bool expert = false;                          // a routed expert's weight: reduced over the expert-data group, normed over the expert group
  TensorInit init = TensorInit::Zeros;          // the declared initialisation (model/tensors.hpp)
  size_t count() const { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }
  /// Where local element `i` (row-major in [rows, cols]) sits in the serial tensor (row-major).
  size_t global_index(size_t i) const {
    return static_cast<size_t>(row_offset + static_cast<int64_t>(i) / cols) * static_cast<size_t>(global_cols) +
           static_cast<size_t>(col_offset + static_cast<int64_t>(i) % cols);
  }
};

/// Index of the parameter named `name` in `params`, or -1.
int param_index(const std::vector<ParamInfo>& params, const std::string& name);

/// The slice of the model a stage holds (not which rank holds it: model/partition.hpp's
/// stage_placement): stage s of S = p·v holds layers [first_layer,
/// first_layer + num_layers), the counts of model/partition.hpp (uneven partitions included).
/// DualPipe's lanes (Schedule::lanes): the stages form lanes of lane_stages each, all holding the
/// whole model; stage k·lane_stages + j is a copy of stage j, first and last of its own lane.
struct ModelSlice {
  int stage = 0;
  int num_stages = 1;
  int lane_stages = 1;
  int first_layer = 0;
  int num_layers = 0;
  bool first() const { return stage % lane_stages == 0; }
  bool last() const { return stage % lane_stages == lane_stages - 1; }
  /// A copy in a later lane: its gradients are summed with the first lane's, counted there.
  bool copy() const { return stage >= lane_stages; }
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

/// Sharding of the model states (see the top of this file). `group` is the sharding group (null
/// or zero_stage 0: nothing sharded); `replicas` the other nodes' copies of this rank's shard
/// (hybrid sharding; null otherwise). Offload keeps the optimizer state and the master shard
/// (and with offload_params the parameter shard) in host memory, outside the device allocator,
/// and runs Adam on the host.
struct ShardingOptions {
  int zero_stage = 0;
  Communicator* group = nullptr;
  Communicator* replicas = nullptr;
  bool offload_optimizer = false;
  bool offload_params = false;
  /// Stage 3: units gathered at once, the computing one included (plan.max_inflight_gathers):
  /// the gathers of the next max_inflight_gathers − 1 units start before a unit computes.
  int max_inflight_gathers = 1;
  /// Expert parallelism (ep > 1): the routed experts' piece of each stage shards over this group
  /// instead (the expert-data group: the ranks holding the same experts), as Megatron's
  /// distributed optimizer shards expert parameters over the expert-data-parallel group. Null:
  /// the experts shard with the rest over `group`.
  Communicator* expert_group = nullptr;
  /// Stages 1–2, Megatron's --overlap-param-gather: the optimizer step starts each piece's
  /// all-gather of the updated parameters without waiting; the first forward that uses the piece
  /// waits for it (ModelShard::acquire), so the gathers run under the forwards before it.
  bool overlap_param_gather = false;
  /// torchtitan's FSDP with pipelines (plan.hpp gradients_reduced_once_per_step): the units'
  /// whole gradients accumulate over the step's backwards and are reduce-scattered once, at the
  /// stage's REDUCE_GRAD, instead of after each unit's backward.
  bool reduce_once_per_step = false;
  /// Stage 3, FSDP2's reshard_after_forward (plan.hpp reshard_group) between a unit's forward and
  /// its backward: keep_whole_after_forward (false: 1) keeps the gathered unit, so its backward
  /// gathers nothing; `reshard` (N: the reshard group, 1 < N < the sharding group) keeps this
  /// member's 1/N of it, which the backward all-gathers over those N; neither re-gathers over the
  /// whole group. keep_last_unit_whole: torchtitan's head unit is kept whatever the others do.
  bool keep_whole_after_forward = false;
  Communicator* reshard = nullptr;
  bool keep_last_unit_whole = false;
};

/// What a stage keeps between F and B for one microbatch.
struct StageActivations {
  std::vector<Tensor> inputs;            // input of each layer (inputs[0]: the stage input)
  std::vector<LayerActivations> layers;  // empty under full recompute
  Tensor output;                         // output of a non-last stage (until sent)
  HeadActivations head;                  // last stage
  std::vector<MtpActivations> mtp;       // last stage: the multi-token-prediction modules'
  double mtp_loss = 0;                   // last stage: their mean loss (1/D Σ_k loss_k), unweighted
  DeferredWeightGrads deferred;          // weight gradients held back by an I (split backward)
  bool backward_done = false;            // B or I ran
};

class ModelShard;
class Stage;

/// A contiguous part of a stage's flat layout that is sharded as one (see the top of the file):
/// [begin, begin + N·shard_len) with `len` real values; member r owns
/// [begin + r·shard_len, begin + (r+1)·shard_len), at shard_offset in the stage's shard buffers.
struct Piece {
  size_t begin = 0, len = 0, shard_len = 0, shard_offset = 0;
  /// The group the piece shards over (sharding group, or the expert-data group for the routed
  /// experts at ep > 1; null when nothing is sharded), its size N and this rank's place r in it.
  Communicator* group = nullptr;
  size_t members = 1, member = 0;
  std::vector<int> params;  // indices into the stage's params
  Tensor values;            // stage 3: the gathered piece (while users > 0, or prefetched)
  Tensor staged;            // offload_params: the shard copied host → device for the gather; stages 1–2
                            // with overlap_param_gather: this member's updated block being gathered
  std::unique_ptr<Request> gathering;  // stage 3: the gather started by a prefetch; stages 1–2: the
                                       // optimizer step's gather of the updated parameters
  Tensor grads;             // stage ≥ 2: the full gradient while a backward accumulates it
  int users = 0;            // stage 3: acquisitions of the gathered values
  Tensor held;              // stage 3, reshard_after_forward N: this member's 1/N of the values,
  int holds = 0;            // kept from a forward of a unit using the piece until the last such backward
};

/// A unit's pieces: (stage, piece index), possibly on another stage of the rank (tied head).
struct Unit {
  std::vector<std::pair<Stage*, int>> pieces;
  std::vector<std::pair<Stage*, int>> flush;  // stage ≥ 2: pieces complete after this unit's backward
  bool kept_whole = false;                     // stage 3: gathered from its forward to its backward
};

/// A part of a parameter this rank holds in its shard buffers.
struct ShardSegment {
  int param = 0;             // index into the stage's params
  size_t begin = 0;          // first element within the parameter
  size_t count = 0;
  size_t shard_offset = 0;   // in the stage's shard buffers
};

/// One pipeline stage on this rank.
class Stage {
 public:
  const ModelSlice& slice() const { return slice_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  /// Values in the flat layout (pieces padded to the sharding group).
  size_t num_values() const { return flat_size_; }
  /// Full flat buffers (empty for parameters under stage 3 and gradients under stage ≥ 2).
  float* values() { return values_.data(); }
  float* grads() { return grads_.data(); }
  /// Adam moments: the whole flat layout (stage 0) or the shard (stage ≥ 1); device memory, or
  /// host memory with offload (then null: see host_adam_m()).
  float* adam_m() { return adam_m_.data(); }
  float* adam_v() { return adam_v_.data(); }
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<ShardSegment>& segments() const { return segments_; }
  size_t shard_size() const { return shard_size_; }

 private:
  friend class ModelShard;
  ModelSlice slice_;
  std::vector<ParamInfo> params_;
  std::vector<Piece> pieces_;
  std::vector<int> piece_of_param_;
  std::vector<ShardSegment> segments_;  // stage ≥ 1: what this rank's shard holds
  size_t shard_size_ = 0;
  size_t flat_size_ = 0;
  size_t expert_begin_ = 0;  // the routed experts' region [expert_begin_, flat_size_) of the flat layout
  size_t expert_shard_begin_ = 0;  // and of the shard buffers [expert_shard_begin_, shard_size_)
  std::vector<Unit> units_;  // embedding (first stage), layers, head (last stage)
  // Every view pointer (layer_w_, emb_w_, head_w_ and the gradient views) bound to a parameter,
  // per parameter: re-pointed when stage 2/3 materialise or free a piece.
  std::vector<std::vector<float**>> value_slots_, grad_slots_;
  Tensor values_, grads_, adam_m_, adam_v_;
  Tensor grad_shard_, value_shard_;  // stage ≥ 1 / stage 3 (device)
  std::vector<float> host_m_, host_v_, host_values_, host_grads_;  // offload
  std::vector<LayerWeights> layer_w_, layer_g_;
  // aux-free MoE layers: tokens per expert this iteration (host), per layer of the stage, then
  // (last stage) per multi-token-prediction module
  std::vector<std::vector<float>> expert_load_;
  std::vector<MtpWeights> mtp_w_, mtp_g_;      // last stage: the multi-token-prediction modules
  EmbeddingWeights mtp_emb_w_, mtp_emb_g_;     // the word embedding they read (this stage's copy or the rank's first stage's)
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
  /// `context` > 1: context parallelism, this rank (`context_rank`) holding s/context tokens of
  /// each sequence (LayerShape::cp); stage inputs and outputs are its tokens only.
  /// `expert` ranks split the routed experts (this rank holds those of `expert_rank`), and
  /// `expert_tensor` ranks (0: t) split each expert's columns (this rank's part: `expert_tensor_rank`;
  /// at 0 the tensor rank).
  ModelShard(Device& dev, const TransformerSpec& spec, int micro_batch, int tp_rank, int t,
             const std::vector<int64_t>& stage_layers, const std::vector<int>& stages, uint64_t seed,
             const ShardingOptions& sharding = {}, bool sequence_parallel = false, int context = 1, int context_rank = 0,
             int expert = 1, int expert_rank = 0, int expert_tensor = 0, int expert_tensor_rank = 0);

  Device& device() { return dev_; }
  const LayerShape& shape() const { return shape_; }
  /// Context parallelism's all-gather variant (parallel.context_comm: allgather) instead of the ring.
  void use_context_all_gather(bool on) { shape_.cp_all_gather = on && shape_.cp > 1; }
  /// Ulysses (parallel.context_comm: alltoall) instead of the ring.
  void use_context_all_to_all(bool on) { shape_.cp_all_to_all = on && shape_.cp > 1; }
  /// The allgather MoE dispatcher (parallel.moe_dispatcher: allgather) instead of the all-to-all.
  void use_moe_all_gather(bool on) { shape_.moe_allgather = on && shape_.moe_experts > 0; }
  const TransformerSpec& spec() const { return spec_; }
  /// Rows of the word embedding (the vocabulary padded for this tensor-parallel size).
  int64_t padded_vocab() const { return padded_vocab_; }
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
  /// W: the held-back weight gradients of a split backward (stage ≥ 2: then reduce-scatters the
  /// full gradients once no split backward of this rank waits for its W).
  void weight_backward(StageActivations& acts);

  void zero_grads();
  /// Gradients of `stage_id`'s TP-replicated parameters (norms, row-parallel biases, positions)
  /// that sequence parallelism leaves partial on each TP rank (to be summed over the TP group);
  /// empty without sequence parallelism. Stage ≥ 1: their parts in this rank's gradient shard
  /// (after reduce_gradients).
  std::vector<std::pair<float*, size_t>> sequence_parallel_grads(int stage_id);
  /// Σ grad² over the parameters this rank counts in the global norm (TP-sharded ones, the
  /// replicated ones only on tp rank 0, the tied embedding once); stage ≥ 1: over its gradient
  /// shard only (sum it over the sharding group).
  double grad_sum_squares();
  /// Gradients of the tied word embedding held here (first stage, or the last stage's copy, which
  /// the tied output layer or the multi-token-prediction modules read); empty when this rank holds
  /// neither, and always with untied embeddings without multi-token prediction. With p = 1 both
  /// stages share one tensor. Stage ≥ 1: the shard of it (the same elements on both stages).
  std::vector<std::pair<float*, size_t>> tied_embedding_grads();
  /// REDUCE_GRAD's data-parallel part for `stage_id` (schedules/schedule.hpp): stage 0 all-reduces
  /// over `data` and divides by its size; stage 1 reduce-scatters over the sharding group; stage
  /// ≥ 2 reduce-scatters what is left; hybrid then all-reduces the shard over the replicas.
  void reduce_gradients(int stage_id, Communicator& data);
  /// Expert parallelism: the group the routed experts' gradients are all-reduced over (the d/ep
  /// ranks holding the same experts; null without expert parallelism: the data group). Their
  /// region of each stage's flat layout is reduced over it, the rest over the data group, both
  /// divided by the data group's size.
  void set_expert_data_group(Communicator* group) { expert_data_ = group; }
  /// DualPipe (two lanes): the mirror group (ProcessGroups::mirror), whose other member holds a
  /// copy of each of this rank's stages. reduce_gradients then sums the copies' gradients too,
  /// folded into the data-parallel reduction: 1/d of them crosses to the mirror rank (whole
  /// gradients: reduce-scatter over d, the pair sums its part, all-gather; sharded states: the
  /// pair sums the gradient shard). The routed experts' region is summed whole over the pair.
  void set_mirror_group(Communicator* group) { mirror_ = group; }
  /// Σ grad² over this rank's routed experts (sum it over the expert-parallel group; it is not in
  /// grad_sum_squares()). Sharded (ZeRO): over this rank's part of them, summed over
  /// expert_sharding_group() first, or (no expert parallelism) over the sharding group with the rest.
  double expert_grad_sum_squares();
  /// Sharded with expert parallelism: the group the routed experts' states shard over
  /// (ShardingOptions::expert_group); null otherwise.
  Communicator* expert_sharding_group() const { return sharding_.zero_stage > 0 ? sharding_.expert_group : nullptr; }
  /// Aux-loss-free load balancing (model.moe.router_load_balance: aux_free), Megatron-Core's
  /// update after each iteration's backward: each MoE layer's tokens per expert summed over
  /// `data` (and `mirror`, DualPipe's other copy), then each expert's bias moves by
  /// kExpertBiasUpdateRate towards balance: + rate when the expert got fewer tokens than the mean,
  /// − rate when more. `tensor` (sequence parallelism: each tensor rank routed its own tokens)
  /// sums them over the tensor group too. Collective over the groups (a no-op without aux_free).
  void update_expert_bias(Communicator& data, Communicator* mirror, Communicator* tensor = nullptr);
  /// Megatron's --moe-router-bias-update-rate default.
  static constexpr float kExpertBiasUpdateRate = 1e-3f;
  /// Megatron's overlapped gradient reduction (parallel.overlap_grad_reduce, zero_stage 0 or 1):
  /// called before the last backward of `stage_id` in an iteration (its B, or its last W), it
  /// splits the stage's gradients into buckets of about `bucket_elements` and starts each
  /// bucket's non-blocking collective as soon as the backward finalised all of it (buckets from
  /// the last layer's towards the first). Stage 0: all-reduces of buckets rounded up to whole
  /// all-reduce pieces of `data` (every piece the one the blocking all-reduce would reduce);
  /// stage 1 (the distributed optimizer): reduce-scatters into the shard of the bucket's whole
  /// pieces, each over its own group, as REDUCE_GRAD runs them. reduce_gradients then starts what
  /// is left, waits for every bucket and goes on: the same sums as without overlap, bit for bit.
  void arm_overlapped_reduction(int stage_id, Communicator& data, size_t bucket_elements);
  /// When set, told the stage whose overlapped buckets start now, inside a backward (their
  /// collectives belong to its REDUCE_GRAD: the ledger books them there), then −1 when they are.
  std::function<void(int stage_id)> on_buckets;
  /// overlap_param_gather: waits for every parameter all-gather the optimizer step started and
  /// no forward waited for yet (before the parameters are read whole: checkpoints, the run's end).
  void complete_parameter_gathers();
  /// Tells an armed stage that all its gradients are final (after its last W): starts its buckets.
  void gradients_final(int stage_id);
  /// Buckets whose all-reduce a backward started (not REDUCE_GRAD), since construction.
  int64_t buckets_started() const { return buckets_started_; }
  /// One AdamW step (`step` counts from 1) with gradients multiplied by grad_scale; stage ≥ 1 on
  /// the shard (on the host with offload), stages 1 and 2 then all-gather the parameters.
  void adam_step(const AdamOptions& opt, int64_t step, float grad_scale);
  /// Everything adam_step changes (parameters, their shard and offloaded master, Adam moments),
  /// copied to host memory: the post-validated step's roll-back point.
  struct OptimizerSnapshot {
    std::vector<std::vector<float>> buffers;
  };
  OptimizerSnapshot save_optimizer_state();
  void restore_optimizer_state(const OptimizerSnapshot& snapshot);

  const ShardingOptions& sharding() const { return sharding_; }
  int zero_stage() const { return sharding_.zero_stage; }
  /// UNSHARD / RESHARD of a stage (stage 3: gathers every unit and keeps it; no-op otherwise).
  void unshard_stage(int stage_id);
  void reshard_stage(int stage_id);
  /// Parameter values of `p` of `st`, elements [begin, begin + count), to host memory: from the
  /// full buffer, or (stage 3) the shard, which must hold them.
  void read_values(Stage& st, const ParamInfo& p, size_t begin, size_t count, float* host);
  /// The optimizer state of a shard segment (or, stage 0, of a whole parameter) to and from host.
  void read_moments(Stage& st, size_t offset, size_t count, float* m, float* v);
  void write_moments(Stage& st, size_t offset, size_t count, const float* m, const float* v);
  /// Writes parameter elements from host memory wherever this rank keeps them (full buffer,
  /// shard and the offloaded master); elements outside its shard are ignored under stage 3.
  void write_values(Stage& st, const ParamInfo& p, size_t begin, size_t count, const float* host);
  /// Host bytes of the offloaded states (0 without offload).
  size_t host_bytes() const;
  /// Where each parameter's values are now, by global name (null while a stage-3 piece is not
  /// gathered): the keys FP8's delayed scaling files its amax histories under.
  std::map<const float*, std::string> value_names();
  /// When set, told the wall-clock interval (now_s()) of each blocking sharding transfer inside
  /// F/B/I/W and OPTIM (gathers, per-unit reduce-scatters, the parameter all-gather, offload
  /// copies); not those of REDUCE_GRAD and UNSHARD, transfer actions themselves.
  std::function<void(double start_s, double end_s)> on_shard_wait;

 private:
  void build_stage(Stage& st);
  /// Multi-token-prediction module k (0-based) of the last stage `st`: what it reads.
  MtpModule mtp_module(const Stage& st, size_t k) const;
  /// The gradient scale of depth `depth`'s per-token losses, from the main loss's `loss_scale`.
  float mtp_loss_scale(float loss_scale, int depth) const;
  /// The last stage reads the word embedding: the tied output layer, or the multi-token-prediction
  /// modules' lookups (Megatron keeps a copy there, summed with the first stage's, either way).
  bool reads_embedding_at_head() const { return spec_.head_reads_embedding(); }
  /// The rank's first stage of a lane (the embedding's), or null.
  Stage* first_stage_held();
  void link_views(Stage& st);
  void build_units(Stage& st);
  void initialise(Stage& st, uint64_t seed);
  void allocate_states(Stage& st);
  float* param_ptr(Stage& st, int param, bool values);
  void relink(Stage& st, int piece);
  /// Which group a new piece shards over: the routed experts' (expert_group, when set) or the rest.
  Communicator* piece_group(bool experts) const;
  // Stage 3: all-gather (first user; waits for a prefetch) / free (last user) the pieces of a
  // unit; prefetch starts the gathers of a unit without waiting.
  void prefetch(const Unit& u);
  void start_gather(Stage& st, int piece);
  // overlap_param_gather (stages 1–2): waits for the optimizer step's gather of a piece.
  void finish_parameter_gather(Piece& pc);
  void acquire(const Unit& u);
  void release(const Unit& u);
  // Stage 3, around reshard_after_forward: after a unit's forward (frees it, keeps it whole, or
  // keeps this member's 1/N) and after its backward (frees what the forward kept).
  void release_after_forward(const Unit& u);
  void release_after_backward(const Unit& u);
  bool gathering_for_backward_ = false;  // start_gather: from the 1/N kept, over the reshard group
  // Stage ≥ 2: full gradients of a unit's pieces (zeroed when new), and their reduce-scatter
  // into the shard.
  void open_grads(const Unit& u);
  void flush_grads(Stage& st, int piece);
  void flush_all_grads();
  // Runs a sharding transfer, reported to on_shard_wait unless inside REDUCE_GRAD or UNSHARD
  // (transfer actions, timed as a whole).
  void shard_transfer(const std::function<void()>& f);
  bool in_transfer_action_ = false;
  // Overlapped gradient reduction of armed stages: bucket b = [bounds[b], bounds[b + 1]) of the
  // flat gradients, with the count of its pieces not yet final; buckets start from the last.
  struct Buckets {
    std::vector<size_t> bounds;
    std::vector<Communicator*> groups;  // each bucket's: data, or expert-data for the routed experts
    std::vector<int> unready;
    std::vector<bool> piece_ready;
    size_t started = 0;
    std::vector<std::unique_ptr<Request>> requests;
    // Hybrid sharding (shard replicas): each started bucket's reduce-scatter requests
    // [first, last) and its index; once they complete, the bucket's shard is all-reduced over the
    // replicas, bucket after bucket in start order (every replica starts them alike).
    struct Started {
      size_t bucket, first, last;
    };
    std::vector<Started> started_list;
    size_t replicas_started = 0;
    std::vector<std::unique_ptr<Request>> replica_requests;
  };
  std::map<const Stage*, Buckets> buckets_;
  int64_t buckets_started_ = 0;
  void piece_final(Stage& st, int piece);
  void start_ready_buckets(Stage& st, Buckets& b);
  // Stage 3: a stage holding the embedding and the tied head, whose first and last units share
  // the word embedding's piece — gathered once per pass, held from one end to the other.
  bool word_shared_by_end_units(const Stage& st) const;
  // Hybrid sharding: the replicas' all-reduces of the buckets whose reduce-scatters completed
  // (all of them, waiting, when `wait`).
  void start_replica_reductions(Stage& st, Buckets& b, bool wait);

  Device& dev_;
  TransformerSpec spec_;
  LayerShape shape_;
  int tp_rank_, t_;
  int64_t padded_vocab_;
  ShardingOptions sharding_;
  int pending_split_ = 0;  // split backwards (I) whose W has not run
  Communicator* expert_data_ = nullptr;
  Communicator* mirror_ = nullptr;
  int expert_size_ = 1, expert_rank_ = 0, etp_ = 1, etp_rank_ = 0;
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace ptdp::exec
