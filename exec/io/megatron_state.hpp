// The executor's model as Megatron-LM names and lays it out: the state dict of Megatron Core's
// GPTModel built with the local layer spec (get_gpt_layer_local_spec), with the real shapes, so
// that `safetensors.torch.load_file` gives a dict that loads into that model.
//
//   embedding.word_embeddings.weight                       [V_padded, h]
//   embedding.position_embeddings.weight                   [s, h]   (learned absolute positions only;
//                                                                    rotary and none have no table)
//   decoder.layers.N.input_layernorm.weight (.bias)        [h]      (.bias with LayerNorm only)
//   decoder.layers.N.self_attention.linear_qkv.weight      [(a + 2g)·d, h]  per query group: its
//                                                                    a/g query heads, key, value
//   decoder.layers.N.self_attention.linear_qkv.bias        [(a + 2g)·d]
//   decoder.layers.N.self_attention.linear_proj.weight     [h, a·d]  (.bias [h])
//   decoder.layers.N.pre_mlp_layernorm.weight (.bias)      [h]
//   decoder.layers.N.mlp.linear_fc1.weight                 [f, h], SwiGLU [2f, h] = [gate; up]
//   decoder.layers.N.mlp.linear_fc1.bias                   [f] / [2f]
//   decoder.layers.N.mlp.linear_fc2.weight                 [h, f]   (.bias [h])
//   MoE layers: decoder.layers.N.mlp.router.weight         [E, h]
//               decoder.layers.N.mlp.experts.local_experts.K.linear_fc1.weight / linear_fc2.weight
//   decoder.final_layernorm.weight (.bias)                 [h]
//   mtp.layers.K.enorm.weight (.bias), hnorm.weight (.bias) [h]     (model.mtp_layers: Megatron-Core's
//   mtp.layers.K.eh_proj.weight                            [h, 2h]   MultiTokenPredictionBlock; eh_proj
//   mtp.layers.K.transformer_layer.<a decoder layer's names>          reads [embedding; hidden])
//   mtp.layers.K.final_layernorm.weight (.bias)            [h]
//   output_layer.weight                                    [V_padded, h]  (untied embeddings only)
//
// Linear weights are [out, in] (torch.nn.Linear's layout; ptdp computes with [in, out]); layer N
// is the global layer number. Biases exist as model.bias says. Everything else is the same
// arithmetic as Megatron's: pre-norm residual blocks, GELU in its tanh form, norm ε 1e-5, rotary
// embeddings on the queries and keys (non-interleaved halves, --rotary-base, --rotary-percent),
// the softmax of the loss over the whole padded vocabulary.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace ptdp::exec {

/// A tensor with its shape (row-major F32).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

/// Full (unsharded) parameters by ptdp's global name ("layers.0.mlp.fc1.weight", …), row-major
/// in the serial model's shapes ([in, out] for linear weights); the word embedding has the padded
/// vocabulary's rows.
using ParameterSet = std::map<std::string, std::vector<float>>;

/// ptdp's full parameters (or an Adam moment of each, same layout) as Megatron's state dict, in
/// Megatron's order. `padded_vocab` is the word embedding's row count. Asserts every parameter of
/// `spec` is present with its size.
std::vector<NamedTensor> to_megatron_state(const TransformerSpec& spec, int64_t padded_vocab, const ParameterSet& params);

/// Elements of the whole model's state dict.
uint64_t megatron_state_elements(const TransformerSpec& spec, int64_t padded_vocab);

/// The inverse: a Megatron state dict (as to_megatron_state writes it) to ptdp's names and layouts.
/// The word embedding (and output layer) may have another padded row count than `padded_vocab`
/// (another tensor-parallel size), at least spec.vocab_size rows: the common rows are taken, the
/// rest of the returned tensor is 0 (rows no token reads, left out of the loss). Throws ConfigError
/// (key `key`) naming `source` and the tensor when one is missing, has another shape, or the file
/// holds a tensor the model does not have.
/// A learned position table given to a model with rotary (or no) positions, or its absence for a
/// model with learned ones, is a ConfigError naming 'embedding.position_embeddings.weight'; with
/// `metadata` (the file's), a 'ptdp_position_embedding' entry other than the model's is one too.
ParameterSet from_megatron_state(const TransformerSpec& spec, int64_t padded_vocab, const std::vector<NamedTensor>& tensors,
                                 const std::string& source, const std::string& key,
                                 const std::map<std::string, std::string>* metadata = nullptr);

/// A Megatron state dict (as to_megatron_state writes it) as Hugging Face transformers'
/// GPT2LMHeadModel holds it (`transformer.wte.weight`, `transformer.h.N.attn.c_attn.weight`, …;
/// Conv1D weights [in, out], c_attn's columns [all queries | all keys | all values]), the word
/// embedding (and lm_head) cut to `vocab_size` rows, with the config.json that describes it
/// (GELU in tanh form = "gelu_new", LayerNorm ε 1e-5, no dropout). GPT-2's architecture only:
/// LayerNorm, GELU MLP, biases, multi-head attention, learned positions, no experts; anything
/// else is a ConfigError (key `key`) saying what differs.
struct HfExport {
  std::vector<NamedTensor> tensors;
  std::string config_json;
};
HfExport to_hf_gpt2(const std::vector<NamedTensor>& megatron, int64_t vocab_size, int num_heads, const std::string& key);

/// What a Llama-style export needs besides the state dict (from the save's meta.json).
struct HfLlamaConfig {
  int64_t vocab_size = 0;
  int64_t num_heads = 0;
  int64_t num_query_groups = 0;  // key/value heads
  int64_t seq_length = 0;        // max_position_embeddings
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  std::string normalization;       // must be "rmsnorm"
  std::string position_embedding;  // must be "rope"
};

/// A Megatron state dict of a Llama-style model (SwiGLU MLP, RMSNorm, rotary embeddings on whole
/// heads, no biases, no experts; GQA and tied or untied embeddings) as Hugging Face transformers'
/// LlamaForCausalLM holds it: model.embed_tokens.weight (cut to vocab_size rows),
/// model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
/// mlp.{gate,up,down}_proj}.weight, model.norm.weight, lm_head.weight (untied only), with its
/// config.json (hidden_act "silu", rms_norm_eps 1e-5, rope_theta = rotary_base; in-vocabulary
/// bos/eos ids). Megatron's rope rotates channel i with i + d/2 (not neighbouring pairs), which is
/// transformers' rotate_half: q_proj and k_proj rows are the per-group QKV's query and key rows
/// as they are. Anything else (partial rotary, LayerNorm, biases, experts) is a ConfigError
/// (key `key`) naming what differs.
HfExport to_hf_llama(const std::vector<NamedTensor>& megatron, const HfLlamaConfig& config, const std::string& key);

/// Hugging Face Llama or Mistral tensors (LlamaForCausalLM's / MistralForCausalLM's names, or
/// LlamaModel's without "model."; rotary inv_freq buffers ignored) as Megatron's state dict for
/// the Llama-style `spec`: q/k/v_proj regrouped per query group (GQA), gate_proj and up_proj
/// stacked into linear_fc1, tied or untied as for GPT-2. A tensor that maps to nothing (GPT-2's
/// names, a bias, another layer count) is a ConfigError (key `key`) naming `source`, the tensor
/// and the layout expected; a model that is not Llama-style is refused by its keys.
std::vector<NamedTensor> from_hf_llama(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                       const std::string& key);

/// from_hf_llama for a Llama-style `spec`, else from_hf_gpt2.
std::vector<NamedTensor> from_hf(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                 const std::string& key);

/// Whether a state dict is in Hugging Face's names (GPT-2's `transformer.wte.weight`, `h.0.…`;
/// Llama's `model.embed_tokens.weight`, `model.layers.0.…`) rather than Megatron's.
bool is_hf_state(const std::vector<NamedTensor>& tensors);

/// The inverse of to_hf_gpt2: Hugging Face GPT-2 tensors (GPT2LMHeadModel's, or GPT2Model's
/// without the `transformer.` prefix; the causal-mask buffers `attn.bias`/`attn.masked_bias`
/// ignored) as Megatron's state dict for `spec` — c_attn's columns regrouped per head, Conv1D
/// weights transposed. Tied or untied: a missing lm_head gives an untied model a copy of the
/// word embedding; a tied model takes an lm_head only when it equals the embedding. Another
/// architecture (Llama's `model.layers.…`) or a tensor that maps to nothing is a ConfigError
/// (key `key`) naming `source`, the first such tensor and what GPT-2's layout expected there.
std::vector<NamedTensor> from_hf_gpt2(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::string& source,
                                      const std::string& key);

}  // namespace ptdp::exec
