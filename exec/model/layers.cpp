#include "exec/model/layers.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "exec/model/context_attention.hpp"
#include "exec/model/mla.hpp"
#include "exec/model/moe.hpp"
#include "exec/runtime/elementwise_math.hpp"

namespace ptdp::exec {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void LayerContext::tp_all_reduce(float* data, size_t count, ReduceOp op) {
  if (tp.size() == 1) return;
  dev.synchronize();
  const double start = now_s();
  tp.all_reduce(data, count, op);
  if (on_tp_collective) on_tp_collective(start, now_s());
}

namespace {
// [batch, seq, cols] ⇄ [parts, batch, seq/parts, cols]: the collectives' block order (one
// contiguous block per rank) from the sequence-major activation layout, or back.
void permute_rank_blocks(Device& dev, const LayerShape& sh, const float* src, float* dst, int cols, bool to_blocks) {
  const size_t chunk = static_cast<size_t>(sh.seq / sh.seq_parts) * cols;
  for (int r = 0; r < sh.seq_parts; ++r)
    for (int b = 0; b < sh.batch; ++b) {
      const size_t in_full = (static_cast<size_t>(b) * sh.seq_parts + r) * chunk;
      const size_t in_blocks = (static_cast<size_t>(r) * sh.batch + b) * chunk;
      dev.copy(src + (to_blocks ? in_full : in_blocks), dst + (to_blocks ? in_blocks : in_full), chunk);
    }
}
}  // namespace

namespace {
// The runs of consecutive sequence positions among a rank's local rows of a sequence-parallel
// region, f(local row, sequence position, count): with sequence parallelism the rank's s/t part
// of its context-local tokens, with context parallelism two chunks per sequence (a part may
// straddle them).
template <typename F>
void for_each_position_run(const LayerShape& sh, F f) {
  const size_t part = static_cast<size_t>(sh.seq / sh.seq_parts), first = static_cast<size_t>(sh.seq_part) * part;
  const size_t chunk = static_cast<size_t>(sh.cp > 1 ? sh.seq / 2 : sh.seq);
  for (int b = 0; b < sh.batch; ++b)
    for (size_t i = first; i < first + part;) {
      const size_t end = std::min(first + part, (i / chunk + 1) * chunk);
      f(static_cast<size_t>(b) * part + (i - first), static_cast<size_t>(sh.position(static_cast<int>(i), sh.cp_rank)), end - i);
      i = end;
    }
}
}  // namespace

namespace {
// Dropout sites of a layer (the embedding's output is site 0 of layer −1).
enum class DropoutSite : uint64_t { Embedding = 0, Attention = 1, Mlp = 2 };

// Dropout of a sequence-parallel region's rows (local_tokens() × hidden) in place: each row's key
// from its global sample and sequence position (math::dropout_keep draws the columns).
void apply_dropout(LayerContext& ctx, const LayerShape& sh, DropoutSite site, float* x) {
  if (sh.dropout <= 0) return;
  const DropoutStream& d = ctx.dropout;
  const size_t part = static_cast<size_t>(sh.seq / sh.seq_parts);
  std::vector<uint64_t> keys(static_cast<size_t>(sh.local_tokens()));
  uint64_t base = math::mix64(d.seed);
  base = math::mix64(base ^ static_cast<uint64_t>(d.step));
  base = math::mix64(base ^ (static_cast<uint64_t>(d.layer + 1) << 8 | static_cast<uint64_t>(site)));
  for_each_position_run(sh, [&](size_t row, size_t position, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const uint64_t sample = static_cast<uint64_t>(d.first_sample) + (row + i) / part;
      keys[row + i] = math::mix64(math::mix64(base ^ sample) ^ static_cast<uint64_t>(position + i));
    }
  });
  ctx.dev.dropout(sh.local_tokens(), sh.hidden, keys.data(), sh.dropout, x);
}
}  // namespace

void LayerContext::sequence_reduce_scatter(const LayerShape& sh, const float* full, float* part, int cols) {
  PTDP_ASSERT(sh.seq_parts == tp.size() && sh.seq % sh.seq_parts == 0, "sequence parts must match the TP group");
  const size_t local = static_cast<size_t>(sh.local_tokens()) * cols;
  Tensor blocks(dev, static_cast<int64_t>(local) * sh.seq_parts, 1);
  permute_rank_blocks(dev, sh, full, blocks.data(), cols, true);
  dev.synchronize();
  const double start = now_s();
  tp.reduce_scatter(blocks.data(), part, local);
  if (on_tp_collective) on_tp_collective(start, now_s());
}

void LayerContext::sequence_all_gather(const LayerShape& sh, const float* part, float* full, int cols) {
  PTDP_ASSERT(sh.seq_parts == tp.size() && sh.seq % sh.seq_parts == 0, "sequence parts must match the TP group");
  const size_t local = static_cast<size_t>(sh.local_tokens()) * cols;
  Tensor blocks(dev, static_cast<int64_t>(local) * sh.seq_parts, 1);
  dev.synchronize();
  const double start = now_s();
  tp.all_gather(part, blocks.data(), local);
  if (on_tp_collective) on_tp_collective(start, now_s());
  permute_rank_blocks(dev, sh, blocks.data(), full, cols, false);
}

void LayerContext::timed_recompute(const std::function<void()>& work) {
  // A recompute re-runs forwards whose amaxes were recorded once (FP8 delayed scaling).
  struct Freeze {
    Fp8Emulation* fp8;
    bool was;
    explicit Freeze(Fp8Emulation* e) : fp8(e), was(e != nullptr && e->frozen) { if (fp8) fp8->frozen = true; }
    ~Freeze() { if (fp8) fp8->frozen = was; }
  } freeze(fp8);
  struct Mark {
    bool& flag;
    bool was;
    explicit Mark(bool& f) : flag(f), was(f) { flag = true; }
    ~Mark() { flag = was; }
  } mark(recomputing);
  if (!on_recompute) return work();
  dev.synchronize();
  const double start = now_s();
  work();
  dev.synchronize();
  on_recompute(start, now_s());
}


namespace layer_ops {

// C[m, n] (+)= A[m, k] · B[k, n], all contiguous row-major.
void matmul(Device& dev, int m, int n, int k, const float* a, const float* b, float* c, float beta) {
  dev.gemm(Trans::No, Trans::No, m, n, k, 1.0f, a, k, b, n, beta, c, n);
}
// C[m, n] = A[m, k] · B[n, k]ᵀ.
void matmul_bt(Device& dev, int m, int n, int k, const float* a, const float* b, float* c) {
  dev.gemm(Trans::No, Trans::Yes, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
// C[m, n] += A[k, m]ᵀ · B[k, n] (weight gradient: inputᵀ · output gradient).
void matmul_at_acc(Device& dev, int m, int n, int k, const float* a, const float* b, float* c) {
  dev.gemm(Trans::Yes, Trans::No, m, n, k, 1.0f, a, m, b, n, 1.0f, c, n);
}

// Runs `task` now, or queues it with the tensors it reads when the backward is split.
void weight_grad(DeferredWeightGrads* defer, std::function<void()> task, std::vector<Tensor*> keep) {
  if (defer == nullptr) {
    task();
    return;
  }
  for (Tensor* t : keep) defer->kept.push_back(std::move(*t));
  defer->tasks.push_back(std::move(task));
}

}  // namespace layer_ops
void DeferredWeightGrads::run() {
  for (auto& task : tasks) task();
  tasks.clear();
  kept.clear();
}

namespace {

using layer_ops::matmul;
using layer_ops::matmul_at_acc;
using layer_ops::matmul_bt;
using layer_ops::weight_grad;

// The linear layers' GEMMs (QKV, projection, fc1, gate, fc2; W is [in, out]): the device's
// GEMMs, or with ctx.fp8 Transformer Engine's FP8 GEMMs emulated: each operand cast (inputs and
// weights e4m3, output gradients e5m2 in the hybrid format) with the recipe's scales along the
// GEMM's reduction, then multiplied unrounded with fp32 accumulation. The amax histories are keyed
// by the layer's weight; the forward records its inputs' and weight's amax, the input gradient
// GEMM its output gradient's; the weight gradient reuses the scales of both.
using Fp8Role = Fp8Emulation::Role;

// The cast of one operand (rows×cols, reduced along its rows or columns) into a new tensor.
// `scale` (tensorwise): the scale to use, or ≤ 0 to take it from the history (the tensor's own
// amax on a first use); set to the scale used.
Tensor fp8_operand(LayerContext& ctx, const void* key, Fp8Role role, const float* src, int rows, int cols,
                   bool reduce_along_rows, float& scale, bool record) {
  Fp8Emulation& e = *ctx.fp8;
  Fp8Cast c{e.recipe(), e.type(role), rows, cols, reduce_along_rows, role == Fp8Role::Weight, 1.0f};
  Tensor out(ctx.dev, rows, cols);
  if (e.recipe() != Fp8Recipe::Tensorwise) scale = 1.0f;
  else if (!(scale > 0)) scale = e.has_history(key, role) ? e.delayed_scale(key, role) : fp8_scale_for(ctx.dev.fp8_cast(c, src, out.data()), c.type);
  c.tensor_scale = scale;
  const float amax = ctx.dev.fp8_cast(c, src, out.data());
  if (record) e.record(key, role, amax);
  return out;
}

// A GEMM of operands already cast to FP8 values: no further rounding to the device's bf16/fp16.
template <typename F>
void unrounded_gemm(Device& dev, F gemm) {
  const GemmOperands saved = dev.gemm_operands();
  dev.set_gemm_operands(GemmOperands::FP32);
  gemm();
  dev.set_gemm_operands(saved);
}

}  // namespace

namespace layer_ops {

// y[T, out] = x[T, in]·W; returns the tensorwise scale x was cast with (1 without FP8).
float linear_forward(LayerContext& ctx, int T, int out, int in, const float* x, const float* w, float* y) {
  if (ctx.fp8 == nullptr) {
    matmul(ctx.dev, T, out, in, x, w, y);
    return 1.0f;
  }
  float xs = 0, ws = 0;
  Tensor qx = fp8_operand(ctx, w, Fp8Role::Input, x, T, in, false, xs, true);
  Tensor qw = fp8_operand(ctx, w, Fp8Role::Weight, w, in, out, true, ws, true);
  unrounded_gemm(ctx.dev, [&] { matmul(ctx.dev, T, out, in, qx.data(), qw.data(), y); });
  return xs;
}

// dx[T, in] = dy[T, out]·Wᵀ + beta·dx; returns the tensorwise scale dy was cast with.
float linear_input_grad(LayerContext& ctx, int T, int in, int out, const float* dy, const float* w, float* dx,
                        float beta) {
  auto gemm = [&](const float* g, const float* wt) {
    ctx.dev.gemm(Trans::No, Trans::Yes, T, in, out, 1.0f, g, out, wt, out, beta, dx, in);
  };
  if (ctx.fp8 == nullptr) {
    gemm(dy, w);
    return 1.0f;
  }
  float gs = 0, ws = 0;
  Tensor qg = fp8_operand(ctx, w, Fp8Role::OutputGrad, dy, T, out, false, gs, true);
  Tensor qw = fp8_operand(ctx, w, Fp8Role::Weight, w, in, out, false, ws, false);
  unrounded_gemm(ctx.dev, [&] { gemm(qg.data(), qw.data()); });
  return gs;
}

// gw[in, out] += x[T, in]ᵀ·dy[T, out], with the scales the forward and the input gradient used.
void linear_weight_grad(LayerContext& ctx, const float* w, int T, int in, int out, const float* x, float x_scale,
                        const float* dy, float dy_scale, float* gw) {
  if (ctx.fp8 == nullptr) return matmul_at_acc(ctx.dev, in, out, T, x, dy, gw);
  Tensor qx = fp8_operand(ctx, w, Fp8Role::Input, x, T, in, true, x_scale, false);
  Tensor qg = fp8_operand(ctx, w, Fp8Role::OutputGrad, dy, T, out, true, dy_scale, false);
  unrounded_gemm(ctx.dev, [&] { matmul_at_acc(ctx.dev, in, out, T, qx.data(), qg.data(), gw); });
}


}  // namespace layer_ops

namespace {

using layer_ops::linear_forward;
using layer_ops::linear_input_grad;
using layer_ops::linear_weight_grad;

// One linear layer's GEMM cut into blocks of rows under a chunked collective (tp_comm_overlap),
// cast as the whole GEMM's operands would be. The forward (y = x·W) records the input's and the
// weight's amax, the input gradient (dx = dy·Wᵀ) the output gradient's, as linear_forward and
// linear_input_grad do. Every recipe's scales but tensorwise's are row-local (rowwise: per
// token; blockwise and mxfp8: blocks along the row), so a block of rows casts as it would inside
// the whole tensor; tensorwise's one scale comes from the amax history (delayed scaling) or, on a
// first use, from the whole tensor's amax (take_whole, before the first block's GEMM). Without
// FP8: the device's GEMM on the raw rows.
class ChunkedLinear {
 public:
  ChunkedLinear(LayerContext& ctx, const float* w, int in, int out, bool forward)
      : ctx_(ctx), w_(w), in_(in), out_(out), forward_(forward), role_(forward ? Fp8Role::Input : Fp8Role::OutputGrad) {
    if (ctx.fp8 == nullptr) return;
    float ws = 0;
    qw_ = fp8_operand(ctx, w, Fp8Role::Weight, w, in, out, forward, ws, forward);
    Fp8Emulation& e = *ctx.fp8;
    if (e.recipe() != Fp8Recipe::Tensorwise) scale_ = 1.0f;
    else if (e.has_history(w, role_)) scale_ = e.delayed_scale(w, role_);
  }
  /// A tensorwise first use: the scale waits for the whole tensor (take_whole).
  bool needs_whole() const { return ctx_.fp8 != nullptr && !(scale_ > 0); }
  void take_whole(const float* rows, int n) {
    Fp8Cast c{ctx_.fp8->recipe(), ctx_.fp8->type(role_), n, cols(), false, false, 1.0f};
    Tensor scratch(ctx_.dev, n, cols());
    scale_ = fp8_scale_for(ctx_.dev.fp8_cast(c, rows, scratch.data()), c.type);
  }
  /// The n output rows of the input rows `rows` ([n, in] forward, [n, out] input gradient).
  void gemm(const float* rows, int n, float* y) {
    Device& dev = ctx_.dev;
    auto run = [&](const float* x, const float* w) {
      if (forward_) matmul(dev, n, out_, in_, x, w, y);
      else dev.gemm(Trans::No, Trans::Yes, n, in_, out_, 1.0f, x, out_, w, out_, 0.0f, y, in_);
    };
    if (ctx_.fp8 == nullptr) return run(rows, w_);
    PTDP_ASSERT(scale_ > 0, "a tensorwise first use takes the whole tensor first");
    Fp8Cast c{ctx_.fp8->recipe(), ctx_.fp8->type(role_), n, cols(), false, false, scale_};
    Tensor q(dev, n, cols());
    amax_ = std::max(amax_, dev.fp8_cast(c, rows, q.data()));
    unrounded_gemm(dev, [&] { run(q.data(), qw_.data()); });
  }
  /// After the last block: records the input's amax; the scale it was cast with (1 without FP8).
  float finish() {
    if (ctx_.fp8 == nullptr) return 1.0f;
    ctx_.fp8->record(w_, role_, amax_);
    return scale_;
  }

 private:
  int cols() const { return forward_ ? in_ : out_; }
  LayerContext& ctx_;
  const float* w_;
  int in_, out_;
  bool forward_;
  Fp8Role role_;
  Tensor qw_;
  float scale_ = 0, amax_ = 0;
};

}  // namespace

// The norms and the sequence-parallel collectives around the linear layers (declared in
// exec/model/mtp.hpp for the multi-token-prediction modules).
namespace layer_ops {

// LayerNorm or RMSNorm of x into y; the statistics kept for backward (mean: LayerNorm only).
void norm_forward(Device& dev, const LayerShape& sh, int rows, const float* x, const float* gamma, const float* beta,
                  Tensor& y, Tensor& mean, Tensor& rstd) {
  const int h = sh.hidden;
  y = Tensor(dev, rows, h);
  rstd = Tensor(dev, rows, 1);
  if (sh.rms_norm) {
    dev.rms_norm_forward(rows, h, kLayerNormEps, x, gamma, y.data(), rstd.data());
  } else {
    mean = Tensor(dev, rows, 1);
    dev.layer_norm_forward(rows, h, kLayerNormEps, x, gamma, beta, y.data(), mean.data(), rstd.data());
  }
}

void norm_backward(Device& dev, const LayerShape& sh, int rows, const float* dy, const float* x, const float* gamma,
                   const Tensor& mean, const Tensor& rstd, float* dx, float* dgamma, float* dbeta) {
  if (sh.rms_norm) dev.rms_norm_backward(rows, sh.hidden, dy, x, gamma, rstd.data(), dx, dgamma);
  else dev.layer_norm_backward(rows, sh.hidden, dy, x, gamma, mean.data(), rstd.data(), dx, dgamma, dbeta);
}

// The whole sequence of a sequence-parallel shard [local_tokens, cols] (Megatron's ḡ before a
// column-parallel GEMM); an empty tensor without sequence parallelism (use the shard itself).
Tensor gathered(LayerContext& ctx, const LayerShape& sh, const Tensor& part) {
  if (!sh.sequence_parallel()) return Tensor();
  Tensor full(ctx.dev, sh.tokens(), part.cols());
  ctx.sequence_all_gather(sh, part.data(), full.data(), static_cast<int>(part.cols()));
  return full;
}

// g after a row-parallel GEMM: `out` [tokens, h] summed over the group in place, or with
// sequence parallelism `partial` [tokens, h] reduce-scattered into `out` [local_tokens, h].
void row_parallel_output(LayerContext& ctx, const LayerShape& sh, const Tensor& partial, float* out) {
  if (sh.sequence_parallel()) ctx.sequence_reduce_scatter(sh, partial.data(), out, sh.hidden);
  else ctx.tp_all_reduce(out, static_cast<size_t>(sh.tokens()) * sh.hidden);
}

// A tensor-parallel collective started without waiting (Megatron's asynchronous collectives of
// the backward): posted to MPI, or queued on the group's NCCL stream after the compute so far;
// wait() completes it. Its exposed parts, the start and the wait, are reported to
// on_tp_collective. Empty (wait() does nothing) when nothing was started.
class AsyncTp {
 public:
  template <typename Start>
  void start(LayerContext& ctx, Start&& begin) {
    const double t0 = now_s();
    request_ = begin();
    if (ctx.on_tp_collective) ctx.on_tp_collective(t0, now_s());
  }
  void wait(LayerContext& ctx) {
    if (!request_) return;
    const double t0 = now_s();
    request_->wait();
    request_.reset();
    if (ctx.on_tp_collective) ctx.on_tp_collective(t0, now_s());
  }

 private:
  std::unique_ptr<Request> request_;
};

// gathered(), started now and completed by finish_gathered(): sequence parallelism's re-gather of
// a norm output for a column-parallel weight gradient, run under the input-gradient GEMM (the
// lowering's `.input.allgather`, which overlaps `.dgrad`).
struct PendingGather {
  Tensor blocks;  // every rank's shard, in the collective's block order
  AsyncTp tp;
};
PendingGather start_gathered(LayerContext& ctx, const LayerShape& sh, const Tensor& part) {
  PendingGather g;
  if (!sh.sequence_parallel()) return g;
  PTDP_ASSERT(sh.seq_parts == ctx.tp.size() && sh.seq % sh.seq_parts == 0, "sequence parts must match the TP group");
  g.blocks = Tensor(ctx.dev, static_cast<int64_t>(part.size()) * sh.seq_parts, 1);
  g.tp.start(ctx, [&] { return ctx.tp.start_all_gather(part.data(), g.blocks.data(), part.size()); });
  return g;
}
Tensor finish_gathered(LayerContext& ctx, const LayerShape& sh, PendingGather&& g, int cols) {
  if (g.blocks.empty()) return Tensor();
  g.tp.wait(ctx);
  Tensor full(ctx.dev, sh.tokens(), cols);
  permute_rank_blocks(ctx.dev, sh, g.blocks.data(), full.data(), cols, false);
  return full;
}

// tp_comm_overlap (Transformer Engine's userbuffers; sequence parallelism): the sequence-parallel
// collectives next to a linear layer's GEMM split into the members' blocks, each block's GEMM rows
// computed while the other blocks travel (with FP8, each block cast as ChunkedLinear says).
bool chunked(const LayerContext& ctx, const LayerShape& sh) { return ctx.tp_comm_overlap && sh.sequence_parallel(); }

// An all-gather feeding a GEMM, chunked: every member's block (its [local_tokens, cols] part) is
// broadcast, all started at once; the GEMM runs on this member's own block, then on each other
// block as soon as it arrived. gemm(rows, n, first) computes the output rows [first, first + n)
// of the whole [tokens, ·] layout from the n input rows at `rows`. `full` (optional) receives the
// gathered [tokens, cols] tensor (a weight gradient reads it). A tensorwise FP8 first use among
// `linears` (ChunkedLinear::needs_whole) waits for every block before the first GEMM.
void gather_under_gemm(LayerContext& ctx, const LayerShape& sh, const float* part, int cols, float* full,
                       const std::function<void(const float* rows, int n, int first)>& gemm,
                       std::initializer_list<ChunkedLinear*> linears = {}) {
  const int t = ctx.tp.size(), me = ctx.tp.rank(), per = sh.seq / sh.seq_parts;
  PTDP_ASSERT(sh.seq_parts == t && sh.seq % t == 0, "sequence parts must match the TP group");
  const size_t block = static_cast<size_t>(sh.local_tokens()) * cols;
  Tensor blocks(ctx.dev, static_cast<int64_t>(block) * t, 1);
  ctx.dev.copy(part, blocks.data() + static_cast<size_t>(me) * block, block);
  std::vector<AsyncTp> arriving(static_cast<size_t>(t));
  for (int q = 0; q < t; ++q)
    arriving[static_cast<size_t>(q)].start(ctx, [&] { return ctx.tp.start_gather_block(blocks.data() + static_cast<size_t>(q) * block, block, q); });
  bool whole = false;
  for (const ChunkedLinear* l : linears) whole = whole || l->needs_whole();
  if (whole) {
    for (int q = 0; q < t; ++q)
      if (q != me) arriving[static_cast<size_t>(q)].wait(ctx);
    for (ChunkedLinear* l : linears)
      if (l->needs_whole()) l->take_whole(blocks.data(), t * sh.local_tokens());
  }
  for (int k = 0; k < t; ++k) {
    const int q = (me + k) % t;
    if (q != me && !whole) arriving[static_cast<size_t>(q)].wait(ctx);
    for (int b = 0; b < sh.batch; ++b)
      gemm(blocks.data() + static_cast<size_t>(q) * block + static_cast<size_t>(b) * per * cols, per, b * sh.seq + q * per);
  }
  arriving[static_cast<size_t>(me)].wait(ctx);  // its own block on the way out
  if (full != nullptr) permute_rank_blocks(ctx.dev, sh, blocks.data(), full, cols, false);
}

// A GEMM whose [tokens, cols] output is reduce-scattered, chunked: member c's rows computed, then
// their sum over the group started towards c (a reduce), members in order; `out`
// [local_tokens, cols] receives this member's block. gemm(first, n, y) computes the n output rows
// from row `first` of the whole layout into y.
void gemm_under_reduce_scatter(LayerContext& ctx, const LayerShape& sh, int cols, float* out,
                               const std::function<void(int first, int n, float* y)>& gemm) {
  const int t = ctx.tp.size(), per = sh.seq / sh.seq_parts;
  PTDP_ASSERT(sh.seq_parts == t && sh.seq % t == 0, "sequence parts must match the TP group");
  const size_t block = static_cast<size_t>(sh.local_tokens()) * cols;
  Tensor blocks(ctx.dev, static_cast<int64_t>(block) * t, 1);
  std::vector<AsyncTp> leaving(static_cast<size_t>(t));
  for (int c = 0; c < t; ++c) {
    float* mine = blocks.data() + static_cast<size_t>(c) * block;
    for (int b = 0; b < sh.batch; ++b) gemm(b * sh.seq + c * per, per, mine + static_cast<size_t>(b) * per * cols);
    leaving[static_cast<size_t>(c)].start(ctx, [&] { return ctx.tp.start_reduce_block(mine, out, block, c); });
  }
  for (AsyncTp& l : leaving) l.wait(ctx);
}

// f's backward before the input gradient leaves a column-parallel GEMM: `full` [tokens, h]
// all-reduced in place, or reduce-scattered into a new shard [local_tokens, h] (returned). The
// collective starts without waiting and `under` — the layer's weight gradients, in a whole B —
// runs while it is on the wire (Megatron's asynchronous dgrad all-reduce / reduce-scatter under
// the wgrad GEMM: the lowering's `.dgrad.allreduce` / `.dgrad.reduce_scatter`, which overlaps
// `.wgrad`). A split backward's I defers its weight gradients to the W: nothing runs under it.
Tensor column_parallel_input_grad(LayerContext& ctx, const LayerShape& sh, Tensor full, DeferredWeightGrads* under = nullptr) {
  AsyncTp tp;
  Tensor blocks, part;
  if (!sh.sequence_parallel()) {
    if (ctx.tp.size() > 1) tp.start(ctx, [&] { return ctx.tp.start_all_reduce(full.data(), full.size(), ReduceOp::Sum); });
  } else {
    PTDP_ASSERT(sh.seq_parts == ctx.tp.size() && sh.seq % sh.seq_parts == 0, "sequence parts must match the TP group");
    const size_t local = static_cast<size_t>(sh.local_tokens()) * sh.hidden;
    blocks = Tensor(ctx.dev, static_cast<int64_t>(local) * sh.seq_parts, 1);
    permute_rank_blocks(ctx.dev, sh, full.data(), blocks.data(), sh.hidden, true);
    full.reset();
    part = Tensor(ctx.dev, sh.local_tokens(), sh.hidden);
    tp.start(ctx, [&] { return ctx.tp.start_reduce_scatter(blocks.data(), part.data(), local); });
  }
  if (under != nullptr) under->run();
  tp.wait(ctx);
  return sh.sequence_parallel() ? std::move(part) : std::move(full);
}
}  // namespace layer_ops
using namespace layer_ops;  // the norms and collectives above, for the rest of the file

namespace {

// An MLP's weights (or gradients): this rank's columns of FC1 (and SwiGLU's gate) with their
// biases, its rows of the row-parallel FC2 (whose bias the caller adds once, after the reduction).
struct MlpWeights {
  float* fc1 = nullptr;
  float* fc1_bias = nullptr;
  float* gate = nullptr;
  float* gate_bias = nullptr;
  float* fc2 = nullptr;
};
MlpWeights dense_mlp(const LayerWeights& w) { return {w.fc1_weight, w.fc1_bias, w.gate_weight, w.gate_bias, w.fc2_weight}; }
MlpWeights shared_experts(const LayerWeights& w) {
  return {w.shared_fc1, w.shared_fc1_bias, w.shared_gate, w.shared_gate_bias, w.shared_fc2};
}

// y [tokens, h] = act(ln2·W1 + b1 [, ln2·Wg + bg])·W2 over this rank's f columns: its partial sum
// of the row-parallel FC2 (summed over the group by the caller). ln2 holds every token's row.
// `chunk` (tp_comm_overlap): ln2 is this rank's sequence shard, gathered under the fc1 (and
// gate) GEMMs, and y [local_tokens, h] this rank's block of the output, reduce-scattered under
// the fc2 GEMM.
void mlp_forward(LayerContext& ctx, const LayerShape& sh, int f, const MlpWeights& w, const float* ln2, float* y,
                 MlpActivations& a, bool chunk = false) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), h = sh.hidden;
  a.fc1 = Tensor(dev, T, f);
  if (sh.swiglu) a.gate = Tensor(dev, T, f);  // column-parallel gate projection alongside the up projection (fc1)
  if (chunk) {
    ChunkedLinear fc1(ctx, w.fc1, h, f, true);
    std::optional<ChunkedLinear> gate;
    if (sh.swiglu) gate.emplace(ctx, w.gate, h, f, true);
    gather_under_gemm(ctx, sh, ln2, h, nullptr, [&](const float* rows, int n, int first) {
      fc1.gemm(rows, n, a.fc1.data() + static_cast<size_t>(first) * f);
      if (gate) gate->gemm(rows, n, a.gate.data() + static_cast<size_t>(first) * f);
    }, {&fc1, gate ? &*gate : &fc1});
    a.fp8_input_scale[0] = fc1.finish();
    if (gate) a.fp8_input_scale[1] = gate->finish();
  } else {
    a.fp8_input_scale[0] = linear_forward(ctx, T, f, h, ln2, w.fc1, a.fc1.data());
    if (sh.swiglu) a.fp8_input_scale[1] = linear_forward(ctx, T, f, h, ln2, w.gate, a.gate.data());
  }
  dev.add_bias(T, f, w.fc1_bias, a.fc1.data());
  a.act = Tensor(dev, T, f);
  if (sh.swiglu) {
    dev.add_bias(T, f, w.gate_bias, a.gate.data());
    dev.swiglu_forward(a.act.size(), a.gate.data(), a.fc1.data(), a.act.data());
  } else {
    dev.gelu_forward(a.act.size(), a.fc1.data(), a.act.data());
  }
  if (chunk) {
    ChunkedLinear fc2(ctx, w.fc2, f, h, true);
    if (fc2.needs_whole()) fc2.take_whole(a.act.data(), T);
    gemm_under_reduce_scatter(ctx, sh, h, y, [&](int first, int n, float* rows) {
      fc2.gemm(a.act.data() + static_cast<size_t>(first) * f, n, rows);
    });
    a.fp8_input_scale[2] = fc2.finish();
  } else
    a.fp8_input_scale[2] = linear_forward(ctx, T, h, f, a.act.data(), w.fc2, y);
}

// Backward of mlp_forward from dy [tokens, h] (`dy_full`: the tensor holding it when the caller
// gathered it, taken over; else dy is the caller's and copied when deferred): d_ln2 [tokens, h]
// = beta·d_ln2 + its input gradient (partial over the group), the weight gradients accumulated
// or deferred. The weight gradients read the norm output's shard `ln2` (gathered again with
// sequence parallelism), which a deferred backward keeps.
void mlp_backward(LayerContext& ctx, const LayerShape& sh, int f, const MlpWeights& w, const MlpWeights& g, Tensor& ln2,
                  MlpActivations& a, const float* dy, Tensor& dy_full, float* d_ln2, float beta, DeferredWeightGrads* defer,
                  DeferredWeightGrads* column, const float* dy_part = nullptr) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), h = sh.hidden;
  Tensor d_act(dev, T, f);
  float fc2_gs = 1.0f;
  if (dy_part != nullptr) {  // tp_comm_overlap: g's backward all-gather of dy under the fc2 input-gradient GEMM
    dy_full = Tensor(dev, T, h);
    ChunkedLinear fc2(ctx, w.fc2, f, h, false);
    gather_under_gemm(ctx, sh, dy_part, h, dy_full.data(), [&](const float* rows, int n, int first) {
      fc2.gemm(rows, n, d_act.data() + static_cast<size_t>(first) * f);
    }, {&fc2});
    fc2_gs = fc2.finish();
    dy = dy_full.data();
  } else {
    fc2_gs = linear_input_grad(ctx, T, f, h, dy, w.fc2, d_act.data());
  }
  {
    Tensor dout_kept = !dy_full.empty() ? std::move(dy_full) : defer != nullptr ? Tensor::copy_of(dev, dy, T, h) : Tensor();
    const float* dyk = dout_kept.empty() ? dy : dout_kept.data();
    const float* act = a.act.data();
    weight_grad(defer, [&ctx, T, h, f, act, dyk, xs = a.fp8_input_scale[2], fc2_gs, wk = w.fc2, gw = g.fc2] {
      linear_weight_grad(ctx, wk, T, f, h, act, xs, dyk, fc2_gs, gw);
    }, {&a.act, &dout_kept});
  }
  // act = GELU(fc1), or silu(gate)·fc1; fc1 (and gate) = ln2·W + b (column-parallel)
  Tensor d_gate;
  if (sh.swiglu) {
    d_gate = Tensor(dev, T, f);
    dev.swiglu_backward(d_act.size(), a.gate.data(), a.fc1.data(), d_act.data(), d_gate.data(), d_act.data());
    a.gate.reset();
  } else {
    dev.gelu_backward(d_act.size(), a.fc1.data(), d_act.data(), d_act.data());
  }
  a.fc1.reset();
  dev.add_bias_grad(T, f, d_act.data(), g.fc1_bias);
  // The weight gradients read the whole norm output: gathered again from the kept shard, under
  // the input-gradient GEMM.
  PendingGather ln2_gather = start_gathered(ctx, sh, ln2);
  const float fc1_gs = linear_input_grad(ctx, T, h, f, d_act.data(), w.fc1, d_ln2, beta);
  Tensor ln2_full = finish_gathered(ctx, sh, std::move(ln2_gather), h);
  Tensor& ln2_kept = sh.sequence_parallel() ? ln2_full : ln2;
  const float* x = ln2_kept.data();
  if (sh.swiglu) {
    dev.add_bias_grad(T, f, d_gate.data(), g.gate_bias);
    const float gate_gs = linear_input_grad(ctx, T, h, f, d_gate.data(), w.gate, d_ln2, 1.0f);
    const float* dg = d_gate.data();
    // Queued before fc1's, which moves the norm output into the deferred set (its data pointer stays valid).
    weight_grad(column, [&ctx, T, h, f, x, dg, xs = a.fp8_input_scale[1], gate_gs, wk = w.gate, gw = g.gate] {
      linear_weight_grad(ctx, wk, T, h, f, x, xs, dg, gate_gs, gw);
    }, {&d_gate});
  }
  const float* dfc1 = d_act.data();
  weight_grad(column, [&ctx, T, h, f, x, dfc1, xs = a.fp8_input_scale[0], fc1_gs, wk = w.fc1, gw = g.fc1] {
    linear_weight_grad(ctx, wk, T, h, f, x, xs, dfc1, fc1_gs, gw);
  }, {&ln2_kept, &d_act});
}

}  // namespace

void layer_forward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const float* x, float* out,
                   LayerActivations& a, bool keep_probs) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, q3 = sh.qkv_cols(), ac = sh.attn_cols(), f = sh.ffn_local;
  const bool sp = sh.sequence_parallel();
  const size_t lh = static_cast<size_t>(L) * h;

  norm_forward(dev, sh, L, x, w.ln1_gamma, w.ln1_beta, a.ln1, a.ln1_mean, a.ln1_rstd);
  const bool chunk = chunked(ctx, sh);
  const AttentionShape ash = sh.attention();
  if (sh.mla()) {
    mla_forward(ctx, sh, w, a);  // multi-head latent attention's projections (rotary applied)
  } else {
    // Column-parallel QKV (f: identity in forward; with sequence parallelism an all-gather).
    a.qkv = Tensor(dev, T, q3);
    if (chunk) {
      ChunkedLinear qkv(ctx, w.qkv_weight, h, q3, true);
      gather_under_gemm(ctx, sh, a.ln1.data(), h, nullptr, [&](const float* rows, int n, int first) {
        qkv.gemm(rows, n, a.qkv.data() + static_cast<size_t>(first) * q3);
      }, {&qkv});
      a.fp8_input_scale[0] = qkv.finish();
    } else {
      Tensor ln1_full = gathered(ctx, sh, a.ln1);
      a.fp8_input_scale[0] = linear_forward(ctx, T, q3, h, sp ? ln1_full.data() : a.ln1.data(), w.qkv_weight, a.qkv.data());
    }
    dev.add_bias(T, q3, w.qkv_bias, a.qkv.data());
    // Rotary embeddings on the queries and keys (kept rotated: the attention backward reads them).
    if (sh.rotary_dim > 0) dev.rotary(ash, sh.rotary_dim, sh.rotary_base, positions_of(sh, sh.cp_rank).data(), false, a.qkv.data());
  }
  a.ctx = Tensor(dev, T, ac);
  if (sh.flash) {
    // Fused attention: the output and one log-sum-exp per query row; no s×s tensor. Selective
    // recompute (Megatron's core_attn) drops even those and re-runs the kernel in the backward.
    Tensor lse(dev, static_cast<int64_t>(ash.batch) * ash.heads * ash.seq, 1);
    if (sh.cp > 1) context_attention_forward(ctx, sh, a.qkv, a.ctx, lse, a);
    else dev.flash_attention_forward(ash, a.qkv.data(), a.ctx.data(), lse.data());
    a.lse = keep_probs ? std::move(lse) : Tensor();
    // Ulysses' backward reads the head shard it keeps, not the sequence shard's Q, K, V (which
    // Megatron does not keep either); a recompute re-runs the exchange from them.
    if (!keep_probs) a.heads_qkv.reset(), a.heads_ctx.reset();
    else if (sh.cp_all_to_all) a.qkv.reset();
  } else {
    a.probs = keep_probs ? Tensor(dev, static_cast<int64_t>(ash.probs_count()), 1) : Tensor();
    dev.attention_forward(ash, a.qkv.data(), keep_probs ? a.probs.data() : nullptr, a.ctx.data());
  }
  // Row-parallel projection, g: all-reduce (or reduce-scatter); the replicated bias is added
  // once, after it.
  a.x2 = Tensor(dev, L, h);
  if (chunk) {
    ChunkedLinear proj(ctx, w.proj_weight, ac, h, true);
    if (proj.needs_whole()) proj.take_whole(a.ctx.data(), T);
    gemm_under_reduce_scatter(ctx, sh, h, a.x2.data(), [&](int first, int n, float* rows) {
      proj.gemm(a.ctx.data() + static_cast<size_t>(first) * ac, n, rows);
    });
    a.fp8_input_scale[1] = proj.finish();
  } else {
    Tensor partial = sp ? Tensor(dev, T, h) : Tensor();
    a.fp8_input_scale[1] = linear_forward(ctx, T, h, ac, a.ctx.data(), w.proj_weight, sp ? partial.data() : a.x2.data());
    row_parallel_output(ctx, sh, partial, a.x2.data());
  }
  dev.add_bias(L, h, w.proj_bias, a.x2.data());
  apply_dropout(ctx, sh, DropoutSite::Attention, a.x2.data());
  dev.axpy(lh, 1.0f, x, a.x2.data());

  norm_forward(dev, sh, L, a.x2.data(), w.ln2_gamma, w.ln2_beta, a.ln2, a.ln2_mean, a.ln2_rstd);
  if (w.router != nullptr && moe_split(ctx, sh)) {
    // Sequence parallelism: the routed experts take this rank's part and return it whole; the
    // shared experts run as the dense MLP does, on the gathered sequence.
    a.moe = std::make_shared<MoeActivations>();
    moe_forward(ctx, sh, w, a.ln2.data(), out, *a.moe);
    if (sh.moe_shared_ffn_local > 0) {
      Tensor shared(dev, L, h);
      if (chunk) {
        mlp_forward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), a.ln2.data(), shared.data(), a.shared, true);
      } else if (!sp) {  // t 1 with folded experts: the rank's tokens are whole already
        mlp_forward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), a.ln2.data(), shared.data(), a.shared);
      } else {
        Tensor ln2_full = gathered(ctx, sh, a.ln2);
        Tensor partial(dev, T, h);
        mlp_forward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), ln2_full.data(), partial.data(), a.shared);
        ln2_full.reset();
        row_parallel_output(ctx, sh, partial, shared.data());
      }
      dev.axpy(lh, 1.0f, shared.data(), out);
    }
    dev.add_bias(L, h, w.shared_fc2_bias, out);
    apply_dropout(ctx, sh, DropoutSite::Mlp, out);
    dev.axpy(lh, 1.0f, a.x2.data(), out);
    return;
  }
  if (chunk && w.router == nullptr) {
    mlp_forward(ctx, sh, f, dense_mlp(w), a.ln2.data(), out, a.mlp, true);
    dev.add_bias(L, h, w.fc2_bias, out);
    apply_dropout(ctx, sh, DropoutSite::Mlp, out);
    dev.axpy(lh, 1.0f, a.x2.data(), out);
    return;
  }
  Tensor ln2_full = gathered(ctx, sh, a.ln2);
  const float* ln2 = sp ? ln2_full.data() : a.ln2.data();
  if (w.router != nullptr) {  // mixture of experts instead of the dense MLP
    a.moe = std::make_shared<MoeActivations>();
    Tensor partial = sp ? Tensor(dev, T, h) : Tensor();
    float* y = sp ? partial.data() : out;
    moe_forward(ctx, sh, w, ln2, y, *a.moe);
    if (sh.moe_shared_ffn_local > 0) {  // the shared experts' partial sum joins the routed experts'
      Tensor shared(dev, T, h);
      mlp_forward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), ln2, shared.data(), a.shared);
      dev.axpy(static_cast<size_t>(T) * h, 1.0f, shared.data(), y);
    }
    ln2_full.reset();
    row_parallel_output(ctx, sh, partial, out);
    dev.add_bias(L, h, w.shared_fc2_bias, out);
    apply_dropout(ctx, sh, DropoutSite::Mlp, out);
    dev.axpy(lh, 1.0f, a.x2.data(), out);
    return;
  }
  {
    Tensor partial = sp ? Tensor(dev, T, h) : Tensor();
    mlp_forward(ctx, sh, f, dense_mlp(w), ln2, sp ? partial.data() : out, a.mlp);
    ln2_full.reset();
    row_parallel_output(ctx, sh, partial, out);
  }
  dev.add_bias(L, h, w.fc2_bias, out);
  apply_dropout(ctx, sh, DropoutSite::Mlp, out);
  dev.axpy(lh, 1.0f, a.x2.data(), out);
}

namespace {

// The MLP branch's backward from its output gradient `dout` [local_tokens, h] (after its
// dropout's backward): the gradient of the norm output it read, d_ln2 [local_tokens, h] — the
// routed experts', the shared experts' and the dense MLP's — with the weight gradients
// accumulated, or deferred to the W of a split backward.
Tensor mlp_branch_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g,
                           LayerActivations& a, const float* dout, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, f = sh.ffn_local;
  const bool sp = sh.sequence_parallel();
  const size_t lh = static_cast<size_t>(L) * h;
  Tensor d_ln2;
  if (w.router != nullptr && moe_split(ctx, sh)) {
    // Sequence parallelism: the routed experts' input gradient is this rank's part, whole; the
    // shared experts' comes as the dense MLP's does (gathered output gradient, reduce-scatter).
    d_ln2 = Tensor(dev, L, h);
    moe_backward(ctx, sh, w, g, a.ln2.data(), std::move(*a.moe), dout, d_ln2.data(), defer);
    a.moe.reset();
    if (sh.moe_shared_ffn_local > 0) {
      Tensor dout_full, d_shared(dev, T, h);
      if (!chunked(ctx, sh)) {
        dout_full = Tensor(dev, T, h);
        ctx.sequence_all_gather(sh, dout, dout_full.data(), h);
      }
      DeferredWeightGrads under;  // a whole B's fc1 (and gate) weight gradients, under the reduce-scatter
      mlp_backward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), shared_experts(g), a.ln2, a.shared, dout_full.data(),
                   dout_full, d_shared.data(), 0.0f, defer, defer != nullptr ? defer : &under, chunked(ctx, sh) ? dout : nullptr);
      const Tensor part = column_parallel_input_grad(ctx, sh, std::move(d_shared), &under);
      dev.axpy(lh, 1.0f, part.data(), d_ln2.data());
    }
    if (defer != nullptr) defer->kept.push_back(std::move(a.ln2));  // the router's weight gradient reads it
  }
  Tensor dout_full;
  // tp_comm_overlap: the dense MLP gathers dout under its fc2 input-gradient GEMM.
  const bool chunk_dense = chunked(ctx, sh) && w.router == nullptr;
  if (sp && d_ln2.empty() && !chunk_dense) {
    dout_full = Tensor(dev, T, h);
    ctx.sequence_all_gather(sh, dout, dout_full.data(), h);
  }
  const float* dy = sp ? dout_full.data() : dout;
  if (d_ln2.empty()) {
    Tensor d_ln2_full(dev, T, h);
    // The column-parallel weight gradients (fc1, gate; the experts' and the router's), queued in
    // a whole B to run under f's input-gradient collective; a split backward's go to its W.
    DeferredWeightGrads under;
    DeferredWeightGrads* column = defer != nullptr ? defer : &under;
    if (w.router != nullptr) {  // mixture of experts
      Tensor ln2_full = gathered(ctx, sh, a.ln2);
      Tensor& ln2_kept = sp ? ln2_full : a.ln2;
      const float* router_input = ln2_kept.data();
      moe_backward(ctx, sh, w, g, router_input, std::move(*a.moe), dy, d_ln2_full.data(), column);
      a.moe.reset();
      // (A deferred shared-experts backward may take the shard over: its data stays where the
      // router's weight gradient reads it.)
      if (sh.moe_shared_ffn_local > 0)
        mlp_backward(ctx, sh, sh.moe_shared_ffn_local, shared_experts(w), shared_experts(g), a.ln2, a.shared, dy, dout_full,
                     d_ln2_full.data(), 1.0f, defer, column);
      column->kept.push_back(std::move(ln2_kept));  // the router's weight gradient reads it
    } else {
      mlp_backward(ctx, sh, f, dense_mlp(w), dense_mlp(g), a.ln2, a.mlp, dy, dout_full, d_ln2_full.data(), 0.0f, defer, column,
                   chunk_dense ? dout : nullptr);
    }
    d_ln2 = column_parallel_input_grad(ctx, sh, std::move(d_ln2_full), &under);  // f: all-reduce in backward
  }
  return d_ln2;
}

}  // namespace

void layer_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g,
                    const float* x, LayerActivations&& a, const float* dout, float* dx, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, q3 = sh.qkv_cols(), ac = sh.attn_cols();
  const bool sp = sh.sequence_parallel();
  const size_t lh = static_cast<size_t>(L) * h;

  // out = x2 + dropout(act·W2 + b2) (the bias on this rank's tokens; with sequence parallelism
  // the row-parallel GEMM's output gradient is gathered first: g's backward). The residual
  // takes dout itself, the branch its dropout's backward (the forward's mask again).
  const float* const d_out_residual = dout;
  Tensor d_mlp_branch;
  if (sh.dropout > 0) {
    d_mlp_branch = Tensor::copy_of(dev, dout, L, h);
    apply_dropout(ctx, sh, DropoutSite::Mlp, d_mlp_branch.data());
    dout = d_mlp_branch.data();
  }
  dev.add_bias_grad(L, h, dout, g.fc2_bias);
  dev.add_bias_grad(L, h, dout, g.shared_fc2_bias);
  Tensor d_ln2 = mlp_branch_backward(ctx, sh, w, g, a, dout, defer);
  // x2 → LayerNorm 2; d_x2 = dout + LN2ᵀ(d_ln2)
  Tensor d_x2(dev, L, h);
  norm_backward(dev, sh, L, d_ln2.data(), a.x2.data(), w.ln2_gamma, a.ln2_mean, a.ln2_rstd, d_x2.data(), g.ln2_gamma,
                g.ln2_beta);
  d_ln2.reset();
  a.x2.reset();
  dev.axpy(lh, 1.0f, d_out_residual, d_x2.data());

  // x2 = x + dropout(ctx·Wproj + bproj) (row-parallel projection)
  Tensor d_attn_branch;
  if (sh.dropout > 0) {
    d_attn_branch = Tensor::copy_of(dev, d_x2.data(), L, h);
    apply_dropout(ctx, sh, DropoutSite::Attention, d_attn_branch.data());
  }
  Tensor& d_branch = sh.dropout > 0 ? d_attn_branch : d_x2;
  dev.add_bias_grad(L, h, d_branch.data(), g.proj_bias);
  Tensor d_x2_full, d_ctx(dev, T, ac);
  float proj_gs = 1.0f;
  if (chunked(ctx, sh)) {  // g's backward all-gather under the projection's input-gradient GEMM
    d_x2_full = Tensor(dev, T, h);
    ChunkedLinear proj(ctx, w.proj_weight, ac, h, false);
    gather_under_gemm(ctx, sh, d_branch.data(), h, d_x2_full.data(), [&](const float* rows, int n, int first) {
      proj.gemm(rows, n, d_ctx.data() + static_cast<size_t>(first) * ac);
    }, {&proj});
    proj_gs = proj.finish();
  } else {
    d_x2_full = gathered(ctx, sh, d_branch);
  }
  const float* d_proj = sp ? d_x2_full.data() : d_branch.data();
  if (!chunked(ctx, sh)) proj_gs = linear_input_grad(ctx, T, ac, h, d_proj, w.proj_weight, d_ctx.data());
  Tensor d_qkv(dev, T, q3);
  if (sh.flash) {
    const AttentionShape ash = sh.attention();
    if (a.lse.empty()) {
      // Selective recompute with flash attention: the kernel's forward runs again for its log-sum-exp.
      ctx.timed_recompute([&] {
        a.lse = Tensor(dev, static_cast<int64_t>(ash.batch) * ash.heads * ash.seq, 1);
        Tensor context(dev, T, ac);
        if (sh.cp > 1) context_attention_forward(ctx, sh, a.qkv, context, a.lse, a);
        else dev.flash_attention_forward(ash, a.qkv.data(), context.data(), a.lse.data());
      });
    }
    if (sh.cp > 1) context_attention_backward(ctx, sh, a.qkv, a.ctx, a.lse, d_ctx.data(), d_qkv, a);
    else dev.flash_attention_backward(ash, a.qkv.data(), a.ctx.data(), a.lse.data(), d_ctx.data(), d_qkv.data());
    a.lse.reset(), a.heads_qkv.reset(), a.heads_ctx.reset();
  } else {
    if (a.probs.empty()) {
      // Selective recompute: the attention core (QKᵀ, softmax, ·V) runs again for its probabilities.
      const AttentionShape ash = sh.attention();
      ctx.timed_recompute([&] {
        a.probs = Tensor(dev, static_cast<int64_t>(ash.probs_count()), 1);
        Tensor context(dev, T, ac);
        dev.attention_forward(ash, a.qkv.data(), a.probs.data(), context.data());
      });
    }
    dev.attention_backward(sh.attention(), a.qkv.data(), a.probs.data(), d_ctx.data(), d_qkv.data());
    a.probs.reset();
  }
  {
    const float* c = a.ctx.data();
    weight_grad(defer, [&ctx, T, h, ac, c, d = d_proj, xs = a.fp8_input_scale[1], proj_gs, wk = w.proj_weight, gw = g.proj_weight] {
      linear_weight_grad(ctx, wk, T, ac, h, c, xs, d, proj_gs, gw);
    }, {&a.ctx});
  }
  d_ctx.reset();
  Tensor d_ln1;
  if (sh.mla()) {
    d_ln1 = mla_backward(ctx, sh, w, g, a, std::move(d_qkv), defer);
  } else {
    // The gradient of the rotated queries and keys, rotated back: the QKV GEMM's output gradient.
    if (sh.rotary_dim > 0) dev.rotary(sh.attention(), sh.rotary_dim, sh.rotary_base, positions_of(sh, sh.cp_rank).data(), true, d_qkv.data());
    dev.add_bias_grad(T, q3, d_qkv.data(), g.qkv_bias);
    Tensor d_ln1_full(dev, T, h);
    // Megatron's order: the norm output re-gathered (sequence parallelism) under the input-gradient
    // GEMM, the input gradient's collective under the weight-gradient GEMM.
    PendingGather ln1_gather = start_gathered(ctx, sh, a.ln1);
    const float qkv_gs = linear_input_grad(ctx, T, h, q3, d_qkv.data(), w.qkv_weight, d_ln1_full.data());
    Tensor ln1_full = finish_gathered(ctx, sh, std::move(ln1_gather), h);
    DeferredWeightGrads under;
    {
      Tensor& ln1_kept = sp ? ln1_full : a.ln1;
      const float* l1 = ln1_kept.data();
      const float* d = d_qkv.data();
      weight_grad(defer != nullptr ? defer : &under,
                  [&ctx, T, h, q3, l1, d, xs = a.fp8_input_scale[0], qkv_gs, wk = w.qkv_weight, gw = g.qkv_weight] {
                    linear_weight_grad(ctx, wk, T, h, q3, l1, xs, d, qkv_gs, gw);
                  }, {&ln1_kept, &d_qkv});
    }
    d_ln1 = column_parallel_input_grad(ctx, sh, std::move(d_ln1_full), &under);
  }
  a.qkv.reset();
  norm_backward(dev, sh, L, d_ln1.data(), x, w.ln1_gamma, a.ln1_mean, a.ln1_rstd, dx, g.ln1_gamma, g.ln1_beta);
  dev.axpy(lh, 1.0f, d_x2.data(), dx);
  // The output gradient of the projection is read by its deferred weight gradient.
  if (defer != nullptr) defer->kept.push_back(std::move(sp ? d_x2_full : d_branch));
  a = LayerActivations();
}

void embedding_forward(LayerContext& ctx, const LayerShape& sh, const EmbeddingWeights& w, const int32_t* tokens,
                       float* out) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), h = sh.hidden;
  if (sh.sequence_parallel()) {
    Tensor partial(dev, T, h);
    dev.embedding_forward(T, tokens, w.first_row, w.rows, h, w.word, partial.data());
    ctx.sequence_reduce_scatter(sh, partial.data(), out, h);
  } else {
    dev.embedding_forward(T, tokens, w.first_row, w.rows, h, w.word, out);
    ctx.tp_all_reduce(out, static_cast<size_t>(T) * h);
  }
  if (w.position != nullptr)  // learned positions (none with rotary or no position embeddings)
    for_each_position_run(sh, [&](size_t row, size_t position, size_t count) {
      dev.axpy(count * h, 1.0f, w.position + position * h, out + row * h);
    });
  apply_dropout(ctx, sh, DropoutSite::Embedding, out);
}

void embedding_backward(LayerContext& ctx, const LayerShape& sh, const EmbeddingWeights& g, const int32_t* tokens,
                        const float* dout, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden;
  Tensor masked;  // the embedding dropout's backward
  if (sh.dropout > 0) {
    masked = Tensor::copy_of(dev, dout, L, h);
    apply_dropout(ctx, sh, DropoutSite::Embedding, masked.data());
    dout = masked.data();
  }
  // The word embedding's gradient needs every token's: gathered with sequence parallelism.
  Tensor full;
  if (sh.sequence_parallel()) {
    full = Tensor(dev, T, h);
    ctx.sequence_all_gather(sh, dout, full.data(), h);
  }
  Tensor part = defer != nullptr ? Tensor::copy_of(dev, dout, L, h) : Tensor();  // kept for a deferred W
  const float* d_part = defer != nullptr ? part.data() : dout;
  const float* d_full = sh.sequence_parallel() ? full.data() : d_part;
  weight_grad(
      defer,
      [&dev, sh, tokens, d_part, d_full, T, h, g] {
        if (g.position != nullptr)
          for_each_position_run(sh, [&](size_t row, size_t position, size_t count) {
            dev.axpy(count * h, 1.0f, d_part + row * h, g.position + position * h);
          });
        dev.embedding_backward(T, tokens, g.first_row, g.rows, h, d_full, g.word);
      },
      {&part, &full});
}

double head_forward(LayerContext& ctx, const LayerShape& sh, const HeadWeights& w, const float* x,
                    const int32_t* targets, HeadActivations& a, int counted_positions) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, vc = w.vocab_cols;
  norm_forward(dev, sh, L, x, w.lnf_gamma, w.lnf_beta, a.lnf, a.lnf_mean, a.lnf_rstd);
  // The LM head is column-parallel over the vocabulary: it needs the whole sequence.
  a.probs = Tensor(dev, T, vc);
  if (chunked(ctx, sh)) {  // gathered under the logits GEMM (kept whole: the weight gradient reads it)
    Tensor full(dev, T, h);
    gather_under_gemm(ctx, sh, a.lnf.data(), h, full.data(), [&](const float* rows, int n, int first) {
      matmul_bt(dev, n, vc, h, rows, w.word, a.probs.data() + static_cast<size_t>(first) * vc);
    });
    a.lnf = std::move(full);
  } else {
    if (sh.sequence_parallel()) a.lnf = gathered(ctx, sh, a.lnf);
    matmul_bt(dev, T, vc, h, a.lnf.data(), w.word, a.probs.data());
  }
  // Vocab-parallel softmax: global row max, then global Σexp and target logit in one all-reduce.
  Tensor stats(dev, 2 * static_cast<int64_t>(T), 1);
  dev.logits_row_max(T, vc, w.valid_cols, a.probs.data(), stats.data());
  ctx.tp_all_reduce(stats.data(), T, ReduceOp::Max);
  Tensor row_max = Tensor::copy_of(dev, stats.data(), T, 1);
  dev.softmax_numerators(T, vc, w.valid_cols, row_max.data(), targets, w.first_col, a.probs.data(), stats.data());
  ctx.tp_all_reduce(stats.data(), 2 * static_cast<size_t>(T));
  Tensor loss(dev, T, 1);
  dev.cross_entropy_finish(T, vc, stats.data(), a.probs.data(), loss.data());
  std::vector<float> host(static_cast<size_t>(T));
  dev.download(loss.data(), host.data(), host.size());
  if (counted_positions <= 0 || counted_positions >= sh.seq * sh.cp) {
    double sum = 0;
    for (float v : host) sum += v;
    return sum / T;
  }
  // The positions of the whole sequence before counted_positions (a context rank's by
  // LayerShape::position); the mean over all of them, as this rank's share: the context group's
  // ranks' losses are averaged.
  double sum = 0;
  for (int b = 0; b < sh.batch; ++b)
    for (int i = 0; i < sh.seq; ++i)
      if (sh.position(i, sh.cp_rank) < counted_positions) sum += host[static_cast<size_t>(b) * sh.seq + i];
  return sum * sh.cp / (static_cast<double>(sh.batch) * counted_positions);
}

void head_backward(LayerContext& ctx, const LayerShape& sh, const HeadWeights& w, const HeadWeights& g, const float* x,
                   const int32_t* targets, float loss_scale, HeadActivations&& a, float* dx, DeferredWeightGrads* defer,
                   int counted_positions) {
  Device& dev = ctx.dev;
  const int T = sh.tokens(), L = sh.local_tokens(), h = sh.hidden, vc = w.vocab_cols;
  dev.cross_entropy_backward(T, vc, targets, w.first_col, loss_scale, a.probs.data(), a.probs.data());
  if (counted_positions > 0 && counted_positions < sh.seq * sh.cp)  // the positions left out of the loss
    for (int b = 0; b < sh.batch; ++b)
      for (int i = 0; i < sh.seq; ++i)
        if (sh.position(i, sh.cp_rank) >= counted_positions)
          dev.fill(a.probs.data() + (static_cast<size_t>(b) * sh.seq + i) * vc, static_cast<size_t>(vc), 0.0f);
  Tensor d_lnf_full(dev, T, h);
  matmul(dev, T, h, vc, a.probs.data(), w.word, d_lnf_full.data());
  DeferredWeightGrads under;  // a whole B's weight gradient, under the input gradient's collective
  {
    const float* dl = a.probs.data();
    const float* l = a.lnf.data();
    weight_grad(defer != nullptr ? defer : &under, [&dev, T, h, vc, dl, l, gw = g.word] { matmul_at_acc(dev, vc, h, T, dl, l, gw); },
                {&a.probs, &a.lnf});
  }
  Tensor d_lnf = column_parallel_input_grad(ctx, sh, std::move(d_lnf_full), &under);
  norm_backward(dev, sh, L, d_lnf.data(), x, w.lnf_gamma, a.lnf_mean, a.lnf_rstd, dx, g.lnf_gamma, g.lnf_beta);
  a = HeadActivations();
}

}  // namespace ptdp::exec
