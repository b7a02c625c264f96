// Context parallelism's attention in the executor: ring attention, the all-gather variant and
// Ulysses' all-to-alls.
#include "exec/model/context_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"

namespace ptdp::exec {

// Context parallelism: ring attention over the context group (LayerShape::cp ranks). Each
// rank's key/value block (keys and values only, see pack_kv) goes around the ring; every rank merges the block it holds into its queries' output by log-sum-exp while the
// next block is already in flight.
std::vector<int32_t> positions_of(const LayerShape& sh, int rank) {
  std::vector<int32_t> pos(static_cast<size_t>(sh.seq));
  for (int i = 0; i < sh.seq; ++i) pos[static_cast<size_t>(i)] = sh.position(i, rank);
  return pos;
}

namespace {

// The all-gather variant (Megatron / Transformer Engine's cp_comm_type all_gather): every rank
// gathers the whole group's keys and values at once (not the queries: pack_kv) and attends to
// each block in turn; the backward gathers them again and reduce-scatters the key/value gradients
// to their owners.
void pack_kv(Device& dev, const AttentionShape& a, int64_t rows, const float* qkv, float* packed, int packed_cols, int at);
void unpack_kv(Device& dev, const AttentionShape& a, int64_t rows, const float* packed, int packed_cols, int at, float* qkv);

// Every member's K/V rows [rows, kv_cols], gathered (member r's at r · rows · kv_cols).
Tensor gathered_kv(Device& dev, Communicator& group, const AttentionShape& ash, const Tensor& qkv, int kv_cols) {
  const int64_t rows = qkv.rows();
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(kv_cols);
  Tensor mine(dev, rows, kv_cols), all(dev, static_cast<int64_t>(n) * group.size(), 1);
  pack_kv(dev, ash, rows, qkv.data(), mine.data(), kv_cols, 0);
  dev.synchronize();
  group.all_gather(mine.data(), all.data(), n);
  return all;
}

void context_attention_allgather_forward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, Tensor& out, Tensor& lse) {
  Device& dev = ctx.dev;
  Communicator& group = *ctx.context;
  const int cp = sh.cp;
  const AttentionShape ash = sh.attention();
  const int kv_cols = ash.groups() * (ash.head_dim + ash.v_dim());
  const int64_t rows = qkv.rows();
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(kv_cols);
  dev.fill(out.data(), out.size(), 0.0f);
  dev.fill(lse.data(), lse.size(), -std::numeric_limits<float>::infinity());
  const std::vector<int32_t> q_pos = positions_of(sh, group.rank());
  const Tensor all = gathered_kv(dev, group, ash, qkv, kv_cols);
  Tensor block = Tensor::zeros(dev, rows, qkv.cols());  // qkv-shaped: its query columns are never read
  for (int r = 0; r < cp; ++r) {
    unpack_kv(dev, ash, rows, all.data() + static_cast<size_t>(r) * n, kv_cols, 0, block.data());
    const std::vector<int32_t> k_pos = positions_of(sh, r);
    dev.attention_block_forward(ash, qkv.data(), q_pos.data(), block.data(), k_pos.data(), out.data(), lse.data());
  }
}

void context_attention_allgather_backward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, const Tensor& out,
                                          const Tensor& lse, const float* d_out, Tensor& d_qkv) {
  Device& dev = ctx.dev;
  Communicator& group = *ctx.context;
  const int cp = sh.cp;
  const AttentionShape ash = sh.attention();
  const int kv_cols = ash.groups() * (ash.head_dim + ash.v_dim());
  const int64_t rows = qkv.rows();
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(kv_cols);
  dev.fill(d_qkv.data(), d_qkv.size(), 0.0f);
  const std::vector<int32_t> q_pos = positions_of(sh, group.rank());
  const Tensor all = gathered_kv(dev, group, ash, qkv, kv_cols);
  Tensor d_all(dev, static_cast<int64_t>(n) * cp, 1);
  Tensor block = Tensor::zeros(dev, rows, qkv.cols()), grads(dev, rows, qkv.cols());
  for (int r = 0; r < cp; ++r) {
    unpack_kv(dev, ash, rows, all.data() + static_cast<size_t>(r) * n, kv_cols, 0, block.data());
    dev.fill(grads.data(), grads.size(), 0.0f);
    const std::vector<int32_t> k_pos = positions_of(sh, r);
    dev.attention_block_backward(ash, qkv.data(), q_pos.data(), block.data(), k_pos.data(), out.data(), lse.data(), d_out,
                                 d_qkv.data(), grads.data());
    pack_kv(dev, ash, rows, grads.data(), d_all.data() + static_cast<size_t>(r) * n, kv_cols, 0);
  }
  Tensor mine(dev, rows, kv_cols);
  dev.synchronize();
  group.reduce_scatter(d_all.data(), mine.data(), n);
  Tensor home = Tensor::zeros(dev, rows, qkv.cols());
  unpack_kv(dev, ash, rows, mine.data(), kv_cols, 0, home.data());
  dev.axpy(d_qkv.size(), 1.0f, home.data(), d_qkv.data());  // this rank's keys and values
}

// The ring moves keys and values only, as Megatron does: each row's groups hold [queries | k | v],
// so a row's K/V are `groups` runs of head_dim + v_dim columns. pack_kv copies them out of a
// qkv-shaped tensor into [rows, groups·(head_dim + v_dim)] at column `at` of a wider `packed` row;
// unpack_kv writes them back (the queries' columns untouched).
void pack_kv(Device& dev, const AttentionShape& a, int64_t rows, const float* qkv, float* packed, int packed_cols, int at) {
  const int G = a.groups(), run = a.head_dim + a.v_dim(), group_cols = a.group_cols();
  const int skip = a.heads_per_group() * a.head_dim;
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < G; ++g)
      dev.copy(qkv + r * a.qkv_cols() + g * group_cols + skip, packed + r * packed_cols + at + g * run, static_cast<size_t>(run));
}
void unpack_kv(Device& dev, const AttentionShape& a, int64_t rows, const float* packed, int packed_cols, int at, float* qkv) {
  const int G = a.groups(), run = a.head_dim + a.v_dim(), group_cols = a.group_cols();
  const int skip = a.heads_per_group() * a.head_dim;
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < G; ++g)
      dev.copy(packed + r * packed_cols + at + g * run, qkv + r * a.qkv_cols() + g * group_cols + skip, static_cast<size_t>(run));
}

// Ulysses (DeepSpeed-Ulysses; Transformer Engine's cp_comm_type a2a): an all-to-all over the
// context group trades this rank's s/cp rows of every head for 1/cp of the heads (context rank c:
// the key/value groups [c·G/cp, (c+1)·G/cp) with their queries, contiguous columns of a qkv or
// output row) over the whole sequence, laid out in sequence order; the single-GPU causal kernel
// runs on it, and a second all-to-all returns the output to the sequence shards. The backward
// runs the two the other way (the output gradient in, the qkv gradient back).
AttentionShape head_shard(const LayerShape& sh) {
  AttentionShape a = sh.attention();
  a.seq *= sh.cp;
  a.heads /= sh.cp;
  if (a.kv_heads > 0) a.kv_heads /= sh.cp;
  return a;
}

// One of Ulysses' all-to-alls between the sequence shard — this rank's batch · seq rows, each of
// cp parts of `part` columns (part c: member c's heads) — and the head shard — batch · cp·seq rows
// of one part, in sequence order. to_heads: member c gets part c of every sequence-shard row and
// puts the rows received from member r at their sequence positions; else the reverse.
void ulysses_exchange(LayerContext& ctx, const LayerShape& sh, const float* src, int part, float* dst, bool to_heads) {
  Device& dev = ctx.dev;
  const int cp = sh.cp, B = sh.batch, S = sh.seq;
  const size_t n = static_cast<size_t>(B) * static_cast<size_t>(S) * static_cast<size_t>(part);  // each member's block
  Tensor send(dev, static_cast<int64_t>(n) * cp, 1), recv(dev, static_cast<int64_t>(n) * cp, 1);
  const auto width = static_cast<size_t>(part);
  // Member r's rows: on the wire at r·n + (b·S + i)·part; row b·S + i's part r in the sequence
  // shard; row (b, position of i on member r) in the head shard.
  auto each_row = [&](auto&& move) {
    for (int r = 0; r < cp; ++r)
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i) {
          const size_t local = static_cast<size_t>(b) * S + i;
          const size_t sequence = (local * cp + r) * width;
          const size_t heads = (static_cast<size_t>(b) * S * cp + static_cast<size_t>(sh.position(i, r))) * width;
          move(r * n + local * width, to_heads ? sequence : heads, to_heads ? heads : sequence);
        }
  };
  each_row([&](size_t wire, size_t from, size_t) { dev.copy(src + from, send.data() + wire, width); });
  dev.synchronize();
  const std::vector<size_t> counts(static_cast<size_t>(cp), n);
  ctx.context->all_to_all_v(send.data(), counts, recv.data(), counts);
  each_row([&](size_t wire, size_t, size_t to) { dev.copy(recv.data() + wire, dst + to, width); });
}

Tensor to_head_shard(LayerContext& ctx, const LayerShape& sh, const float* src, int part) {
  Tensor out(ctx.dev, static_cast<int64_t>(sh.batch) * sh.seq * sh.cp, part);
  ulysses_exchange(ctx, sh, src, part, out.data(), true);
  return out;
}

void to_sequence_shard(LayerContext& ctx, const LayerShape& sh, const float* src, int part, float* dst) {
  ulysses_exchange(ctx, sh, src, part, dst, false);
}

void ulysses_forward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, Tensor& out, Tensor& lse, LayerActivations& a) {
  const AttentionShape heads = head_shard(sh);
  a.heads_qkv = to_head_shard(ctx, sh, qkv.data(), heads.qkv_cols());
  a.heads_ctx = Tensor(ctx.dev, a.heads_qkv.rows(), heads.ctx_cols());
  ctx.dev.flash_attention_forward(heads, a.heads_qkv.data(), a.heads_ctx.data(), lse.data());
  to_sequence_shard(ctx, sh, a.heads_ctx.data(), heads.ctx_cols(), out.data());
}

void ulysses_backward(LayerContext& ctx, const LayerShape& sh, const Tensor& lse, const float* d_out, Tensor& d_qkv,
                      const LayerActivations& a) {
  PTDP_ASSERT(!a.heads_qkv.empty() && !a.heads_ctx.empty(), "Ulysses' backward needs the forward's head shard");
  const AttentionShape heads = head_shard(sh);
  const Tensor d_heads_ctx = to_head_shard(ctx, sh, d_out, heads.ctx_cols());
  Tensor d_heads_qkv(ctx.dev, a.heads_qkv.rows(), heads.qkv_cols());
  ctx.dev.flash_attention_backward(heads, a.heads_qkv.data(), a.heads_ctx.data(), lse.data(), d_heads_ctx.data(), d_heads_qkv.data());
  to_sequence_shard(ctx, sh, d_heads_qkv.data(), heads.qkv_cols(), d_qkv.data());
}

}  // namespace

void context_attention_forward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, Tensor& out, Tensor& lse,
                               LayerActivations& a) {
  PTDP_ASSERT(ctx.context != nullptr && ctx.context->size() == sh.cp, "context parallelism needs the context group");
  if (sh.cp_all_to_all) return ulysses_forward(ctx, sh, qkv, out, lse, a);
  if (sh.cp_all_gather) return context_attention_allgather_forward(ctx, sh, qkv, out, lse);
  Device& dev = ctx.dev;
  Communicator& group = *ctx.context;
  const int cp = sh.cp, me = group.rank();
  const AttentionShape ash = sh.attention();
  dev.fill(out.data(), out.size(), 0.0f);
  dev.fill(lse.data(), lse.size(), -std::numeric_limits<float>::infinity());
  const std::vector<int32_t> q_pos = positions_of(sh, me);
  // The block in hand, qkv-shaped (its query columns are never read), and the K/V in flight.
  const int kv_cols = ash.groups() * (ash.head_dim + ash.v_dim());
  const int64_t rows = qkv.rows();
  Tensor held = Tensor::copy_of(dev, qkv.data(), rows, qkv.cols());
  Tensor outgoing(dev, rows, kv_cols), incoming(dev, rows, kv_cols);
  for (int step = 0; step < cp; ++step) {
    std::unique_ptr<Request> send, recv;
    if (step + 1 < cp) {
      pack_kv(dev, ash, rows, held.data(), outgoing.data(), kv_cols, 0);
      dev.synchronize();
      recv = group.irecv(incoming.data(), incoming.size(), (me + cp - 1) % cp, 0);
      send = group.isend(outgoing.data(), outgoing.size(), (me + 1) % cp, 0);
    }
    const std::vector<int32_t> k_pos = positions_of(sh, (me + cp - step) % cp);
    dev.attention_block_forward(ash, qkv.data(), q_pos.data(), held.data(), k_pos.data(), out.data(), lse.data());
    if (send) {
      send->wait();
      recv->wait();
      unpack_kv(dev, ash, rows, incoming.data(), kv_cols, 0, held.data());
    }
  }
}

// Backward: each block's keys and values travel with their gradients accumulated by the ranks
// they visited, and the gradients come home after cp hops; the query gradients stay local.
void context_attention_backward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, const float* d_out, Tensor& d_qkv, const LayerActivations& a) {
  if (sh.cp_all_to_all) return ulysses_backward(ctx, sh, lse, d_out, d_qkv, a);
  if (sh.cp_all_gather) return context_attention_allgather_backward(ctx, sh, qkv, out, lse, d_out, d_qkv);
  Device& dev = ctx.dev;
  Communicator& group = *ctx.context;
  const int cp = sh.cp, me = group.rank();
  const AttentionShape ash = sh.attention();
  const size_t n = qkv.size();
  const int64_t rows = qkv.rows();
  const int kv_cols = ash.groups() * (ash.head_dim + ash.v_dim());
  dev.fill(d_qkv.data(), d_qkv.size(), 0.0f);
  const std::vector<int32_t> q_pos = positions_of(sh, me);
  // The block in hand and its key/value gradients (qkv-shaped; only their K/V columns are used).
  Tensor block = Tensor::copy_of(dev, qkv.data(), rows, qkv.cols()), grads = Tensor::zeros(dev, rows, qkv.cols());
  // On the wire: [K/V | their gradients], the last hop the gradients only.
  Tensor outgoing(dev, rows, 2 * kv_cols), incoming(dev, rows, 2 * kv_cols);
  for (int step = 0; step < cp; ++step) {
    const std::vector<int32_t> k_pos = positions_of(sh, (me + cp - step) % cp);
    dev.attention_block_backward(ash, qkv.data(), q_pos.data(), block.data(), k_pos.data(), out.data(), lse.data(), d_out,
                                 d_qkv.data(), grads.data());
    const bool last = step + 1 == cp;
    const int wire = last ? kv_cols : 2 * kv_cols;
    if (!last) pack_kv(dev, ash, rows, block.data(), outgoing.data(), wire, 0);
    pack_kv(dev, ash, rows, grads.data(), outgoing.data(), wire, last ? 0 : kv_cols);
    dev.synchronize();
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(wire);
    auto recv = group.irecv(incoming.data(), count, (me + cp - 1) % cp, 0);
    auto send = group.isend(outgoing.data(), count, (me + 1) % cp, 0);
    send->wait();
    recv->wait();
    if (!last) unpack_kv(dev, ash, rows, incoming.data(), wire, 0, block.data());
    unpack_kv(dev, ash, rows, incoming.data(), wire, last ? 0 : kv_cols, grads.data());
  }
  dev.axpy(n, 1.0f, grads.data(), d_qkv.data());  // this rank's keys and values
}

}  // namespace ptdp::exec
