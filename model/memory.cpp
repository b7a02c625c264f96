#include "model/memory.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/partition.hpp"
#include "model/plan_fields.hpp"
#include "model/units.hpp"

namespace ptdp {

ActivationBytesMemo* activation_bytes_memo() { return ActivationBytesScope::current(); }

namespace {
// `bytes` of the plan from the thread's ActivationBytesMemo when a scope set one, kept per shape:
// every plan field model/cost.cpp reads (dims_of, layer_ops, embedding_ops, head_ops,
// saved_activation_bytes), and which figure it is (`what`: layer, embedding, head or MTP).
template <class Bytes>
double per_shape(char what, const ParallelPlan& plan, Bytes bytes) {
  ActivationBytesMemo* memo = ActivationBytesScope::current();
  if (!memo) return bytes();
  // The pipeline degree only under vocabulary parallelism: no other op of a layer, the embedding,
  // the head or the MTP modules reads it (model/cost.cpp), so the layouts (cp, t, p) of one t
  // share their figures.
  const bool vocab_parallel = plan.vocab_parallel_pipeline && plan.pipeline > 1;
  const ActivationBytesMemo::Key key = {what, plan.tensor, vocab_parallel ? plan.pipeline : 0, plan.context, plan.expert, plan.expert_tensor_size(), plan.micro_batch,
                            static_cast<int64_t>(plan.recompute), static_cast<int64_t>(plan.recompute_modules),
                            plan.sequence_parallel, static_cast<int64_t>(plan.precision), static_cast<int64_t>(plan.fp8_recipe),
                            static_cast<int64_t>(plan.framework), static_cast<int64_t>(plan.moe_dispatcher),
                            static_cast<int64_t>(plan.context_comm), plan.vocab_parallel_pipeline, plan.mtp_apart()};
  if (const auto it = memo->by_shape.find(key); it != memo->by_shape.end()) return it->second;
  return memo->by_shape.emplace(key, bytes()).first->second;
}
}  // namespace

double layer_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  // What each of the layer's operations keep (model/cost.hpp): the one description of a layer.
  return per_shape('l', plan, [&] { return saved_activation_bytes(spec, plan); });
}

double layer_kind_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan, bool moe) {
  return per_shape(moe ? 'K' : 'k', plan, [&] { return layer_kind_saved_bytes(spec, plan, moe); });
}

namespace {
double saved_bytes_of(const std::vector<Op>& ops) {
  double bytes = 0;
  for (const Op& op : ops) bytes += op.saved_bytes;
  return bytes;
}

// The last stage's final norm + output layer unit (per TP rank): the one count (model/units.hpp).
double head_unit_parameters(const TransformerSpec& spec, const ParallelPlan& plan) {
  const StageParameters last = stage_parameters(spec, plan, static_cast<int>(plan.lane_stages() - 1));
  if (!last.has_head || last.units.empty()) return 0;
  return last.units[last.units.size() - (last.has_vocab_share ? 2 : 1)];
}
}  // namespace

// The embedding's, the head's and the vocabulary share's activations: what their forward ops keep
// (model/cost.hpp), as for a layer.
double embedding_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  return per_shape('e', plan, [&] { return saved_bytes_of(embedding_ops(spec, plan, Pass::Forward)); });
}

namespace {
// What the head's forward ops keep (`saved`) and the most the loss has alive beyond it
// (`transient`). Under a memo both figures of a shape come from one build of the ops: the head
// (with its multi-token-prediction modules, an MoE layer each) is the costliest of them to build,
// and memory_per_rank reads both for every plan whose last stage it checks.
struct HeadBytes {
  double saved = 0, transient = 0;
};
HeadBytes head_bytes_of(const TransformerSpec& spec, const ParallelPlan& plan) {
  HeadBytes out;
  for (const Op& op : head_ops(spec, plan, Pass::Forward)) {
    out.saved += op.saved_bytes;
    out.transient = std::max(out.transient, op.peak_bytes - op.saved_bytes);
  }
  return out;
}
double head_figure(const TransformerSpec& spec, const ParallelPlan& plan, bool transient) {
  HeadBytes both;
  bool built = false;
  auto once = [&] {
    if (!built) both = head_bytes_of(spec, plan);
    built = true;
    return both;
  };
  // The figure asked for, then the other one of the same build kept too (a lookup, no build, when
  // it was kept already).
  const double saved = per_shape('h', plan, [&] { return once().saved; });
  const double most = per_shape('H', plan, [&] { return once().transient; });
  return transient ? most : saved;
}
}  // namespace

double head_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) { return head_figure(spec, plan, false); }

double head_loss_transient_bytes(const TransformerSpec& spec, const ParallelPlan& plan) { return head_figure(spec, plan, true); }

double mtp_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  return per_shape('m', plan, [&] { return saved_bytes_of(mtp_ops(spec, plan, Pass::Forward)); });
}

double vocab_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  return saved_bytes_of(vocab_ops(spec, plan, Pass::Forward));
}

double layer_local_expert_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan) {
  return layer_expert_parameter_count(spec) / static_cast<double>(plan.expert_tensor_size() * plan.expert);
}

double layer_local_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan) {
  const double t = static_cast<double>(plan.tensor);
  return (layer_split_parameter_count(spec) - layer_expert_parameter_count(spec)) / t + layer_local_expert_parameter_count(spec, plan) +
         layer_replicated_parameter_count(spec);
}

double rank_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan, int pipeline_rank) {
  // The rank's stages, each counted once by the one description of a stage's parameters (the
  // LM head of a tied model reads the rank's embedding when the rank holds a first stage too).
  return rank_parameter_counts(spec, plan)[static_cast<size_t>(pipeline_rank)];
}

namespace {
// Each pipeline rank's parameters: its stages' (placed by `placement`) summed.
std::vector<double> rank_sums(const ParallelPlan& plan, const std::vector<int>& placement, const std::vector<StageParameters>& stages) {
  std::vector<double> params(static_cast<size_t>(plan.pipeline), 0.0);
  for (size_t st = 0; st < placement.size(); ++st) params[static_cast<size_t>(placement[st])] += stages[st].total;
  return params;
}

// The largest FSDP unit (the ones pricing gathers, model/units.hpp: the embedding, each layer, the head).
double largest_unit(const std::vector<StageParameters>& stages) {
  double largest = 0;
  for (const StageParameters& stage : stages)
    for (double unit : stage.units) largest = std::max(largest, unit);
  return largest;
}
}  // namespace

std::vector<double> rank_parameter_counts(const TransformerSpec& spec, const ParallelPlan& plan) {
  const std::vector<int> placement = stage_placement(plan);
  return rank_sums(plan, placement, stage_parameters_all(spec, plan, placement));
}

double rank_linear_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan, int pipeline_rank) {
  double layers = 0;
  for (int64_t n : rank_chunk_layers(plan, stage_layers(spec, plan), pipeline_rank)) layers += static_cast<double>(n);
  return layers * (layer_local_parameter_count(spec, plan) - layer_replicated_parameter_count(spec));
}

double largest_unit_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan) {
  return largest_unit(stage_parameters_all(spec, plan, stage_placement(plan)));
}

void add_model_states(const ParallelPlan& plan, double parameters, MemoryBreakdown& m, double fp8_parameters) {
  // Mixed precision: 2-byte weights, fp32 master weights + Adam moments (K = 12); fp32 training
  // keeps only the two moments besides the weights (K = 8).
  const StateBytes sb = state_bytes(plan.precision);
  const double weight_b = sb.weight, grad_b = sb.gradient, optim_b = sb.optimizer;
  const double n = static_cast<double>(plan.sharding_degree());
  const double psi = parameters;
  m.weights_bytes = (plan.zero_stage >= 3 ? psi / n : psi) * weight_b;
  if (plan.precision == Precision::FP8) {
    // Transformer Engine keeps an FP8 copy of each linear layer's weight (1 byte per parameter)
    // beside the bf16 one; with --fp8-param-gather the FP8 copy is the only one (no bf16 copy).
    const double fp8_local = plan.zero_stage >= 3 ? fp8_parameters / n : fp8_parameters;
    m.weights_bytes += plan.fp8_param_gather ? -fp8_local * (weight_b - 1) : fp8_local;
  }
  m.gradients_bytes = (plan.zero_stage >= 2 ? psi / n : psi) * grad_b;
  m.optimizer_bytes = (plan.zero_stage >= 1 ? psi / n : psi) * optim_b;
  if (sharded_parameter_is_master(plan)) {
    // PyTorch FSDP keeps the sharded parameter in fp32 and steps it in place: it is the master
    // copy, so there is no bf16 shard (nor a persistent FP8 one: torchao casts the fp32 shard
    // each step, and the gathered copies are the buffers'), the fp32 sharded gradient
    // (reduce_dtype fp32; FSDP casts it to the parameter's dtype under fp16 too) and Adam's two
    // moments: 4 + 4 + 8 bytes per parameter per shard.
    m.weights_bytes = psi / n * 4;
    m.gradients_bytes = psi / n * 4;
    m.optimizer_bytes = psi / n * (optim_b - 4);
  }
  m.host_bytes = 0;
  if (plan.offload != Offload::None) {
    // ZeRO-Offload: the optimizer state and the Adam step live on the host, which also keeps an
    // fp32 copy of the gradient shard it receives over PCIe.
    m.host_bytes += m.optimizer_bytes + psi / n * 4;
    m.optimizer_bytes = 0;
  }
  if (plan.offload == Offload::OptimizerAndParams) {
    m.host_bytes += m.weights_bytes;
    m.weights_bytes = 0;
  }
}

double runtime_memory_bytes(const ParallelPlan& plan) {
  if (!plan.gpu_runtime_memory) return 0;
  constexpr double kMiB = 1024.0 * 1024.0;
  const double context = 287e6;
  const double collective = 16 * (4 + 0.5 + 4.69) * kMiB;  // channels × (SIMPLE + LL + LL128)
  const double p2p = 2 * 2 * 4 * kMiB;                      // two neighbours × two channels × SIMPLE
  const double nvls = 256 * kMiB;
  int communicators = 0;
  for (int64_t size : {plan.tensor, plan.context, plan.gradient_ranks(), plan.expert, plan.expert > 1 ? plan.expert_data() : 1,
                       plan.pipeline > 1 ? plan.tensor * plan.pipeline : 1})
    if (size > 1) ++communicators;
  double bytes = context + communicators * collective;
  if (plan.nvls && plan.tensor == 8 && !plan.sequence_parallel) bytes += nvls;  // TP all-reduces on NVLS
  if (plan.pipeline > 1) bytes += p2p;
  return bytes;
}

double allocator_reserve_bytes(const ParallelPlan& plan, double transient_bytes) {
  return plan.expandable_segments ? 0.0 : transient_bytes * 0.34 / (1 - 0.34);
}

ShardedMemory::ShardedMemory(const TransformerSpec& spec, const ParallelPlan& plan)
    : spec_(spec), shape_(plan), placement_(stage_placement(plan)), stage_params_(stage_parameters_all(spec, plan, placement_)) {
  const auto layers = stage_layers(spec, plan);
  per_layer_ = layer_activation_bytes(spec, plan);
  ParallelPlan no_recompute = plan;
  no_recompute.recompute = Recompute::None;
  full_layer_ = layer_activation_bytes(spec, no_recompute);
  rank_params_ = rank_sums(plan, placement_, stage_params_);
  // Per layer (the same for every rank): the routed experts' local parameters, and the linear
  // layers' (rank_linear_parameter_count's factor). Both read the model and t, ep, etp (in the
  // per-shape key): kept under an ActivationBytesMemo, as each count rebuilds the layer's tensors.
  expert_per_layer_ = per_shape('x', plan, [&] { return layer_local_expert_parameter_count(spec, plan); });
  linear_per_layer_ =
      per_shape('y', plan, [&] { return layer_local_parameter_count(spec, plan) - layer_replicated_parameter_count(spec); });
  // Each rank's chunks (its stages' layer counts), and what the embedding, head, MTP and
  // vocabulary-share ops keep (asked of the ranks holding them).
  bool first = false, last = false;
  for (int r = 0; r < plan.pipeline; ++r) {
    chunks_.push_back(rank_chunk_layers(plan, layers, r));
    first = first || rank_holds_first_stage(plan, r);
    last = last || rank_holds_last_stage(plan, r);
  }
  if (first) embedding_bytes_ = embedding_activation_bytes(spec, plan);
  if (last) {
    head_bytes_ = head_activation_bytes(spec, plan);
    head_transient_bytes_ = head_loss_transient_bytes(spec, plan);
  }
  if (plan.mtp_apart()) mtp_bytes_ = mtp_activation_bytes(spec, plan);
  vocab_bytes_ = vocab_activation_bytes(spec, plan);
}

std::vector<MemoryBreakdown> ShardedMemory::per_rank(const ParallelPlan& plan, const std::vector<int>& inflight_chunks) const {
  PTDP_ASSERT(static_cast<int64_t>(inflight_chunks.size()) == plan.pipeline, "one in-flight count per pipeline rank");
  PTDP_ASSERT(plan.tensor == shape_.tensor && plan.pipeline == shape_.pipeline && plan.data == shape_.data &&
                  plan.micro_batch == shape_.micro_batch && plan.schedule == shape_.schedule &&
                  plan.virtual_stages == shape_.virtual_stages && plan.recompute == shape_.recompute &&
                  plan.sequence_parallel == shape_.sequence_parallel && plan.expert == shape_.expert &&
                  plan.context == shape_.context && plan.partition == shape_.partition,
              "ShardedMemory: the plan differs from its shape beyond the sharding");
  const TransformerSpec& spec = spec_;
  const double weight_b = bytes_per_element(plan.precision), grad_b = gradient_bytes(plan.precision);
  const std::vector<StageParameters>& stage_params = stage_params_;
  // The largest unit matters only to sharded gradients and gathers (stages 2–3).
  const double unit = plan.zero_stage >= 2 ? largest_unit(stage_params) : 0.0;
  const double per_layer = per_layer_, full_layer = full_layer_;
  const std::vector<double>& rank_params = rank_params_;
  const double expert_per_layer = expert_per_layer_, linear_per_layer = linear_per_layer_;
  std::vector<MemoryBreakdown> out;
  out.reserve(static_cast<size_t>(plan.pipeline));
  for (int r = 0; r < plan.pipeline; ++r) {
    MemoryBreakdown m;
    m.pipeline_rank = r;
    m.parameters = rank_params[static_cast<size_t>(r)];
    const std::vector<int64_t>& chunks = chunks_[static_cast<size_t>(r)];
    // The routed experts' states are sharded over their expert-data-parallel group, the rest over
    // the d·cp replicas.
    double rank_layers = 0;
    for (int64_t n : chunks) rank_layers += static_cast<double>(n);
    const double expert = rank_layers * expert_per_layer;
    const double linear = rank_layers * linear_per_layer;  // rank_linear_parameter_count
    add_model_states(plan, m.parameters - expert, m, linear - expert);
    if (expert > 0) {
      MemoryBreakdown e;
      add_model_states(plan.expert_view(), expert, e, expert);
      m.weights_bytes += e.weights_bytes, m.gradients_bytes += e.gradients_bytes, m.optimizer_bytes += e.optimizer_bytes;
      m.host_bytes += e.host_bytes;
    }
    // Stage 3 gathers up to max_inflight_gathers units' parameters at once (the computing one and
    // those prefetched); stages 2 and 3 hold one unit's full gradients until its reduce-scatter.
    // (never more than the units the rank's stages hold: a limit above that gathers them all).
    // reshard_after_forward (plan.hpp reshard_group): false keeps every unit whole from its
    // forward to its backward (all the rank's parameters, gathered); N keeps them sharded over N
    // ranks (1/N of them) besides the units being gathered.
    const int64_t regather = reshard_group(plan);
    if (plan.zero_stage >= 3) {
      double units = 0;
      for (int64_t n : chunks) units += static_cast<double>(n);
      units += (rank_holds_first_stage(plan, r) ? 1 : 0) + (rank_holds_last_stage(plan, r) ? 1 : 0);  // embedding, output layer
      if (plan.mtp_apart() && stage_rank(plan, plan.mtp_stage()) == r) units += 1;                    // a layout's MTP unit
      if (regather == 1) {
        m.buffers_bytes += m.parameters * weight_b;
      } else {
        m.buffers_bytes += std::min(static_cast<double>(plan.max_inflight_gathers), units) * unit * weight_b;
        if (regather < plan.sharding_degree()) m.buffers_bytes += m.parameters / static_cast<double>(regather) * weight_b;
        // torchtitan's last unit (final norm + output layer) stays whole from its forward to its
        // backward, beside the units being gathered.
        if (last_unit_kept_whole(plan) && rank_holds_last_stage(plan, r)) m.buffers_bytes += head_unit_parameters(spec, plan) * weight_b;
        // One stage holding both ends whose head reads the word embedding (tied, or the MTP
        // modules' lookup): the embedding's unit stays gathered from the embedding to the head
        // and back, as FSDP holds a parameter two modules share (the executor's
        // word_shared_by_end_units).
        if (spec.head_reads_embedding() && plan.lane_stages() == 1 && stage_params[0].has_embedding && !stage_params[0].units.empty())
          m.buffers_bytes += stage_params[0].units.front() * weight_b;
      }
    }
    // torchtitan's FSDP with pipelines accumulates the whole (unsharded) gradients over the step,
    // in the reduction's precision, and reduce-scatters them once.
    if (gradients_reduced_once_per_step(plan)) m.buffers_bytes += m.parameters * grad_b;
    else if (plan.zero_stage >= 2) m.buffers_bytes += unit * grad_b;
    // In-flight chunks of an uneven partition are counted at the rank's largest chunk (an upper
    // bound; exact without interleaving).
    const double layers_per_chunk = static_cast<double>(*std::max_element(chunks.begin(), chunks.end()));
    double act = inflight_chunks[r] * layers_per_chunk * per_layer;
    // Recomputing a layer materialises its full activations once more during its backward.
    double transient = plan.recompute != Recompute::None ? full_layer - per_layer : 0.0;
    // Microbatches in flight through the rank's first (or last) stage: its chunks in flight
    // shared among its v chunks, at least one.
    const double per_stage = std::max(1.0, std::ceil(static_cast<double>(inflight_chunks[r]) / static_cast<double>(chunks.size())));
    if (rank_holds_first_stage(plan, r)) act += per_stage * embedding_bytes_;
    // The last stage (on rank 0 under zb-v): its norm, and fp32 logits with their gradient for
    // the microbatch in its backward.
    // Under vocabulary parallelism every rank holds its share of the logits.
    // The eager loss's peak (head_loss_transient_bytes) comes before the microbatch's layers run
    // their backward and is freed by then: the last stage peaks at the larger of the two moments,
    // each on top of the activations held (the final norm's are counted as held through both).
    if (rank_holds_last_stage(plan, r)) {
      act += head_bytes_;
      transient = std::max(transient, head_transient_bytes_);
    }
    act += transient;
    // A layout's MTP stage before the last: its modules' activations, for its microbatches in
    // flight as for the embedding's.
    if (plan.mtp_apart() && stage_rank(plan, plan.mtp_stage()) == r) act += per_stage * mtp_bytes_;
    act += vocab_bytes_;
    m.activations_bytes = act;
    m.runtime_bytes = runtime_memory_bytes(plan);
    m.allocator_bytes = allocator_reserve_bytes(plan, m.activations_bytes + m.buffers_bytes);
    m.total_bytes = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes + m.buffers_bytes + m.runtime_bytes +
                    m.allocator_bytes;
    out.push_back(m);
  }
  return out;
}

std::vector<MemoryBreakdown> memory_per_rank(const TransformerSpec& spec, const ParallelPlan& plan,
                                             const std::vector<int>& inflight_chunks) {
  return ShardedMemory(spec, plan).per_rank(plan, inflight_chunks);
}

const ShardedMemory& ShardedMemoryCache::of(const TransformerSpec& spec, const ParallelPlan& plan) {
  ParallelPlan shape = plan;  // what per_rank finishes for each plan is not the shape's
  shape.zero_stage = 0;
  shape.sharding_group = ShardingGroup::Data;
  shape.offload = Offload::None;
  const std::vector<int64_t> fields = plan_integers(shape);
  const TransformerSpec* model = &spec;
  key_.assign(reinterpret_cast<const char*>(&model), sizeof model);
  key_.append(reinterpret_cast<const char*>(fields.data()), fields.size() * sizeof(int64_t));
  if (const auto it = shapes_.find(key_); it != shapes_.end()) return *it->second;
  if (shapes_.size() >= capacity_) shapes_.clear();
  return *shapes_.emplace(key_, std::make_unique<const ShardedMemory>(spec, shape)).first->second;
}

MemoryBreakdown peak_memory(const std::vector<MemoryBreakdown>& ranks) {
  PTDP_ASSERT(!ranks.empty(), "no ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const MemoryBreakdown& a, const MemoryBreakdown& b) { return a.total_bytes < b.total_bytes; });
}

}  // namespace ptdp
