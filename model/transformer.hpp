// The GPT model being trained: sizes and architecture choices, no parallelism.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ptdp {

/// The MLP of a layer: GELU (GPT, two GEMMs h→ffn→h) or SwiGLU (Llama: gate and up
/// projections h→ffn, silu(gate)·up, then ffn→h: three GEMMs).
enum class MlpKind { Gelu, SwiGLU };
/// The normalisation before attention, before the MLP and at the end: LayerNorm (scale and
/// bias) or RMSNorm (scale only).
enum class NormKind { LayerNorm, RMSNorm };
/// How attention runs: flash (one fused, tiled kernel — FlashAttention-2/3, cuDNN: no s×s score,
/// softmax or dropout tensors are materialised; the backward recomputes the scores blockwise) or
/// unfused (2021 Megatron: QKᵀ, softmax, dropout and ·V as separate kernels over s×s tensors).
enum class AttentionKind { Flash, Unfused };
/// How a token's position enters the model: learned absolute position embeddings added to the
/// word embedding (GPT; an [s, h] table), rotary embeddings applied to each layer's queries and
/// keys (Llama; no parameters: Su et al. 2021, as Megatron's --position-embedding-type rope), or
/// none (no position signal but the causal mask).
enum class PositionKind { Learned, Rope, None };

std::string to_string(MlpKind k);
std::string to_string(NormKind k);
/// Parse "gelu" | "swiglu"; throws ConfigError naming the choices.
MlpKind parse_mlp_kind(const std::string& text);
/// Parse "layernorm" | "rmsnorm"; throws ConfigError naming the choices.
NormKind parse_norm_kind(const std::string& text);
std::string to_string(AttentionKind k);
/// Parse "flash" | "unfused"; throws ConfigError naming the choices.
AttentionKind parse_attention_kind(const std::string& text);
std::string to_string(PositionKind k);
/// Parse "learned" | "rope" | "none"; throws ConfigError naming the choices.
PositionKind parse_position_kind(const std::string& text);

/// Mixture of experts (Megatron-Core MoE): the MLP of an MoE layer is a router (h → E) choosing
/// top_k of num_experts routed experts per token, each an MLP of expert_ffn_hidden_size (the
/// model's MLP kind), plus shared_experts always-on experts of shared_expert_ffn_hidden_size.
struct MoeSpec {
  int64_t num_experts = 0;              // E; 0 = a dense model
  int64_t top_k = 2;                    // k
  int64_t expert_ffn_hidden_size = 0;   // 0 = the model's ffn_hidden_size
  int64_t shared_experts = 0;           // always-on experts (DeepSeek, Qwen-MoE)
  int64_t shared_expert_ffn_hidden_size = 0;  // 0 = expert_ffn_hidden_size
  int64_t layer_frequency = 1;          // every n-th layer is MoE (1 = every layer, 2 = every other)
  int64_t first_dense_layers = 0;       // the first layers keep a dense MLP (DeepSeek-V3: 3)
  double capacity_factor = 0;           // 0 = dropless; else capacity = ceil(tokens·k/E·factor) per expert
  bool aux_free = false;                // router load balancing: aux-loss-free expert bias (else aux loss)
  double imbalance = 1.0;               // the busiest expert's load over the mean (dropless)
};

/// Multi-head latent attention (DeepSeek-V2/V3; Megatron's --multi-latent-attention): queries
/// and keys/values pass through low-rank latents. Per token: q = W_qb·norm(W_qa·x) (q_lora_rank
/// wide latent; 0 = one h → a·(qk + rope) projection), [c_kv, k_rope] = W_kva·x (kv_lora_rank +
/// qk_pos_emb_head_dim), k_nope and v of every head = W_kvb·norm(c_kv); each head's QKᵀ runs over
/// qk_head_dim + qk_pos_emb_head_dim channels (the rope channels of the key shared by all heads),
/// its ·V over v_head_dim; the output projection maps a·v_head_dim back to h.
struct MlaSpec {
  int64_t q_lora_rank = 0;           // 0: queries projected directly from h
  int64_t kv_lora_rank = 0;          // > 0 when the model has MLA
  int64_t qk_head_dim = 128;         // per head, without rotary position (DeepSeek-V3: 128)
  int64_t qk_pos_emb_head_dim = 64;  // per head, rotary (DeepSeek-V3: 64)
  int64_t v_head_dim = 128;          // per head (DeepSeek-V3: 128)
};

/// A decoder-only transformer (GPT). All sizes are counts.
struct TransformerSpec {
  std::string name = "gpt";
  int64_t num_layers = 0;           // l
  int64_t hidden_size = 0;          // h
  int64_t num_attention_heads = 0;  // a (query heads)
  int64_t num_query_groups = 0;     // key/value heads (GQA; 1 = MQA); 0 = a (multi-head attention)
  int64_t ffn_hidden_size = 0;      // 0 = 4h; with SwiGLU the inner size of gate, up and down
  int64_t seq_length = 0;           // s
  int64_t vocab_size = 0;           // V (before padding)
  /// Megatron's --make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this
  /// times the tensor-parallel size (each rank's shard a multiple of it).
  int64_t vocab_divisible_by = 128;
  /// Megatron-DeepSpeed's --pad-vocab-size-to: the padded vocabulary itself (0 = computed from
  /// vocab_divisible_by); at least vocab_size and divisible by the tensor-parallel size.
  int64_t padded_vocab_size = 0;
  MlpKind mlp = MlpKind::Gelu;
  NormKind normalization = NormKind::LayerNorm;
  bool tie_embeddings = true;       // the LM head reuses the word embedding
  AttentionKind attention = AttentionKind::Flash;
  /// Dropout probability of the attention probabilities and of the hidden states after the
  /// attention and MLP blocks; < 0 = the architecture's default (dropout_rate()).
  double dropout = -1;
  /// Biases in the linear layers (QKV, projection, MLP); -1 = the architecture's default
  /// (has_bias()), else 0 / 1.
  int bias = -1;
  /// Position embedding; unset = the architecture's default (position_kind()).
  std::optional<PositionKind> position_embedding;
  /// Rotary embeddings (Megatron's --rotary-base, --rotary-percent): the first
  /// rotary_dim() = head_dim·rotary_percent channels of each query and key head rotate, pair
  /// (i, i + rotary_dim/2) by the angle position·rotary_base^(−2i/rotary_dim); the rest pass.
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  MoeSpec moe;
  /// Multi-head latent attention (model.mla); kv_lora_rank 0 = the grouped-query attention above.
  MlaSpec mla;
  /// Multi-token prediction (DeepSeek-V3; Megatron's --mtp-num-layers): after the last layer,
  /// each MTP module norms the hidden state and the next token's embedding, projects the two
  /// (2h → h), runs one transformer layer (the last layer's kind) and the shared output layer and
  /// loss again — on the last pipeline stage. The embedding and output layer are shared.
  int64_t mtp_layers = 0;
  /// The MTP losses' weight (Megatron's --mtp-loss-scaling-factor): the loss trained is the
  /// next-token loss + mtp_loss_scale / mtp_layers × Σ over the modules of their losses.
  double mtp_loss_scale = 0.1;

  bool has_mla() const { return mla.kv_lora_rank > 0; }
  /// Whether the multi-token-prediction layers are MoE layers (as the model's last layer is).
  bool mtp_moe() const { return is_moe_layer(num_layers - 1); }
  bool has_moe() const { return moe.num_experts > 0; }
  /// Whether the output side reads the word embedding: the tied output layer, or the MTP
  /// modules' lookup of the next tokens (the pipeline's two ends then share the table).
  bool head_reads_embedding() const { return tie_embeddings || mtp_layers > 0; }
  /// Layers whose MLP is a mixture of experts.
  int64_t moe_layer_count() const;
  /// Whether layer i (0-based) has a mixture-of-experts MLP.
  bool is_moe_layer(int64_t i) const;
  int64_t expert_ffn() const { return moe.expert_ffn_hidden_size > 0 ? moe.expert_ffn_hidden_size : ffn(); }
  int64_t shared_expert_ffn() const { return moe.shared_expert_ffn_hidden_size > 0 ? moe.shared_expert_ffn_hidden_size : expert_ffn(); }

  /// Llama-style architecture (gated SwiGLU MLP): no biases and no dropout by default.
  bool llama_style() const { return mlp == MlpKind::SwiGLU; }
  /// The dropout probability in effect: the given one, else GPT's 0.1, or 0 for Llama-style models.
  double dropout_rate() const { return dropout >= 0 ? dropout : (llama_style() ? 0.0 : 0.1); }
  bool has_dropout() const { return dropout_rate() > 0; }
  /// Whether the linear layers have biases: the given choice, else GPT yes, Llama-style no.
  bool has_bias() const { return bias >= 0 ? bias != 0 : !llama_style(); }
  /// The position embedding in effect: the given one, else rotary for Llama-style models and
  /// learned positions for GPT.
  PositionKind position_kind() const { return position_embedding.value_or(llama_style() ? PositionKind::Rope : PositionKind::Learned); }
  /// Whether the model has the learned [s, h] position table.
  bool learned_positions() const { return position_kind() == PositionKind::Learned; }
  /// Channels of each head that rotate (Megatron: int(head_dim · rotary_percent); with MLA
  /// int(qk_pos_emb_head_dim · rotary_percent), its rotary embedding's width); 0 without rope.
  int64_t rotary_dim() const {
    return position_kind() == PositionKind::Rope ? static_cast<int64_t>(static_cast<double>(rotary_head_dim()) * rotary_percent) : 0;
  }
  /// The channels of a query or key head that rope may rotate: the head (MLA: its rotary part).
  int64_t rotary_head_dim() const { return has_mla() ? mla.qk_pos_emb_head_dim : head_dim(); }

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  /// Megatron's --kv-channels (model.head_dim): the width of each attention head; 0 = h / a.
  /// Qwen3 sets it to 128 with h / a = 64: queries and the attention output are then a·d_h wide,
  /// twice the hidden size.
  int64_t head_dim_size = 0;
  int64_t head_dim() const { return head_dim_size > 0 ? head_dim_size : hidden_size / num_attention_heads; }
  /// The attention kernel's head widths: QKᵀ over qk_dim() channels, ·V over v_dim() (MLA: 192 and
  /// 128 for DeepSeek-V3; else both head_dim()).
  int64_t qk_dim() const { return has_mla() ? mla.qk_head_dim + mla.qk_pos_emb_head_dim : head_dim(); }
  int64_t v_dim() const { return has_mla() ? mla.v_head_dim : head_dim(); }
  /// Width of the queries and of the attention output: heads · head_dim (= h by default).
  int64_t q_width() const { return num_attention_heads * head_dim(); }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  /// Width of the key (and of the value) projection: groups · head_dim (= h without GQA).
  int64_t kv_width() const { return query_groups() * head_dim(); }
  /// Vocabulary padded to a multiple of 128·t, as Megatron-LM does.
  int64_t padded_vocab(int64_t tensor) const;
  /// The architecture of the SC'21 paper: GELU MLP with ffn = 4h, multi-head attention,
  /// LayerNorm, tied embeddings, biases. Its FLOPs are the paper's Eq. 3 exactly.
  bool paper_architecture() const;
};

/// The counts below are sums over the declared tensors (model/tensors.hpp). With experts, the
/// per-layer counts are the mean over the model's layers (dense and MoE).
/// Parameters of the parts of one layer that tensor parallelism splits 1/t (QKV, projection and
/// MLP weights, the column-parallel biases, the routed experts), and those every TP rank holds
/// whole (the norms, the row-parallel biases, the router). layer_parameter_count = split +
/// replicated.
double layer_split_parameter_count(const TransformerSpec& spec);
/// The routed experts' part of layer_split_parameter_count (their MLP weights and biases, the
/// mean over the layers): split over expert_tensor × expert ranks instead of t.
double layer_expert_parameter_count(const TransformerSpec& spec);
double layer_replicated_parameter_count(const TransformerSpec& spec);

/// Parameters of one transformer layer: attention h·(h + 2·kv) + h² weights and 2h + 2·kv biases,
/// MLP 2h·ffn (GELU) or 3h·ffn (SwiGLU) weights and ffn + h (2·ffn + h) biases (no biases when
/// has_bias() is false), two norms of 2h (LayerNorm) or h (RMSNorm). For the paper's
/// architecture: 12h² + 13h.
double layer_parameter_count(const TransformerSpec& spec);

/// Parameters of one norm (2h LayerNorm, h RMSNorm).
double norm_parameter_count(const TransformerSpec& spec);

/// Parameters a token uses: total for a dense model; with experts the router, top_k routed
/// and the shared experts of each MoE layer, not the other experts.
double active_parameter_count(const TransformerSpec& spec);

/// Parameters of the multi-token-prediction modules (their routed experts included; the shared
/// embedding and output layer not): 0 without model.mtp_layers.
double mtp_parameter_count(const TransformerSpec& spec);

/// Parameter count: l layers, word embedding V·h (+ an output layer V·h when untied), learned
/// position embeddings s·h (none with rotary or no positions) and the final norm. For the paper's architecture this is exactly
/// Eq. 2, P = 12lh²(1 + 13/(12h) + (V+s)/(12lh)). The MTP modules' parameters are added.
double parameter_count(const TransformerSpec& spec);

}  // namespace ptdp
