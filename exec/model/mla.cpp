#include "exec/model/mla.hpp"

#include <vector>

#include "core/error.hpp"
#include "exec/model/context_attention.hpp"
#include "exec/model/moe.hpp"

namespace ptdp::exec {
namespace {

using layer_ops::linear_forward;
using layer_ops::linear_input_grad;
using layer_ops::linear_weight_grad;
using layer_ops::weight_grad;

// A latent's norm (the model's kind, as Megatron builds q_layernorm and kv_layernorm) over
// `cols` channels.
void latent_norm_forward(Device& dev, const LayerShape& sh, int rows, int cols, const float* x, const float* gamma,
                         const float* beta, float* y, Tensor& mean, Tensor& rstd) {
  rstd = Tensor(dev, rows, 1);
  if (sh.rms_norm) {
    dev.rms_norm_forward(rows, cols, kLayerNormEps, x, gamma, y, rstd.data());
  } else {
    mean = Tensor(dev, rows, 1);
    dev.layer_norm_forward(rows, cols, kLayerNormEps, x, gamma, beta, y, mean.data(), rstd.data());
  }
}

void latent_norm_backward(Device& dev, const LayerShape& sh, int rows, int cols, const float* dy, const float* x,
                          const float* gamma, const Tensor& mean, const Tensor& rstd, float* dx, float* dgamma, float* dbeta) {
  if (sh.rms_norm) dev.rms_norm_backward(rows, cols, dy, x, gamma, rstd.data(), dx, dgamma);
  else dev.layer_norm_backward(rows, cols, dy, x, gamma, mean.data(), rstd.data(), dx, dgamma, dbeta);
}

// Columns [first, first + cols) of a row-major [rows, ld] tensor, as a tensor of their own.
Tensor columns(Device& dev, int rows, const float* src, int ld, int first, int cols) {
  Tensor out(dev, rows, cols);
  dev.copy_2d(rows, cols, src + first, ld, out.data(), cols);
  return out;
}

// Sizes of the rank's heads.
struct MlaDims {
  int heads, qk, nope, rope, v, q_cols, kv_cols;
  explicit MlaDims(const LayerShape& sh)
      : heads(sh.heads_local), qk(sh.head_dim), nope(sh.head_dim - sh.mla_rope), rope(sh.mla_rope),
        v(sh.attention().v_dim()), q_cols(heads * qk), kv_cols(heads * (nope + v)) {}
};

// The rotary channels of every query head ([nope | rope] per head) and of the one rotary key, in
// place; `inverse` rotates a gradient back. Interleaved pairs: Megatron's MLA rope de-interleaves
// the rotary channels of queries and key before rotating them (rope_utils.py), which leaves the
// scores those of rotating the pairs (2i, 2i + 1) in place.
void rotate(Device& dev, const LayerShape& sh, const MlaDims& d, float* q, float* k_rope, bool inverse) {
  if (sh.rotary_dim <= 0) return;
  const std::vector<int32_t> pos = positions_of(sh, sh.cp_rank);
  std::vector<size_t> heads;
  for (int j = 0; j < d.heads; ++j) heads.push_back(static_cast<size_t>(j * d.qk + d.nope));
  dev.rotary_heads(sh.batch, sh.seq, d.q_cols, heads, sh.rotary_dim, sh.rotary_base, pos.data(), inverse, true, q);
  dev.rotary_heads(sh.batch, sh.seq, d.rope, {0}, sh.rotary_dim, sh.rotary_base, pos.data(), inverse, true, k_rope);
}

}  // namespace

void mla_forward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, LayerActivations& a) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden;
  const int qr = sh.mla_q_lora, kr = sh.mla_kv_lora, q_in = sh.mla_q_in(), W = sh.mla_latent_cols();
  const MlaDims d(sh);
  a.mla = std::make_shared<MlaActivations>();
  MlaActivations& m = *a.mla;
  // The down projections and the latents' norms on the rank's rows, into one row of latents.
  m.latent = Tensor(dev, L, W);
  if (qr > 0) {
    m.q_down = Tensor(dev, L, qr);
    m.fp8_input_scale[0] = linear_forward(ctx, L, qr, h, a.ln1.data(), w.q_down, m.q_down.data());
    Tensor normed(dev, L, qr);
    latent_norm_forward(dev, sh, L, qr, m.q_down.data(), w.q_norm_gamma, w.q_norm_beta, normed.data(), m.q_mean, m.q_rstd);
    dev.copy_2d(L, qr, normed.data(), qr, m.latent.data(), W);
  } else {
    dev.copy_2d(L, h, a.ln1.data(), h, m.latent.data(), W);
  }
  Tensor kv(dev, L, kr + d.rope);
  m.fp8_input_scale[1] = linear_forward(ctx, L, kr + d.rope, h, a.ln1.data(), w.kv_down, kv.data());
  m.kv_down = columns(dev, L, kv.data(), kr + d.rope, 0, kr);
  Tensor normed(dev, L, kr);
  latent_norm_forward(dev, sh, L, kr, m.kv_down.data(), w.kv_norm_gamma, w.kv_norm_beta, normed.data(), m.kv_mean, m.kv_rstd);
  dev.copy_2d(L, kr, normed.data(), kr, m.latent.data() + q_in, W);
  dev.copy_2d(L, d.rope, kv.data() + kr, kr + d.rope, m.latent.data() + q_in + kr, W);
  normed.reset();
  kv.reset();
  // Every token's latents (one all-gather with sequence parallelism), then the up projections.
  Tensor gathered;
  if (sh.sequence_parallel()) {
    gathered = Tensor(dev, T, W);
    ctx.sequence_all_gather(sh, m.latent.data(), gathered.data(), W);
  }
  const float* full = sh.sequence_parallel() ? gathered.data() : m.latent.data();
  Tensor q(dev, T, d.q_cols), kv_up(dev, T, d.kv_cols);
  {
    Tensor x = columns(dev, T, full, W, 0, q_in);
    m.fp8_input_scale[2] = linear_forward(ctx, T, d.q_cols, q_in, x.data(), w.q_up, q.data());
    x = columns(dev, T, full, W, q_in, kr);
    m.fp8_input_scale[3] = linear_forward(ctx, T, d.kv_cols, kr, x.data(), w.kv_up, kv_up.data());
  }
  Tensor k_rope = columns(dev, T, full, W, q_in + kr, d.rope);
  gathered.reset();
  rotate(dev, sh, d, q.data(), k_rope.data(), false);
  // The kernel's layout: per head [query | key | value], the key [k_nope | k_rope].
  const AttentionShape ash = sh.attention();
  const int ld = ash.qkv_cols();
  a.qkv = Tensor(dev, T, ld);
  float* out = a.qkv.data();
  for (int j = 0; j < d.heads; ++j) {
    dev.copy_2d(T, d.qk, q.data() + j * d.qk, d.q_cols, out + ash.q_col(j), ld);
    dev.copy_2d(T, d.nope, kv_up.data() + j * (d.nope + d.v), d.kv_cols, out + ash.k_col(j), ld);
    dev.copy_2d(T, d.rope, k_rope.data(), d.rope, out + ash.k_col(j) + d.nope, ld);
    dev.copy_2d(T, d.v, kv_up.data() + j * (d.nope + d.v) + d.nope, d.kv_cols, out + ash.v_col(j), ld);
  }
}

Tensor mla_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g, LayerActivations& a,
                    Tensor&& d_qkv, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden;
  const int qr = sh.mla_q_lora, kr = sh.mla_kv_lora, q_in = sh.mla_q_in(), W = sh.mla_latent_cols();
  const MlaDims d(sh);
  PTDP_ASSERT(a.mla != nullptr, "multi-head latent attention's backward needs its forward's latents");
  MlaActivations& m = *a.mla;
  // The kernel's layout back to the up projections' outputs; the rotary key's gradient sums over
  // the heads it was broadcast to.
  const AttentionShape ash = sh.attention();
  const int ld = ash.qkv_cols();
  Tensor d_q(dev, T, d.q_cols), d_kv_up(dev, T, d.kv_cols), d_rope = Tensor::zeros(dev, T, d.rope), head(dev, T, d.rope);
  for (int j = 0; j < d.heads; ++j) {
    dev.copy_2d(T, d.qk, d_qkv.data() + ash.q_col(j), ld, d_q.data() + j * d.qk, d.q_cols);
    dev.copy_2d(T, d.nope, d_qkv.data() + ash.k_col(j), ld, d_kv_up.data() + j * (d.nope + d.v), d.kv_cols);
    dev.copy_2d(T, d.v, d_qkv.data() + ash.v_col(j), ld, d_kv_up.data() + j * (d.nope + d.v) + d.nope, d.kv_cols);
    dev.copy_2d(T, d.rope, d_qkv.data() + ash.k_col(j) + d.nope, ld, head.data(), d.rope);
    dev.axpy(head.size(), 1.0f, head.data(), d_rope.data());
  }
  head.reset();
  d_qkv.reset();
  rotate(dev, sh, d, d_q.data(), d_rope.data(), true);
  // The latents' gradient, partial over the tensor group (each rank's heads).
  Tensor d_full(dev, T, W);
  float q_gs = 1, kv_gs = 1;
  {
    Tensor part(dev, T, q_in);
    q_gs = linear_input_grad(ctx, T, q_in, d.q_cols, d_q.data(), w.q_up, part.data());
    dev.copy_2d(T, q_in, part.data(), q_in, d_full.data(), W);
    part = Tensor(dev, T, kr);
    kv_gs = linear_input_grad(ctx, T, kr, d.kv_cols, d_kv_up.data(), w.kv_up, part.data());
    dev.copy_2d(T, kr, part.data(), kr, d_full.data() + q_in, W);
    dev.copy_2d(T, d.rope, d_rope.data(), d.rope, d_full.data() + q_in + kr, W);
  }
  d_rope.reset();
  // The up projections' weight gradients read every token's latents (not the rotary key):
  // gathered again.
  {
    const int up = q_in + kr;
    Tensor gathered;
    if (sh.sequence_parallel()) {
      const Tensor mine = columns(dev, L, m.latent.data(), W, 0, up);
      gathered = Tensor(dev, T, up);
      ctx.sequence_all_gather(sh, mine.data(), gathered.data(), up);
    }
    const float* full = sh.sequence_parallel() ? gathered.data() : m.latent.data();
    const int ld_full = sh.sequence_parallel() ? up : W;
    Tensor x_q = columns(dev, T, full, ld_full, 0, q_in), x_kv = columns(dev, T, full, ld_full, q_in, kr);
    const float *xq = x_q.data(), *xkv = x_kv.data(), *dq = d_q.data(), *dkv = d_kv_up.data();
    weight_grad(defer, [&ctx, T, q_in, n = d.q_cols, xq, dq, xs = m.fp8_input_scale[2], q_gs, wk = w.q_up, gw = g.q_up] {
      linear_weight_grad(ctx, wk, T, q_in, n, xq, xs, dq, q_gs, gw);
    }, {&x_q, &d_q});
    weight_grad(defer, [&ctx, T, kr, n = d.kv_cols, xkv, dkv, xs = m.fp8_input_scale[3], kv_gs, wk = w.kv_up, gw = g.kv_up] {
      linear_weight_grad(ctx, wk, T, kr, n, xkv, xs, dkv, kv_gs, gw);
    }, {&x_kv, &d_kv_up});
  }
  // Summed over the tensor group: Megatron's f before the column-parallel up projections.
  Tensor d_latent;
  if (sh.sequence_parallel()) {
    d_latent = Tensor(dev, L, W);
    ctx.sequence_reduce_scatter(sh, d_full.data(), d_latent.data(), W);
  } else {
    ctx.tp_all_reduce(d_full.data(), d_full.size());
    d_latent = std::move(d_full);
  }
  // The latents' norms and the down projections, on the rank's rows.
  Tensor d_ln1(dev, L, h);
  const float* ln1 = a.ln1.data();
  if (qr > 0) {
    Tensor d_normed = columns(dev, L, d_latent.data(), W, 0, qr), d_down(dev, L, qr);
    latent_norm_backward(dev, sh, L, qr, d_normed.data(), m.q_down.data(), w.q_norm_gamma, m.q_mean, m.q_rstd, d_down.data(),
                         g.q_norm_gamma, g.q_norm_beta);
    const float gs = linear_input_grad(ctx, L, h, qr, d_down.data(), w.q_down, d_ln1.data());
    const float* dd = d_down.data();
    weight_grad(defer, [&ctx, L, h, qr, ln1, dd, xs = m.fp8_input_scale[0], gs, wk = w.q_down, gw = g.q_down] {
      linear_weight_grad(ctx, wk, L, h, qr, ln1, xs, dd, gs, gw);
    }, {&d_down});
  } else {
    dev.copy_2d(L, h, d_latent.data(), W, d_ln1.data(), h);
  }
  Tensor d_kv(dev, L, kr + d.rope);
  {
    Tensor d_normed = columns(dev, L, d_latent.data(), W, q_in, kr), d_down(dev, L, kr);
    latent_norm_backward(dev, sh, L, kr, d_normed.data(), m.kv_down.data(), w.kv_norm_gamma, m.kv_mean, m.kv_rstd, d_down.data(),
                         g.kv_norm_gamma, g.kv_norm_beta);
    dev.copy_2d(L, kr, d_down.data(), kr, d_kv.data(), kr + d.rope);
    dev.copy_2d(L, d.rope, d_latent.data() + q_in + kr, W, d_kv.data() + kr, kr + d.rope);
  }
  const float gs = linear_input_grad(ctx, L, h, kr + d.rope, d_kv.data(), w.kv_down, d_ln1.data(), 1.0f);
  const float* dkv = d_kv.data();
  // The norm output stays with a split backward's W (both down projections read it).
  weight_grad(defer, [&ctx, L, h, n = kr + d.rope, ln1, dkv, xs = m.fp8_input_scale[1], gs, wk = w.kv_down, gw = g.kv_down] {
    linear_weight_grad(ctx, wk, L, h, n, ln1, xs, dkv, gs, gw);
  }, {&d_kv, &a.ln1});
  a.mla.reset();
  return d_ln1;
}

}  // namespace ptdp::exec
