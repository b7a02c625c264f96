#include "exec/model/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ptdp::exec {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t param_key(uint64_t seed, const std::string& name) { return splitmix64(splitmix64(seed) ^ fnv1a(name)); }

// Box–Muller on two counter-derived uniforms.
float normal_from_key(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key + 2 * index), b = splitmix64(key + 2 * index + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Appends parameters to a stage's flat buffer layout, in pieces padded to a multiple of the size
// of the group each shards over (none: no padding).
struct Builder {
  std::vector<ParamInfo>& params;
  std::vector<Piece>& pieces;
  std::vector<int>& piece_of_param;
  size_t offset = 0;

  void begin_piece(Communicator* group) {
    Piece p;
    p.begin = offset;
    p.group = group;
    if (group != nullptr) {
      p.members = static_cast<size_t>(group->size());
      p.member = static_cast<size_t>(group->rank());
    }
    pieces.push_back(std::move(p));
  }
  void end_piece() {
    Piece& p = pieces.back();
    p.len = offset - p.begin;
    p.shard_len = (p.len + p.members - 1) / p.members;
    offset = p.begin + p.shard_len * p.members;
  }
  void add(std::string name, int64_t rows, int64_t cols, int64_t grows, int64_t gcols, int64_t roff, int64_t coff,
           bool decay, bool replicated, bool in_norm = true) {
    ParamInfo p;
    p.name = std::move(name);
    p.rows = rows;
    p.cols = cols;
    p.global_rows = grows;
    p.global_cols = gcols;
    p.row_offset = roff;
    p.col_offset = coff;
    p.offset = offset;
    p.weight_decay = decay;
    p.tp_replicated = replicated;
    p.counted_in_norm = in_norm;
    offset += p.count();
    pieces.back().params.push_back(static_cast<int>(params.size()));
    piece_of_param.push_back(static_cast<int>(pieces.size()) - 1);
    params.push_back(std::move(p));
  }
};

constexpr float kInitStd = 0.02f;

}  // namespace

int param_index(const std::vector<ParamInfo>& params, const std::string& name) {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int>(i);
  return -1;
}

float init_normal(uint64_t seed, const std::string& name, uint64_t index) {
  return normal_from_key(param_key(seed, name), index);
}

ModelShard::ModelShard(Device& dev, const TransformerSpec& spec, int micro_batch, int tp_rank, int t,
                       const std::vector<int64_t>& stage_layers, const std::vector<int>& stages, uint64_t seed,
                       const ShardingOptions& sharding, bool sequence_parallel, int context, int context_rank, int expert,
                       int expert_rank, int expert_tensor, int expert_tensor_rank)
    : dev_(dev), spec_(spec), tp_rank_(tp_rank), t_(t), padded_vocab_(spec.padded_vocab(t)), sharding_(sharding) {
  if (sharding_.group == nullptr) sharding_.zero_stage = 0;
  PTDP_ASSERT(sharding_.zero_stage >= 0 && sharding_.zero_stage <= 3, "zero stage out of range");
  PTDP_ASSERT(!sharding_.offload_params || sharding_.zero_stage == 3, "offloading parameters needs stage 3");
  if (sharding_.zero_stage == 0) sharding_.offload_optimizer = sharding_.offload_params = false;
  if (sharding_.offload_params) sharding_.offload_optimizer = true;
  PTDP_ASSERT(spec.num_attention_heads % t == 0 && (spec.has_mla() || spec.query_groups() % t == 0) && spec.ffn() % t == 0,
              "tensor size must divide heads, query groups and ffn");
  const int num_stages = static_cast<int>(stage_layers.size());
  int64_t total = 0;
  for (int64_t n : stage_layers) total += n;
  // Every lane holds every layer once (DualPipe: two lanes, stage_layers repeated).
  const int lanes = spec.num_layers > 0 ? static_cast<int>(total / spec.num_layers) : 1;
  PTDP_ASSERT(lanes >= 1 && total == lanes * spec.num_layers && num_stages % lanes == 0, "the stages must hold every layer");
  const int lane_stages = num_stages / lanes;
  shape_.batch = micro_batch;
  shape_.seq = static_cast<int>(spec.seq_length);
  shape_.hidden = static_cast<int>(spec.hidden_size);
  shape_.heads_local = static_cast<int>(spec.num_attention_heads / t);
  shape_.groups_local = static_cast<int>(spec.query_groups() / t);
  shape_.head_dim = static_cast<int>(spec.head_dim());
  shape_.ffn_local = static_cast<int>(spec.ffn() / t);
  shape_.swiglu = spec.mlp == MlpKind::SwiGLU;
  shape_.rms_norm = spec.normalization == NormKind::RMSNorm;
  shape_.flash = spec.attention == AttentionKind::Flash;
  shape_.tp_rank = tp_rank;
  shape_.rotary_dim = static_cast<int>(spec.rotary_dim());
  shape_.dropout = static_cast<float>(spec.dropout_rate());
  shape_.rotary_base = spec.rotary_base;
  if (spec.has_mla()) {  // multi-head latent attention: one key/value head per query head
    shape_.groups_local = shape_.heads_local;
    shape_.head_dim = static_cast<int>(spec.qk_dim());
    shape_.v_dim = static_cast<int>(spec.v_dim());
    shape_.mla_q_lora = static_cast<int>(spec.mla.q_lora_rank);
    shape_.mla_kv_lora = static_cast<int>(spec.mla.kv_lora_rank);
    shape_.mla_rope = static_cast<int>(spec.mla.qk_pos_emb_head_dim);
  }
  expert_size_ = expert;
  expert_rank_ = expert_rank;
  etp_ = expert_tensor > 0 ? expert_tensor : t;
  etp_rank_ = expert_tensor > 0 ? expert_tensor_rank : tp_rank;
  if (spec.has_moe()) {
    PTDP_ASSERT(spec.moe.num_experts % expert == 0 && spec.expert_ffn() % etp_ == 0 && expert_rank < expert &&
                    etp_rank_ < etp_ && spec.moe.top_k >= 1 && spec.moe.top_k <= spec.moe.num_experts,
                "expert layout: experts divisible by the expert-parallel size, expert ffn by the expert-tensor size");
    shape_.moe_experts = static_cast<int>(spec.moe.num_experts);
    shape_.moe_top_k = static_cast<int>(spec.moe.top_k);
    shape_.moe_ffn_local = static_cast<int>(spec.expert_ffn() / etp_);
    shape_.moe_etp_rank = etp_rank_;
    shape_.moe_folded = etp_ != t;
    shape_.moe_local_experts = static_cast<int>(spec.moe.num_experts / expert);
    shape_.moe_first_expert = shape_.moe_local_experts * expert_rank;
    shape_.moe_capacity_factor = spec.moe.capacity_factor;
    const int64_t shared = spec.moe.shared_experts * spec.shared_expert_ffn();
    PTDP_ASSERT(shared % t == 0, "shared experts' inner size divisible by t");
    shape_.moe_shared_ffn_local = static_cast<int>(shared / t);
  }
  if (context > 1) {
    PTDP_ASSERT(spec.seq_length % (2 * context) == 0 && context_rank < context &&
                    (!(sequence_parallel && t > 1) || (spec.seq_length / context) % t == 0),
                "context parallelism needs seq_length divisible by 2·context (and, with sequence parallelism, by context·t)");
    shape_.seq = static_cast<int>(spec.seq_length / context);
    shape_.cp = context;
    shape_.cp_rank = context_rank;
  }
  if (sequence_parallel && t > 1) {
    PTDP_ASSERT(shape_.seq % t == 0, "sequence parallelism needs the rank's tokens of a sequence divisible by t");
    shape_.seq_parts = t;
    shape_.seq_part = tp_rank;
  }
  for (int id : stages) {
    auto st = std::make_unique<Stage>();
    st->slice_.stage = id;
    st->slice_.num_stages = num_stages;
    st->slice_.lane_stages = lane_stages;
    st->slice_.num_layers = static_cast<int>(stage_layers[static_cast<size_t>(id)]);
    int64_t first = 0;
    for (int k = id / lane_stages * lane_stages; k < id; ++k) first += stage_layers[static_cast<size_t>(k)];
    st->slice_.first_layer = static_cast<int>(first);
    stages_.push_back(std::move(st));
  }
  for (auto& st : stages_) build_stage(*st);
  for (auto& st : stages_) allocate_states(*st);
  for (auto& st : stages_) initialise(*st, seed);
  for (auto& st : stages_) link_views(*st);
  for (auto& st : stages_) build_units(*st);
}

bool ModelShard::holds_stage(int stage_id) const {
  return std::any_of(stages_.begin(), stages_.end(), [&](const auto& s) { return s->slice_.stage == stage_id; });
}

Stage& ModelShard::stage(int stage_id) {
  for (auto& s : stages_)
    if (s->slice_.stage == stage_id) return *s;
  PTDP_ASSERT(false, "stage " + std::to_string(stage_id) + " is not held by this rank");
  return *stages_.front();
}

Stage* ModelShard::first_stage_held() {
  for (auto& s : stages_)
    if (s->slice_.first()) return s.get();
  return nullptr;
}

void ModelShard::build_stage(Stage& st) {
  const int64_t tp = tp_rank_;
  Builder b{st.params_, st.pieces_, st.piece_of_param_};
  Communicator* const group = piece_group(false);
  const bool first = st.slice_.first(), last = st.slice_.last();
  // This rank's shard of a declared tensor (model/tensors.hpp): rows or columns
  // [tp·n/t, (tp+1)·n/t) of the serial tensor, or all of it; a routed expert's over the
  // expert-tensor group instead.
  auto add = [&](const ParamTensor& d, std::string name, bool in_norm = true) {
    const bool routed = d.owner == TensorOwner::RoutedExpert;
    const int64_t parts = routed ? etp_ : t_, part = routed ? etp_rank_ : tp;
    int64_t rows = d.rows, cols = d.cols, roff = 0, coff = 0;
    if (d.split == TensorSplit::Rows) {
      rows /= parts;
      roff = part * rows;
    } else if (d.split == TensorSplit::Cols) {
      cols /= parts;
      coff = part * cols;
    }
    b.add(std::move(name), rows, cols, d.rows, d.cols, roff, coff, d.weight_decay, d.split == TensorSplit::Replicated, in_norm);
    ParamInfo& p = st.params_.back();
    p.sequence_partial = d.sequence_partial;
    p.expert = d.owner == TensorOwner::RoutedExpert;
    p.init = d.init;
  };
  if (first)
    for (const ParamTensor& d : embedding_tensors(spec_, padded_vocab_)) {  // each its own piece
      b.begin_piece(group);
      add(d, tensor_name(d));
      b.end_piece();
    }
  const auto& pl = st.slice_;
  // The aux-loss-free expert bias: Megatron's router buffer (not a parameter: not in the counts),
  // kept in the layout so that it shards, gathers and checkpoints with its layer; no gradient
  // reaches it, update_expert_bias moves it.
  ParamTensor expert_bias;
  expert_bias.suffix = "mlp.router.expert_bias";
  expert_bias.rows = 1;
  expert_bias.cols = spec_.moe.num_experts;
  expert_bias.init = TensorInit::Zeros;
  expert_bias.weight_decay = false;
  expert_bias.sequence_partial = false;
  for (int i = pl.first_layer; i < pl.first_layer + pl.num_layers; ++i) {
    b.begin_piece(group);
    for (const ParamTensor& d : layer_tensors(spec_, i)) add(d, tensor_name(d, i));
    if (spec_.moe.aux_free && spec_.is_moe_layer(i)) add(expert_bias, tensor_name(expert_bias, i), false);
    b.end_piece();
  }
  if (last) {
    // The head's piece: the final norm, the untied output layer and the multi-token-prediction
    // modules (one unit: they run with the head).
    b.begin_piece(group);
    for (const ParamTensor& d : head_tensors(spec_, padded_vocab_)) add(d, tensor_name(d));
    for (int k = 0; k < spec_.mtp_layers; ++k) {
      for (const ParamTensor& d : mtp_tensors(spec_)) add(d, mtp_tensor_name(d, k));
      if (spec_.moe.aux_free && spec_.mtp_moe()) add(expert_bias, mtp_tensor_name(expert_bias, k), false);
    }
    b.end_piece();
    if (reads_embedding_at_head() && !first && first_stage_held() == nullptr) {
      // The tied LM head and the multi-token-prediction modules read the embedding; a rank
      // without a first stage keeps its own copy, kept equal by all-reducing the two gradients
      // (counted once in the norm, on the first stage). Its own piece: sharded exactly like the
      // first stage's word embedding.
      const ParamTensor word = embedding_tensors(spec_, padded_vocab_).front();
      b.begin_piece(group);
      add(word, tensor_name(word), false);
      b.end_piece();
    }
  }
  // This rank's routed experts of the stage's MoE layers: one region at the end of the layout.
  st.expert_begin_ = b.offset;
  bool experts = false;
  const std::vector<ParamTensor> expert = expert_tensors(spec_);
  for (int i = pl.first_layer; i < pl.first_layer + pl.num_layers; ++i) {
    if (!spec_.is_moe_layer(i)) continue;
    if (!experts) b.begin_piece(piece_group(true));
    experts = true;
    for (int le = 0; le < shape_.moe_local_experts; ++le)
      for (const ParamTensor& d : expert) add(d, tensor_name(d, i, shape_.moe_first_expert + le));
  }
  if (last && spec_.mtp_moe())
    for (int k = 0; k < spec_.mtp_layers; ++k) {
      if (!experts) b.begin_piece(piece_group(true));
      experts = true;
      for (int le = 0; le < shape_.moe_local_experts; ++le)
        for (const ParamTensor& d : expert) add(d, mtp_tensor_name(d, k, shape_.moe_first_expert + le));
    }
  if (experts) b.end_piece();
  // A later lane's copy (DualPipe): its gradients are summed with the first lane's copy, whose
  // rank counts them in the norm.
  if (st.slice_.copy())
    for (ParamInfo& p : st.params_) p.counted_in_norm = false;
  st.value_slots_.assign(st.params_.size(), {});
  st.grad_slots_.assign(st.params_.size(), {});
  // Each member's shard: block r of every piece (r its place in the piece's group), concatenated.
  for (Piece& pc : st.pieces_) {
    pc.shard_offset = st.shard_size_;
    st.shard_size_ += pc.shard_len;
    if (pc.begin < st.expert_begin_) st.expert_shard_begin_ = st.shard_size_;  // the dense pieces come first
    if (sharding_.zero_stage == 0) continue;
    const size_t lo = pc.begin + pc.member * pc.shard_len, hi = lo + pc.shard_len;
    for (int i : pc.params) {
      const ParamInfo& p = st.params_[static_cast<size_t>(i)];
      const size_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.count());
      if (a < e) st.segments_.push_back(ShardSegment{i, a - p.offset, e - a, pc.shard_offset + (a - lo)});
    }
  }
  st.flat_size_ = b.offset;
}

void ModelShard::initialise(Stage& st, uint64_t seed) {
  const float out_std = kInitStd / std::sqrt(2.0f * static_cast<float>(spec_.num_layers));
  std::vector<float> host;
  for (const ParamInfo& p : st.params_) {
    host.assign(p.count(), 0.0f);
    if (p.init == TensorInit::Ones) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (p.init == TensorInit::Normal || p.init == TensorInit::NormalScaled) {
      const float sd = p.init == TensorInit::NormalScaled ? out_std : kInitStd;
      const uint64_t key = param_key(seed, p.name);
      for (size_t i = 0; i < p.count(); ++i) host[i] = sd * normal_from_key(key, p.global_index(i));
    }  // biases and norms' shifts: zeros
    write_values(st, p, 0, p.count(), host.data());
  }
}

void ModelShard::link_views(Stage& st) {
  // Binds a view slot to a parameter (null when it does not exist). Under sharding the slots are
  // re-pointed whenever a piece is gathered, freed or given a full gradient (relink()).
  auto bind = [&](Stage& s, const std::string& name, bool values, float*& slot) {
    const int i = param_index(s.params_, name);
    slot = i < 0 ? nullptr : param_ptr(s, i, values);
    if (i >= 0) (values ? s.value_slots_ : s.grad_slots_)[static_cast<size_t>(i)].push_back(&slot);
  };
  const auto& pl = st.slice_;
  const int64_t vl = padded_vocab_ / t_;
  st.layer_w_.resize(pl.num_layers);
  st.layer_g_.resize(pl.num_layers);
  // A transformer layer's views from its tensors' names (prefix "layers.N." or an MTP module's
  // "mtp.layers.K.transformer_layer."): values (v) or gradients; `load` its expert counts.
  auto bind_layer = [&](const std::string& p, bool moe, bool v, LayerWeights& w, std::vector<float>& load) {
    bind(st, p + "ln1.weight", v, w.ln1_gamma);
    bind(st, p + "ln1.bias", v, w.ln1_beta);
    bind(st, p + "attention.qkv.weight", v, w.qkv_weight);
    bind(st, p + "attention.qkv.bias", v, w.qkv_bias);
    bind(st, p + "attention.q_down.weight", v, w.q_down);
    bind(st, p + "attention.q_norm.weight", v, w.q_norm_gamma);
    bind(st, p + "attention.q_norm.bias", v, w.q_norm_beta);
    bind(st, p + "attention.q_up.weight", v, w.q_up);
    bind(st, p + "attention.kv_down.weight", v, w.kv_down);
    bind(st, p + "attention.kv_norm.weight", v, w.kv_norm_gamma);
    bind(st, p + "attention.kv_norm.bias", v, w.kv_norm_beta);
    bind(st, p + "attention.kv_up.weight", v, w.kv_up);
    bind(st, p + "attention.proj.weight", v, w.proj_weight);
    bind(st, p + "attention.proj.bias", v, w.proj_bias);
    bind(st, p + "ln2.weight", v, w.ln2_gamma);
    bind(st, p + "ln2.bias", v, w.ln2_beta);
    bind(st, p + "mlp.fc1.weight", v, w.fc1_weight);
    bind(st, p + "mlp.fc1.bias", v, w.fc1_bias);
    bind(st, p + "mlp.fc2.weight", v, w.fc2_weight);
    bind(st, p + "mlp.fc2.bias", v, w.fc2_bias);
    bind(st, p + "mlp.gate.weight", v, w.gate_weight);
    bind(st, p + "mlp.gate.bias", v, w.gate_bias);
    if (!moe) return;
    bind(st, p + "mlp.router.weight", v, w.router);
    if (v && spec_.moe.aux_free) {
      bind(st, p + "mlp.router.expert_bias", true, w.expert_bias);
      load.assign(static_cast<size_t>(spec_.moe.num_experts), 0.0f);
      w.expert_load = load.data();
    }
    bind(st, p + "mlp.shared_experts.fc1.weight", v, w.shared_fc1);
    bind(st, p + "mlp.shared_experts.gate.weight", v, w.shared_gate);
    bind(st, p + "mlp.shared_experts.fc2.weight", v, w.shared_fc2);
    bind(st, p + "mlp.shared_experts.fc1.bias", v, w.shared_fc1_bias);
    bind(st, p + "mlp.shared_experts.gate.bias", v, w.shared_gate_bias);
    bind(st, p + "mlp.shared_experts.fc2.bias", v, w.shared_fc2_bias);
    const auto n = static_cast<size_t>(shape_.moe_local_experts);
    w.expert_fc1.assign(n, nullptr);
    w.expert_gate.assign(n, nullptr);
    w.expert_fc2.assign(n, nullptr);
    const size_t biased = spec_.has_bias() ? n : 0;
    w.expert_fc1_bias.assign(biased, nullptr);
    w.expert_gate_bias.assign(biased, nullptr);
    w.expert_fc2_bias.assign(biased, nullptr);
    for (size_t le = 0; le < n; ++le) {
      const std::string e = p + "mlp.experts." + std::to_string(shape_.moe_first_expert + static_cast<int>(le)) + ".";
      bind(st, e + "fc1.weight", v, w.expert_fc1[le]);
      bind(st, e + "gate.weight", v, w.expert_gate[le]);
      bind(st, e + "fc2.weight", v, w.expert_fc2[le]);
      if (le >= biased) continue;
      bind(st, e + "fc1.bias", v, w.expert_fc1_bias[le]);
      bind(st, e + "gate.bias", v, w.expert_gate_bias[le]);
      bind(st, e + "fc2.bias", v, w.expert_fc2_bias[le]);
    }
  };
  const size_t mtp = pl.last() ? static_cast<size_t>(spec_.mtp_layers) : 0;
  st.expert_load_.resize(static_cast<size_t>(pl.num_layers) + mtp);
  for (int k = 0; k < pl.num_layers; ++k)
    for (int which = 0; which < 2; ++which)
      bind_layer("layers." + std::to_string(pl.first_layer + k) + ".", spec_.is_moe_layer(pl.first_layer + k), which == 0,
                 which == 0 ? st.layer_w_[k] : st.layer_g_[k], st.expert_load_[static_cast<size_t>(k)]);
  st.mtp_w_.resize(mtp);
  st.mtp_g_.resize(mtp);
  for (size_t k = 0; k < mtp; ++k)
    for (int which = 0; which < 2; ++which) {
      MtpWeights& w = which == 0 ? st.mtp_w_[k] : st.mtp_g_[k];
      const bool v = which == 0;
      const std::string p = "mtp.layers." + std::to_string(k) + ".";
      bind(st, p + "enorm.weight", v, w.enorm_gamma);
      bind(st, p + "enorm.bias", v, w.enorm_beta);
      bind(st, p + "hnorm.weight", v, w.hnorm_gamma);
      bind(st, p + "hnorm.bias", v, w.hnorm_beta);
      bind(st, p + "eh_proj.weight", v, w.eh_proj);
      bind(st, p + "final_layernorm.weight", v, w.final_gamma);
      bind(st, p + "final_layernorm.bias", v, w.final_beta);
      bind_layer(p + "transformer_layer.", spec_.mtp_moe(), v, w.layer, st.expert_load_[static_cast<size_t>(pl.num_layers) + k]);
    }
  const int64_t first_row = tp_rank_ * vl;
  if (pl.first()) {
    for (int which = 0; which < 2; ++which) {
      EmbeddingWeights& e = which == 0 ? st.emb_w_ : st.emb_g_;
      bind(st, "embedding.word_embeddings.weight", which == 0, e.word);
      bind(st, "embedding.position_embeddings.weight", which == 0, e.position);
      e.first_row = first_row;
      e.rows = static_cast<int>(vl);
    }
  }
  if (pl.last()) {
    Stage* owner = &st;
    const std::string head = spec_.tie_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight";
    if (param_index(st.params_, head) < 0) owner = first_stage_held();  // tied, the rank's own first stage
    PTDP_ASSERT(param_index(owner->params_, head) >= 0, "the last stage has no word embedding");
    // Megatron's vocab-parallel cross entropy takes the softmax over the whole padded vocabulary:
    // the padding rows are initialised and trained like the others and take probability mass.
    const int valid = static_cast<int>(vl);
    for (int which = 0; which < 2; ++which) {
      HeadWeights& w = which == 0 ? st.head_w_ : st.head_g_;
      bind(st, "final_layernorm.weight", which == 0, w.lnf_gamma);
      bind(st, "final_layernorm.bias", which == 0, w.lnf_beta);
      bind(*owner, head, which == 0, w.word);
      w.first_col = first_row;
      w.vocab_cols = static_cast<int>(vl);
      w.valid_cols = valid;
    }
    if (spec_.mtp_layers > 0) {
      // The multi-token-prediction modules read the word embedding: this stage's own (first
      // stage), its copy, or the rank's first stage's.
      const std::string word = "embedding.word_embeddings.weight";
      Stage* table = param_index(st.params_, word) >= 0 ? &st : first_stage_held();
      PTDP_ASSERT(table != nullptr && param_index(table->params_, word) >= 0, "the last stage has no word embedding for MTP");
      for (int which = 0; which < 2; ++which) {
        EmbeddingWeights& e = which == 0 ? st.mtp_emb_w_ : st.mtp_emb_g_;
        bind(*table, word, which == 0, e.word);
        e.first_row = first_row;
        e.rows = static_cast<int>(vl);
      }
    }
  }
}

double ModelShard::forward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor input,
                           StageActivations& acts, RecomputeMode recompute) {
  Stage& st = stage(stage_id);
  const auto& pl = st.slice_;
  const int T = shape_.local_tokens(), h = shape_.hidden;  // the sequence-parallel shard
  const size_t layer0 = pl.first() ? 1 : 0;
  // Forward prefetch (stage 3): at most max_inflight_gathers units gathered at once, the
  // computing one included: before unit i computes, the next max_inflight_gathers − 1 start.
  const size_t window = static_cast<size_t>(std::max(1, sharding_.max_inflight_gathers) - 1);
  auto ahead = [&](size_t i) {
    for (size_t j = i + 1; j <= i + window && j < st.units_.size(); ++j) prefetch(st.units_[j]);
  };
  Tensor x;
  const bool shared_word = word_shared_by_end_units(st);
  if (pl.first()) {
    x = Tensor(dev_, T, h);
    acquire(st.units_.front());
    ahead(0);
    ctx.dropout.layer = -1;
    embedding_forward(ctx, shape_, st.emb_w_, tokens, x.data());
    if (!shared_word) release_after_forward(st.units_.front());
  } else {
    PTDP_ASSERT(input.rows() == T && input.cols() == h, "stage input of the wrong shape");
    x = std::move(input);
  }
  acts.inputs.clear();
  acts.inputs.resize(pl.num_layers);
  acts.layers.clear();
  if (recompute != RecomputeMode::Full) acts.layers.resize(pl.num_layers);
  for (int k = 0; k < pl.num_layers; ++k) {
    const Unit& unit = st.units_[layer0 + static_cast<size_t>(k)];
    Tensor y(dev_, T, h);
    acquire(unit);
    ahead(layer0 + static_cast<size_t>(k));
    ctx.dropout.layer = pl.first_layer + k;
    if (recompute == RecomputeMode::Full) {
      LayerActivations discard;  // full recompute keeps only each layer's input
      layer_forward(ctx, shape_, st.layer_w_[k], x.data(), y.data(), discard, false);
    } else {
      layer_forward(ctx, shape_, st.layer_w_[k], x.data(), y.data(), acts.layers[k],
                    recompute != RecomputeMode::Selective);
    }
    release_after_forward(unit);
    acts.inputs[k] = std::move(x);
    x = std::move(y);
  }
  double loss = 0;
  if (pl.last()) {
    acquire(st.units_.back());
    ahead(st.units_.size() - 1);
    loss = head_forward(ctx, shape_, st.head_w_, x.data(), targets, acts.head);
    // The multi-token-prediction modules, each from the previous depth's hidden states (the
    // first from the last layer's output, before the final norm): loss + scale/D Σ_k loss_k.
    acts.mtp.clear();
    acts.mtp.resize(st.mtp_w_.size());
    acts.mtp_loss = 0;
    for (size_t k = 0; k < st.mtp_w_.size(); ++k) {
      const float* h_prev = k == 0 ? x.data() : acts.mtp[k - 1].layer_out.data();
      const int32_t* depth_tokens = k == 0 ? tokens : acts.mtp[k - 1].tokens.data();  // rolled one place further
      const int32_t* depth_targets = k == 0 ? targets : acts.mtp[k - 1].targets.data();
      acts.mtp_loss += mtp_forward(ctx, shape_, st.mtp_w_[k], mtp_module(st, k), h_prev, depth_tokens, depth_targets,
                                   recompute == RecomputeMode::Full, recompute != RecomputeMode::Selective, acts.mtp[k]);
    }
    if (!acts.mtp.empty()) {
      acts.mtp_loss /= static_cast<double>(acts.mtp.size());
      loss += spec_.mtp_loss_scale * acts.mtp_loss;
    }
    release_after_forward(st.units_.back());
  }
  if (shared_word) release_after_forward(st.units_.front());  // held from the embedding to the head
  acts.output = std::move(x);  // last stage: the head's input, kept for its backward
  return loss;
}

Tensor ModelShard::backward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor dout,
                            StageActivations& acts, float loss_scale, RecomputeMode recompute, bool split) {
  Stage& st = stage(stage_id);
  const auto& pl = st.slice_;
  const int T = shape_.local_tokens(), h = shape_.hidden;  // the sequence-parallel shard
  const size_t layer0 = pl.first() ? 1 : 0;
  DeferredWeightGrads* defer = split ? &acts.deferred : nullptr;
  // Around each unit's backward: its parameters gathered (stage 3), its full gradients present
  // (stage ≥ 2), and after it the gradients that are complete reduce-scattered (not under a
  // split backward: the W still adds to them; nor when they are reduced once per step).
  // Backward prefetch (stage 3): the units in reverse order, the next ones' gathers (window as
  // in forward) started before the current unit's gradient computation.
  const size_t window = static_cast<size_t>(std::max(1, sharding_.max_inflight_gathers) - 1);
  struct BackwardGathers {  // the gathers this backward starts re-gather what its forwards kept
    bool& flag;
    explicit BackwardGathers(bool& f) : flag(f) { flag = true; }
    ~BackwardGathers() { flag = false; }
  } backward_gathers(gathering_for_backward_);
  auto begin_unit = [&](size_t i) {
    const Unit& u = st.units_[i];
    acquire(u);
    for (size_t n = 1; n <= window && n <= i; ++n) prefetch(st.units_[i - n]);
    open_grads(u);
  };
  auto end_unit = [&](const Unit& u) {
    release_after_backward(u);
    if (!split && !sharding_.reduce_once_per_step)
      for (auto [s, piece] : u.flush) {
        flush_grads(*s, piece);
        if (!buckets_.empty()) piece_final(*s, piece);  // overlapped reduction: the piece is final
      }
  };
  Tensor d;
  // The tied word embedding of a stage holding both ends: gathered once for the head's backward
  // and kept to the embedding's, as FSDP gathers a parameter two modules share (their common
  // ancestor's unit) and as the lowering counts it (the embedding's unit).
  const bool shared_word = word_shared_by_end_units(st);
  if (shared_word) {
    acquire(st.units_.front());
    open_grads(st.units_.front());  // the head's backward adds to the word embedding's gradient
  }
  if (pl.last()) {
    d = Tensor(dev_, T, h);
    begin_unit(st.units_.size() - 1);
    // The multi-token-prediction modules' backward first, the last depth's first: each gives
    // the gradient of its input hidden states, the first's joins the head's.
    Tensor d_mtp;
    for (size_t k = st.mtp_w_.size(); k-- > 0;) {
      const float* h_prev = k == 0 ? acts.output.data() : acts.mtp[k - 1].layer_out.data();
      Tensor d_prev(dev_, T, h);
      mtp_backward(ctx, shape_, st.mtp_w_[k], st.mtp_g_[k], mtp_module(st, k), st.mtp_emb_g_, st.head_g_.word,
                   mtp_loss_scale(loss_scale, static_cast<int>(k) + 1), recompute == RecomputeMode::Full, h_prev, acts.mtp[k],
                   d_mtp.empty() ? nullptr : d_mtp.data(), d_prev.data(), defer);
      d_mtp = std::move(d_prev);
    }
    head_backward(ctx, shape_, st.head_w_, st.head_g_, acts.output.data(), targets, loss_scale, std::move(acts.head),
                  d.data(), defer);
    if (!d_mtp.empty()) dev_.axpy(static_cast<size_t>(T) * h, 1.0f, d_mtp.data(), d.data());
    end_unit(st.units_.back());
  } else {
    PTDP_ASSERT(dout.rows() == T && dout.cols() == h, "output gradient of the wrong shape");
    d = std::move(dout);
  }
  acts.output.reset();
  for (int k = pl.num_layers - 1; k >= 0; --k) {
    const Unit& unit = st.units_[layer0 + static_cast<size_t>(k)];
    begin_unit(layer0 + static_cast<size_t>(k));
    ctx.dropout.layer = pl.first_layer + k;
    LayerActivations la;
    if (recompute == RecomputeMode::Full) {
      ctx.timed_recompute([&] {
        Tensor scratch(dev_, T, h);
        layer_forward(ctx, shape_, st.layer_w_[k], acts.inputs[k].data(), scratch.data(), la, true);
      });
    } else {
      la = std::move(acts.layers[k]);
    }
    Tensor dx(dev_, T, h);
    layer_backward(ctx, shape_, st.layer_w_[k], st.layer_g_[k], acts.inputs[k].data(), std::move(la), d.data(),
                   dx.data(), defer);
    end_unit(unit);
    acts.inputs[k].reset();
    d = std::move(dx);
  }
  acts.backward_done = true;
  if (split) ++pending_split_;
  if (pl.first()) {
    begin_unit(0);
    ctx.dropout.layer = -1;
    embedding_backward(ctx, shape_, st.emb_g_, tokens, d.data(), defer);
    end_unit(st.units_.front());
    if (shared_word) release(st.units_.front());
    return Tensor();
  }
  return d;
}

MtpModule ModelShard::mtp_module(const Stage& st, size_t k) const {
  MtpModule m;
  m.depth = static_cast<int>(k) + 1;
  m.layer_index = static_cast<int>(spec_.num_layers + static_cast<int64_t>(k));
  m.embedding = st.mtp_emb_w_;
  m.head = st.head_w_;
  return m;
}

float ModelShard::mtp_loss_scale(float loss_scale, int depth) const {
  // loss_scale is the main loss's: its gradient per token, the mean's 1/(b·s) included. Depth k's
  // loss is a mean over the b·(s − k) positions whose labels stay inside the sequence, weighted
  // by mtp_loss_scale / D in the loss trained. Under context parallelism both over the whole
  // sequences (each rank's loss is its share of the group's mean).
  const double whole = static_cast<double>(shape_.seq) * shape_.cp;
  const double tokens = static_cast<double>(shape_.batch) * whole;
  const double counted = static_cast<double>(shape_.batch) * (whole - depth);
  return static_cast<float>(loss_scale * spec_.mtp_loss_scale / static_cast<double>(spec_.mtp_layers) * tokens / counted);
}

void ModelShard::weight_backward(StageActivations& acts) {
  acts.deferred.run();
  if (pending_split_ > 0 && --pending_split_ == 0 && !sharding_.reduce_once_per_step) flush_all_grads();
}

std::vector<std::pair<float*, size_t>> ModelShard::sequence_parallel_grads(int stage_id) {
  std::vector<std::pair<float*, size_t>> out;
  if (!shape_.sequence_parallel()) return out;
  Stage& st = stage(stage_id);
  if (sharding_.zero_stage == 0) {
    for (const ParamInfo& p : st.params_)
      if (p.tp_replicated && p.sequence_partial) out.emplace_back(st.grads_.data() + p.offset, p.count());
  } else {  // every TP rank's shard has the same layout: sum the replicated parameters' segments
    for (const ShardSegment& g : st.segments_)
      if (st.params_[static_cast<size_t>(g.param)].tp_replicated && st.params_[static_cast<size_t>(g.param)].sequence_partial)
        out.emplace_back(st.grad_shard_.data() + g.shard_offset, g.count);
  }
  return out;
}

}  // namespace ptdp::exec
