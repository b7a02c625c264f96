// Memory per GPU: weights, gradients, optimizer state and activations of in-flight microbatches.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/thread_scope.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "model/units.hpp"

namespace ptdp {

struct MemoryBreakdown {
  int pipeline_rank = 0;  // the rank this breakdown is for (the largest one for memory_per_gpu)
  double parameters = 0;  // local parameter count
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  /// Communication buffers of sharding: gathered parameters of the units in flight (stage 3) and
  /// one unit's unreduced gradients (stages 2 and 3).
  double buffers_bytes = 0;
  /// The GPU runtime's own memory per process: the CUDA context and NCCL's buffers of every
  /// communicator the rank belongs to (runtime_memory_bytes).
  double runtime_bytes = 0;
  /// What the caching allocator reserves beyond the tensors it holds (fragmentation) without
  /// expandable segments.
  double allocator_bytes = 0;
  double total_bytes = 0;  // on the GPU: weights + gradients + optimizer + activations + buffers + runtime + allocator
  /// Host memory the offloaded states take (ZeRO-Offload), per GPU; not in total_bytes.
  double host_bytes = 0;
};

/// Model-state bytes of one rank with `parameters` local parameters under the plan's ZeRO stage,
/// sharding degree and offload (sharding-sp-zb-facts.md: 16Ψ, 4Ψ + KΨ/N, 2Ψ + (2 + K)Ψ/N,
/// 16Ψ/N with K = 12 for mixed precision; bf16 keeps 4-byte gradients). Fills weights,
/// gradients, optimizer and host bytes of `m`. With training.precision fp8, the `fp8_parameters`
/// of the linear layers also keep an FP8 copy (1 byte), or only it with fp8_param_gather. Stage 3
/// under PyTorch FSDP (sharded_parameter_is_master, model/plan.hpp): the fp32 sharded parameter
/// is the master, 4 + 4 + 8 bytes per parameter per shard (16Ψ/N instead of 18Ψ/N).
void add_model_states(const ParallelPlan& plan, double parameters, MemoryBreakdown& m, double fp8_parameters = 0);
/// Parameters of the linear layers (QKV, projection, MLP) of pipeline rank r, per TP rank: the
/// ones that run in FP8.
double rank_linear_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan, int pipeline_rank);

/// Activation bytes one layer keeps for one microbatch on one TP rank until its backward: the sum
/// of what the layer's operations keep (model/cost.hpp saved_activation_bytes). With unfused
/// attention this is Korthikanti et al. 2022: sbh(10 + 24/t + 5as/(ht)); selective recompute
/// drops the attention term; full recompute keeps only the layer input, 2sbh. Flash attention
/// keeps no s² tensor (only a 4-byte log-sum-exp per query row and head); without dropout the two
/// 1-byte masks go; FP8 keeps the linear layers' inputs in 1 byte. The 24 generalises to
/// 4 + 4·kv/h (GQA keeps smaller K and V) + 4·ffn/h (GELU) or 6·ffn/h (SwiGLU). Sequence
/// parallelism splits the replicated 10 over t as well: sbh(34/t + 5as/(ht)), sbh·34/t with
/// selective recompute, and the full-recompute input 2sbh/t.
double layer_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);

/// layer_kind_saved_bytes (model/cost.hpp) of one layer kind (dense or MoE), kept per shape under
/// an ActivationBytesMemo like the others: a multi-token-prediction module's layer reads it for
/// every head the enumeration checks, and it is the layers' own figure of that kind.
double layer_kind_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan, bool moe);

/// The sweep's enumeration checks the memory of thousands of plans of one model with few layer
/// shapes: while a memo is in scope on a thread (ActivationBytesScope), layer_activation_bytes,
/// layer_kind_activation_bytes, embedding_activation_bytes, head_activation_bytes and memory_per_rank's
/// per-layer parameter counts keep their figures per shape (the plan
/// fields the layer's, embedding's and head's ops read: model/cost.cpp). One model per memo, one
/// thread at a time.
struct ActivationBytesMemo {
  /// The figure (a letter) and the plan fields it reads.
  using Key = std::array<int64_t, 17>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = 14695981039346656037ull;  // FNV-1a over the fields
      for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<Key, double, KeyHash> by_shape;
  /// stage_parameters' per-unit counts on one tensor rank (model/units.cpp: the embedding, final
  /// norm, dense and MoE layers, MTP modules and vocabulary shard), by (t, ep, etp): each count
  /// rebuilds the model's declared tensors.
  std::unordered_map<Key, UnitCounts, KeyHash> unit_counts;
};
/// The ActivationBytesMemo in scope on this thread (nullptr: none).
ActivationBytesMemo* activation_bytes_memo();
using ActivationBytesScope = ThreadScope<ActivationBytesMemo>;

/// Activation bytes outside the layers for one in-flight microbatch (Korthikanti et al. 2022,
/// §4.3), summed from what the embedding's and head's forward ops keep (model/cost.hpp): on the
/// first stage the embedding's dropout mask (sbh, ÷t with sequence parallelism); on the last the
/// final norm's input and output (4sbh at 2 bytes, ÷t with sequence parallelism) and, unless
/// vocabulary parallelism spreads them, the fp32 logits with their gradient (8sbV/t, held by the
/// microbatch in its backward); under vocabulary parallelism each pipeline rank's share of those.
double embedding_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
double head_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
/// What the last stage's loss has alive at its own peak beyond head_activation_bytes (Op::peak_bytes
/// − saved_bytes, the largest of the head's ops): the eager PyTorch loss's 12 bytes per local
/// logit element at its backward (FrameworkCosts::loss_peak_bytes), freed before the layers'
/// backward; 0 for Megatron's fused loss, whose 8 bytes are held (head_activation_bytes).
double head_loss_transient_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
double vocab_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
/// A layout's MTP stage before the last (ParallelPlan::mtp_apart): what its modules keep per
/// microbatch (model/cost.hpp mtp_ops); 0 otherwise.
double mtp_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
/// Parameters of one FSDP unit on one TP rank: a transformer layer, or the embedding when it is
/// larger. The unit is what a stage-3 all-gather materialises at once.
double largest_unit_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan);

/// Local parameters of one layer on one rank (the mean over the layers): the split weights ÷ t,
/// the routed experts' ÷ (expert_tensor × expert), the replicated ones whole.
double layer_local_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan);
/// Of those, the routed experts' (reduced over the expert-data-parallel group, not d·cp).
double layer_local_expert_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan);
/// Local parameters of pipeline rank r (the layers of its stages (model/partition.hpp) / t, plus
/// embeddings on the first and the LM head on the last stage).
double rank_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan, int pipeline_rank);
/// rank_parameter_count of every pipeline rank (the stages priced once).
std::vector<double> rank_parameter_counts(const TransformerSpec& spec, const ParallelPlan& plan);

/// Per process on a GPU cluster (plan.gpu_runtime_memory; 0 otherwise), kernel-and-framework
/// facts §8: the CUDA context, 287 MB with lazy module loading (PyTorch's default); NCCL's
/// buffers, per collective communicator the rank belongs to (tensor, context, data × context,
/// expert, expert-data, and with pipelines the model-parallel group of the gradient norm) one
/// ring connection on each of 16 channels with the SIMPLE, LL and LL128 protocols' buffers (4 +
/// 0.5 + 4.69 MiB), and 256 MiB of NVLS buffers for a tensor-parallel all-reduce group of 8 GPUs
/// on NVLS nodes; per pipeline neighbour two channels of 4 MiB point-to-point buffers.
double runtime_memory_bytes(const ParallelPlan& plan);
/// The caching allocator's reserve beyond what it holds, without expandable segments: up to 34 %
/// of the peak reserved memory goes to fragmentation (kernel-and-framework facts §8: expandable
/// segments took a Llama-3 8B run's peak from 16.39 to 10.83 GiB), i.e. 0.34 / 0.66 of the memory
/// allocated and freed during the step (activations and sharding buffers); the model states are
/// allocated once. 0 with expandable segments.
double allocator_reserve_bytes(const ParallelPlan& plan, double transient_bytes);

/// Per pipeline rank, given the schedule's peak in-flight microbatch-chunks per rank
/// (schedules::peak_inflight_activations). Returns one breakdown per pipeline rank.
std::vector<MemoryBreakdown> memory_per_rank(const TransformerSpec& spec, const ParallelPlan& plan,
                                             const std::vector<int>& inflight_chunks);

/// memory_per_rank of one plan under several sharding settings (ZeRO stage, sharding group,
/// offload): what those do not change — the stages' parameters, placement and layers, the
/// activations a layer, the embedding, the head and the vocabulary share keep — computed once
/// (`--auto` checks each sharding choice of a layout). memory_per_rank is one of these asked once.
class ShardedMemory {
 public:
  ShardedMemory(const TransformerSpec& spec, const ParallelPlan& plan);
  /// memory_per_rank(spec, plan, inflight_chunks) for a `plan` that is the constructor's but for
  /// zero_stage, sharding_group, offload and the overlaps (asserted on the layout fields).
  std::vector<MemoryBreakdown> per_rank(const ParallelPlan& plan, const std::vector<int>& inflight_chunks) const;

 private:
  const TransformerSpec& spec_;
  ParallelPlan shape_;
  std::vector<int> placement_;
  std::vector<StageParameters> stage_params_;
  std::vector<double> rank_params_;
  std::vector<std::vector<int64_t>> chunks_;  // per pipeline rank: its stages' layer counts
  double per_layer_ = 0, full_layer_ = 0, expert_per_layer_ = 0, linear_per_layer_ = 0;
  double embedding_bytes_ = 0, head_bytes_ = 0, head_transient_bytes_ = 0, mtp_bytes_ = 0, vocab_bytes_ = 0;
};
/// ShardedMemory by plan shape: the plans that differ only in their ZeRO stage, sharding group
/// and offload share one (the sweep's memory checks meet a layout's sharding choices one after
/// another). The key is every other plan field (model/plan_fields.hpp) and the model's address:
/// the models must outlive the cache. At most `capacity` shapes are kept (all dropped when full).
/// One thread at a time.
class ShardedMemoryCache {
 public:
  explicit ShardedMemoryCache(size_t capacity = 4096) : capacity_(capacity) {}
  /// The ShardedMemory of `plan`'s shape: per_rank(plan, …) is memory_per_rank(spec, plan, …).
  const ShardedMemory& of(const TransformerSpec& spec, const ParallelPlan& plan);
  size_t size() const { return shapes_.size(); }

 private:
  size_t capacity_;
  std::string key_;
  std::unordered_map<std::string, std::unique_ptr<const ShardedMemory>> shapes_;
};
/// The rank with the largest total.
MemoryBreakdown peak_memory(const std::vector<MemoryBreakdown>& ranks);

}  // namespace ptdp
