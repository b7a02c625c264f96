#include "exec/model/mtp.hpp"

#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "exec/model/moe.hpp"

namespace ptdp::exec {

using layer_ops::column_parallel_input_grad;
using layer_ops::gathered;
using layer_ops::linear_forward;
using layer_ops::linear_input_grad;
using layer_ops::linear_weight_grad;
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

// [a, b] row by row: [rows, 2·cols] from two [rows, cols] tensors.
Tensor concatenated(Device& dev, int rows, int cols, const float* a, const float* b) {
  Tensor out(dev, rows, 2 * cols);
  for (int i = 0; i < rows; ++i) {
    dev.copy(a + static_cast<size_t>(i) * cols, out.data() + static_cast<size_t>(i) * 2 * cols, cols);
    dev.copy(b + static_cast<size_t>(i) * cols, out.data() + static_cast<size_t>(i) * 2 * cols + cols, cols);
  }
  return out;
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

// Megatron-Core's roll_tensor(shifts=-1) of the tokens and labels [batch, seq] in place: each
// sequence one place left, its last position 0. Under context parallelism a rank holds chunks r
// and 2·cp − 1 − r of each sequence; each chunk rolls within itself and its last place takes the
// first element of the next chunk in sequence order — rank r + 1's first chunk (the rank's own
// second chunk at r = cp − 1) and rank r − 1's second chunk (0 at r = 0: the sequence's end).
// So rank r > 0 sends its first chunk's head to r − 1, rank r < cp − 1 its second chunk's head to
// r + 1, one [token, label] pair per sequence each, as roll_tensor's isend/irecv pairs do.
void roll_left(LayerContext& ctx, const LayerShape& sh, std::vector<int32_t>& tokens, std::vector<int32_t>& labels) {
  const int s = sh.seq, b = sh.batch, cp = sh.cp;
  auto at = [s](int seq, int pos) { return static_cast<size_t>(seq) * s + pos; };
  if (cp == 1) {  // whole sequences: one place left, 0 rolled in at the end
    for (int q = 0; q < b; ++q) {
      for (int i = 0; i + 1 < s; ++i) tokens[at(q, i)] = tokens[at(q, i + 1)], labels[at(q, i)] = labels[at(q, i + 1)];
      tokens[at(q, s - 1)] = 0, labels[at(q, s - 1)] = 0;
    }
    return;
  }
  const int chunk = s / 2;  // the rank's two chunks of each sequence
  // The heads of the chunks before the roll: [seq][chunk] → (token, label).
  std::vector<int32_t> head(static_cast<size_t>(b) * 4);
  for (int q = 0; q < b; ++q)
    for (int c = 0; c < 2; ++c) {
      head[static_cast<size_t>(q) * 4 + c * 2] = tokens[at(q, c * chunk)];
      head[static_cast<size_t>(q) * 4 + c * 2 + 1] = labels[at(q, c * chunk)];
    }
  for (int q = 0; q < b; ++q)
    for (int c = 0; c < 2; ++c)
      for (int i = c * chunk; i + 1 < (c + 1) * chunk; ++i) tokens[at(q, i)] = tokens[at(q, i + 1)], labels[at(q, i)] = labels[at(q, i + 1)];
  // What each chunk's last place takes: [seq] → (token, label); 0 past the sequence's end.
  std::vector<int32_t> first_tail(static_cast<size_t>(b) * 2, 0), second_tail(static_cast<size_t>(b) * 2, 0);
  PTDP_ASSERT(ctx.context != nullptr && ctx.context->size() == cp, "the roll across context ranks needs the context group");
  Communicator& group = *ctx.context;
  const int r = group.rank();
  // The pairs travel as float-sized words (bit copies: no arithmetic touches them).
  static_assert(sizeof(int32_t) == sizeof(float));
  const size_t n = static_cast<size_t>(b) * 2;
  std::vector<float> send_first(n), send_second(n), recv_first(n), recv_second(n);
  for (int q = 0; q < b; ++q) {
    std::memcpy(&send_first[static_cast<size_t>(q) * 2], &head[static_cast<size_t>(q) * 4], 2 * sizeof(float));
    std::memcpy(&send_second[static_cast<size_t>(q) * 2], &head[static_cast<size_t>(q) * 4 + 2], 2 * sizeof(float));
  }
  constexpr int kRollTag = 1;  // apart from ring attention's blocks (tag 0)
  std::vector<std::unique_ptr<Request>> pending;
  if (r > 0) {
    pending.push_back(group.irecv(recv_second.data(), n, r - 1, kRollTag));
    pending.push_back(group.isend(send_first.data(), n, r - 1, kRollTag));
  }
  if (r < cp - 1) {
    pending.push_back(group.irecv(recv_first.data(), n, r + 1, kRollTag));
    pending.push_back(group.isend(send_second.data(), n, r + 1, kRollTag));
  } else {
    recv_first = send_second;  // the last rank's first chunk is followed by its own second chunk
  }
  for (auto& req : pending) req->wait();
  if (r > 0) std::memcpy(second_tail.data(), recv_second.data(), n * sizeof(float));
  std::memcpy(first_tail.data(), recv_first.data(), n * sizeof(float));
  for (int q = 0; q < b; ++q) {
    tokens[at(q, chunk - 1)] = first_tail[static_cast<size_t>(q) * 2];
    labels[at(q, chunk - 1)] = first_tail[static_cast<size_t>(q) * 2 + 1];
    tokens[at(q, s - 1)] = second_tail[static_cast<size_t>(q) * 2];
    labels[at(q, s - 1)] = second_tail[static_cast<size_t>(q) * 2 + 1];
  }
}

}  // namespace

double mtp_forward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpModule& m, const float* h_prev,
                   const int32_t* tokens, const int32_t* targets, bool full_recompute, bool keep_probs, MtpActivations& a) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, k = m.depth;
  const int whole = sh.seq * sh.cp;  // the whole sequence's length
  PTDP_ASSERT(k >= 1 && k < whole, "multi-token prediction needs sequences longer than its depth");
  const int hl = h / ctx.tp.size();
  // The previous depth's inputs and labels rolled left by one (Megatron's roll_tensor): depth k's
  // are the model's rolled by k, the k positions rolled in at the sequence's end 0 and left out
  // of the loss.
  a.tokens.assign(tokens, tokens + T);
  a.targets.assign(targets, targets + T);
  roll_left(ctx, sh, a.tokens, a.targets);
  a.emb = Tensor(dev, L, h);
  ctx.dropout.layer = -1 - k;  // the module's embedding dropout: masks of its own
  embedding_forward(ctx, sh, m.embedding, a.tokens.data(), a.emb.data());
  norm_forward(dev, sh, L, a.emb.data(), w.enorm_gamma, w.enorm_beta, a.ne, a.ne_mean, a.ne_rstd);
  norm_forward(dev, sh, L, h_prev, w.hnorm_gamma, w.hnorm_beta, a.nh, a.nh_mean, a.nh_rstd);
  // eh_proj (column-parallel: its input whole sequences, all-gathered under SP) of the
  // concatenation [norm(emb), norm(h)] (torch.cat in Megatron): rows 0…h−1 of its weight read
  // the embedding, rows h…2h−1 the hidden states; a linear layer as the others (FP8-emulated
  // with its own amax history under training.precision fp8).
  // (Only the shards are kept: the backward gathers them again for the weight gradient.)
  {
    Tensor ge = gathered(ctx, sh, a.ne), gh = gathered(ctx, sh, a.nh);
    const Tensor cat = concatenated(dev, T, h, sh.sequence_parallel() ? ge.data() : a.ne.data(),
                                    sh.sequence_parallel() ? gh.data() : a.nh.data());
    Tensor part(dev, T, hl);
    a.eh_input_scale = linear_forward(ctx, T, hl, 2 * h, cat.data(), w.eh_proj, part.data());
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
  return head_forward(ctx, sh, head_of(m, w.final_gamma, w.final_beta), a.layer_out.data(), a.targets.data(), a.head, whole - k);
}

void mtp_backward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpWeights& g, const MtpModule& m,
                  const EmbeddingWeights& embedding_grads, float* output_grad, float loss_scale, bool full_recompute,
                  const float* h_prev, MtpActivations& a, const float* d_out, float* d_h_prev, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, k = m.depth;
  const int t = ctx.tp.size(), hl = h / t;
  Tensor d_layer_out(dev, L, h);
  HeadWeights head_grads = head_of(m, g.final_gamma, g.final_beta);
  head_grads.word = output_grad;
  head_backward(ctx, sh, head_of(m, w.final_gamma, w.final_beta), head_grads, a.layer_out.data(), a.targets.data(), loss_scale,
                std::move(a.head), d_layer_out.data(), defer, sh.seq * sh.cp - k);
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
  Tensor cat;
  {
    Tensor ge = gathered(ctx, sh, a.ne), gh = gathered(ctx, sh, a.nh);
    cat = concatenated(dev, T, h, sh.sequence_parallel() ? ge.data() : a.ne.data(), sh.sequence_parallel() ? gh.data() : a.nh.data());
  }
  Tensor d_in(dev, T, 2 * h);
  const float d_scale = linear_input_grad(ctx, T, 2 * h, hl, d_part.data(), w.eh_proj, d_in.data());
  DeferredWeightGrads under;  // a whole B's weight gradient, under the input gradient's collective
  weight_grad(defer != nullptr ? defer : &under,
              [&ctx, T, h, hl, x = cat.data(), xs = a.eh_input_scale, dp = d_part.data(), d_scale, wk = w.eh_proj, gw = g.eh_proj] {
                linear_weight_grad(ctx, wk, T, 2 * h, hl, x, xs, dp, d_scale, gw);
              },
              {&cat, &d_part});
  // The two inputs' gradients: the columns of d_in.
  Tensor d_in_e(dev, T, h), d_in_h(dev, T, h);
  for (int i = 0; i < T; ++i) {
    dev.copy(d_in.data() + static_cast<size_t>(i) * 2 * h, d_in_e.data() + static_cast<size_t>(i) * h, h);
    dev.copy(d_in.data() + static_cast<size_t>(i) * 2 * h + h, d_in_h.data() + static_cast<size_t>(i) * h, h);
  }
  d_in.reset();
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
