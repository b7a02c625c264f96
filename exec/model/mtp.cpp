#include "exec/model/mtp.hpp"

#include "core/error.hpp"
#include "exec/model/moe.hpp"

namespace ptdp::exec {

using layer_ops::column_parallel_input_grad;
using layer_ops::gathered;
using layer_ops::linear_input_grad;
using layer_ops::matmul;
using layer_ops::matmul_at_acc;
using layer_ops::norm_backward;
using layer_ops::norm_forward;
using layer_ops::weight_grad;

namespace {

// The module's final norm with the shared output layer.
HeadWeights head_of(const MtpModule& m, const float* gamma, const float* beta) {
  HeadWeights w = m.head;
  w.lnf_gamma = const_cast<float*>(gamma);
  w.lnf_beta = const_cast<float*>(beta);
  return w;
}

// eh_proj's output columns [tokens, h/t] of every tensor rank gathered into [tokens, h] (Megatron's
// gather_from_tensor_model_parallel_region), timed as a tensor-parallel collective.
Tensor gather_columns(LayerContext& ctx, const LayerShape& sh, Tensor part) {
  const int t = ctx.tp.size();
  if (t == 1) return part;
  const int T = sh.tokens(), h = sh.hidden, hl = h / t;
  Tensor blocks(ctx.dev, static_cast<int64_t>(t) * T * hl, 1);
  ctx.dev.synchronize();
  const double start = now_s();
  ctx.tp.all_gather(part.data(), blocks.data(), static_cast<size_t>(T) * hl);
  if (ctx.on_tp_collective) ctx.on_tp_collective(start, now_s());
  Tensor full(ctx.dev, T, h);
  for (int r = 0; r < t; ++r)
    for (int i = 0; i < T; ++i)
      ctx.dev.copy(blocks.data() + (static_cast<size_t>(r) * T + i) * hl, full.data() + static_cast<size_t>(i) * h + r * hl, hl);
  return full;
}

// Rows of this rank's sequence part of a whole-sequence tensor [tokens, h] (Megatron's
// scatter_to_sequence_parallel_region; no communication), or the tensor itself without SP.
Tensor sequence_part(Device& dev, const LayerShape& sh, Tensor full) {
  if (!sh.sequence_parallel()) return full;
  const int per = sh.seq / sh.seq_parts, h = sh.hidden;
  Tensor part(dev, sh.local_tokens(), h);
  for (int b = 0; b < sh.batch; ++b)
    dev.copy(full.data() + (static_cast<size_t>(b) * sh.seq + static_cast<size_t>(sh.seq_part) * per) * h,
             part.data() + static_cast<size_t>(b) * per * h, static_cast<size_t>(per) * h);
  return part;
}

}  // namespace

double mtp_forward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpModule& m, const float* h_prev,
                   const int32_t* tokens, const int32_t* targets, bool full_recompute, bool keep_probs, MtpActivations& a) {
  Device& dev = ctx.dev;
  PTDP_ASSERT(sh.cp == 1 && m.depth >= 1 && m.depth < sh.seq, "multi-token prediction needs whole sequences longer than its depth");
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, s = sh.seq, k = m.depth;
  const int hl = h / ctx.tp.size();
  // The inputs and labels rolled left by k; the k positions rolled in are 0 (Megatron's
  // roll_tensor) and left out of the loss.
  a.tokens.assign(static_cast<size_t>(T), 0);
  a.targets.assign(static_cast<size_t>(T), 0);
  for (int b = 0; b < sh.batch; ++b)
    for (int i = 0; i + k < s; ++i) {
      const size_t at = static_cast<size_t>(b) * s + i;
      a.tokens[at] = tokens[at + k];
      a.targets[at] = targets[at + k];
    }
  a.emb = Tensor(dev, L, h);
  ctx.dropout.layer = -1 - k;  // the module's embedding dropout: masks of its own
  embedding_forward(ctx, sh, m.embedding, a.tokens.data(), a.emb.data());
  norm_forward(dev, sh, L, a.emb.data(), w.enorm_gamma, w.enorm_beta, a.ne, a.ne_mean, a.ne_rstd);
  norm_forward(dev, sh, L, h_prev, w.hnorm_gamma, w.hnorm_beta, a.nh, a.nh_mean, a.nh_rstd);
  // eh_proj (column-parallel: its input whole sequences, all-gathered under SP): rows 0…h−1 of
  // its weight read norm(emb), rows h…2h−1 norm(h).
  // (Only the shards are kept: the backward gathers them again for the weight gradient.)
  {
    Tensor ge = gathered(ctx, sh, a.ne), gh = gathered(ctx, sh, a.nh);
    const float* xe = sh.sequence_parallel() ? ge.data() : a.ne.data();
    const float* xh = sh.sequence_parallel() ? gh.data() : a.nh.data();
    Tensor part(dev, T, hl);
    matmul(dev, T, hl, h, xe, w.eh_proj, part.data());
    matmul(dev, T, hl, h, xh, w.eh_proj + static_cast<size_t>(h) * hl, part.data(), 1.0f);
    a.layer_in = sequence_part(dev, sh, gather_columns(ctx, sh, std::move(part)));
  }
  a.layer_out = Tensor(dev, L, h);
  ctx.dropout.layer = m.layer_index;
  if (full_recompute) {
    LayerActivations discard;  // full recompute keeps only the layer's input
    layer_forward(ctx, sh, w.layer, a.layer_in.data(), a.layer_out.data(), discard, false);
  } else {
    layer_forward(ctx, sh, w.layer, a.layer_in.data(), a.layer_out.data(), a.layer, keep_probs);
  }
  return head_forward(ctx, sh, head_of(m, w.final_gamma, w.final_beta), a.layer_out.data(), a.targets.data(), a.head, s - k);
}

void mtp_backward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpWeights& g, const MtpModule& m,
                  const EmbeddingWeights& embedding_grads, float* output_grad, float loss_scale, bool full_recompute,
                  const float* h_prev, MtpActivations& a, const float* d_out, float* d_h_prev, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, s = sh.seq, k = m.depth;
  const int t = ctx.tp.size(), hl = h / t;
  Tensor d_layer_out(dev, L, h);
  HeadWeights head_grads = head_of(m, g.final_gamma, g.final_beta);
  head_grads.word = output_grad;
  head_backward(ctx, sh, head_of(m, w.final_gamma, w.final_beta), head_grads, a.layer_out.data(), a.targets.data(), loss_scale,
                std::move(a.head), d_layer_out.data(), defer, s - k);
  if (d_out != nullptr) dev.axpy(static_cast<size_t>(L) * h, 1.0f, d_out, d_layer_out.data());
  a.layer_out.reset();
  ctx.dropout.layer = m.layer_index;
  LayerActivations la;
  if (full_recompute) {
    ctx.timed_recompute([&] {
      Tensor scratch(dev, L, h);
      layer_forward(ctx, sh, w.layer, a.layer_in.data(), scratch.data(), la, true);
    });
  } else {
    la = std::move(a.layer);
  }
  Tensor d_layer_in(dev, L, h);
  layer_backward(ctx, sh, w.layer, g.layer, a.layer_in.data(), std::move(la), d_layer_out.data(), d_layer_in.data(), defer);
  a.layer_in.reset();
  // eh_proj's output gradient: whole sequences (all-gathered under SP), this rank's columns.
  Tensor d_full = sh.sequence_parallel() ? gathered(ctx, sh, d_layer_in) : std::move(d_layer_in);
  Tensor d_part(dev, T, hl);
  for (int i = 0; i < T; ++i)
    dev.copy(d_full.data() + static_cast<size_t>(i) * h + static_cast<size_t>(ctx.tp.rank()) * hl,
             d_part.data() + static_cast<size_t>(i) * hl, hl);
  d_full.reset();
  // The projection's inputs, whole sequences: gathered again under SP (the lowering's
  // mtp.eh_proj.input.allgather of the backward).
  Tensor ge = gathered(ctx, sh, a.ne), gh = gathered(ctx, sh, a.nh);
  Tensor& in_e = sh.sequence_parallel() ? ge : a.ne;
  Tensor& in_h = sh.sequence_parallel() ? gh : a.nh;
  Tensor d_in_e(dev, T, h), d_in_h(dev, T, h);
  linear_input_grad(ctx, T, h, hl, d_part.data(), w.eh_proj, d_in_e.data());
  linear_input_grad(ctx, T, h, hl, d_part.data(), w.eh_proj + static_cast<size_t>(h) * hl, d_in_h.data());
  DeferredWeightGrads under;  // a whole B's weight gradient, under the input gradient's collective
  {
    const float* xe = in_e.data();
    const float* xh = in_h.data();
    const float* dp = d_part.data();
    float* gw = g.eh_proj;
    weight_grad(defer != nullptr ? defer : &under, [&dev, T, h, hl, xe, xh, dp, gw] {
      matmul_at_acc(dev, h, hl, T, xe, dp, gw);
      matmul_at_acc(dev, h, hl, T, xh, dp, gw + static_cast<size_t>(h) * hl);
    }, {&in_e, &in_h, &d_part});
  }
  Tensor d_ne = column_parallel_input_grad(ctx, sh, std::move(d_in_e), &under);
  Tensor d_nh = column_parallel_input_grad(ctx, sh, std::move(d_in_h), nullptr);
  norm_backward(dev, sh, L, d_nh.data(), h_prev, w.hnorm_gamma, a.nh_mean, a.nh_rstd, d_h_prev, g.hnorm_gamma, g.hnorm_beta);
  Tensor d_emb(dev, L, h);
  norm_backward(dev, sh, L, d_ne.data(), a.emb.data(), w.enorm_gamma, a.ne_mean, a.ne_rstd, d_emb.data(), g.enorm_gamma,
                g.enorm_beta);
  ctx.dropout.layer = -1 - k;
  embedding_backward(ctx, sh, embedding_grads, a.tokens.data(), d_emb.data(), defer);
  std::vector<int32_t> tokens = std::move(a.tokens);
  a = MtpActivations();
  a.tokens = std::move(tokens);
}

}  // namespace ptdp::exec
