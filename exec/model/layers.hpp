// GPT building blocks with Megatron-style tensor parallelism, forward and explicit backward.
// Activations are [tokens, hidden] row-major with tokens = batch·seq (sequence-major inside a
// sequence). Inputs and outputs of every block are replicated across the tensor-parallel group;
// the column-parallel QKV/FC1 and row-parallel projection/FC2 hold 1/t of the weights, with
// Megatron's f (identity forward, all-reduce backward) and g (all-reduce forward, identity
// backward) operators around them.
//
// With sequence parallelism (LayerShape::seq_parts = t, Korthikanti et al. 2022) the inputs and
// outputs of the blocks, the norms, bias + residual adds and the position embedding hold
// [batch, seq/t, hidden]: positions [part·s/t, (part+1)·s/t) of every sequence. f becomes an
// all-gather forward (reduce-scatter backward) and g a reduce-scatter forward (all-gather
// backward); the norm outputs are kept as shards and gathered again for the weight gradients.
// The replicated parameters of those regions (norms, row-parallel biases, positions) then get
// only this rank's tokens' gradient: sum them over the TP group before the optimizer step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/fp8.hpp"

namespace ptdp::exec {

inline constexpr float kLayerNormEps = 1e-5f;

struct LayerShape;

/// Dropout (model.dropout): which masks a call draws. An element's mask is a hash of (seed,
/// iteration, global sample, layer, site, sequence position, column), so every parallel layout
/// (t, p, d, cp, sequence parallelism) drops the same elements as serial training, and a
/// backward or a recompute draws the forward's mask again.
struct DropoutStream {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_sample = 0;  // the iteration's index of the microbatch's first sequence (over all data-parallel ranks)
  int layer = -1;            // the model's layer index; -1 = the embedding
};

/// What the blocks run on: a device and the tensor-parallel group. `on_tp_collective`, when
/// set, is told the wall-clock interval (seconds, steady clock) of each TP all-reduce.
struct LayerContext {
  Device& dev;
  Communicator& tp;
  std::function<void(double start_s, double end_s)> on_tp_collective;
  /// When set, told the interval of each activation recompute in a backward (the attention core
  /// under selective recompute, the layer forward under full recompute); the device is
  /// synchronised around it so the interval is its own.
  std::function<void(double start_s, double end_s)> on_recompute;
  /// The context-parallel group (LayerShape::cp members), null without context parallelism.
  Communicator* context = nullptr;
  /// The expert-parallel group (the ranks splitting the routed experts), null without it.
  Communicator* expert = nullptr;
  /// Sequence parallelism with t > 1: the expert-tensor group (the ranks splitting each expert's
  /// columns; the all-to-all dispatcher gathers their received tokens over it) and the
  /// expert-model group (expert-tensor × expert; the allgather dispatcher gathers over it). Null
  /// otherwise: every tensor rank then routes the same tokens.
  Communicator* expert_tensor = nullptr;
  Communicator* expert_model = nullptr;
  /// training.precision fp8: the linear layers' GEMMs (QKV, projection, fc1, gate, fc2) run
  /// FP8-emulated with this state's recipe and amax histories (exec/runtime/fp8.hpp); null: they
  /// run in the device's precision.
  Fp8Emulation* fp8 = nullptr;
  /// The dropout masks of the current microbatch and layer (LayerShape::dropout > 0).
  DropoutStream dropout{};
  /// Inside timed_recompute: a forward run again (the routers do not count their tokens twice).
  bool recomputing = false;
  /// parallel.tp_comm_overlap (sequence parallelism, not FP8): the all-gathers feeding the linear
  /// layers' GEMMs and the reduce-scatters after them run in the members' blocks under the
  /// GEMM's rows (Transformer Engine's userbuffers), as the engines price it.
  bool tp_comm_overlap = false;

  /// Runs `work` (a recompute) and reports its interval to on_recompute.
  void timed_recompute(const std::function<void()>& work);

  /// Sum over the tensor-parallel group (after synchronising the device), timed.
  void tp_all_reduce(float* data, size_t count, ReduceOp op = ReduceOp::Sum);
  /// Sequence parallelism: `full` [batch·seq, cols] (partial sums) reduced over the group into
  /// this rank's sequence part `part` [batch·seq/t, cols]; and the inverse gather. Timed.
  void sequence_reduce_scatter(const LayerShape& sh, const float* full, float* part, int cols);
  void sequence_all_gather(const LayerShape& sh, const float* part, float* full, int cols);
};

/// Monotonic wall clock in seconds (the executor's time base).
double now_s();

/// Per-rank sizes of one transformer layer.
struct LayerShape {
  int batch = 1;        // b
  int seq = 1;          // s
  int hidden = 1;       // h
  int heads_local = 1;  // a / t
  int head_dim = 1;     // h / a
  int ffn_local = 1;    // ffn / t
  int groups_local = 0; // key/value heads (query groups) / t; 0 = heads_local
  bool swiglu = false;  // gated MLP: silu(gate)·up instead of GELU
  bool rms_norm = false;  // RMSNorm (scale only) instead of LayerNorm
  int seq_parts = 1;      // sequence parallelism: t (each rank holds seq/t positions), else 1
  int seq_part = 0;       // this rank's part (its TP rank)
  bool flash = false;     // fused (flash) attention: no s×s probabilities kept, the backward recomputes them
  // Context parallelism (cp > 1): `seq` is this rank's s/cp tokens of each sequence, chunks
  // cp_rank and 2·cp − 1 − cp_rank of the sequence's 2·cp equal chunks (causal load balance);
  // attention exchanges key/value blocks around the context group (ring attention).
  int cp = 1;
  int cp_rank = 0;
  bool cp_all_gather = false;  // parallel.context_comm: allgather (gather every block at once) instead of the ring
  bool cp_all_to_all = false;  // parallel.context_comm: alltoall (Ulysses: a head shard of the whole sequence)
  int tp_rank = 0;  // this rank's place in the tensor-parallel group
  // Dropout probability of the embedding output and of each block's output before its residual
  // add (Megatron's hidden dropout, in bias_dropout_add); attention-probability dropout is not run.
  float dropout = 0;
  // Rotary position embeddings (model.position_embedding: rope): the first rotary_dim channels of
  // each query and key head rotate by position·rotary_base^(−2i/rotary_dim); 0 = none.
  int rotary_dim = 0;
  double rotary_base = 10000;
  // Mixture of experts (the layers whose LayerWeights have a router): moe_experts routed experts,
  // each token sent to its moe_top_k best (softmax over their router logits); this rank holds
  // experts [moe_first_expert, moe_first_expert + moe_local_experts), each split over the
  // expert-tensor group (parallel.expert_tensor, t by default: like the dense MLP) into
  // moe_ffn_local columns, moe_etp_rank this rank's place in it; moe_folded when that group is
  // not the tensor group (Megatron's parallel folding: every rank routes its own tokens, the
  // dispatchers gather over the expert groups). moe_capacity_factor > 0 caps each expert at
  // ceil(tokens·k/E·factor) tokens of a rank's microbatch (the most probable kept), 0 = dropless.
  int moe_experts = 0;
  int moe_top_k = 0;
  int moe_ffn_local = 0;
  int moe_local_experts = 0;
  int moe_first_expert = 0;
  int moe_etp_rank = 0;
  bool moe_folded = false;
  double moe_capacity_factor = 0;
  // Shared experts (model.moe.shared_experts): one MLP of shared·shared_ffn inner size beside the
  // routed experts on every token, split 1/t like the dense MLP (these columns); 0 = none.
  int moe_shared_ffn_local = 0;
  // parallel.moe_dispatcher: allgather (every member gathers the group's tokens, runs its experts
  // on theirs and reduce-scatters the weighted outputs back) instead of the all-to-all.
  bool moe_allgather = false;

  // Multi-head latent attention (model.mla; mla_kv_lora > 0): head_dim is each head's QK width
  // (qk_head_dim + qk_pos_emb_head_dim, the rotary channels last), v_dim its value width. The
  // queries come from a mla_q_lora-wide latent (0: from the norm's output), the keys' non-rotary
  // part and the values from a mla_kv_lora-wide latent, the rotary key (mla_rope channels) is
  // one per token, shared by the heads (exec/model/mla.hpp).
  int mla_q_lora = 0;
  int mla_kv_lora = 0;
  int mla_rope = 0;
  int v_dim = 0;  // 0 = head_dim
  bool mla() const { return mla_kv_lora > 0; }
  /// Width of the queries' input: the query latent, or the hidden size.
  int mla_q_in() const { return mla_q_lora > 0 ? mla_q_lora : hidden; }
  /// One token's row of the latents gathered for the up-projections: [queries' input | normed
  /// key/value latent | rotary key].
  int mla_latent_cols() const { return mla_q_in() + mla_kv_lora + mla_rope; }

  int tokens() const { return batch * seq; }
  /// Sequence position of the local token i (0 ≤ i < seq) of context rank `rank`.
  int32_t position(int i, int rank) const {
    if (cp == 1) return i;
    const int chunk = seq / 2;
    return i < chunk ? rank * chunk + i : (2 * cp - 1 - rank) * chunk + (i - chunk);
  }
  /// Rows of the sequence-parallel regions (block inputs and outputs) on this rank.
  int local_tokens() const { return batch * (seq / seq_parts); }
  bool sequence_parallel() const { return seq_parts > 1; }
  int qkv_cols() const { return attention().qkv_cols(); }
  int attn_cols() const { return attention().ctx_cols(); }
  AttentionShape attention() const { return AttentionShape{batch, seq, heads_local, head_dim, groups_local, v_dim}; }
};

/// This rank's parameters (or gradients) of one layer: pointers into device memory.
/// Shapes: ln* [h] (replicated; no beta with RMSNorm), qkv_weight [h, (a + 2g)·d/t], qkv_bias
/// [(a + 2g)·d/t] (column-parallel, g query groups of head size d), proj_weight [h/t, h]
/// (row-parallel), proj_bias [h] (replicated), fc1_weight [h, ffn/t], fc1_bias [ffn/t] (SwiGLU:
/// the up projection; gate_weight, gate_bias the same shapes), fc2_weight [ffn/t, h], fc2_bias [h].
struct LayerWeights {
  float* ln1_gamma = nullptr;
  float* ln1_beta = nullptr;
  float* qkv_weight = nullptr;
  float* qkv_bias = nullptr;
  float* proj_weight = nullptr;
  float* proj_bias = nullptr;
  float* ln2_gamma = nullptr;
  float* ln2_beta = nullptr;
  float* fc1_weight = nullptr;
  float* fc1_bias = nullptr;
  float* fc2_weight = nullptr;
  float* fc2_bias = nullptr;
  float* gate_weight = nullptr;  // SwiGLU only
  float* gate_bias = nullptr;
  // Mixture-of-experts layers (instead of fc1/gate/fc2): the router [h, E] (replicated) and
  // this rank's experts: fc1 and gate [h, f/t], fc2 [f/t, h] each (no biases).
  float* router = nullptr;
  std::vector<float*> expert_fc1, expert_gate, expert_fc2;
  // With model.bias: fc1 and gate biases [f/t] (column-parallel), fc2 bias [h] (replicated over
  // the tensor group, added on tensor rank 0's partial sums); empty without biases.
  std::vector<float*> expert_fc1_bias, expert_gate_bias, expert_fc2_bias;
  // Aux-loss-free load balancing (model.moe.router_load_balance: aux_free), as Megatron-Core runs
  // it (its expert bias needs the sigmoid score): scores σ(logits), the top k of score + bias
  // chosen, weights the chosen scores over their sum. expert_bias [E] is a parameter slot no
  // gradient reaches (ModelShard::update_expert_bias moves it); expert_load [E] (host memory)
  // counts the tokens each expert was given in this iteration's forwards.
  float* expert_bias = nullptr;
  float* expert_load = nullptr;
  // Their shared experts (LayerShape::moe_shared_ffn_local > 0): fc1 and gate [h, fs/t], fc2
  // [fs/t, h] (no biases); the output is added to the routed experts'.
  float* shared_fc1 = nullptr;
  float* shared_gate = nullptr;
  float* shared_fc2 = nullptr;
  // Multi-head latent attention (instead of qkv_weight): the replicated down projections
  // q_down [h, q_lora] and kv_down [h, kv_lora + rope], their latents' norms, and the
  // column-parallel up projections q_up [q_lora (or h), a·qk/t] and kv_up [kv_lora, a·(nope + v)/t].
  float* q_down = nullptr;
  float* q_norm_gamma = nullptr;
  float* q_norm_beta = nullptr;
  float* q_up = nullptr;
  float* kv_down = nullptr;
  float* kv_norm_gamma = nullptr;
  float* kv_norm_beta = nullptr;
  float* kv_up = nullptr;
  float* shared_fc1_bias = nullptr;  // with model.bias, as the dense MLP's
  float* shared_gate_bias = nullptr;
  float* shared_fc2_bias = nullptr;
};

/// What an MLP (the dense one, or an MoE layer's shared experts) keeps from forward for backward.
struct MlpActivations {
  Tensor fc1;   // pre-activation (SwiGLU: the up projection)
  Tensor gate;  // SwiGLU: the gate projection
  Tensor act;   // GELU or SwiGLU output
  /// FP8 tensorwise scaling: the scales fc1's, the gate's and fc2's inputs were cast with.
  float fp8_input_scale[3] = {1, 1, 1};
};

/// What one layer keeps from forward for backward.
struct LayerActivations {
  Tensor ln1, ln1_mean, ln1_rstd;
  Tensor qkv;
  Tensor probs;  // unfused attention: the probabilities, empty under selective recompute
  Tensor lse;    // flash attention: the log-sum-exp of each query row [batch, heads, seq] (empty under selective recompute)
  Tensor ctx;
  /// Ulysses context parallelism: the attention's Q, K, V and output in the head-shard layout
  /// (1/cp of the tensor rank's heads, the whole sequence in order), kept with lse.
  Tensor heads_qkv, heads_ctx;
  Tensor x2;  // x + attention output (LayerNorm 2 input)
  Tensor ln2, ln2_mean, ln2_rstd;
  MlpActivations mlp;     // the dense MLP
  MlpActivations shared;  // mixture-of-experts layers with shared experts: theirs
  std::shared_ptr<struct MoeActivations> moe;  // mixture-of-experts layers: routing and expert activations
  std::shared_ptr<struct MlaActivations> mla;  // multi-head latent attention: the latents
  /// FP8 tensorwise scaling: the scales the forward's QKV and projection inputs were cast with,
  /// which their weight gradients reuse (Transformer Engine keeps the FP8 copy); the MLPs' in theirs.
  float fp8_input_scale[2] = {1, 1};
};

/// Weight-gradient work held back by a split backward (zero-bubble I/W): the tensors it needs
/// and the tasks that accumulate the weight gradients. run() performs and clears them.
struct DeferredWeightGrads {
  std::vector<Tensor> kept;
  std::vector<std::function<void()>> tasks;
  void run();
  bool empty() const { return tasks.empty(); }
};

/// y = x + Attn(LN1(x)); out = y + MLP(LN2(y)). `out` must not alias `x`. x and out hold
/// local_tokens() rows.
/// keep_probs = false leaves acts.probs empty (the backward recomputes them: selective recompute).
void layer_forward(LayerContext& ctx, const LayerShape& shape, const LayerWeights& w, const float* x, float* out,
                   LayerActivations& acts, bool keep_probs);

/// Backward of layer_forward: dx (overwritten) from dout; weight gradients are accumulated into
/// `grads`, or queued in `defer` when it is not null (then only dx is computed now). Consumes
/// `acts` (its tensors are released or moved into `defer`). dx must not alias dout or x.
void layer_backward(LayerContext& ctx, const LayerShape& shape, const LayerWeights& w, const LayerWeights& grads,
                    const float* x, LayerActivations&& acts, const float* dout, float* dx, DeferredWeightGrads* defer);

/// Vocab-parallel word embedding (rows [first_row, first_row + rows) of the padded vocabulary
/// on this rank) plus learned position embeddings [seq, h] (replicated; null when the model has
/// rotary or no position embeddings).
struct EmbeddingWeights {
  float* word = nullptr;
  float* position = nullptr;
  int64_t first_row = 0;
  int rows = 0;
};

/// out[b·s + i] = word[tokens[b·s + i]] + position[i]; one TP all-reduce completes the lookup.
void embedding_forward(LayerContext& ctx, const LayerShape& shape, const EmbeddingWeights& w, const int32_t* tokens_host,
                       float* out);
/// Accumulates word and position gradients from dout (queued in `defer` when not null; then
/// `dout` is copied into it).
void embedding_backward(LayerContext& ctx, const LayerShape& shape, const EmbeddingWeights& grads,
                        const int32_t* tokens_host, const float* dout, DeferredWeightGrads* defer);

/// Final norm + LM head (logits = LN(x)·Eᵀ over this rank's vocabulary shard: the tied word
/// embedding, or the untied output layer of the same shape) +
/// vocab-parallel cross entropy. `valid_cols` counts the shard's columns below the real
/// vocabulary size: padding columns take no probability mass.
struct HeadWeights {
  float* lnf_gamma = nullptr;
  float* lnf_beta = nullptr;  // null with RMSNorm
  float* word = nullptr;  // [vocab_cols, h], the embedding shard (tied) or output layer shard
  int64_t first_col = 0;
  int vocab_cols = 0;
  int valid_cols = 0;
};

struct HeadActivations {
  Tensor lnf, lnf_mean, lnf_rstd;
  Tensor probs;  // softmax over the vocabulary shard, [tokens, vocab_cols]
};

/// Returns the mean cross-entropy loss (nats) over the shape's tokens. `counted_positions` > 0
/// leaves the positions from there to the end of each (whole) sequence out of the loss and its
/// mean (a multi-token-prediction module's labels past the sequence's end); under context
/// parallelism the positions are LayerShape::position's and the mean is the rank's share (its sum
/// over the counted positions of the whole sequences, times cp: the group's ranks are averaged).
double head_forward(LayerContext& ctx, const LayerShape& shape, const HeadWeights& w, const float* x,
                    const int32_t* targets_host, HeadActivations& acts, int counted_positions = 0);
/// dx (overwritten) of the loss scaled by `loss_scale` (d loss_scale·Σ token losses);
/// gradients of the final LayerNorm and the word embedding accumulated into `grads`
/// (the embedding's queued in `defer` when not null). Consumes `acts`. The positions head_forward
/// left out (`counted_positions`) get no gradient.
void head_backward(LayerContext& ctx, const LayerShape& shape, const HeadWeights& w, const HeadWeights& grads,
                   const float* x, const int32_t* targets_host, float loss_scale, HeadActivations&& acts, float* dx,
                   DeferredWeightGrads* defer, int counted_positions = 0);

}  // namespace ptdp::exec
