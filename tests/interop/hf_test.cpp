// Hugging Face model configs in (interop/hf.cpp). The configs are written here from the published
// config.json files of each model (sizes as released), trimmed to the keys that matter.
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "interop/interop.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

Scenario imported(const std::string& config, ImportResult* out = nullptr) {
  const ImportResult r = import_hf(config, "config.json", ImportOptions{});
  if (out) *out = r;
  return load_scenario_text(r.yaml, "imported");
}

std::string refusal(const std::string& config) {
  try {
    import_hf(config, "config.json", ImportOptions{});
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.where().file, "config.json") << e.what();
    return e.what();
  }
  ADD_FAILURE() << config << ": accepted";
  return "";
}

TEST(HuggingFace, Llama3And8x7bMixtralAndGpt2HaveTheirPublishedSizes) {
  ImportResult r;
  const Scenario llama = imported(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": false, "hidden_act": "silu", "rope_theta": 500000.0})", &r);
  EXPECT_EQ(llama.model.mlp, MlpKind::SwiGLU);
  EXPECT_EQ(llama.model.normalization, NormKind::RMSNorm);
  EXPECT_EQ(llama.model.query_groups(), 8);
  EXPECT_FALSE(llama.model.tie_embeddings);
  EXPECT_NEAR(parameter_count(llama.model) / 8.03e9, 1.0, 0.02);  // Llama 3 8B
  EXPECT_NE(r.no_effect.size(), 0u);                                 // rope_theta: listed, not dropped

  const Scenario mixtral = imported(R"({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "sliding_window": null, "router_aux_loss_coef": 0.02})", &r);
  EXPECT_EQ(mixtral.model.moe.num_experts, 8);
  EXPECT_EQ(mixtral.model.moe.top_k, 2);
  EXPECT_EQ(mixtral.model.seq_length, 8192);  // capped, and said so
  EXPECT_NE(r.notes.front().find("seq_length 8192 of max_position_embeddings 32768"), std::string::npos) << r.notes.front();
  EXPECT_NEAR(parameter_count(mixtral.model) / 46.7e9, 1.0, 0.02);
  EXPECT_NEAR(active_parameter_count(mixtral.model) / 12.9e9, 1.0, 0.03);

  const Scenario gpt2 = imported(R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "vocab_size": 50257, "n_inner": null, "activation_function": "gelu_new"})");
  EXPECT_EQ(gpt2.model.mlp, MlpKind::Gelu);
  EXPECT_TRUE(gpt2.model.has_bias());
  EXPECT_NEAR(parameter_count(gpt2.model) / 124e6, 1.0, 0.02);

  const Scenario qwen = imported(R"({"model_type": "qwen2_moe", "hidden_size": 3584, "intermediate_size": 18944,
    "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480, "num_experts": 64, "num_experts_per_tok": 8,
    "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 151936,
    "max_position_embeddings": 32768, "decoder_sparse_step": 1, "mlp_only_layers": []})", &r);
  EXPECT_EQ(qwen.model.moe.shared_experts, 1);
  EXPECT_EQ(qwen.model.shared_expert_ffn(), 20480);
  EXPECT_NEAR(parameter_count(qwen.model) / 57.4e9, 1.0, 0.02);  // Qwen2-57B-A14B
  bool said_biases = false;
  for (const auto& u : r.unsupported) said_biases |= u.find("QKV biases") != std::string::npos;
  EXPECT_TRUE(said_biases);
}

TEST(HuggingFace, WhatItCannotModelOrReadIsOneClearError) {
  EXPECT_NE(refusal(R"({"model_type": "t5", "d_model": 512})").find("'t5' is not an architecture ptdp models"), std::string::npos);
  EXPECT_NE(refusal(R"({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": "4096"})").find("hidden_size: expected an integer"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 10})")
                .find("num_hidden_layers: missing"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"model_type": "llama", "model_type": "gpt2"})").find("duplicate key"), std::string::npos);
  EXPECT_NE(refusal("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(refusal("{\"model_type\": ").find("not valid JSON"), std::string::npos);
  // A plan ptdp refuses is named too: 30 heads on a hidden size they do not divide.
  EXPECT_NE(refusal(R"({"model_type": "llama", "hidden_size": 4000, "intermediate_size": 100, "num_attention_heads": 30,
    "num_hidden_layers": 2, "vocab_size": 100})").find("the imported plan is not valid"),
            std::string::npos);
}

// Issue 36: Qwen3-0.6B's head_dim 128 (hidden 1024, 16 heads) was ignored (516 M parameters for
// ~596 M); it is read into model.head_dim (issue 31's key). A number beyond double's range names
// the file and key.
TEST(HuggingFace, AHeadDimOfItsOwnIsReadNotIgnored) {
  const std::string qwen3 = R"({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072, "num_hidden_layers": 28, "vocab_size": 151936, "max_position_embeddings": 40960,
    "tie_word_embeddings": true})";
  const Scenario sc = imported(qwen3);
  EXPECT_EQ(sc.model.head_dim(), 128);
  EXPECT_NEAR(parameter_count(sc.model) / 596e6, 1.0, 0.02);  // Qwen3-0.6B: ~596 M
  std::string same = qwen3;
  same.replace(same.find("\"head_dim\": 128"), 15, "\"head_dim\": 64");
  EXPECT_LT(parameter_count(imported(same).model), parameter_count(sc.model));
  const std::string big = refusal(R"({"model_type": "llama", "rope_theta": 1e400})");
  EXPECT_NE(big.find("rope_theta: not valid JSON (number overflow"), std::string::npos) << big;
}

// DeepSeek-V3's config.json (the published fields): its latent-attention widths, the
// multi-token-prediction module, the experts and the dense first layers import to the preset's
// values (scenarios/moe/deepseek-v3.yaml), so the same FLOPs and parameters follow.
TEST(HuggingFace, DeepSeekV3ImportsToThePresetsLatentAttentionExpertsAndMtp) {
  const std::string v3 = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "num_nextn_predict_layers": 1, "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": false,
    "hidden_act": "silu", "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "norm_topk_prob": true, "rms_norm_eps": 1e-06, "rope_theta": 10000})";
  ImportResult r;
  const Scenario sc = imported(v3, &r);
  const TransformerSpec preset = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/moe/deepseek-v3.yaml", {}).model;
  const TransformerSpec& m = sc.model;
  EXPECT_EQ(m.mla.q_lora_rank, 1536);
  EXPECT_EQ(m.mla.kv_lora_rank, preset.mla.kv_lora_rank);
  EXPECT_EQ(m.mla.q_lora_rank, preset.mla.q_lora_rank);
  EXPECT_EQ(m.mla.qk_head_dim, preset.mla.qk_head_dim);
  EXPECT_EQ(m.mla.qk_pos_emb_head_dim, preset.mla.qk_pos_emb_head_dim);
  EXPECT_EQ(m.mla.v_head_dim, preset.mla.v_head_dim);
  EXPECT_EQ(m.mtp_layers, 1);
  EXPECT_EQ(m.mtp_layers, preset.mtp_layers);
  EXPECT_EQ(m.num_layers, preset.num_layers);
  EXPECT_EQ(m.ffn(), preset.ffn());
  EXPECT_EQ(m.moe.num_experts, preset.moe.num_experts);
  EXPECT_EQ(m.moe.top_k, preset.moe.top_k);
  EXPECT_EQ(m.expert_ffn(), preset.expert_ffn());
  EXPECT_EQ(m.moe.shared_experts, preset.moe.shared_experts);
  EXPECT_EQ(m.shared_expert_ffn(), preset.shared_expert_ffn());
  EXPECT_EQ(m.moe.first_dense_layers, 3);
  EXPECT_EQ(m.moe.aux_free, preset.moe.aux_free);
  EXPECT_EQ(m.tie_embeddings, preset.tie_embeddings);
  EXPECT_EQ(m.query_groups(), preset.query_groups());
  // Hence the same model: 670.8 B + 11.5 B (MTP) parameters, as the preset counts them.
  EXPECT_DOUBLE_EQ(parameter_count(m), parameter_count(preset));
  EXPECT_NEAR(mtp_parameter_count(m) / 11.5e9, 1.0, 0.01);
  bool said_groups = false;
  for (const auto& u : r.unsupported) said_groups |= u.find("n_group 8") != std::string::npos;
  EXPECT_TRUE(said_groups);
  for (const auto& u : r.unknown) ADD_FAILURE() << "not read: " << u;
  // DeepSeek-V2-Lite: no query latent (q_lora_rank null), no MTP module.
  std::string lite = v3;
  lite.replace(lite.find("\"q_lora_rank\": 1536"), 19, "\"q_lora_rank\": null");
  lite.replace(lite.find("\"num_nextn_predict_layers\": 1"), 29, "\"num_nextn_predict_layers\": 0");
  const Scenario v2 = imported(lite);
  EXPECT_EQ(v2.model.mla.q_lora_rank, 0);
  EXPECT_EQ(v2.model.mla.kv_lora_rank, 512);
  EXPECT_EQ(v2.model.mtp_layers, 0);
  EXPECT_LT(parameter_count(v2.model), parameter_count(m));
  std::string no_latent = v3;
  no_latent.replace(no_latent.find("\"kv_lora_rank\": 512, "), 21, "");
  EXPECT_NE(refusal(no_latent).find("kv_lora_rank: missing"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
