// Hugging Face model configs in (import_hf): a model's config.json (Llama, Mistral, Mixtral,
// Qwen2, Qwen2-MoE, DeepSeek-V2/V3, GPT-2, BLOOM) becomes the model keys of a scenario, on a base scenario's
// cluster, plan and training settings (or a small default plan).
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "interop/common.hpp"
#include "interop/interop.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

using nlohmann::json;

// The families ptdp models and what their configs mean.
enum class Family { Llama, Mixtral, QwenMoe, DeepSeek, Gpt2, Bloom };

struct Reader {
  const json& cfg;
  const std::string& source;
  std::set<std::string> read;  // keys used

  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
    read.insert(key);
    if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
    const json& v = cfg.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      json_fail(source, key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
    return v.get<int64_t>();
  }
  int64_t required(const char* key, int64_t lo, int64_t hi) {
    const auto v = integer(key, lo, hi);
    if (!v) throw ConfigError(key, "missing: the model's " + std::string(key) + " is needed", SourceLocation{source, 0, 0});
    return *v;
  }
  std::optional<bool> boolean(const char* key) {
    read.insert(key);
    if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
    if (!cfg.at(key).is_boolean()) json_fail(source, key, "expected true or false", cfg.at(key));
    return cfg.at(key).get<bool>();
  }
  std::optional<std::string> text(const char* key) {
    read.insert(key);
    if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
    if (!cfg.at(key).is_string()) json_fail(source, key, "expected a string", cfg.at(key));
    return cfg.at(key).get<std::string>();
  }
};

Family family_of(const std::string& model_type, const std::string& source) {
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3") return Family::Llama;
  if (model_type == "mixtral") return Family::Mixtral;
  if (model_type == "qwen2_moe") return Family::QwenMoe;
  if (model_type == "deepseek_v2" || model_type == "deepseek_v3") return Family::DeepSeek;
  if (model_type == "gpt2") return Family::Gpt2;
  if (model_type == "bloom") return Family::Bloom;
  throw ConfigError("model_type", "'" + printable(model_type) +
                                      "' is not an architecture ptdp models: expected llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, "
                                      "deepseek_v2, deepseek_v3, gpt2 or bloom" +
                                      did_you_mean(model_type, {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "deepseek_v2",
                                                                "deepseek_v3", "gpt2", "bloom"}),
                    SourceLocation{source, 0, 0});
}

// DeepSeek's multi-head latent attention (q_lora_rank: null means queries straight from h) and
// multi-token prediction modules (num_nextn_predict_layers), as model.mla and model.mtp_layers.
void deepseek_mla_mtp(Reader& in, std::vector<std::pair<std::string, std::string>>& model) {
  constexpr int64_t kWide = 1'000'000;
  auto width = [&](const char* key) { return std::to_string(in.required(key, 0, kWide)); };
  model.emplace_back("mla", yaml_list({{"q_lora_rank", std::to_string(in.integer("q_lora_rank", 0, kWide).value_or(0))},
                                       {"kv_lora_rank", width("kv_lora_rank")},
                                       {"qk_head_dim", width("qk_nope_head_dim")},
                                       {"qk_pos_emb_head_dim", width("qk_rope_head_dim")},
                                       {"v_head_dim", width("v_head_dim")}}));
  if (const auto mtp = in.integer("num_nextn_predict_layers", 0, 16); mtp && *mtp > 0) model.emplace_back("mtp_layers", std::to_string(*mtp));
}

// DeepSeek's experts: n_routed_experts of moe_intermediate_size (top num_experts_per_tok),
// n_shared_experts of the same width, the first first_k_dense_replace layers dense (of
// intermediate_size), every moe_layer_freq-th layer after; topk_method noaux_tc is the
// auxiliary-loss-free balancing.
std::vector<std::pair<std::string, std::string>> deepseek_moe(Reader& in, ImportResult& r) {
  constexpr int64_t kBig = 100'000'000;
  std::vector<std::pair<std::string, std::string>> moe;
  const int64_t experts = in.required("n_routed_experts", 1, 100'000);
  moe.emplace_back("num_experts", std::to_string(experts));
  moe.emplace_back("top_k", std::to_string(in.required("num_experts_per_tok", 1, experts)));
  moe.emplace_back("expert_ffn_hidden_size", std::to_string(in.required("moe_intermediate_size", 1, kBig)));
  if (const auto shared = in.integer("n_shared_experts", 0, 1000); shared && *shared > 0) moe.emplace_back("shared_experts", std::to_string(*shared));
  if (const auto dense = in.integer("first_k_dense_replace", 0, 100'000); dense && *dense > 0)
    moe.emplace_back("first_dense_layers", std::to_string(*dense));
  if (const auto every = in.integer("moe_layer_freq", 1, 100'000); every && *every > 1) moe.emplace_back("moe_layer_frequency", std::to_string(*every));
  if (const auto method = in.text("topk_method"); method && *method == "noaux_tc") moe.emplace_back("router_load_balance", "aux_free");
  if (const auto groups = in.integer("n_group", 1, 100'000); groups && *groups > 1)
    r.unsupported.push_back("n_group " + std::to_string(*groups) + " / topk_group (node-limited routing: tokens reach experts of fewer "
                            "nodes than top_k; modelled as unrestricted top_k routing)");
  in.read.insert("topk_group");
  return moe;
}

}  // namespace

ImportResult import_hf(const std::string& text, const std::string& source, const ImportOptions& options) {
  const json cfg = parse_config_json(text, source);
  try {
    if (!cfg.is_object()) json_fail(source, "(top level)", "expected a JSON object (a model's config.json)", cfg);
    ImportResult r;
    Reader in{cfg, source, {}};
    // The architecture: model_type, else the first of "architectures" (LlamaForCausalLM → llama).
    std::string model_type = in.text("model_type").value_or("");
    in.read.insert("architectures");
    if (model_type.empty() && cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
        cfg["architectures"][0].is_string()) {
      std::string arch = cfg["architectures"][0].get<std::string>();
      for (const char* suffix : {"ForCausalLM", "LMHeadModel"})
        if (const auto at = arch.find(suffix); at != std::string::npos) arch = arch.substr(0, at);
      for (char& c : arch) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      model_type = arch == "qwen2moe" ? "qwen2_moe" : arch == "deepseekv2" ? "deepseek_v2" : arch == "deepseekv3" ? "deepseek_v3" : arch;
    }
    if (model_type.empty()) throw ConfigError("model_type", "missing (and no \"architectures\"): which model is this?", SourceLocation{source, 0, 0});
    const Family family = family_of(model_type, source);
    const bool gpt2 = family == Family::Gpt2;

    constexpr int64_t kBig = 100'000'000;
    std::vector<std::pair<std::string, std::string>> model = {{"name", scalar_yaml(model_type)}};
    auto set = [&](const std::string& k, int64_t v) { model.emplace_back(k, std::to_string(v)); };
    const int64_t layers = in.required(gpt2 ? "n_layer" : family == Family::Bloom ? "n_layer" : "num_hidden_layers", 1, 100'000);
    const int64_t hidden = in.required(gpt2 ? "n_embd" : "hidden_size", 1, 1'000'000);
    const int64_t heads = in.required(gpt2 || family == Family::Bloom ? "n_head" : "num_attention_heads", 1, 1'000'000);
    set("num_layers", layers);
    set("hidden_size", hidden);
    set("num_attention_heads", heads);
    // An explicit head width (Qwen3: head_dim 128 with hidden 1024 and 16 heads) changes the
    // attention's parameters and FLOPs: model.head_dim carries it.
    if (const auto hd = in.integer("head_dim", 1, 1'000'000); hd && *hd * heads != hidden) set("head_dim", *hd);
    if (const auto kv = in.integer("num_key_value_heads", 1, 1'000'000); kv && *kv != heads) set("num_query_groups", *kv);
    set("vocab_size", in.required("vocab_size", 1, kBig));

    // Sequence length: the trained length is the run's choice; the model's maximum, capped.
    const char* pos_key = gpt2 ? "n_positions" : "max_position_embeddings";
    int64_t seq = in.integer(pos_key, 1, 10'000'000).value_or(family == Family::Bloom ? 2048 : 4096);
    constexpr int64_t kSeqCap = 8192;
    if (seq > kSeqCap) {
      r.notes.push_back(std::string("seq_length ") + std::to_string(kSeqCap) + " of " + pos_key + " " + std::to_string(seq) +
                        " (set model.seq_length to the run's sequence length)");
      seq = kSeqCap;
    } else if (family == Family::Bloom) {
      r.notes.push_back("seq_length 2048 (BLOOM's training length; its config has none)");
    }
    set("seq_length", seq);

    if (gpt2 || family == Family::Bloom) {
      model.emplace_back("mlp", "gelu");
      model.emplace_back("normalization", "layernorm");
      model.emplace_back("bias", "true");
      model.emplace_back("tie_embeddings", "true");
      if (gpt2) {
        if (const auto inner = in.integer("n_inner", 1, kBig)) set("ffn_hidden_size", *inner);
        if (const auto act = in.text("activation_function"); act && act->rfind("gelu", 0) != 0)
          r.unsupported.push_back("activation_function: " + *act + " (modelled as GELU)");
      }
      if (family == Family::Bloom)
        r.unsupported.push_back("ALiBi position biases: BLOOM has no position embeddings; ptdp counts learned ones (s × h parameters too many)");
    } else {
      // Llama-style: SwiGLU MLP, RMSNorm, no biases.
      model.emplace_back("mlp", "swiglu");
      model.emplace_back("normalization", "rmsnorm");
      model.emplace_back("bias", "false");
      model.emplace_back("tie_embeddings", in.boolean("tie_word_embeddings").value_or(false) ? "true" : "false");
      if (const auto act = in.text("hidden_act"); act && *act != "silu" && *act != "swish")
        r.unsupported.push_back("hidden_act: " + *act + " (modelled as SwiGLU's SiLU gate)");
      if (family != Family::QwenMoe) set("ffn_hidden_size", in.required("intermediate_size", 1, kBig));
      if (model_type == "qwen2" || model_type == "qwen2_moe")
        r.unsupported.push_back("Qwen2's QKV biases (modelled without biases: a few hundred parameters per layer)");
      if (const auto window = in.integer("sliding_window", 0, 10'000'000); window && model_type == "mistral")
        r.unsupported.push_back("sliding_window " + std::to_string(*window) + " (attention modelled over the whole sequence)");
      in.read.insert("use_sliding_window");
    }
    model.emplace_back("attention", "flash");
    model.emplace_back("dropout", "0");
    if (family == Family::DeepSeek) deepseek_mla_mtp(in, model);

    // Mixture of experts.
    if (family == Family::DeepSeek) {
      model.emplace_back("moe", yaml_list(deepseek_moe(in, r)));
    } else if (family == Family::Mixtral || family == Family::QwenMoe) {
      std::vector<std::pair<std::string, std::string>> moe;
      const int64_t experts = in.required(family == Family::Mixtral ? "num_local_experts" : "num_experts", 1, 100'000);
      moe.emplace_back("num_experts", std::to_string(experts));
      moe.emplace_back("top_k", std::to_string(in.required("num_experts_per_tok", 1, experts)));
      if (family == Family::Mixtral) {
        moe.emplace_back("expert_ffn_hidden_size", std::to_string(in.required("intermediate_size", 1, kBig)));
      } else {
        moe.emplace_back("expert_ffn_hidden_size", std::to_string(in.required("moe_intermediate_size", 1, kBig)));
        if (const auto shared = in.integer("shared_expert_intermediate_size", 0, kBig); shared && *shared > 0) {
          moe.emplace_back("shared_experts", "1");
          moe.emplace_back("shared_expert_ffn_hidden_size", std::to_string(*shared));
        }
        if (const auto every = in.integer("decoder_sparse_step", 1, 100'000); every && *every > 1)
          moe.emplace_back("moe_layer_frequency", std::to_string(*every));
        in.read.insert("mlp_only_layers");
        if (cfg.contains("mlp_only_layers") && cfg["mlp_only_layers"].is_array() && !cfg["mlp_only_layers"].empty())
          r.unsupported.push_back("mlp_only_layers " + printable(cfg["mlp_only_layers"].dump(), 60) + " (dense layers at chosen places)");
        in.integer("intermediate_size", 1, kBig);  // the dense layers' (with mlp_only_layers)
      }
      model.emplace_back("moe", yaml_list(moe));
    }

    // What the config holds that does not change time or memory, and the rest.
    static const std::set<std::string> no_effect = {
        "initializer_range", "rms_norm_eps",     "layer_norm_epsilon", "layer_norm_eps",  "rope_theta",        "rope_scaling",
        "torch_dtype",       "use_cache",        "bos_token_id",       "eos_token_id",    "pad_token_id",      "transformers_version",
        "attention_dropout", "attn_pdrop",       "resid_pdrop",        "embd_pdrop",      "summary_type",      "summary_use_proj",
        "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "router_aux_loss_coef",
        "output_router_logits", "router_jitter_noise", "norm_topk_prob", "pretraining_tp", "mlp_bias", "attention_bias",
        "max_window_layers", "hidden_dropout", "apply_residual_connection_post_layernorm", "slow_but_exact", "offset_alibi",
        "unk_token_id", "head_dim", "n_ctx", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "task_specific_params",
        "qkv_bias", "tie_word_embeddings", "_name_or_path", "model_type", "scoring_func", "routed_scaling_factor",
        "aux_loss_alpha", "seq_aux", "ep_size", "quantization_config"};
    for (const auto& [key, value] : cfg.items()) {
      if (in.read.count(key)) continue;
      const std::string shown = key + ": " + printable(value.dump(-1, ' ', false, json::error_handler_t::replace), 60);
      if (no_effect.count(key)) r.no_effect.push_back(shown);
      else r.unknown.push_back(shown);
    }

    // Cluster, plan and training: the base scenario's, else eight GPUs of the topology, data
    // parallelism only.
    std::ostringstream y;
    y << "# imported from a Hugging Face config (" << source << ") by ptdp import hf\n";
    y << "model:    " << yaml_list(model) << "\n";
    if (!options.base_scenario.empty()) {
      const Scenario base = load_scenario(options.base_scenario);
      const int64_t gpus = options.gpus > 0 ? options.gpus : base.gpus;
      y << "cluster:  " << yaml_list({{"topology", scalar_yaml(base.cluster.name)}, {"gpus", std::to_string(gpus)}}) << "\n";
      y << "parallel: " << yaml_list({{"tensor", std::to_string(base.plan.tensor)}, {"pipeline", std::to_string(base.plan.pipeline)}}) << "\n";
      y << "training: " << yaml_list({{"global_batch", std::to_string(base.plan.global_batch)},
                                       {"micro_batch", std::to_string(base.plan.micro_batch)},
                                       {"precision", to_string(base.plan.precision)}}) << "\n";
      r.notes.push_back("cluster topology, tensor/pipeline sizes and batch from " + options.base_scenario);
    } else {
      const int64_t gpus = options.gpus > 0 ? options.gpus : 8;
      y << "cluster:  " << yaml_list({{"topology", scalar_yaml(options.topology)}, {"gpus", std::to_string(gpus)}}) << "\n";
      y << "parallel: " << yaml_list({{"tensor", "1"}, {"pipeline", "1"}}) << "\n";
      y << "training: " << yaml_list({{"global_batch", std::to_string(gpus)}, {"micro_batch", "1"}, {"precision", "bf16"}}) << "\n";
      r.notes.push_back("plan: data parallelism over " + std::to_string(gpus) + " GPUs, micro batch 1, bf16 (choose one: ptdp sweep --auto)");
    }
    finish_import(r, y.str(), source);
    return r;
  } catch (const json::exception& e) {
    throw ConfigError("", std::string("unexpected JSON value: ") + e.what(), SourceLocation{source, 0, 0});
  }
}

}  // namespace ptdp
