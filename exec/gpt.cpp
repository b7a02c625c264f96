#include "exec/gpt.hpp"

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

// Appends parameters to a stage's flat buffer layout.
struct Builder {
  std::vector<ParamInfo>& params;
  size_t offset = 0;

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
    params.push_back(std::move(p));
  }
};

constexpr float kInitStd = 0.02f;

}  // namespace

float init_normal(uint64_t seed, const std::string& name, uint64_t index) {
  return normal_from_key(param_key(seed, name), index);
}

ModelShard::ModelShard(Device& dev, const TransformerSpec& spec, int micro_batch, int tp_rank, int t,
                       const std::vector<int64_t>& stage_layers, const std::vector<int>& stages, uint64_t seed,
                       bool sequence_parallel)
    : dev_(dev), spec_(spec), tp_rank_(tp_rank), t_(t), padded_vocab_(spec.padded_vocab(t)) {
  PTDP_ASSERT(spec.num_attention_heads % t == 0 && spec.query_groups() % t == 0 && spec.ffn() % t == 0,
              "tensor size must divide heads, query groups and ffn");
  const int num_stages = static_cast<int>(stage_layers.size());
  int64_t total = 0;
  for (int64_t n : stage_layers) total += n;
  PTDP_ASSERT(total == spec.num_layers, "the stages must hold every layer");
  shape_.batch = micro_batch;
  shape_.seq = static_cast<int>(spec.seq_length);
  shape_.hidden = static_cast<int>(spec.hidden_size);
  shape_.heads_local = static_cast<int>(spec.num_attention_heads / t);
  shape_.groups_local = static_cast<int>(spec.query_groups() / t);
  shape_.head_dim = static_cast<int>(spec.head_dim());
  shape_.ffn_local = static_cast<int>(spec.ffn() / t);
  shape_.swiglu = spec.mlp == MlpKind::SwiGLU;
  shape_.rms_norm = spec.normalization == NormKind::RMSNorm;
  if (sequence_parallel && t > 1) {
    PTDP_ASSERT(spec.seq_length % t == 0, "sequence parallelism needs seq_length divisible by t");
    shape_.seq_parts = t;
    shape_.seq_part = tp_rank;
  }
  for (int id : stages) {
    auto st = std::make_unique<Stage>();
    st->placement_.stage = id;
    st->placement_.num_stages = num_stages;
    st->placement_.num_layers = static_cast<int>(stage_layers[static_cast<size_t>(id)]);
    int64_t first = 0;
    for (int k = 0; k < id; ++k) first += stage_layers[static_cast<size_t>(k)];
    st->placement_.first_layer = static_cast<int>(first);
    stages_.push_back(std::move(st));
  }
  for (auto& st : stages_) build_stage(*st, st->placement_.stage, num_stages, stages);
  for (auto& st : stages_) initialise(*st, seed);
  for (auto& st : stages_) link_views(*st);
}

bool ModelShard::holds_stage(int stage_id) const {
  return std::any_of(stages_.begin(), stages_.end(), [&](const auto& s) { return s->placement_.stage == stage_id; });
}

Stage& ModelShard::stage(int stage_id) {
  for (auto& s : stages_)
    if (s->placement_.stage == stage_id) return *s;
  PTDP_ASSERT(false, "stage " + std::to_string(stage_id) + " is not held by this rank");
  return *stages_.front();
}

void ModelShard::build_stage(Stage& st, int stage_id, int num_stages, const std::vector<int>& stages) {
  const int64_t h = spec_.hidden_size, f = spec_.ffn(), s = spec_.seq_length, V = padded_vocab_;
  const int64_t vl = V / t_, tp = tp_rank_;
  Builder b{st.params_};
  const bool first = stage_id == 0, last = stage_id == num_stages - 1;
  if (first) {
    b.add("embedding.word_embeddings.weight", vl, h, V, h, tp * vl, 0, true, false);
    b.add("embedding.position_embeddings.weight", s, h, s, h, 0, 0, true, true);
  }
  const auto& pl = st.placement_;
  // QKV columns: query groups are contiguous (their query heads, key, value), so a TP rank's
  // groups are one column range of the serial tensor.
  const int64_t q_all = (spec_.num_attention_heads + 2 * spec_.query_groups()) * spec_.head_dim(), ql = q_all / t_;
  const bool layer_norm = spec_.normalization == NormKind::LayerNorm;
  auto norm = [&](const std::string& name) {
    b.add(name + ".weight", 1, h, 1, h, 0, 0, false, true);
    if (layer_norm) b.add(name + ".bias", 1, h, 1, h, 0, 0, false, true);
  };
  for (int i = pl.first_layer; i < pl.first_layer + pl.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    norm(p + "ln1");
    b.add(p + "attention.qkv.weight", h, ql, h, q_all, 0, tp * ql, true, false);
    b.add(p + "attention.qkv.bias", 1, ql, 1, q_all, 0, tp * ql, false, false);
    b.add(p + "attention.proj.weight", h / t_, h, h, h, tp * h / t_, 0, true, false);
    b.add(p + "attention.proj.bias", 1, h, 1, h, 0, 0, false, true);
    norm(p + "ln2");
    b.add(p + "mlp.fc1.weight", h, f / t_, h, f, 0, tp * f / t_, true, false);
    b.add(p + "mlp.fc1.bias", 1, f / t_, 1, f, 0, tp * f / t_, false, false);
    if (spec_.mlp == MlpKind::SwiGLU) {
      b.add(p + "mlp.gate.weight", h, f / t_, h, f, 0, tp * f / t_, true, false);
      b.add(p + "mlp.gate.bias", 1, f / t_, 1, f, 0, tp * f / t_, false, false);
    }
    b.add(p + "mlp.fc2.weight", f / t_, h, f, h, tp * f / t_, 0, true, false);
    b.add(p + "mlp.fc2.bias", 1, h, 1, h, 0, 0, false, true);
  }
  if (last) {
    norm("final_layernorm");
    if (!spec_.tie_embeddings) {
      b.add("output_layer.weight", vl, h, V, h, tp * vl, 0, true, false);
    } else if (!first && std::find(stages.begin(), stages.end(), 0) == stages.end()) {
      // The tied LM head reads the embedding; a rank without stage 0 keeps its own copy, kept
      // equal by all-reducing the two gradients (counted once in the norm, on the first stage).
      b.add("embedding.word_embeddings.weight", vl, h, V, h, tp * vl, 0, true, false, false);
    }
  }
  const size_t n = b.offset;
  st.values_ = Tensor(dev_, static_cast<int64_t>(n), 1);
  st.grads_ = Tensor::zeros(dev_, static_cast<int64_t>(n), 1);
  st.adam_m_ = Tensor::zeros(dev_, static_cast<int64_t>(n), 1);
  st.adam_v_ = Tensor::zeros(dev_, static_cast<int64_t>(n), 1);
}

void ModelShard::initialise(Stage& st, uint64_t seed) {
  const float out_std = kInitStd / std::sqrt(2.0f * static_cast<float>(spec_.num_layers));
  std::vector<float> host;
  for (const ParamInfo& p : st.params_) {
    host.assign(p.count(), 0.0f);
    auto ends_with = [&](const char* suffix) {
      const std::string s(suffix);
      return p.name.size() >= s.size() && p.name.compare(p.name.size() - s.size(), s.size(), s) == 0;
    };
    const bool layer_norm = ends_with("ln1.weight") || ends_with("ln2.weight") || ends_with("final_layernorm.weight");
    if (layer_norm) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (p.weight_decay) {  // weights: N(0, 0.02²), output layers scaled by 1/√(2l)
      const float sd = (ends_with("proj.weight") || ends_with("fc2.weight")) ? out_std : kInitStd;
      const uint64_t key = param_key(seed, p.name);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t c = 0; c < p.cols; ++c) {
          const uint64_t gi = static_cast<uint64_t>((p.row_offset + r) * p.global_cols + p.col_offset + c);
          host[static_cast<size_t>(r * p.cols + c)] = sd * normal_from_key(key, gi);
        }
    }  // biases and LayerNorm shifts: zeros
    dev_.upload(host.data(), st.values_.data() + p.offset, p.count());
  }
}

void ModelShard::link_views(Stage& st) {
  auto find = [&](Stage& s, const std::string& name, bool values) -> float* {
    for (const ParamInfo& p : s.params_)
      if (p.name == name) return (values ? s.values_.data() : s.grads_.data()) + p.offset;
    return nullptr;
  };
  const auto& pl = st.placement_;
  const int64_t vl = padded_vocab_ / t_;
  st.layer_w_.resize(pl.num_layers);
  st.layer_g_.resize(pl.num_layers);
  for (int k = 0; k < pl.num_layers; ++k) {
    const std::string p = "layers." + std::to_string(pl.first_layer + k) + ".";
    for (int which = 0; which < 2; ++which) {
      LayerWeights& w = which == 0 ? st.layer_w_[k] : st.layer_g_[k];
      const bool v = which == 0;
      w.ln1_gamma = find(st, p + "ln1.weight", v);
      w.ln1_beta = find(st, p + "ln1.bias", v);
      w.qkv_weight = find(st, p + "attention.qkv.weight", v);
      w.qkv_bias = find(st, p + "attention.qkv.bias", v);
      w.proj_weight = find(st, p + "attention.proj.weight", v);
      w.proj_bias = find(st, p + "attention.proj.bias", v);
      w.ln2_gamma = find(st, p + "ln2.weight", v);
      w.ln2_beta = find(st, p + "ln2.bias", v);
      w.fc1_weight = find(st, p + "mlp.fc1.weight", v);
      w.fc1_bias = find(st, p + "mlp.fc1.bias", v);
      w.fc2_weight = find(st, p + "mlp.fc2.weight", v);
      w.fc2_bias = find(st, p + "mlp.fc2.bias", v);
      w.gate_weight = find(st, p + "mlp.gate.weight", v);
      w.gate_bias = find(st, p + "mlp.gate.bias", v);
    }
  }
  const int64_t first_row = tp_rank_ * vl;
  if (pl.first()) {
    st.emb_w_ = EmbeddingWeights{find(st, "embedding.word_embeddings.weight", true),
                                 find(st, "embedding.position_embeddings.weight", true), first_row,
                                 static_cast<int>(vl)};
    st.emb_g_ = EmbeddingWeights{find(st, "embedding.word_embeddings.weight", false),
                                 find(st, "embedding.position_embeddings.weight", false), first_row,
                                 static_cast<int>(vl)};
  }
  if (pl.last()) {
    Stage* owner = &st;
    const std::string head = spec_.tie_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight";
    if (find(st, head, true) == nullptr) owner = &stage(0);  // tied, p = 1, v > 1
    const int valid = static_cast<int>(std::clamp<int64_t>(spec_.vocab_size - first_row, 0, vl));
    st.head_w_ = HeadWeights{find(st, "final_layernorm.weight", true), find(st, "final_layernorm.bias", true),
                             find(*owner, head, true), first_row, static_cast<int>(vl), valid};
    st.head_g_ = HeadWeights{find(st, "final_layernorm.weight", false), find(st, "final_layernorm.bias", false),
                             find(*owner, head, false), first_row, static_cast<int>(vl), valid};
    PTDP_ASSERT(st.head_w_.word != nullptr, "the last stage has no word embedding");
  }
}

double ModelShard::forward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor input,
                           StageActivations& acts, RecomputeMode recompute) {
  Stage& st = stage(stage_id);
  const auto& pl = st.placement_;
  const int T = shape_.local_tokens(), h = shape_.hidden;  // the sequence-parallel shard
  Tensor x;
  if (pl.first()) {
    x = Tensor(dev_, T, h);
    embedding_forward(ctx, shape_, st.emb_w_, tokens, x.data());
  } else {
    PTDP_ASSERT(input.rows() == T && input.cols() == h, "stage input of the wrong shape");
    x = std::move(input);
  }
  acts.inputs.clear();
  acts.inputs.resize(pl.num_layers);
  acts.layers.clear();
  if (recompute != RecomputeMode::Full) acts.layers.resize(pl.num_layers);
  for (int k = 0; k < pl.num_layers; ++k) {
    Tensor y(dev_, T, h);
    if (recompute == RecomputeMode::Full) {
      LayerActivations discard;  // full recompute keeps only each layer's input
      layer_forward(ctx, shape_, st.layer_w_[k], x.data(), y.data(), discard, false);
    } else {
      layer_forward(ctx, shape_, st.layer_w_[k], x.data(), y.data(), acts.layers[k],
                    recompute != RecomputeMode::Selective);
    }
    acts.inputs[k] = std::move(x);
    x = std::move(y);
  }
  double loss = 0;
  if (pl.last()) loss = head_forward(ctx, shape_, st.head_w_, x.data(), targets, acts.head);
  acts.output = std::move(x);  // last stage: the head's input, kept for its backward
  return loss;
}

Tensor ModelShard::backward(LayerContext& ctx, int stage_id, const int32_t* tokens, const int32_t* targets, Tensor dout,
                            StageActivations& acts, float loss_scale, RecomputeMode recompute, bool split) {
  Stage& st = stage(stage_id);
  const auto& pl = st.placement_;
  const int T = shape_.local_tokens(), h = shape_.hidden;  // the sequence-parallel shard
  DeferredWeightGrads* defer = split ? &acts.deferred : nullptr;
  Tensor d;
  if (pl.last()) {
    d = Tensor(dev_, T, h);
    head_backward(ctx, shape_, st.head_w_, st.head_g_, acts.output.data(), targets, loss_scale, std::move(acts.head),
                  d.data(), defer);
  } else {
    PTDP_ASSERT(dout.rows() == T && dout.cols() == h, "output gradient of the wrong shape");
    d = std::move(dout);
  }
  acts.output.reset();
  for (int k = pl.num_layers - 1; k >= 0; --k) {
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
    acts.inputs[k].reset();
    d = std::move(dx);
  }
  acts.backward_done = true;
  if (pl.first()) {
    embedding_backward(ctx, shape_, st.emb_g_, tokens, d.data(), defer);
    return Tensor();
  }
  return d;
}

std::vector<std::pair<float*, size_t>> ModelShard::sequence_parallel_grads(int stage_id) {
  std::vector<std::pair<float*, size_t>> out;
  if (!shape_.sequence_parallel()) return out;
  Stage& st = stage(stage_id);
  for (const ParamInfo& p : st.params_)
    if (p.tp_replicated) out.emplace_back(st.grads_.data() + p.offset, p.count());
  return out;
}

void ModelShard::zero_grads() {
  for (auto& st : stages_) dev_.fill(st->grads_.data(), st->grads_.size(), 0.0f);
}

double ModelShard::grad_sum_squares() {
  double total = 0;
  for (auto& st : stages_)
    for (const ParamInfo& p : st->params_) {
      if (!p.counted_in_norm || (p.tp_replicated && tp_rank_ != 0)) continue;
      total += dev_.sum_squares(p.count(), st->grads_.data() + p.offset);
    }
  return total;
}

std::vector<std::pair<float*, size_t>> ModelShard::tied_embedding_grads() {
  std::vector<std::pair<float*, size_t>> out;
  if (!spec_.tie_embeddings) return out;  // the output layer is its own parameter
  for (auto& st : stages_)
    for (const ParamInfo& p : st->params_)
      if (p.name == "embedding.word_embeddings.weight") out.emplace_back(st->grads_.data() + p.offset, p.count());
  return out;
}

void ModelShard::adam_step(const AdamOptions& opt, int64_t step, float grad_scale) {
  AdamStep a;
  a.lr = static_cast<float>(opt.lr);
  a.beta1 = static_cast<float>(opt.beta1);
  a.beta2 = static_cast<float>(opt.beta2);
  a.eps = static_cast<float>(opt.eps);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(opt.beta1, static_cast<double>(step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(opt.beta2, static_cast<double>(step)));
  a.grad_scale = grad_scale;
  for (auto& st : stages_)
    for (const ParamInfo& p : st->params_) {
      a.weight_decay = p.weight_decay ? static_cast<float>(opt.weight_decay) : 0.0f;
      const size_t off = p.offset;
      dev_.adam_update(p.count(), a, st->values_.data() + off, st->grads_.data() + off, st->adam_m_.data() + off,
                       st->adam_v_.data() + off);
    }
}

}  // namespace ptdp::exec
