#include "exec/io/megatron_state.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/error.hpp"
#include "model/tensors.hpp"

#include <nlohmann/json.hpp>

namespace ptdp::exec {
namespace {

// How one Megatron tensor is made of ptdp parameters, each of ptdp shape [rows, cols]:
//   Copy      one parameter, same layout ([rows, cols]);
//   Vector    [1, n] parameters concatenated into one 1-D tensor;
//   Transpose [in, out] parameters, each transposed to [out, in], stacked along the first dim.
enum class Kind { Copy, Vector, Transpose };

struct Mapping {
  std::string name;                // Megatron's
  std::vector<std::string> parts;  // ptdp's
  int64_t rows = 0, cols = 0;      // ptdp shape of each part
  Kind kind = Kind::Copy;
  bool vocab_rows = false;         // rows are the padded vocabulary (may differ between runs)

  std::vector<int64_t> shape() const {
    const int64_t n = static_cast<int64_t>(parts.size());
    switch (kind) {
      case Kind::Copy: return {rows, cols};
      case Kind::Vector: return {n * cols};
      case Kind::Transpose: return {n * cols, rows};
    }
    return {};
  }
};

std::vector<Mapping> mappings(const TransformerSpec& spec, int64_t padded_vocab) {
  const int64_t h = spec.hidden_size, f = spec.ffn(), s = spec.seq_length;
  const int64_t q_all = (spec.num_attention_heads + 2 * spec.query_groups()) * spec.head_dim();
  const bool layer_norm = spec.normalization == NormKind::LayerNorm, bias = spec.has_bias(),
             swiglu = spec.mlp == MlpKind::SwiGLU;
  std::vector<Mapping> out;
  auto add = [&](std::string name, std::vector<std::string> parts, int64_t rows, int64_t cols, Kind kind) {
    out.push_back(Mapping{std::move(name), std::move(parts), rows, cols, kind, false});
  };
  auto norm = [&](const std::string& meg, const std::string& ptdp, int64_t width = 0) {
    add(meg + ".weight", {ptdp + ".weight"}, 1, width > 0 ? width : h, Kind::Vector);
    if (layer_norm) add(meg + ".bias", {ptdp + ".bias"}, 1, width > 0 ? width : h, Kind::Vector);
  };
  // A column- or row-parallel linear layer: ptdp's [in, out] weights (gate first for SwiGLU's
  // fused fc1, as Megatron chunks it) and their biases.
  auto linear = [&](const std::string& meg, std::vector<std::string> ptdp, int64_t in, int64_t out_cols, bool with_bias) {
    std::vector<std::string> w, b;
    for (const std::string& p : ptdp) {
      w.push_back(p + ".weight");
      b.push_back(p + ".bias");
    }
    add(meg + ".weight", w, in, out_cols, Kind::Transpose);
    if (with_bias) add(meg + ".bias", b, 1, out_cols, Kind::Vector);
  };
  add("embedding.word_embeddings.weight", {"embedding.word_embeddings.weight"}, padded_vocab, h, Kind::Copy);
  out.back().vocab_rows = true;
  if (spec.learned_positions())  // rotary and no position embeddings have no table (Megatron's Llama)
    add("embedding.position_embeddings.weight", {"embedding.position_embeddings.weight"}, s, h, Kind::Copy);
  // One transformer layer: Megatron's names under `m`, ptdp's under `p` (a decoder layer, or a
  // multi-token-prediction module's transformer_layer), dense or with experts.
  auto layer = [&](const std::string& m, const std::string& p, bool moe) {
    norm(m + "input_layernorm", p + "ln1");
    if (spec.has_mla()) {  // MLASelfAttention (local spec: the latents' norms q_layernorm, kv_layernorm)
      const MlaSpec& a = spec.mla;
      const std::string sa = m + "self_attention.";
      if (a.q_lora_rank > 0) {
        linear(sa + "linear_q_down_proj", {p + "attention.q_down"}, h, a.q_lora_rank, false);
        norm(sa + "q_layernorm", p + "attention.q_norm", a.q_lora_rank);
      }
      linear(sa + (a.q_lora_rank > 0 ? "linear_q_up_proj" : "linear_q_proj"), {p + "attention.q_up"},
             a.q_lora_rank > 0 ? a.q_lora_rank : h, spec.num_attention_heads * spec.qk_dim(), false);
      linear(sa + "linear_kv_down_proj", {p + "attention.kv_down"}, h, a.kv_lora_rank + a.qk_pos_emb_head_dim, false);
      norm(sa + "kv_layernorm", p + "attention.kv_norm", a.kv_lora_rank);
      linear(sa + "linear_kv_up_proj", {p + "attention.kv_up"}, a.kv_lora_rank,
             spec.num_attention_heads * (a.qk_head_dim + a.v_head_dim), false);
    } else {
      linear(m + "self_attention.linear_qkv", {p + "attention.qkv"}, h, q_all, bias);
    }
    // The heads' outputs (heads · head_dim; MLA heads · v_head_dim) back to h.
    linear(m + "self_attention.linear_proj", {p + "attention.proj"}, spec.num_attention_heads * spec.v_dim(), h, bias);
    norm(m + "pre_mlp_layernorm", p + "ln2");
    if (moe) {
      linear(m + "mlp.router", {p + "mlp.router"}, h, spec.moe.num_experts, false);
      if (spec.moe.aux_free)  // the aux-loss-free router's buffer
        add(m + "mlp.router.expert_bias", {p + "mlp.router.expert_bias"}, 1, spec.moe.num_experts, Kind::Vector);
      const int64_t fe = spec.expert_ffn();
      for (int64_t e = 0; e < spec.moe.num_experts; ++e) {
        const std::string me = m + "mlp.experts.local_experts." + std::to_string(e) + ".",
                          pe = p + "mlp.experts." + std::to_string(e) + ".";
        linear(me + "linear_fc1", swiglu ? std::vector<std::string>{pe + "gate", pe + "fc1"} : std::vector<std::string>{pe + "fc1"},
               h, fe, bias);
        linear(me + "linear_fc2", {pe + "fc2"}, fe, h, bias);
      }
      if (spec.moe.shared_experts > 0) {  // Megatron's SharedExpertMLP: one MLP of shared · ffn inner size
        const int64_t fs = spec.moe.shared_experts * spec.shared_expert_ffn();
        const std::string ms = m + "mlp.shared_experts.", ps = p + "mlp.shared_experts.";
        linear(ms + "linear_fc1", swiglu ? std::vector<std::string>{ps + "gate", ps + "fc1"} : std::vector<std::string>{ps + "fc1"},
               h, fs, bias);
        linear(ms + "linear_fc2", {ps + "fc2"}, fs, h, bias);
      }
      return;
    }
    linear(m + "mlp.linear_fc1", swiglu ? std::vector<std::string>{p + "mlp.gate", p + "mlp.fc1"} : std::vector<std::string>{p + "mlp.fc1"},
           h, f, bias);
    linear(m + "mlp.linear_fc2", {p + "mlp.fc2"}, f, h, bias);
  };
  for (int64_t i = 0; i < spec.num_layers; ++i)
    layer("decoder.layers." + std::to_string(i) + ".", "layers." + std::to_string(i) + ".", spec.is_moe_layer(i));
  norm("decoder.final_layernorm", "final_layernorm");
  // Megatron-Core's MultiTokenPredictionBlock (GPTModel.mtp, after the decoder): per module its
  // own tensors under the names model/tensors.hpp declares (the same in both: enorm, hnorm,
  // eh_proj, final_layernorm; eh_proj column-parallel, [h, 2h] over the input [embedding;
  // hidden] as the executor concatenates it), and its transformer_layer as a decoder layer's.
  for (int64_t k = 0; k < spec.mtp_layers; ++k) {
    for (const ParamTensor& t : mtp_tensors(spec)) {
      if (t.owner != TensorOwner::Head) continue;  // the module's layer: below
      const std::string name = mtp_tensor_name(t, k);
      add(name, {name}, t.rows, t.cols, t.rows == 1 ? Kind::Vector : Kind::Transpose);
    }
    const std::string prefix = "mtp.layers." + std::to_string(k) + ".transformer_layer.";
    layer(prefix, prefix, spec.mtp_moe());
  }
  if (!spec.tie_embeddings) {
    add("output_layer.weight", {"output_layer.weight"}, padded_vocab, h, Kind::Copy);
    out.back().vocab_rows = true;
  }
  return out;
}

// A row-major [rows, cols] matrix at `v` as [cols, rows].
std::vector<float> transposed(const float* v, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = v[r * cols + c];
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The tensors of a Hugging Face file under the names a reader looks them up by (a prefix such as
// "transformer." or "model." dropped), each taken at most once: `need` checks a shape (negative
// entries: at least), `output_layer` the LM head, `check_all_taken` names the first tensor of the
// file that no lookup took.
class HfTensors {
 public:
  HfTensors(const TransformerSpec& spec, std::string source, std::string key, std::string layout, std::string shown_prefix,
            std::string shape_hint, std::string leftover_hint)
      : spec_(spec), source_(std::move(source)), key_(std::move(key)), layout_(std::move(layout)),
        shown_prefix_(std::move(shown_prefix)), shape_hint_(std::move(shape_hint)), leftover_hint_(std::move(leftover_hint)) {}

  void add(const std::string& name, const NamedTensor& t) {
    if (by_.emplace(name, &t).second) order_.push_back(name);
  }
  bool has(const std::string& name) const { return by_.count(name) != 0; }
  const NamedTensor& need(const std::string& name, const std::vector<int64_t>& shape) {
    const auto it = by_.find(name);
    if (it == by_.end()) throw ConfigError(key_, source_ + " has no tensor '" + shown_prefix_ + name + "' (" + layout_ + ")");
    const NamedTensor& t = *it->second;
    bool fits = t.shape.size() == shape.size();
    for (size_t i = 0; fits && i < shape.size(); ++i) fits = shape[i] >= 0 ? t.shape[i] == shape[i] : t.shape[i] >= -shape[i];
    if (!fits)
      throw ConfigError(key_, source_ + ": tensor '" + printable(t.name) + "' has shape " + shape_text(t.shape) + ", this model's " +
                                  spec_.name + " needs " + shape_text(shape) + " (negative: at least" + shape_hint_ + ")");
    taken_.insert(name);
    return t;
  }
  // The LM head: `head` (lm_head.weight) for an untied model; a tied model takes one only when it
  // equals the word embedding `wte`; a file without one starts an untied model's head as `wte`.
  void output_layer(std::vector<NamedTensor>& out, const std::string& head, const NamedTensor& wte) {
    if (has(head)) {
      const NamedTensor& t = need(head, {-spec_.vocab_size, spec_.hidden_size});
      if (!spec_.tie_embeddings) out.push_back(NamedTensor{"output_layer.weight", t.shape, t.values});
      else if (t.shape != wte.shape || t.values != wte.values)
        throw ConfigError(key_, source_ + ": lm_head.weight differs from the word embedding, but the model ties them "
                                          "(model.tie_embeddings: false for an untied head)");
    } else if (!spec_.tie_embeddings) {
      out.push_back(NamedTensor{"output_layer.weight", wte.shape, wte.values});
    }
  }
  void check_all_taken() const {
    for (const std::string& name : order_)
      if (!taken_.count(name)) unmapped(name);
  }
  // Before any shape is checked: the file's first tensor whose name is none of `names` (the
  // layout's parameters for this model) — a file of another architecture is named by it.
  void check_names(const std::set<std::string>& names) const {
    for (const std::string& name : order_)
      if (!names.count(name)) unmapped(name);
  }

 private:
  [[noreturn]] void unmapped(const std::string& name) const {
    throw ConfigError(key_, source_ + ": tensor '" + printable(by_.at(name)->name) + "' maps to nothing in " + layout_ + " for this model (" +
                                std::to_string(spec_.num_layers) + " layers" + leftover_hint_ + ")");
  }

  const TransformerSpec& spec_;
  std::string source_, key_, layout_, shown_prefix_, shape_hint_, leftover_hint_;
  std::map<std::string, const NamedTensor*> by_;
  std::vector<std::string> order_;
  std::set<std::string> taken_;
};

// A Hugging Face export of a model with multi-token prediction: refused naming its first module
// tensor (transformers' GPT-2 and Llama have no MTP modules; dropping them would lose trained weights).
void refuse_mtp(const std::vector<NamedTensor>& megatron, const std::string& key, const char* hf_class) {
  for (const NamedTensor& t : megatron)
    if (t.name.rfind("mtp.", 0) == 0)
      throw ConfigError(key, "the model has multi-token prediction ('" + printable(t.name) + "'); transformers' " + hf_class +
                                 " has no MTP modules (model.safetensors is Megatron-Core's state dict, with them)");
}

}  // namespace

uint64_t megatron_state_elements(const TransformerSpec& spec, int64_t padded_vocab) {
  uint64_t n = 0;
  for (const Mapping& mp : mappings(spec, padded_vocab)) n += static_cast<uint64_t>(mp.rows * mp.cols) * mp.parts.size();
  return n;
}

std::vector<NamedTensor> to_megatron_state(const TransformerSpec& spec, int64_t padded_vocab, const ParameterSet& params) {
  std::vector<NamedTensor> out;
  for (const Mapping& mp : mappings(spec, padded_vocab)) {
    NamedTensor t{mp.name, mp.shape(), {}};
    t.values.reserve(static_cast<size_t>(mp.rows * mp.cols) * mp.parts.size());
    for (const std::string& part : mp.parts) {
      const auto it = params.find(part);
      PTDP_ASSERT(it != params.end() && it->second.size() == static_cast<size_t>(mp.rows * mp.cols),
                  "parameter " + part + " missing or of another size for " + mp.name);
      const std::vector<float> v = mp.kind == Kind::Transpose ? transposed(it->second.data(), mp.rows, mp.cols) : it->second;
      t.values.insert(t.values.end(), v.begin(), v.end());
    }
    out.push_back(std::move(t));
  }
  return out;
}

ParameterSet from_megatron_state(const TransformerSpec& spec, int64_t padded_vocab, const std::vector<NamedTensor>& tensors,
                                 const std::string& source, const std::string& key,
                                 const std::map<std::string, std::string>* metadata) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  const std::vector<Mapping> maps = mappings(spec, padded_vocab);
  std::set<std::string> known;
  for (const Mapping& mp : maps) known.insert(mp.name);
  // Learned positions against rotary (or none): the position table decides, named with both sides.
  const std::string positions = "embedding.position_embeddings.weight";
  const std::string mine = "this model has model.position_embedding: " + to_string(spec.position_kind());
  if (by_name.count(positions) && !spec.learned_positions())
    throw ConfigError(key, source + ": tensor '" + positions + "' holds learned absolute position embeddings, but " + mine +
                               " (no position table); give a state dict of a " + to_string(spec.position_kind()) +
                               " model, or set model.position_embedding: learned");
  if (!by_name.count(positions) && spec.learned_positions() && by_name.count("embedding.word_embeddings.weight"))
    throw ConfigError(key, source + " has no tensor '" + positions + "': it was saved by a model with rotary or no position "
                               "embeddings, but " + mine + "; set model.position_embedding to the saved model's (rope for Llama)");
  if (metadata != nullptr) {
    const auto it = metadata->find("ptdp_position_embedding");
    if (it != metadata->end() && it->second != to_string(spec.position_kind()))
      throw ConfigError(key, source + " was saved by a model with model.position_embedding: " + printable(it->second) + " (its metadata '" +
                                 it->first + "'), but " + mine);
  }
  // Multi-token prediction saved and not in the model, or the reverse: the module's tensor named
  // with model.mtp_layers of both sides.
  const std::string mtp_count = "this model has model.mtp_layers: " + std::to_string(spec.mtp_layers);
  for (const NamedTensor& t : tensors)
    if (!known.count(t.name) && t.name.rfind("mtp.layers.", 0) == 0)
      throw ConfigError(key, source + ": tensor '" + printable(t.name) + "' is a multi-token-prediction module's, but " + mtp_count +
                                 " (set model.mtp_layers to the saved model's)");
  for (const Mapping& mp : maps)
    if (!by_name.count(mp.name) && mp.name.rfind("mtp.layers.", 0) == 0 && by_name.count("embedding.word_embeddings.weight"))
      throw ConfigError(key, source + " has no tensor '" + mp.name + "': it was saved with fewer multi-token-prediction modules, but " +
                                 mtp_count + " (set model.mtp_layers to the saved model's)");
  for (const NamedTensor& t : tensors)
    if (!known.count(t.name))
      throw ConfigError(key, source + ": tensor '" + printable(t.name) + "' is not a parameter of this model (" + spec.name +
                                 ", " + std::to_string(spec.num_layers) + " layers" +
                                 (spec.tie_embeddings ? ", tied embeddings" : "") +
                                 "; expected Megatron-LM's names: embedding.word_embeddings.weight, decoder.layers.N.…, output_layer.weight" +
                                 (key == "--init" ? ", or a Hugging Face GPT-2 (transformer.…) or Llama/Mistral (model.…) file" : "") + ")");
  ParameterSet out;
  for (const Mapping& mp : maps) {
    const auto it = by_name.find(mp.name);
    if (it == by_name.end()) throw ConfigError(key, source + " has no tensor '" + mp.name + "'");
    const NamedTensor& t = *it->second;
    std::vector<int64_t> want = mp.shape();
    if (mp.vocab_rows && t.shape.size() == 2 && t.shape[1] == mp.cols && t.shape[0] >= spec.vocab_size) {
      // Another padding of the same vocabulary: the common rows; the others 0.
      std::vector<float> v(static_cast<size_t>(mp.rows * mp.cols), 0.0f);
      const int64_t rows = std::min(mp.rows, t.shape[0]);
      std::copy(t.values.begin(), t.values.begin() + rows * mp.cols, v.begin());
      out[mp.parts[0]] = std::move(v);
      continue;
    }
    if (t.shape != want)
      throw ConfigError(key, source + ": tensor '" + mp.name + "' has shape " + shape_text(t.shape) + ", this model's is " +
                                 shape_text(want) + (mp.vocab_rows ? " (at least " + std::to_string(spec.vocab_size) + " rows)" : ""));
    const size_t part_size = static_cast<size_t>(mp.rows * mp.cols);
    for (size_t k = 0; k < mp.parts.size(); ++k) {
      const float* src = t.values.data() + k * part_size;
      out[mp.parts[k]] = mp.kind == Kind::Transpose ? transposed(src, mp.cols, mp.rows) : std::vector<float>(src, src + part_size);
    }
  }
  return out;
}

HfExport to_hf_gpt2(const std::vector<NamedTensor>& megatron, int64_t vocab_size, int num_heads, const std::string& key) {
  std::map<std::string, const NamedTensor*> by;
  for (const NamedTensor& t : megatron) by[t.name] = &t;
  // A tensor of the given shape (a negative size: any positive one, or at least -size rows).
  auto need = [&](const std::string& name, std::vector<int64_t> shape) -> const NamedTensor& {
    const auto it = by.find(name);
    if (it == by.end())
      throw ConfigError(key, "GPT-2's architecture needs '" + name + "' (LayerNorm, GELU MLP, biases, learned positions); this model has none" +
                                 (name == "embedding.position_embeddings.weight" ? " (its positions are rotary or none)" : ""));
    const NamedTensor& t = *it->second;
    bool fits = t.shape.size() == shape.size();
    for (size_t i = 0; fits && i < shape.size(); ++i) fits = shape[i] >= 0 ? t.shape[i] == shape[i] : t.shape[i] >= std::max<int64_t>(1, -shape[i]);
    if (!fits)
      throw ConfigError(key, "'" + name + "' has shape " + shape_text(t.shape) + ", not GPT-2's (multi-head attention, a GELU MLP)");
    return t;
  };
  refuse_mtp(megatron, key, "GPT2LMHeadModel");
  for (const auto& [name, t] : by)
    if (name.find(".mlp.router.") != std::string::npos)
      throw ConfigError(key, "the model has experts ('" + name + "'); GPT-2's architecture has a dense MLP");
  if (vocab_size < 1 || num_heads < 1) throw ConfigError(key, "needs a vocabulary and heads");
  const NamedTensor& wte = need("embedding.word_embeddings.weight", {-vocab_size, -1});
  const int64_t h = wte.shape[1];
  if (h % num_heads != 0) throw ConfigError(key, "the hidden size " + std::to_string(h) + " is not a multiple of " + std::to_string(num_heads) + " heads");
  int64_t layers = 0;
  while (by.count("decoder.layers." + std::to_string(layers) + ".self_attention.linear_qkv.weight")) ++layers;
  HfExport out;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    out.tensors.push_back(NamedTensor{name, std::move(shape), std::move(values)});
  };
  auto rows = [&](const NamedTensor& t, int64_t n) {  // the first n rows of a [rows, cols] tensor
    return std::vector<float>(t.values.begin(), t.values.begin() + n * t.shape[1]);
  };
  // [out, in] → Conv1D's [in, out].
  auto conv1d = [](const NamedTensor& t) { return transposed(t.values.data(), t.shape[0], t.shape[1]); };
  put("transformer.wte.weight", {vocab_size, h}, rows(wte, vocab_size));
  const NamedTensor& wpe = need("embedding.position_embeddings.weight", {-1, h});
  put("transformer.wpe.weight", wpe.shape, wpe.values);
  const int64_t d = h / num_heads;
  int64_t ffn = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const std::string m = "decoder.layers." + std::to_string(l) + ".", g = "transformer.h." + std::to_string(l) + ".";
    for (const auto& [meg, hf] : {std::pair{"input_layernorm", "ln_1"}, std::pair{"pre_mlp_layernorm", "ln_2"}}) {
      put(g + hf + ".weight", {h}, need(m + meg + ".weight", {h}).values);
      put(g + hf + ".bias", {h}, need(m + meg + ".bias", {h}).values);
    }
    // Megatron's QKV rows go per head (q_j, k_j, v_j); GPT-2's c_attn columns are all queries,
    // then all keys, then all values.
    const NamedTensor& qkv = need(m + "self_attention.linear_qkv.weight", {3 * h, h});
    const NamedTensor& qkv_b = need(m + "self_attention.linear_qkv.bias", {3 * h});
    std::vector<float> w(static_cast<size_t>(3 * h * h)), b(static_cast<size_t>(3 * h));
    for (int64_t j = 0; j < num_heads; ++j)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t e = 0; e < d; ++e) {
          const int64_t from = (j * 3 + part) * d + e, to = part * h + j * d + e;  // Megatron row → GPT-2 column
          b[static_cast<size_t>(to)] = qkv_b.values[static_cast<size_t>(from)];
          for (int64_t c = 0; c < h; ++c) w[static_cast<size_t>(c * 3 * h + to)] = qkv.values[static_cast<size_t>(from * h + c)];
        }
    put(g + "attn.c_attn.weight", {h, 3 * h}, std::move(w));
    put(g + "attn.c_attn.bias", {3 * h}, std::move(b));
    const int64_t f = need(m + "mlp.linear_fc2.weight", {h, -1}).shape[1];
    for (const auto& [meg, hf, out_size, in_size] : {std::tuple{"self_attention.linear_proj", "attn.c_proj", h, h},
                                                     std::tuple{"mlp.linear_fc1", "mlp.c_fc", f, h}, std::tuple{"mlp.linear_fc2", "mlp.c_proj", h, f}}) {
      const NamedTensor& t = need(m + meg + ".weight", {out_size, in_size});  // a gated fc1 is [2f, h]: refused here
      put(g + hf + ".weight", {in_size, out_size}, conv1d(t));
      put(g + hf + ".bias", {out_size}, need(m + meg + ".bias", {out_size}).values);
    }
    ffn = f;
  }
  if (layers == 0) throw ConfigError(key, "the state dict has no transformer layers");
  put("transformer.ln_f.weight", {h}, need("decoder.final_layernorm.weight", {h}).values);
  put("transformer.ln_f.bias", {h}, need("decoder.final_layernorm.bias", {h}).values);
  const bool tied = !by.count("output_layer.weight");
  if (!tied) put("lm_head.weight", {vocab_size, h}, rows(need("output_layer.weight", {-vocab_size, h}), vocab_size));
  const nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"model_type", "gpt2"},
                                 {"vocab_size", vocab_size},
                                 {"n_positions", wpe.shape[0]},
                                 {"n_embd", h},
                                 {"n_layer", layers},
                                 {"n_head", num_heads},
                                 {"n_inner", ffn},
                                 {"activation_function", "gelu_new"},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"resid_pdrop", 0.0},
                                 {"embd_pdrop", 0.0},
                                 {"attn_pdrop", 0.0},
                                 {"tie_word_embeddings", tied},
                                 // GPT-2's end-of-text id is the vocabulary's last (50256 of 50257):
                                 // in the vocabulary whatever its size, as transformers checks.
                                 {"bos_token_id", vocab_size - 1},
                                 {"eos_token_id", vocab_size - 1},
                                 {"torch_dtype", "float32"}};
  out.config_json = config.dump(2) + "\n";
  return out;
}

bool is_hf_state(const std::vector<NamedTensor>& tensors) {
  for (const auto& t : tensors)
    for (const char* prefix : {"transformer.", "wte.", "wpe.", "h.", "lm_head.", "model.embed_tokens.", "model.layers.", "model.norm.", "embed_tokens."})
      if (t.name.rfind(prefix, 0) == 0) return true;
  return false;
}

std::vector<NamedTensor> from_hf_gpt2(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                      const std::string& key) {
  const int64_t h = spec.hidden_size, heads = spec.num_attention_heads;
  if (heads < 1 || h % heads != 0) throw ConfigError(key, "the model's heads do not divide its hidden size");
  const int64_t d = h / heads;
  const std::string expected =
      "GPT-2's layout: transformer.wte/wpe.weight, transformer.h.N.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias}, "
      "transformer.ln_f.{weight,bias}, lm_head.weight";
  HfTensors file(spec, source, key, expected, "", "", "");
  for (const auto& t : hf) {
    std::string name = t.name.rfind("transformer.", 0) == 0 ? t.name.substr(12) : t.name;
    auto ends_with = [&](const std::string& tail) { return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0; };
    if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) continue;  // GPT-2's causal-mask buffers, not parameters
    if (name.rfind("model.", 0) == 0)
      throw ConfigError(key, source + ": tensor '" + printable(t.name) + "' is Llama-style (model.layers.N.…); --init reads " + expected +
                                 " for this GPT-2-style model (a Llama/Mistral file needs model.mlp: swiglu, model.normalization: rmsnorm)");
    file.add(name, t);
  }
  std::set<std::string> names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight"};
  for (int64_t l = 0; l < spec.num_layers; ++l)
    for (const char* part : {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"})
      for (const char* kind : {".weight", ".bias"}) names.insert("h." + std::to_string(l) + "." + part + kind);
  file.check_names(names);
  auto need = [&](const std::string& name, const std::vector<int64_t>& shape) -> const NamedTensor& { return file.need(name, shape); };
  std::vector<NamedTensor> out;
  auto put = [&](std::string name, std::vector<int64_t> shape, std::vector<float> values) {
    out.push_back(NamedTensor{std::move(name), std::move(shape), std::move(values)});
  };
  const NamedTensor& wte = need("wte.weight", {-spec.vocab_size, h});
  put("embedding.word_embeddings.weight", wte.shape, wte.values);
  const NamedTensor& wpe = need("wpe.weight", {-spec.seq_length, h});
  put("embedding.position_embeddings.weight", {spec.seq_length, h},
      std::vector<float>(wpe.values.begin(), wpe.values.begin() + spec.seq_length * h));
  const int64_t f = spec.ffn();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string g = "h." + std::to_string(l) + ".", m = "decoder.layers." + std::to_string(l) + ".";
    for (const auto& [hf_name, meg] : {std::pair{"ln_1", "input_layernorm"}, std::pair{"ln_2", "pre_mlp_layernorm"}}) {
      put(m + meg + ".weight", {h}, need(g + hf_name + ".weight", {h}).values);
      put(m + meg + ".bias", {h}, need(g + hf_name + ".bias", {h}).values);
    }
    // c_attn's columns: all queries, all keys, all values; Megatron's rows go per head (q_j, k_j, v_j).
    const NamedTensor& w = need(g + "attn.c_attn.weight", {h, 3 * h});
    const NamedTensor& b = need(g + "attn.c_attn.bias", {3 * h});
    std::vector<float> qkv(static_cast<size_t>(3 * h * h)), qkv_b(static_cast<size_t>(3 * h));
    for (int64_t j = 0; j < heads; ++j)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t e = 0; e < d; ++e) {
          const int64_t row = (j * 3 + part) * d + e, col = part * h + j * d + e;
          qkv_b[static_cast<size_t>(row)] = b.values[static_cast<size_t>(col)];
          for (int64_t c = 0; c < h; ++c) qkv[static_cast<size_t>(row * h + c)] = w.values[static_cast<size_t>(c * 3 * h + col)];
        }
    put(m + "self_attention.linear_qkv.weight", {3 * h, h}, std::move(qkv));
    put(m + "self_attention.linear_qkv.bias", {3 * h}, std::move(qkv_b));
    for (const auto& [hf_name, meg, in_size, out_size] : {std::tuple{"attn.c_proj", "self_attention.linear_proj", h, h},
                                                          std::tuple{"mlp.c_fc", "mlp.linear_fc1", h, f}, std::tuple{"mlp.c_proj", "mlp.linear_fc2", f, h}}) {
      const NamedTensor& t = need(g + hf_name + ".weight", {in_size, out_size});  // Conv1D: [in, out]
      put(m + meg + ".weight", {out_size, in_size}, transposed(t.values.data(), in_size, out_size));
      put(m + meg + ".bias", {out_size}, need(g + hf_name + ".bias", {out_size}).values);
    }
  }
  put("decoder.final_layernorm.weight", {h}, need("ln_f.weight", {h}).values);
  put("decoder.final_layernorm.bias", {h}, need("ln_f.bias", {h}).values);
  file.output_layer(out, "lm_head.weight", wte);
  file.check_all_taken();
  return out;
}

}  // namespace ptdp::exec

namespace ptdp::exec {
namespace {

// Megatron's fused QKV rows in terms of Hugging Face's separate projections: out[r] is the row of
// [q_proj (a·d rows); k_proj (g·d); v_proj (g·d)] that Megatron's row r holds — per query group
// its a/g query heads, then its key head, then its value head.
std::vector<int64_t> qkv_order(int64_t a, int64_t g, int64_t d) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>((a + 2 * g) * d));
  const int64_t per = a / g;
  for (int64_t grp = 0; grp < g; ++grp) {
    for (int64_t e = 0; e < per * d; ++e) out.push_back(grp * per * d + e);
    for (int64_t e = 0; e < d; ++e) out.push_back(a * d + grp * d + e);
    for (int64_t e = 0; e < d; ++e) out.push_back(a * d + g * d + grp * d + e);
  }
  return out;
}

// Rows [first, first + n) of a row-major tensor of `cols` columns.
std::vector<float> row_block(const NamedTensor& t, int64_t first, int64_t n, int64_t cols) {
  return std::vector<float>(t.values.begin() + first * cols, t.values.begin() + (first + n) * cols);
}

const char* kLlamaLayout =
    "Llama's layout: model.embed_tokens.weight, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, "
    "mlp.{gate,up,down}_proj}.weight, model.norm.weight, lm_head.weight";

}  // namespace

HfExport to_hf_llama(const std::vector<NamedTensor>& megatron, const HfLlamaConfig& c, const std::string& key) {
  if (c.normalization != "rmsnorm")
    throw ConfigError(key, "the model has model.normalization: " + printable(c.normalization, 20) + "; LlamaForCausalLM has RMSNorm");
  if (c.position_embedding != "rope")
    throw ConfigError(key, "the model has model.position_embedding: " + printable(c.position_embedding, 20) +
                               "; LlamaForCausalLM has rotary embeddings (rope)");
  if (c.rotary_percent != 1.0)
    throw ConfigError(key, "the model rotates " + std::to_string(c.rotary_percent) +
                               " of each head (model.rotary_percent); LlamaForCausalLM rotates whole heads");
  if (c.vocab_size < 1 || c.num_heads < 1 || c.num_query_groups < 1 || c.num_heads % c.num_query_groups != 0 || c.seq_length < 1)
    throw ConfigError(key, "needs a vocabulary, a sequence length, and heads in whole query groups");
  refuse_mtp(megatron, key, "LlamaForCausalLM");
  std::map<std::string, const NamedTensor*> by;
  for (const auto& t : megatron) {
    by[t.name] = &t;
    if (t.name.find(".mlp.router.") != std::string::npos)
      throw ConfigError(key, "the model has experts ('" + t.name + "'); LlamaForCausalLM has a dense MLP");
    if (t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0)
      throw ConfigError(key, "the model has biases ('" + t.name + "'); LlamaForCausalLM has none (attention_bias, mlp_bias false)");
  }
  auto need = [&](const std::string& name, const std::vector<int64_t>& shape) -> const NamedTensor& {
    const auto it = by.find(name);
    if (it == by.end()) throw ConfigError(key, "the state dict has no '" + name + "'");
    const NamedTensor& t = *it->second;
    bool fits = t.shape.size() == shape.size();
    for (size_t i = 0; fits && i < shape.size(); ++i) fits = shape[i] >= 0 ? t.shape[i] == shape[i] : t.shape[i] >= std::max<int64_t>(1, -shape[i]);
    if (!fits) throw ConfigError(key, "'" + name + "' has shape " + shape_text(t.shape) + ", not LlamaForCausalLM's " + shape_text(shape));
    return t;
  };
  const int64_t a = c.num_heads, g = c.num_query_groups, V = c.vocab_size;
  const NamedTensor& wte = need("embedding.word_embeddings.weight", {-V, -1});
  const int64_t h = wte.shape[1];
  const NamedTensor& qkv0 = need("decoder.layers.0.self_attention.linear_qkv.weight", {-1, h});
  if (qkv0.shape[0] % (a + 2 * g) != 0)
    throw ConfigError(key, "linear_qkv has " + std::to_string(qkv0.shape[0]) + " rows, not a multiple of heads + 2 · groups = " +
                               std::to_string(a + 2 * g));
  const int64_t d = qkv0.shape[0] / (a + 2 * g);
  int64_t layers = 0;
  while (by.count("decoder.layers." + std::to_string(layers) + ".self_attention.linear_qkv.weight")) ++layers;
  HfExport out;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    out.tensors.push_back(NamedTensor{name, std::move(shape), std::move(values)});
  };
  put("model.embed_tokens.weight", {V, h}, row_block(wte, 0, V, h));
  const std::vector<int64_t> order = qkv_order(a, g, d);
  int64_t f = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const std::string m = "decoder.layers." + std::to_string(l) + ".", o = "model.layers." + std::to_string(l) + ".";
    put(o + "input_layernorm.weight", {h}, need(m + "input_layernorm.weight", {h}).values);
    const NamedTensor& qkv = need(m + "self_attention.linear_qkv.weight", {(a + 2 * g) * d, h});
    std::vector<float> split(qkv.values.size());  // [q; k; v] rows
    for (size_t r = 0; r < order.size(); ++r)
      std::copy_n(qkv.values.begin() + static_cast<int64_t>(r) * h, h, split.begin() + order[r] * h);
    put(o + "self_attn.q_proj.weight", {a * d, h}, std::vector<float>(split.begin(), split.begin() + a * d * h));
    put(o + "self_attn.k_proj.weight", {g * d, h}, std::vector<float>(split.begin() + a * d * h, split.begin() + (a + g) * d * h));
    put(o + "self_attn.v_proj.weight", {g * d, h}, std::vector<float>(split.begin() + (a + g) * d * h, split.end()));
    put(o + "self_attn.o_proj.weight", {h, a * d}, need(m + "self_attention.linear_proj.weight", {h, a * d}).values);
    put(o + "post_attention_layernorm.weight", {h}, need(m + "pre_mlp_layernorm.weight", {h}).values);
    const NamedTensor& down = need(m + "mlp.linear_fc2.weight", {h, -1});
    f = down.shape[1];
    const NamedTensor& fc1 = need(m + "mlp.linear_fc1.weight", {2 * f, h});  // [gate; up]: a GELU fc1 [f, h] is refused here
    put(o + "mlp.gate_proj.weight", {f, h}, row_block(fc1, 0, f, h));
    put(o + "mlp.up_proj.weight", {f, h}, row_block(fc1, f, f, h));
    put(o + "mlp.down_proj.weight", {h, f}, down.values);
  }
  if (layers == 0) throw ConfigError(key, "the state dict has no transformer layers");
  put("model.norm.weight", {h}, need("decoder.final_layernorm.weight", {h}).values);
  const bool tied = !by.count("output_layer.weight");
  if (!tied) put("lm_head.weight", {V, h}, row_block(need("output_layer.weight", {-V, h}), 0, V, h));
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"model_type", "llama"},
                                 {"vocab_size", V},
                                 {"hidden_size", h},
                                 {"intermediate_size", f},
                                 {"num_hidden_layers", layers},
                                 {"num_attention_heads", a},
                                 {"num_key_value_heads", g},
                                 {"head_dim", d},
                                 {"hidden_act", "silu"},
                                 {"max_position_embeddings", c.seq_length},
                                 {"rms_norm_eps", 1e-5},
                                 // transformers 4.x reads rope_theta, 5.x rope_parameters.
                                 {"rope_theta", c.rotary_base},
                                 {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rotary_base}}},
                                 {"rope_scaling", nullptr},
                                 {"attention_bias", false},
                                 {"mlp_bias", false},
                                 {"attention_dropout", 0.0},
                                 {"initializer_range", 0.02},
                                 {"tie_word_embeddings", tied},
                                 // In-vocabulary special tokens (ptdp's data has none of its own).
                                 {"bos_token_id", V - 1},
                                 {"eos_token_id", V - 1},
                                 {"torch_dtype", "float32"}};
  out.config_json = config.dump(2) + "\n";
  return out;
}

std::vector<NamedTensor> from_hf_llama(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                       const std::string& key) {
  std::string differs;
  if (spec.mlp != MlpKind::SwiGLU) differs = "model.mlp: " + to_string(spec.mlp) + " (Llama: swiglu)";
  else if (spec.normalization != NormKind::RMSNorm) differs = "model.normalization: " + to_string(spec.normalization) + " (Llama: rmsnorm)";
  else if (spec.has_bias()) differs = "model.bias: true (Llama: none)";
  else if (spec.position_kind() != PositionKind::Rope) differs = "model.position_embedding: " + to_string(spec.position_kind()) + " (Llama: rope)";
  else if (spec.rotary_percent != 1.0) differs = "model.rotary_percent: " + std::to_string(spec.rotary_percent) + " (Llama: 1)";
  else if (spec.has_moe()) differs = "model.moe (Llama: a dense MLP)";
  if (!differs.empty())
    throw ConfigError(key, source + " is a Hugging Face Llama/Mistral model, but this model has " + differs);
  const int64_t h = spec.hidden_size, a = spec.num_attention_heads, g = spec.query_groups(), d = spec.head_dim(), f = spec.ffn();
  if (a < 1 || g < 1 || a % g != 0) throw ConfigError(key, "the model's heads are not in whole query groups");
  HfTensors file(spec, source, key, kLlamaLayout, "model.",
                 "; heads " + std::to_string(a) + ", key/value heads " + std::to_string(g) + ", head size " + std::to_string(d), ", no biases");
  for (const auto& t : hf) {
    const std::string name = t.name.rfind("model.", 0) == 0 ? t.name.substr(6) : t.name;
    if (name.size() > 20 && name.compare(name.size() - 20, 20, ".rotary_emb.inv_freq") == 0) continue;  // a buffer, not a parameter
    file.add(name, t);
  }
  auto need = [&](const std::string& name, const std::vector<int64_t>& shape) -> const NamedTensor& { return file.need(name, shape); };
  // GPT-2's names are refused before anything else: the first of them names the other architecture.
  for (const auto& t : hf)
    if (t.name.rfind("transformer.", 0) == 0 || t.name.rfind("h.", 0) == 0 || t.name.rfind("wte.", 0) == 0)
      throw ConfigError(key, source + ": tensor '" + printable(t.name) + "' is GPT-2's (transformer.h.N.…), not Llama's; --init reads " +
                                 kLlamaLayout + " for this Llama-style model");
  std::set<std::string> names = {"embed_tokens.weight", "norm.weight", "lm_head.weight"};
  for (int64_t l = 0; l < spec.num_layers; ++l)
    for (const char* part : {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      names.insert("layers." + std::to_string(l) + "." + part + ".weight");
  file.check_names(names);
  std::vector<NamedTensor> out;
  auto put = [&](std::string name, std::vector<int64_t> shape, std::vector<float> values) {
    out.push_back(NamedTensor{std::move(name), std::move(shape), std::move(values)});
  };
  const NamedTensor& wte = need("embed_tokens.weight", {-spec.vocab_size, h});
  put("embedding.word_embeddings.weight", wte.shape, wte.values);
  const std::vector<int64_t> order = qkv_order(a, g, d);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", m = "decoder.layers." + std::to_string(l) + ".";
    put(m + "input_layernorm.weight", {h}, need(o + "input_layernorm.weight", {h}).values);
    const NamedTensor& q = need(o + "self_attn.q_proj.weight", {a * d, h});
    const NamedTensor& k = need(o + "self_attn.k_proj.weight", {g * d, h});
    const NamedTensor& v = need(o + "self_attn.v_proj.weight", {g * d, h});
    std::vector<float> split = q.values;  // [q; k; v] rows, then regrouped per query group
    split.insert(split.end(), k.values.begin(), k.values.end());
    split.insert(split.end(), v.values.begin(), v.values.end());
    std::vector<float> qkv(split.size());
    for (size_t r = 0; r < order.size(); ++r)
      std::copy_n(split.begin() + order[r] * h, h, qkv.begin() + static_cast<int64_t>(r) * h);
    put(m + "self_attention.linear_qkv.weight", {(a + 2 * g) * d, h}, std::move(qkv));
    put(m + "self_attention.linear_proj.weight", {h, a * d}, need(o + "self_attn.o_proj.weight", {h, a * d}).values);
    put(m + "pre_mlp_layernorm.weight", {h}, need(o + "post_attention_layernorm.weight", {h}).values);
    std::vector<float> fc1 = need(o + "mlp.gate_proj.weight", {f, h}).values;  // [gate; up], as Megatron chunks it
    const NamedTensor& up = need(o + "mlp.up_proj.weight", {f, h});
    fc1.insert(fc1.end(), up.values.begin(), up.values.end());
    put(m + "mlp.linear_fc1.weight", {2 * f, h}, std::move(fc1));
    put(m + "mlp.linear_fc2.weight", {h, f}, need(o + "mlp.down_proj.weight", {h, f}).values);
  }
  put("decoder.final_layernorm.weight", {h}, need("norm.weight", {h}).values);
  file.output_layer(out, "lm_head.weight", wte);
  file.check_all_taken();
  return out;
}

std::vector<NamedTensor> from_hf(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                 const std::string& key) {
  return spec.llama_style() ? from_hf_llama(spec, hf, source, key) : from_hf_gpt2(spec, hf, source, key);
}

}  // namespace ptdp::exec
