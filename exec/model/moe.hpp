// The executor's mixture-of-experts layers (Megatron-Core's all-to-all and allgather
// dispatchers), called by layer_forward / layer_backward (exec/model/layers.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <array>
#include <vector>

#include "exec/model/layers.hpp"

namespace ptdp::exec {

// What a mixture-of-experts layer keeps from forward for backward (LayerActivations::moe).
struct MoeActivations {
  int T = 0, k = 0;
  std::vector<int32_t> choice;  // [T·k] the chosen experts of each token, best first
  std::vector<float> prob;      // [T·k] their routing weights (softmax over the chosen logits)
  std::vector<float> score;     // expert bias (sigmoid scores): [T·k] the chosen scores σ(logit), and
  std::vector<float> score_sum; // [T] their sum (the weights' denominator)
  std::vector<int64_t> slot;    // [T·k] row in the send order, −1 when the expert's capacity dropped it
  size_t sent = 0, received = 0;
  std::vector<size_t> send_rows, recv_rows;  // per expert-parallel member
  // Sequence parallelism: the rows this rank received (recv_rows' sum) and, per member of the
  // expert-tensor group, those it received (gathered: `received` rows); empty otherwise.
  size_t local_received = 0;
  std::vector<size_t> gather_rows;
  std::vector<size_t> expert_rows;            // rows of each local expert (grouped order)
  std::vector<std::pair<size_t, size_t>> runs;  // grouped order: (first received row, rows) runs
  Tensor x, fc1, gate, act;  // the experts' inputs and activations, grouped by expert
  // training.precision fp8, tensorwise: per local expert, the scales its fc1's, gate's and fc2's
  // inputs were cast with (the weight gradients reuse them).
  std::vector<std::array<float, 3>> fp8_input_scale;
  Tensor y;                  // the expert outputs back on the tokens' rank, send order (partial over TP)
  // The allgather dispatcher: each grouped row's member r and pair a (row r·T + a/k of the
  // gathered tokens) and routing weight; y then holds the grouped outputs, on the experts' rank.
  std::vector<std::pair<int, size_t>> origin;
  std::vector<float> origin_prob;
};

/// Sequence parallelism with t > 1 (and the expert groups built): each tensor rank routes its
/// own part of the sequence and the layer returns that part whole.
bool moe_split(const LayerContext& ctx, const LayerShape& sh);
/// The routed experts' output for `x` [tokens, h] (moe_split: the rank's local tokens) into
/// `out`: partial over the tensor group like the dense MLP's, or (moe_split) whole.
void moe_forward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const float* x, float* out,
                 MoeActivations& m);
/// dx (overwritten; as moe_forward's out) from dout; the router's and experts' weight gradients
/// into g (queued on `defer` under a split backward).
void moe_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g, const float* x,
                  MoeActivations&& m, const float* dout, float* dx, DeferredWeightGrads* defer);

/// GEMM helpers of the layers, shared with the experts.
namespace layer_ops {
/// C[m, n] (+)= A[m, k] · B[k, n], all contiguous row-major.
void matmul(Device& dev, int m, int n, int k, const float* a, const float* b, float* c, float beta = 0.0f);
/// C[m, n] = A[m, k] · B[n, k]ᵀ.
void matmul_bt(Device& dev, int m, int n, int k, const float* a, const float* b, float* c);
/// C[m, n] += A[k, m]ᵀ · B[k, n] (weight gradient: inputᵀ · output gradient).
void matmul_at_acc(Device& dev, int m, int n, int k, const float* a, const float* b, float* c);
/// Runs `task` now, or queues it with the tensors it reads when the backward is split.
void weight_grad(DeferredWeightGrads* defer, std::function<void()> task, std::vector<Tensor*> keep = {});

/// A linear layer's GEMMs (W is [in, out]; the dense layers' and each expert's): the device's
/// GEMMs, or with ctx.fp8 Transformer Engine's FP8 GEMMs emulated, the amax histories keyed by W.
/// y[T, out] = x[T, in]·W; returns the tensorwise scale x was cast with (1 without FP8).
float linear_forward(LayerContext& ctx, int T, int out, int in, const float* x, const float* w, float* y);
/// dx[T, in] = dy[T, out]·Wᵀ + beta·dx; returns the tensorwise scale dy was cast with.
float linear_input_grad(LayerContext& ctx, int T, int in, int out, const float* dy, const float* w, float* dx,
                        float beta = 0.0f);
/// gw[in, out] += x[T, in]ᵀ·dy[T, out], with the scales the forward and the input gradient used.
void linear_weight_grad(LayerContext& ctx, const float* w, int T, int in, int out, const float* x, float x_scale,
                        const float* dy, float dy_scale, float* gw);
}  // namespace layer_ops

}  // namespace ptdp::exec
