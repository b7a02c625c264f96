// Megatron's state dict of the executor's model (exec/io/megatron_state.hpp) and the safetensors
// reader and writer (exec/io/checkpoint.hpp): names, shapes, layouts, round trips, other dtypes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/io/megatron_state.hpp"
#include "exec/model/gpt.hpp"
#include "exec/model/layers.hpp"
#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"

namespace {

using namespace ptdp;
using namespace ptdp::exec;

// Every parameter ptdp's model has for `spec`, with distinct values (element i of the k-th: k + i/1e4).
ParameterSet numbered(const TransformerSpec& spec, int64_t vocab_rows) {
  ParameterSet set;
  const int64_t h = spec.hidden_size, f = spec.ffn(), q = (spec.num_attention_heads + 2 * spec.query_groups()) * spec.head_dim();
  auto add = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(set.size()) + static_cast<float>(i) * 1e-4f;
    set[name] = v;
  };
  const bool ln = spec.normalization == NormKind::LayerNorm, bias = spec.has_bias(), glu = spec.mlp == MlpKind::SwiGLU;
  add("embedding.word_embeddings.weight", vocab_rows * h);
  if (spec.learned_positions()) add("embedding.position_embeddings.weight", spec.seq_length * h);
  // A transformer layer under `p` (a decoder layer "layers.N.", or an MTP module's transformer_layer).
  auto layer = [&](const std::string& p, bool moe) {
    for (const char* n : {"ln1", "ln2"}) {
      add(p + n + ".weight", h);
      if (ln) add(p + n + ".bias", h);
    }
    add(p + "attention.qkv.weight", h * q);
    add(p + "attention.proj.weight", h * h);
    if (bias) add(p + "attention.qkv.bias", q), add(p + "attention.proj.bias", h);
    if (moe) {
      add(p + "mlp.router.weight", h * spec.moe.num_experts);
      for (int64_t e = 0; e < spec.moe.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "fc1.weight", h * spec.expert_ffn());
        if (glu) add(x + "gate.weight", h * spec.expert_ffn());
        add(x + "fc2.weight", spec.expert_ffn() * h);
      }
      return;
    }
    add(p + "mlp.fc1.weight", h * f);
    add(p + "mlp.fc2.weight", f * h);
    if (glu) add(p + "mlp.gate.weight", h * f);
    if (bias) {
      add(p + "mlp.fc1.bias", f), add(p + "mlp.fc2.bias", h);
      if (glu) add(p + "mlp.gate.bias", f);
    }
  };
  for (int64_t l = 0; l < spec.num_layers; ++l) layer("layers." + std::to_string(l) + ".", spec.is_moe_layer(l));
  add("final_layernorm.weight", h);
  if (ln) add("final_layernorm.bias", h);
  for (int64_t k = 0; k < spec.mtp_layers; ++k) {  // multi-token prediction: norms, the 2h → h projection, a layer, a norm
    const std::string m = "mtp.layers." + std::to_string(k) + ".";
    for (const char* n : {"enorm", "hnorm", "final_layernorm"}) {
      add(m + n + ".weight", h);
      if (ln) add(m + n + ".bias", h);
    }
    add(m + "eh_proj.weight", 2 * h * h);
    layer(m + "transformer_layer.", spec.mtp_moe());
  }
  if (!spec.tie_embeddings) add("output_layer.weight", vocab_rows * h);
  return set;
}

TransformerSpec tiny(bool llama) {
  TransformerSpec s;
  s.num_layers = 2;
  s.hidden_size = 8;
  s.num_attention_heads = 2;
  s.seq_length = 4;
  s.vocab_size = 16;
  if (llama) {
    s.num_query_groups = 1;
    s.mlp = MlpKind::SwiGLU;
    s.normalization = NormKind::RMSNorm;
    s.tie_embeddings = false;
  }
  return s;
}

const NamedTensor& find(const std::vector<NamedTensor>& ts, const std::string& name) {
  for (const NamedTensor& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

TEST(MegatronState, LinearWeightsAreOutByInAndSwiGluStacksGateOverUp) {
  const TransformerSpec spec = tiny(true);
  const ParameterSet p = numbered(spec, 128);
  const auto state = to_megatron_state(spec, 128, p);
  const NamedTensor& fc1 = find(state, "decoder.layers.1.mlp.linear_fc1.weight");
  ASSERT_EQ(fc1.shape, (std::vector<int64_t>{64, 8}));  // [gate; up], each [32, 8]
  // Row o, column i of the gate half is ptdp's gate [in i, out o]; the up half follows.
  const auto& gate = p.at("layers.1.mlp.gate.weight");
  const auto& up = p.at("layers.1.mlp.fc1.weight");
  EXPECT_EQ(fc1.values[5 * 8 + 3], gate[3 * 32 + 5]);
  EXPECT_EQ(fc1.values[(32 + 5) * 8 + 3], up[3 * 32 + 5]);
  const NamedTensor& qkv = find(state, "decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{16, 8}));  // (2 heads + key + value) · 4
  EXPECT_EQ(qkv.values[9 * 8 + 2], p.at("layers.0.attention.qkv.weight")[2 * 16 + 9]);
  EXPECT_EQ(find(state, "output_layer.weight").shape, (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(megatron_state_elements(spec, 128), [&] {
    uint64_t n = 0;
    for (const auto& [name, v] : p) n += v.size();
    return n;
  }());
}

TEST(MegatronState, EveryArchitectureRoundTripsThroughASafetensorsFile) {
  TransformerSpec moe = tiny(true);
  moe.moe.num_experts = 4;
  moe.moe.first_dense_layers = 1;  // layer 0 dense, layer 1 experts
  moe.moe.expert_ffn_hidden_size = 12;
  for (const TransformerSpec& spec : {tiny(false), tiny(true), moe}) {
    const ParameterSet p = numbered(spec, 128);
    const auto state = to_megatron_state(spec, 128, p);
    const std::string bytes = encode_safetensors(state, {{"format", "pt"}});
    std::map<std::string, std::string> md;
    const auto back = decode_safetensors(bytes, "x.safetensors", &md);
    EXPECT_EQ(md.at("format"), "pt");
    EXPECT_EQ(from_megatron_state(spec, 128, back, "x.safetensors", "--init"), p);
  }
  const auto experts = to_megatron_state(moe, 128, numbered(moe, 128));
  EXPECT_EQ(find(experts, "decoder.layers.1.mlp.router.weight").shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(find(experts, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight").shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(find(experts, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight").shape, (std::vector<int64_t>{8, 12}));
}

TEST(MegatronState, RotaryModelsHaveNoPositionTableAndMismatchesNameIt) {
  TransformerSpec rope = tiny(true), learned = tiny(true);
  learned.position_embedding = PositionKind::Learned;
  TransformerSpec none = tiny(true);
  none.position_embedding = PositionKind::None;
  EXPECT_EQ(rope.position_kind(), PositionKind::Rope);  // Llama-style default
  EXPECT_EQ(tiny(false).position_kind(), PositionKind::Learned);
  EXPECT_EQ(megatron_state_elements(learned, 128) - megatron_state_elements(rope, 128), 4u * 8);  // s · h
  EXPECT_EQ(parameter_count(learned) - parameter_count(rope), 4.0 * 8);
  const auto with_table = to_megatron_state(learned, 128, numbered(learned, 128));
  const auto without = to_megatron_state(rope, 128, numbered(rope, 128));
  for (const NamedTensor& t : without) EXPECT_NE(t.name, "embedding.position_embeddings.weight");
  auto message = [&](const TransformerSpec& spec, const std::vector<NamedTensor>& ts, const std::map<std::string, std::string>* md) {
    try {
      from_megatron_state(spec, 128, ts, "w.safetensors", "--init", md);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(rope, with_table, nullptr).find("w.safetensors: tensor 'embedding.position_embeddings.weight' holds learned absolute "
                                                     "position embeddings, but this model has model.position_embedding: rope"),
            std::string::npos)
      << message(rope, with_table, nullptr);
  EXPECT_NE(message(learned, without, nullptr).find("w.safetensors has no tensor 'embedding.position_embeddings.weight': it was saved by "
                                                     "a model with rotary or no position embeddings"),
            std::string::npos)
      << message(learned, without, nullptr);
  // rope and none have the same tensors: the file's metadata tells them apart when it has it.
  const std::map<std::string, std::string> saved_rope{{"ptdp_position_embedding", "rope"}};
  EXPECT_EQ(message(none, without, nullptr), "no error");
  EXPECT_NE(message(none, without, &saved_rope).find("was saved by a model with model.position_embedding: rope"), std::string::npos);
  EXPECT_EQ(message(rope, without, &saved_rope), "no error");
}

TEST(HuggingFace, Gpt2StateDictsInitialiseTheModel) {
  const TransformerSpec spec = tiny(false);  // GPT-2's architecture, tied
  const ParameterSet p = numbered(spec, 16);
  const auto megatron = to_megatron_state(spec, 16, p);
  const HfExport hf = to_hf_gpt2(megatron, 16, 2, "--hf");
  ASSERT_TRUE(is_hf_state(hf.tensors));
  EXPECT_FALSE(is_hf_state(megatron));
  // Through a safetensors file, as transformers' save_pretrained writes it, and back.
  const auto file = decode_safetensors(encode_safetensors(hf.tensors, {{"format", "pt"}}), "gpt2.safetensors");
  EXPECT_EQ(from_megatron_state(spec, 16, from_hf_gpt2(spec, file, "gpt2.safetensors", "--init"), "gpt2.safetensors", "--init"), p);
  // c_attn's column of head 1's key, element 2 (h 8, head size 4: column 8 + 4 + 2) is Megatron's
  // row (1·3 + 1)·4 + 2 of the per-head QKV: checked by hand, not through to_hf_gpt2.
  std::vector<NamedTensor> plain;  // GPT2Model's names (no "transformer."), with the causal-mask buffers
  for (const auto& t : hf.tensors) plain.push_back(NamedTensor{t.name.rfind("transformer.", 0) == 0 ? t.name.substr(12) : t.name, t.shape, t.values});
  plain.push_back(NamedTensor{"h.0.attn.bias", {1, 1, 4, 4}, std::vector<float>(16, 1.0f)});
  const auto back = from_hf_gpt2(spec, plain, "gpt2.safetensors", "--init");
  const NamedTensor& c_attn = find(hf.tensors, "transformer.h.0.attn.c_attn.weight");
  const NamedTensor& qkv = find(back, "decoder.layers.0.self_attention.linear_qkv.weight");
  for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(qkv.values[((1 * 3 + 1) * 4 + 2) * 8 + c], c_attn.values[c * 24 + 8 + 4 + 2]) << c;
  // A tied checkpoint into an untied model: the head starts as the embedding.
  TransformerSpec untied = spec;
  untied.tie_embeddings = false;
  const auto head = from_hf_gpt2(untied, file, "gpt2.safetensors", "--init");
  EXPECT_EQ(find(head, "output_layer.weight").values, find(file, "transformer.wte.weight").values);
}

TEST(HuggingFace, AnotherArchitectureNamesTheTensorThatDoesNotMap) {
  const TransformerSpec spec = tiny(false);
  const HfExport hf = to_hf_gpt2(to_megatron_state(spec, 16, numbered(spec, 16)), 16, 2, "--hf");
  auto refusal = [&](std::vector<NamedTensor> tensors) {
    try {
      from_hf_gpt2(spec, tensors, "model.safetensors", "--init");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string llama = refusal({NamedTensor{"model.embed_tokens.weight", {16, 8}, std::vector<float>(128)}});
  EXPECT_NE(llama.find("'model.embed_tokens.weight' is Llama-style"), std::string::npos) << llama;
  auto extra = hf.tensors;
  extra.push_back(NamedTensor{"transformer.h.5.ln_1.weight", {8}, std::vector<float>(8)});  // a third layer of two
  const std::string more = refusal(extra);
  EXPECT_NE(more.find("'transformer.h.5.ln_1.weight' maps to nothing"), std::string::npos) << more;
  // Falcon's file: GPT-2's transformer.h.N prefix, other names. Its first tensor is named (not a
  // GPT-2 tensor the file lacks), with the layout expected.
  const std::string falcon = refusal({NamedTensor{"transformer.word_embeddings.weight", {16, 8}, std::vector<float>(128)},
                                      NamedTensor{"transformer.h.0.self_attention.query_key_value.weight", {24, 8}, std::vector<float>(192)}});
  EXPECT_NE(falcon.find("tensor 'transformer.word_embeddings.weight' maps to nothing in GPT-2's layout: transformer.wte/wpe.weight"),
            std::string::npos) << falcon;
  auto narrow = hf.tensors;
  for (auto& t : narrow)
    if (t.name == "transformer.h.1.mlp.c_fc.weight") t.shape = {8, 16}, t.values.resize(128);
  const std::string shape = refusal(narrow);
  EXPECT_NE(shape.find("'transformer.h.1.mlp.c_fc.weight' has shape [8, 16]"), std::string::npos) << shape;
  // The exported config names in-vocabulary special tokens (GPT-2's end-of-text is the last id).
  EXPECT_NE(hf.config_json.find("\"eos_token_id\": 15"), std::string::npos) << hf.config_json;
  EXPECT_NE(hf.config_json.find("\"bos_token_id\": 15"), std::string::npos) << hf.config_json;
}

TEST(MegatronState, AnotherVocabularyPaddingKeepsTheCommonRows) {
  const TransformerSpec spec = tiny(false);
  auto state = to_megatron_state(spec, 256, numbered(spec, 256));  // saved at t 2 (256 rows)
  const ParameterSet p = from_megatron_state(spec, 128, state, "x", "--init");
  const auto& word = p.at("embedding.word_embeddings.weight");
  ASSERT_EQ(word.size(), 128u * 8);
  EXPECT_EQ(word[127 * 8 + 7], find(state, "embedding.word_embeddings.weight").values[127 * 8 + 7]);
  const auto small = from_megatron_state(spec, 256, to_megatron_state(spec, 128, numbered(spec, 128)), "x", "--init");
  EXPECT_EQ(small.at("embedding.word_embeddings.weight")[200 * 8], 0.0f);  // rows the file lacks: 0
}

TEST(MegatronState, WhatDoesNotFitIsNamed) {
  const TransformerSpec spec = tiny(false);
  auto state = to_megatron_state(spec, 128, numbered(spec, 128));
  auto message = [&](const std::vector<NamedTensor>& ts) {
    try {
      from_megatron_state(spec, 128, ts, "w.safetensors", "--init");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto missing = state;
  missing.erase(missing.begin() + 3);
  EXPECT_NE(message(missing).find("w.safetensors has no tensor '" + state[3].name + "'"), std::string::npos) << message(missing);
  auto extra = state;
  extra.push_back(NamedTensor{"decoder.layers.7.mlp.linear_fc1.weight", {1}, {0}});
  EXPECT_NE(message(extra).find("tensor 'decoder.layers.7.mlp.linear_fc1.weight' is not a parameter of this model"), std::string::npos);
  auto wrong = state;
  for (NamedTensor& t : wrong)
    if (t.name == "decoder.layers.1.mlp.linear_fc2.weight") t.shape = {32, 8};
  EXPECT_NE(message(wrong).find("'decoder.layers.1.mlp.linear_fc2.weight' has shape [32, 8], this model's is [8, 32]"), std::string::npos)
      << message(wrong);
}

// ---- Multi-token prediction (model.mtp_layers): Megatron-Core's MultiTokenPredictionBlock ----

TransformerSpec tiny_mtp(bool llama, bool moe) {
  TransformerSpec s = tiny(llama);
  s.mtp_layers = 2;
  s.position_embedding = PositionKind::Rope;  // the executor's MTP runs without a position table
  if (moe) {
    s.moe.num_experts = 4;
    s.moe.expert_ffn_hidden_size = 12;
  }
  return s;
}

TEST(MegatronState, MultiTokenPredictionModulesTakeMegatronCoresNamesAndLayouts) {
  for (const TransformerSpec& spec : {tiny_mtp(false, false), tiny_mtp(true, false), tiny_mtp(true, true)}) {
    const ParameterSet p = numbered(spec, 128);
    const auto state = to_megatron_state(spec, 128, p);
    const auto back = decode_safetensors(encode_safetensors(state, {{"format", "pt"}}), "x.safetensors");
    EXPECT_EQ(from_megatron_state(spec, 128, back, "x.safetensors", "--init"), p);
    EXPECT_EQ(megatron_state_elements(spec, 128), [&] {
      uint64_t n = 0;
      for (const auto& [name, v] : p) n += v.size();
      return n;
    }());
    // After the decoder, before the output layer (GPTModel builds decoder, mtp, output_layer).
    size_t final_norm = 0, first_mtp = 0;
    for (size_t i = 0; i < state.size(); ++i) {
      if (state[i].name == "decoder.final_layernorm.weight") final_norm = i;
      if (first_mtp == 0 && state[i].name.rfind("mtp.", 0) == 0) first_mtp = i;
    }
    EXPECT_GT(first_mtp, final_norm);
    if (!spec.tie_embeddings) {
      EXPECT_EQ(state.back().name, "output_layer.weight");
    }
    const bool ln = spec.normalization == NormKind::LayerNorm;
    for (const char* n : {"enorm", "hnorm", "final_layernorm"}) {
      EXPECT_EQ(find(state, "mtp.layers.1." + std::string(n) + ".weight").shape, (std::vector<int64_t>{8}));
      EXPECT_EQ(std::any_of(state.begin(), state.end(), [&](const NamedTensor& t) { return t.name == "mtp.layers.1." + std::string(n) + ".bias"; }), ln);
    }
    // eh_proj is column-parallel: [h, 2h] = [out, in], its input [embedding; hidden] — columns
    // 0…h−1 read the embedding (ptdp's rows 0…h−1), h…2h−1 the previous depth's hidden states.
    const NamedTensor& eh = find(state, "mtp.layers.1.eh_proj.weight");
    ASSERT_EQ(eh.shape, (std::vector<int64_t>{8, 16}));
    const auto& mine = p.at("mtp.layers.1.eh_proj.weight");  // [2h, h]
    EXPECT_EQ(eh.values[5 * 16 + 3], mine[3 * 8 + 5]);        // embedding column 3 → output 5
    EXPECT_EQ(eh.values[5 * 16 + 8 + 3], mine[(8 + 3) * 8 + 5]);  // hidden column 3 → output 5
    // Its transformer_layer takes a decoder layer's names (of the last layer's kind).
    const std::string layer = "mtp.layers.0.transformer_layer.";
    EXPECT_EQ(find(state, layer + "self_attention.linear_qkv.weight").shape, find(state, "decoder.layers.1.self_attention.linear_qkv.weight").shape);
    EXPECT_NO_THROW(find(state, layer + "input_layernorm.weight"));
    if (spec.mtp_moe()) {
      EXPECT_EQ(find(state, layer + "mlp.router.weight").shape, (std::vector<int64_t>{4, 8}));
      EXPECT_EQ(find(state, layer + "mlp.experts.local_experts.3.linear_fc1.weight").shape, (std::vector<int64_t>{24, 8}));
      EXPECT_EQ(find(state, layer + "mlp.experts.local_experts.3.linear_fc2.weight").shape, (std::vector<int64_t>{8, 12}));
    } else {
      EXPECT_NO_THROW(find(state, layer + "mlp.linear_fc2.weight"));
    }
  }
}

TEST(MegatronState, AStateDictWithOtherMultiTokenPredictionModulesIsNamed) {
  const TransformerSpec two = tiny_mtp(true, false);
  TransformerSpec none = two, one = two;
  none.mtp_layers = 0;
  one.mtp_layers = 1;
  auto message = [&](const TransformerSpec& spec, const std::vector<NamedTensor>& ts) {
    try {
      from_megatron_state(spec, 128, ts, "w.safetensors", "--init");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto state = to_megatron_state(two, 128, numbered(two, 128));
  auto missing = state;
  missing.erase(std::find_if(missing.begin(), missing.end(), [](const NamedTensor& t) { return t.name == "mtp.layers.1.hnorm.weight"; }));
  std::string why = message(two, missing);
  EXPECT_NE(why.find("w.safetensors has no tensor 'mtp.layers.1.hnorm.weight'"), std::string::npos) << why;
  EXPECT_NE(why.find("model.mtp_layers: 2"), std::string::npos) << why;
  why = message(none, state);  // saved with MTP, loaded without
  EXPECT_NE(why.find("tensor 'mtp.layers.0.enorm.weight' is a multi-token-prediction module's, but this model has model.mtp_layers: 0"),
            std::string::npos) << why;
  why = message(one, state);  // one module fewer than saved: the second's first tensor
  EXPECT_NE(why.find("tensor 'mtp.layers.1."), std::string::npos) << why;
  why = message(two, to_megatron_state(one, 128, numbered(one, 128)));  // saved with one, loaded with two
  EXPECT_NE(why.find("has no tensor 'mtp.layers.1."), std::string::npos) << why;
  EXPECT_EQ(message(two, state), "no error");
  // transformers' GPT-2 and Llama have no MTP modules: --hf refuses, naming one.
  try {
    to_hf_llama(state, HfLlamaConfig{16, 2, 1, 4, 10000, 1.0, "rmsnorm", "rope"}, "--hf");
    ADD_FAILURE() << "exported";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("multi-token prediction ('mtp.layers.0.enorm.weight')"), std::string::npos) << e.what();
  }
  TransformerSpec gpt = tiny(false);
  gpt.mtp_layers = 1;
  EXPECT_THROW(to_hf_gpt2(to_megatron_state(gpt, 16, numbered(gpt, 16)), 16, 2, "--hf"), ConfigError);
}

// The loss of one microbatch of a one-rank model with seed `seed`, or with `load`'s parameters
// (ptdp's names); its parameters in `out`.
double shard_loss(const TransformerSpec& spec, uint64_t seed, const ParameterSet* load, ParameterSet* out) {
  auto dev = make_cpu_device();
  auto tp = make_self_communicator("tensor-parallel group");
  ModelShard model(*dev, spec, 1, 0, 1, {spec.num_layers}, {0}, seed);
  Stage& st = model.stage(0);
  for (const ParamInfo& p : st.params()) {
    if (load != nullptr) {
      const std::vector<float>& v = load->at(p.name);
      for (size_t i = 0; i < p.count(); ++i) st.values()[p.offset + i] = v[p.global_index(i)];
    }
    if (out != nullptr) (*out)[p.name].assign(st.values() + p.offset, st.values() + p.offset + p.count());
  }
  const std::vector<int32_t> tokens{3, 14, 1, 9}, targets{14, 1, 9, 9};
  LayerContext ctx{*dev, *tp, {}, {}};
  StageActivations acts;
  return model.forward(ctx, 0, tokens.data(), targets.data(), Tensor(), acts, RecomputeMode::None);
}

TEST(MegatronState, AModelWithMultiTokenPredictionSavedAndLoadedHasItsParametersAndLoss) {
  for (const TransformerSpec& spec : {tiny_mtp(false, false), tiny_mtp(true, true)}) {
    ParameterSet saved, loaded;
    const double loss = shard_loss(spec, 7, nullptr, &saved);
    ASSERT_EQ(saved.count("mtp.layers.1.eh_proj.weight"), 1u);
    const auto file = decode_safetensors(encode_safetensors(to_megatron_state(spec, spec.padded_vocab(1), saved), {}), "m.safetensors");
    const ParameterSet read = from_megatron_state(spec, spec.padded_vocab(1), file, "m.safetensors", "--init");
    const double again = shard_loss(spec, 8, &read, &loaded);
    EXPECT_EQ(loaded, saved);
    EXPECT_EQ(again, loss);
    // Another seed's modules give another loss: the modules' tensors were read, not re-drawn.
    EXPECT_NE(shard_loss(spec, 8, nullptr, nullptr), loss);
    ParameterSet other_modules = read;
    for (auto& [name, v] : other_modules)
      if (name.rfind("mtp.layers.1.eh_proj", 0) == 0) std::reverse(v.begin(), v.end());
    EXPECT_NE(shard_loss(spec, 7, &other_modules, nullptr), loss);
  }
}

TEST(Safetensors, HalfAndBfloat16TensorsWidenExactly) {
  // A file with one F16 and one BF16 tensor, as PyTorch writes them.
  const std::string header = R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[6,10]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  bytes += header;
  // F16: 1.0 (0x3c00), -2.5 (0xc100), the smallest subnormal 2^-24 (0x0001); BF16: 1.0 (0x3f80), -0.5 (0xbf00).
  for (uint16_t v : {0x3c00, 0xc100, 0x0001, 0x3f80, 0xbf00}) bytes.push_back(static_cast<char>(v & 0xff)), bytes.push_back(static_cast<char>(v >> 8));
  const auto t = decode_safetensors(bytes, "h.safetensors");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].values, (std::vector<float>{1.0f, -2.5f, 5.9604644775390625e-8f}));
  EXPECT_EQ(t[1].values, (std::vector<float>{1.0f, -0.5f}));
}

TEST(Safetensors, MalformedFilesAreNamedErrors) {
  auto error = [](const std::string& bytes) {
    try {
      decode_safetensors(bytes, "m.safetensors");
    } catch (const EnvironmentError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto file = [](const std::string& header, size_t data) {
    std::string b(8, '\0');
    b[0] = static_cast<char>(header.size());
    return b + header + std::string(data, '\0');
  };
  EXPECT_NE(error("abc").find("m.safetensors is truncated or corrupt"), std::string::npos);
  EXPECT_NE(error(file(R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8)).find("has dtype I64"), std::string::npos);
  EXPECT_NE(error(file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)).find("truncated or corrupt (tensor 'x'"),
            std::string::npos);
  EXPECT_NE(error(file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)).find("does not follow"), std::string::npos);
  // Issue 36: a shape whose element count wraps 64 bits to 0 (2^40 · 2^40 · 2^40 = 2^120), with
  // no data to match; a tensor named twice (the JSON library would keep the second entry).
  const std::string wrap =
      error(file(R"({"x":{"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776],"data_offsets":[0,0]}})", 0));
  EXPECT_NE(wrap.find("tensor 'x' has more than 2^40 elements"), std::string::npos) << wrap;
  const std::string twice = error(file(
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8));
  EXPECT_NE(twice.find("the header names 'x' twice"), std::string::npos) << twice;
  // Overlapping byte ranges (both tensors over the same four bytes).
  EXPECT_NE(error(file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4))
                .find("does not follow"),
            std::string::npos);
  // A metadata key named twice is no tensor: only the top level's names count.
  EXPECT_EQ(error(file(R"({"__metadata__":{"a":"1"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)), "no error");
}

TEST(Safetensors, TheFuzzSeedsLoadAsTheFuzzTargetsModels) {
  for (const char* name : {"gpt-f32.safetensors", "llama-bf16.safetensors", "llama-f32-nometa.safetensors"}) {
    std::ifstream in(std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/" + name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    TransformerSpec spec = tiny(bytes.size() % 2 == 1);
    spec.num_layers = 1;
    spec.position_embedding = PositionKind::Learned;  // the seeds hold a position table (a Llama with learned positions)
    const auto tensors = decode_safetensors(bytes, name);
    EXPECT_NO_THROW(from_megatron_state(spec, 128, tensors, name, "--init")) << name;
  }
}

// ---- Hugging Face Llama/Mistral (LlamaForCausalLM's names) ----

// A tiny Llama with grouped-query attention (4 query heads, 2 key/value heads, head size 4),
// SwiGLU, RMSNorm, rotary embeddings; the vocabulary unpadded so that the loss's softmax is over
// the same 16 rows as transformers'.
TransformerSpec tiny_llama(bool tied) {
  TransformerSpec s;
  s.name = "tiny-llama";
  s.num_layers = 2;
  s.hidden_size = 16;
  s.num_attention_heads = 4;
  s.num_query_groups = 2;
  s.ffn_hidden_size = 24;
  s.seq_length = 6;
  s.vocab_size = 16;
  s.vocab_divisible_by = 16;
  s.mlp = MlpKind::SwiGLU;
  s.normalization = NormKind::RMSNorm;
  s.tie_embeddings = tied;
  s.rotary_base = 500;  // angles that differ visibly between the channel pairs over 6 positions
  return s;
}

// Random tensors in LlamaForCausalLM's names and shapes ([out, in] weights).
std::vector<NamedTensor> hf_llama_tensors(const TransformerSpec& spec, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t h = spec.hidden_size, a = spec.num_attention_heads, g = spec.query_groups(), d = spec.head_dim(), f = spec.ffn(),
                V = spec.vocab_size;
  std::vector<NamedTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float shift) {
    int64_t count = 1;
    for (int64_t x : shape) count *= x;
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = shift + scale * n(rng);
    out.push_back(NamedTensor{name, std::move(shape), std::move(v)});
  };
  add("model.embed_tokens.weight", {V, h}, 1.0f, 0);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string o = "model.layers." + std::to_string(l) + ".";
    add(o + "input_layernorm.weight", {h}, 0.1f, 1);
    add(o + "self_attn.q_proj.weight", {a * d, h}, 0.4f, 0);
    add(o + "self_attn.k_proj.weight", {g * d, h}, 0.4f, 0);
    add(o + "self_attn.v_proj.weight", {g * d, h}, 0.4f, 0);
    add(o + "self_attn.o_proj.weight", {h, a * d}, 0.3f, 0);
    add(o + "post_attention_layernorm.weight", {h}, 0.1f, 1);
    add(o + "mlp.gate_proj.weight", {f, h}, 0.4f, 0);
    add(o + "mlp.up_proj.weight", {f, h}, 0.4f, 0);
    add(o + "mlp.down_proj.weight", {h, f}, 0.3f, 0);
  }
  add("model.norm.weight", {h}, 0.1f, 1);
  if (!spec.tie_embeddings) add("lm_head.weight", {V, h}, 0.5f, 0);
  return out;
}

// The mean next-token loss of LlamaForCausalLM computed from its tensors directly, in double,
// written from transformers' modeling_llama: RMSNorm (ε 1e-5, weight · x/rms), q/k/v_proj,
// rotary embeddings by rotate_half (channel i pairs with i + d/2, angle pos · base^(−2i/d)),
// causal softmax attention with key/value head j·g/a for query head j, o_proj, SiLU(gate)·up,
// down_proj, the final norm, lm_head (the embedding when tied), cross-entropy.
double llama_reference_loss(const TransformerSpec& spec, const std::vector<NamedTensor>& hf, const std::vector<int32_t>& tokens,
                            const std::vector<int32_t>& targets) {
  const int64_t h = spec.hidden_size, a = spec.num_attention_heads, g = spec.query_groups(), d = spec.head_dim(), f = spec.ffn(),
                V = spec.vocab_size, S = static_cast<int64_t>(tokens.size());
  using Mat = std::vector<std::vector<double>>;
  auto W = [&](const std::string& name) -> const NamedTensor& { return find(hf, name); };
  auto linear = [&](const Mat& x, const NamedTensor& w) {  // x [S, in] · wᵀ, w [out, in]
    const int64_t out = w.shape[0], in = w.shape[1];
    Mat y(x.size(), std::vector<double>(static_cast<size_t>(out)));
    for (size_t t = 0; t < x.size(); ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += x[t][static_cast<size_t>(i)] * w.values[static_cast<size_t>(o * in + i)];
        y[t][static_cast<size_t>(o)] = acc;
      }
    return y;
  };
  auto rms = [&](const Mat& x, const NamedTensor& w) {
    Mat y = x;
    for (auto& row : y) {
      double ss = 0;
      for (double v : row) ss += v * v;
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(h) + 1e-5);
      for (int64_t i = 0; i < h; ++i) row[static_cast<size_t>(i)] *= r * w.values[static_cast<size_t>(i)];
    }
    return y;
  };
  auto rope = [&](Mat& x, int64_t heads) {
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t i = 0; i < d / 2; ++i) {
          const double theta = static_cast<double>(t) * std::pow(spec.rotary_base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
          double& x1 = x[static_cast<size_t>(t)][static_cast<size_t>(hd * d + i)];
          double& x2 = x[static_cast<size_t>(t)][static_cast<size_t>(hd * d + i + d / 2)];
          const double r1 = x1 * std::cos(theta) - x2 * std::sin(theta), r2 = x2 * std::cos(theta) + x1 * std::sin(theta);
          x1 = r1, x2 = r2;
        }
  };
  Mat x(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(h)));
  const NamedTensor& emb = W("model.embed_tokens.weight");
  for (int64_t t = 0; t < S; ++t)
    for (int64_t i = 0; i < h; ++i) x[static_cast<size_t>(t)][static_cast<size_t>(i)] = emb.values[static_cast<size_t>(tokens[static_cast<size_t>(t)] * h + i)];
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string o = "model.layers." + std::to_string(l) + ".";
    const Mat n = rms(x, W(o + "input_layernorm.weight"));
    Mat q = linear(n, W(o + "self_attn.q_proj.weight")), k = linear(n, W(o + "self_attn.k_proj.weight"));
    const Mat v = linear(n, W(o + "self_attn.v_proj.weight"));
    rope(q, a);
    rope(k, g);
    Mat ctx(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(a * d), 0.0));
    for (int64_t hd = 0; hd < a; ++hd) {
      const int64_t kv = hd / (a / g);
      for (int64_t t = 0; t < S; ++t) {
        std::vector<double> score(static_cast<size_t>(t + 1));
        double top = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dotp = 0;
          for (int64_t e = 0; e < d; ++e) dotp += q[static_cast<size_t>(t)][static_cast<size_t>(hd * d + e)] * k[static_cast<size_t>(u)][static_cast<size_t>(kv * d + e)];
          score[static_cast<size_t>(u)] = dotp / std::sqrt(static_cast<double>(d));
          top = std::max(top, score[static_cast<size_t>(u)]);
        }
        for (double& sc : score) sum += (sc = std::exp(sc - top));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t e = 0; e < d; ++e)
            ctx[static_cast<size_t>(t)][static_cast<size_t>(hd * d + e)] += score[static_cast<size_t>(u)] / sum * v[static_cast<size_t>(u)][static_cast<size_t>(kv * d + e)];
      }
    }
    const Mat attn = linear(ctx, W(o + "self_attn.o_proj.weight"));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < h; ++i) x[static_cast<size_t>(t)][static_cast<size_t>(i)] += attn[static_cast<size_t>(t)][static_cast<size_t>(i)];
    const Mat n2 = rms(x, W(o + "post_attention_layernorm.weight"));
    Mat gate = linear(n2, W(o + "mlp.gate_proj.weight"));
    const Mat up = linear(n2, W(o + "mlp.up_proj.weight"));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < f; ++i) {
        double& z = gate[static_cast<size_t>(t)][static_cast<size_t>(i)];
        z = z / (1.0 + std::exp(-z)) * up[static_cast<size_t>(t)][static_cast<size_t>(i)];
      }
    const Mat down = linear(gate, W(o + "mlp.down_proj.weight"));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < h; ++i) x[static_cast<size_t>(t)][static_cast<size_t>(i)] += down[static_cast<size_t>(t)][static_cast<size_t>(i)];
  }
  const Mat logits = linear(rms(x, W("model.norm.weight")), spec.tie_embeddings ? emb : W("lm_head.weight"));
  double loss = 0;
  for (int64_t t = 0; t < S; ++t) {
    double top = -1e300, sum = 0;
    for (int64_t c = 0; c < V; ++c) top = std::max(top, logits[static_cast<size_t>(t)][static_cast<size_t>(c)]);
    for (int64_t c = 0; c < V; ++c) sum += std::exp(logits[static_cast<size_t>(t)][static_cast<size_t>(c)] - top);
    loss += top + std::log(sum) - logits[static_cast<size_t>(t)][static_cast<size_t>(targets[static_cast<size_t>(t)])];
  }
  return loss / static_cast<double>(S);
}

// ptdp's loss of one sequence with the parameters of a Megatron state dict (the CPU executor,
// one rank, one stage).
double ptdp_loss(const TransformerSpec& spec, const std::vector<NamedTensor>& megatron, const std::vector<int32_t>& tokens,
                 const std::vector<int32_t>& targets) {
  auto dev = make_cpu_device();
  auto tp = make_self_communicator("tensor-parallel group");
  ModelShard model(*dev, spec, 1, 0, 1, {spec.num_layers}, {0}, 7);
  EXPECT_EQ(model.padded_vocab(), spec.vocab_size);
  const ParameterSet full = from_megatron_state(spec, model.padded_vocab(), megatron, "llama.safetensors", "--init");
  for (const ParamInfo& p : model.stage(0).params()) {
    const std::vector<float>& v = full.at(p.name);
    for (size_t i = 0; i < p.count(); ++i) model.stage(0).values()[p.offset + i] = v[p.global_index(i)];
  }
  LayerContext ctx{*dev, *tp, {}, {}};
  StageActivations acts;
  return model.forward(ctx, 0, tokens.data(), targets.data(), Tensor(), acts, RecomputeMode::None);
}

// The test the conversion rests on: ptdp's loss from Llama tensors converted by from_hf_llama
// equals the loss an independent reference computes from the same tensors as transformers
// does (rotate_half rotary, GQA, SwiGLU). A wrong q/k regrouping, interleaved rotary pairs or a
// swapped gate/up would change the loss by far more than float rounding.
TEST(HuggingFaceLlama, LossFromLlamaTensorsEqualsTheReference) {
  const std::vector<int32_t> tokens{3, 14, 1, 9, 9, 0}, targets{14, 1, 9, 9, 0, 7};
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const TransformerSpec spec = tiny_llama(tied);
    const auto hf = hf_llama_tensors(spec, tied ? 11 : 12);
    const auto file = decode_safetensors(encode_safetensors(hf, {{"format", "pt"}}), "llama.safetensors");
    const double reference = llama_reference_loss(spec, hf, tokens, targets);
    const double mine = ptdp_loss(spec, from_hf(spec, file, "llama.safetensors", "--init"), tokens, targets);
    EXPECT_NEAR(mine, reference, 2e-5 * std::abs(reference)) << "reference " << reference;
    EXPECT_GT(reference, 0.5);
    // The same tensors with the rotary pairs taken as neighbours (the interleaved convention:
    // q_proj/k_proj rows permuted within each head) give another loss: the test tells them apart.
    auto interleaved = hf;
    for (auto& t : interleaved)
      if (t.name.find("q_proj") != std::string::npos || t.name.find("k_proj") != std::string::npos) {
        const int64_t d = spec.head_dim(), h = spec.hidden_size;
        std::vector<float> v = t.values;
        for (int64_t head = 0; head < t.shape[0] / d; ++head)
          for (int64_t i = 0; i < d; ++i) {
            const int64_t from = head * d + (i % 2 == 0 ? i / 2 : d / 2 + i / 2);
            std::copy_n(t.values.begin() + from * h, h, v.begin() + (head * d + i) * h);
          }
        t.values = v;
      }
    EXPECT_GT(std::abs(ptdp_loss(spec, from_hf(spec, interleaved, "x", "--init"), tokens, targets) - reference), 1e-3);
  }
}

// checkpoint --hf for a Llama-style model: LlamaForCausalLM's names and shapes, the tensors the
// import reads back unchanged, and a config.json that describes them.
TEST(HuggingFaceLlama, ExportIsTheInverseOfTheImportWithItsConfig) {
  for (bool tied : {false, true}) {
    const TransformerSpec spec = tiny_llama(tied);
    const auto hf = hf_llama_tensors(spec, 5);
    const auto megatron = from_hf_llama(spec, hf, "llama.safetensors", "--init");
    HfLlamaConfig c;
    c.vocab_size = 16, c.num_heads = 4, c.num_query_groups = 2, c.seq_length = 6, c.rotary_base = 500;
    c.normalization = "rmsnorm", c.position_embedding = "rope";
    const HfExport out = to_hf_llama(megatron, c, "--hf");
    ASSERT_EQ(out.tensors.size(), hf.size());
    for (const NamedTensor& t : hf) {
      const NamedTensor& e = find(out.tensors, t.name);
      EXPECT_EQ(e.shape, t.shape) << t.name;
      EXPECT_EQ(e.values, t.values) << t.name;
    }
    const nlohmann::json config = nlohmann::json::parse(out.config_json);
    EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(config["num_key_value_heads"], 2);
    EXPECT_EQ(config["head_dim"], 4);
    EXPECT_EQ(config["intermediate_size"], 24);
    EXPECT_EQ(config["num_hidden_layers"], 2);
    EXPECT_EQ(config["rope_theta"], 500.0);
    EXPECT_EQ(config["tie_word_embeddings"], tied);
    EXPECT_LT(config["eos_token_id"].get<int>(), 16);  // in the vocabulary
  }
  // What LlamaForCausalLM cannot hold is refused by name.
  const TransformerSpec gpt = tiny(false);
  HfLlamaConfig c;
  c.vocab_size = 16, c.num_heads = 2, c.num_query_groups = 2, c.seq_length = 4, c.normalization = "layernorm", c.position_embedding = "rope";
  try {
    to_hf_llama(to_megatron_state(gpt, 16, numbered(gpt, 16)), c, "--hf");
    FAIL() << "LayerNorm exported as Llama";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.normalization: layernorm"), std::string::npos) << e.what();
  }
  c.normalization = "rmsnorm";
  c.rotary_percent = 0.5;
  EXPECT_THROW(to_hf_llama({}, c, "--hf"), ConfigError);
}

std::string llama_refusal(const TransformerSpec& spec, const std::vector<NamedTensor>& tensors) {
  try {
    from_hf(spec, tensors, "model.safetensors", "--init");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// A file of another architecture names the first tensor that does not map and what was expected.
TEST(HuggingFaceLlama, AnotherArchitectureNamesTheTensorThatDoesNotMap) {
  const TransformerSpec spec = tiny_llama(false);
  // GPT-2's file into the Llama model.
  const TransformerSpec gpt = tiny(false);
  const HfExport gpt2 = to_hf_gpt2(to_megatron_state(gpt, 16, numbered(gpt, 16)), 16, 2, "--hf");
  std::string why = llama_refusal(spec, gpt2.tensors);
  EXPECT_NE(why.find("model.safetensors: tensor 'transformer.wte.weight' is GPT-2's"), std::string::npos) << why;
  EXPECT_NE(why.find("model.layers.N.{input_layernorm"), std::string::npos) << why;
  // Qwen2-style biases on q/k/v: a tensor that maps to nothing, named.
  auto with_bias = hf_llama_tensors(spec, 3);
  with_bias.push_back(NamedTensor{"model.layers.1.self_attn.q_proj.bias", {16}, std::vector<float>(16)});
  why = llama_refusal(spec, with_bias);
  EXPECT_NE(why.find("tensor 'model.layers.1.self_attn.q_proj.bias' maps to nothing in Llama's layout"), std::string::npos) << why;
  // ... also when the file lacks a tensor the model needs: the foreign tensor is named first.
  std::erase_if(with_bias, [](const NamedTensor& t) { return t.name == "model.norm.weight"; });
  why = llama_refusal(spec, with_bias);
  EXPECT_NE(why.find("tensor 'model.layers.1.self_attn.q_proj.bias' maps to nothing in Llama's layout"), std::string::npos) << why;
  // Another shape: more key/value heads than the model has.
  auto mha = hf_llama_tensors(spec, 3);
  for (auto& t : mha)
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {16, 16}, t.values.assign(256, 0.0f);
  why = llama_refusal(spec, mha);
  EXPECT_NE(why.find("'model.layers.0.self_attn.k_proj.weight' has shape [16, 16], this model's tiny-llama needs [8, 16]"),
            std::string::npos) << why;
  // A missing layer.
  auto short_file = hf_llama_tensors(spec, 3);
  std::erase_if(short_file, [](const NamedTensor& t) { return t.name.rfind("model.layers.1.", 0) == 0; });
  why = llama_refusal(spec, short_file);
  EXPECT_NE(why.find("has no tensor 'model.layers.1.input_layernorm.weight'"), std::string::npos) << why;
  // The rotary buffers older transformers saved are not parameters: ignored.
  auto buffers = hf_llama_tensors(spec, 3);
  buffers.push_back(NamedTensor{"model.layers.0.self_attn.rotary_emb.inv_freq", {2}, {1.0f, 0.1f}});
  EXPECT_EQ(llama_refusal(spec, buffers), "accepted");
  // A Llama file into a GPT-2-style model, and a model that is not Llama-style enough.
  why = llama_refusal(gpt, hf_llama_tensors(spec, 3));
  EXPECT_NE(why.find("'model.embed_tokens.weight' is Llama-style"), std::string::npos) << why;
  TransformerSpec layer_norm = spec;
  layer_norm.normalization = NormKind::LayerNorm;
  why = llama_refusal(layer_norm, hf_llama_tensors(spec, 3));
  EXPECT_NE(why.find("is a Hugging Face Llama/Mistral model, but this model has model.normalization: layernorm"), std::string::npos) << why;
}

}  // namespace
