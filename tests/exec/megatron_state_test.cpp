// Megatron's state dict of the executor's model (exec/io/megatron_state.hpp) and the safetensors
// reader and writer (exec/io/checkpoint.hpp): names, shapes, layouts, round trips, other dtypes.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/io/megatron_state.hpp"

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
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : {"ln1", "ln2"}) {
      add(p + n + ".weight", h);
      if (ln) add(p + n + ".bias", h);
    }
    add(p + "attention.qkv.weight", h * q);
    add(p + "attention.proj.weight", h * h);
    if (bias) add(p + "attention.qkv.bias", q), add(p + "attention.proj.bias", h);
    if (spec.is_moe_layer(l)) {
      add(p + "mlp.router.weight", h * spec.moe.num_experts);
      for (int64_t e = 0; e < spec.moe.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "fc1.weight", h * spec.expert_ffn());
        if (glu) add(x + "gate.weight", h * spec.expert_ffn());
        add(x + "fc2.weight", spec.expert_ffn() * h);
      }
      continue;
    }
    add(p + "mlp.fc1.weight", h * f);
    add(p + "mlp.fc2.weight", f * h);
    if (glu) add(p + "mlp.gate.weight", h * f);
    if (bias) {
      add(p + "mlp.fc1.bias", f), add(p + "mlp.fc2.bias", h);
      if (glu) add(p + "mlp.gate.bias", f);
    }
  }
  add("final_layernorm.weight", h);
  if (ln) add("final_layernorm.bias", h);
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

}  // namespace
