// Mixture-of-experts layers of the executor (exec/model/moe.hpp).
#include "exec/model/moe.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.hpp"

namespace ptdp::exec {

using layer_ops::linear_forward;
using layer_ops::linear_input_grad;
using layer_ops::linear_weight_grad;
using layer_ops::matmul;
using layer_ops::matmul_at_acc;
using layer_ops::weight_grad;

bool moe_split(const LayerContext& ctx, const LayerShape& sh) {
  return (sh.sequence_parallel() || sh.moe_folded) && ctx.expert_tensor != nullptr && ctx.expert_model != nullptr;
}

namespace {

// Local expert le's bias in `biases` (null without biases).
float* bias_of(const std::vector<float*>& biases, size_t le) { return le < biases.size() ? biases[le] : nullptr; }

// Mixture of experts (Megatron-Core's all-to-all dispatcher, on every rank of the expert-parallel
// group): each rank routes its own tokens, sends each kept (token, expert) pair's input row to the
// rank holding the expert, the experts run on the rows they received (grouped by expert), and
// the outputs come back to be summed with the routing weights. Each expert's columns are split
// over the expert-tensor group (by default the tensor group's members; with another size,
// Megatron's parallel folding, the grid's expert order over the stage's ranks). With sequence
// parallelism (or folded) each rank routes its own tokens, as Megatron-Core's dispatchers do:
// the rows it receives are all-gathered over the expert-tensor group, each member runs its
// columns of the experts on all of them, and the partial outputs are reduce-scattered back
// before the combine, so the layer's output is the rank's own part, whole.
// Without it every tensor rank routes the same tokens and the experts' partial outputs are
// reduced as the dense MLP's are.
std::vector<size_t> times(const std::vector<size_t>& rows, size_t width) {
  std::vector<size_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
  return out;
}

int moe_tokens(const LayerContext& ctx, const LayerShape& sh) { return moe_split(ctx, sh) ? sh.local_tokens() : sh.tokens(); }
// The allgather dispatcher's group: the expert group, or (split tokens) expert-tensor × expert.
Communicator* gather_group(const LayerContext& ctx, const LayerShape& sh) { return moe_split(ctx, sh) ? ctx.expert_model : ctx.expert; }

// Split tokens: every expert-tensor member's received rows, gathered in member order (else the
// rank's own); and the inverse, the sum of the members' partial outputs on each member's rows.
Tensor gather_received(LayerContext& ctx, const MoeActivations& m, Tensor&& mine, size_t width) {
  if (m.gather_rows.empty()) return std::move(mine);
  Tensor all(ctx.dev, static_cast<int64_t>(m.received), static_cast<int64_t>(width));
  ctx.dev.synchronize();
  ctx.expert_tensor->all_gather_v(mine.data(), all.data(), times(m.gather_rows, width));
  return all;
}
Tensor scatter_received(LayerContext& ctx, const MoeActivations& m, Tensor&& all, size_t width) {
  if (m.gather_rows.empty()) return std::move(all);
  Tensor mine(ctx.dev, static_cast<int64_t>(m.local_received), static_cast<int64_t>(width));
  ctx.dev.synchronize();
  ctx.expert_tensor->reduce_scatter_v(all.data(), mine.data(), times(m.gather_rows, width));
  return mine;
}

void exchange(LayerContext& ctx, const float* send, const std::vector<size_t>& send_rows, float* recv,
              const std::vector<size_t>& recv_rows, size_t width) {
  ctx.dev.synchronize();
  if (ctx.expert == nullptr) {
    if (send_rows[0] > 0) ctx.dev.copy(send, recv, send_rows[0] * width);
    return;
  }
  ctx.expert->all_to_all_v(send, times(send_rows, width), recv, times(recv_rows, width));
}

// Megatron-Core's allgather dispatcher: every member of the expert group gathers every member's
// tokens and routing, runs its experts on the rows routed to them, applies the routing weights
// and reduce-scatters the partial outputs back to the tokens' ranks. The grouped rows are those
// the all-to-all dispatcher would receive, in the same order (each expert: members in order, each
// member's tokens in order), so the experts compute the same products.
void gather_routing(LayerContext& ctx, const LayerShape& sh, MoeActivations& m) {
  Device& dev = ctx.dev;
  Communicator* group = gather_group(ctx, sh);
  const int P = group != nullptr ? group->size() : 1, El = sh.moe_local_experts;
  const int J = moe_split(ctx, sh) ? ctx.expert_tensor->size() : 1;  // members sharing my experts' columns
  const size_t pairs = m.choice.size();
  PTDP_ASSERT(El * P == sh.moe_experts * J && pairs * static_cast<size_t>(P) < 16777216u, "expert layout or row count out of range");
  // Each member's (expert or −1 when dropped, weight) per pair; exact in floats below 2^24.
  std::vector<float> mine(2 * pairs), all(2 * pairs * static_cast<size_t>(P));
  for (size_t a = 0; a < pairs; ++a) {
    mine[2 * a] = m.slot[a] >= 0 ? static_cast<float>(m.choice[a]) : -1.0f;
    mine[2 * a + 1] = m.prob[a];
  }
  if (group != nullptr) {
    Tensor sent(dev, static_cast<int64_t>(mine.size()), 1), got(dev, static_cast<int64_t>(all.size()), 1);
    dev.upload(mine.data(), sent.data(), mine.size());
    dev.synchronize();
    group->all_gather(sent.data(), got.data(), mine.size());
    dev.download(got.data(), all.data(), all.size());
  } else {
    all = mine;
  }
  m.origin.clear();
  m.origin_prob.clear();
  m.expert_rows.assign(static_cast<size_t>(El), 0);
  for (int le = 0; le < El; ++le)
    for (int r = 0; r < P; ++r)
      for (size_t a = 0; a < pairs; ++a) {
        const size_t at = (static_cast<size_t>(r) * pairs + a) * 2;
        if (all[at] != static_cast<float>(sh.moe_first_expert + le)) continue;
        m.origin.emplace_back(r, a);
        m.origin_prob.push_back(all[at + 1]);
        ++m.expert_rows[static_cast<size_t>(le)];
      }
  m.received = m.origin.size();
}

// The rows of every member of the dispatcher's group: `local` [rows, width] gathered into [P·rows, width].
Tensor gather_members(LayerContext& ctx, const LayerShape& sh, const float* local, int rows, int width) {
  Communicator* group = gather_group(ctx, sh);
  const int P = group != nullptr ? group->size() : 1;
  Tensor all(ctx.dev, static_cast<int64_t>(P) * rows, width);
  ctx.dev.synchronize();
  if (group != nullptr) group->all_gather(local, all.data(), static_cast<size_t>(rows) * width);
  else ctx.dev.copy(local, all.data(), all.size());
  return all;
}

// Sums `partial` [P·rows, width] over the dispatcher's group; this member's rows into `out` [rows, width].
void scatter_members(LayerContext& ctx, const LayerShape& sh, const Tensor& partial, float* out, int rows, int width) {
  ctx.dev.synchronize();
  if (Communicator* group = gather_group(ctx, sh)) group->reduce_scatter(partial.data(), out, static_cast<size_t>(rows) * width);
  else ctx.dev.copy(partial.data(), out, static_cast<size_t>(rows) * width);
}

// Row of the gathered tokens a grouped row came from.
size_t origin_row(const MoeActivations& m, size_t i) {
  return static_cast<size_t>(m.origin[i].first) * static_cast<size_t>(m.T) + m.origin[i].second / static_cast<size_t>(m.k);
}

void route(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const float* x, MoeActivations& m) {
  Device& dev = ctx.dev;
  const int T = moe_tokens(ctx, sh), h = sh.hidden, E = sh.moe_experts, k = sh.moe_top_k;
  Tensor logits(dev, T, E);
  matmul(dev, T, E, h, x, w.router, logits.data());
  std::vector<float> lg(static_cast<size_t>(T) * E);
  dev.download(logits.data(), lg.data(), lg.size());
  m.T = T;
  m.k = k;
  m.choice.assign(static_cast<size_t>(T) * k, 0);
  m.prob.assign(static_cast<size_t>(T) * k, 0.0f);
  std::vector<int> order(static_cast<size_t>(E));
  if (w.expert_bias != nullptr) {  // aux-loss-free: sigmoid scores, chosen by score + bias
    std::vector<float> bias(static_cast<size_t>(E)), sc(static_cast<size_t>(E));
    dev.download(w.expert_bias, bias.data(), bias.size());
    m.score.assign(m.prob.size(), 0.0f);
    m.score_sum.assign(static_cast<size_t>(T), 0.0f);
    for (int t = 0; t < T; ++t) {
      const float* row = lg.data() + static_cast<size_t>(t) * E;
      for (int e = 0; e < E; ++e) {
        order[static_cast<size_t>(e)] = e;
        sc[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-row[e]));
      }
      auto biased = [&](int e) { return sc[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)]; };
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return biased(a) != biased(b) ? biased(a) > biased(b) : a < b; });
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += sc[static_cast<size_t>(order[static_cast<size_t>(j)])];
      m.score_sum[static_cast<size_t>(t)] = sum;
      for (int j = 0; j < k; ++j) {
        const size_t a = static_cast<size_t>(t) * k + j;
        m.choice[a] = order[static_cast<size_t>(j)];
        m.score[a] = sc[static_cast<size_t>(m.choice[a])];
        m.prob[a] = k > 1 ? m.score[a] / (sum + 1e-20f) : m.score[a];
      }
    }
  }
  for (int t = 0; t < T && w.expert_bias == nullptr; ++t) {
    const float* row = lg.data() + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
    // The k largest logits (ties: the lower expert), then a softmax over them.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    const float top = row[order[0]];
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += std::exp(row[order[static_cast<size_t>(j)]] - top);
    for (int j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(t) * k + j;
      m.choice[a] = order[static_cast<size_t>(j)];
      m.prob[a] = std::exp(row[order[static_cast<size_t>(j)]] - top) / sum;
    }
  }
  // Capacity: each expert keeps its ceil(T·k/E·factor) most probable tokens (ties: the earlier).
  std::vector<std::vector<size_t>> by_expert(static_cast<size_t>(E));
  for (size_t a = 0; a < m.choice.size(); ++a) by_expert[static_cast<size_t>(m.choice[a])].push_back(a);
  m.slot.assign(m.choice.size(), -1);
  if (sh.moe_capacity_factor > 0) {
    const auto capacity = static_cast<size_t>(std::ceil(static_cast<double>(T) * k / E * sh.moe_capacity_factor));
    for (auto& list : by_expert) {
      std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) { return m.prob[a] > m.prob[b]; });
      if (list.size() > capacity) list.resize(capacity);
      std::sort(list.begin(), list.end());
    }
  }
  // Send order: by expert (so by owner), then by token.
  int64_t next = 0;
  std::vector<float> counts(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    for (size_t a : by_expert[static_cast<size_t>(e)]) m.slot[a] = next++;
    counts[static_cast<size_t>(e)] = static_cast<float>(by_expert[static_cast<size_t>(e)].size());
  }
  m.sent = static_cast<size_t>(next);
  // The tokens each expert was given (after the capacity), counted once per forward.
  if (w.expert_load != nullptr && !ctx.recomputing)
    for (int e = 0; e < E; ++e) w.expert_load[e] += counts[static_cast<size_t>(e)];
  if (sh.moe_allgather) return gather_routing(ctx, sh, m);
  // Every member's count per expert (exact in floats below 2^24 rows).
  const int P = ctx.expert != nullptr ? ctx.expert->size() : 1, El = sh.moe_local_experts;
  PTDP_ASSERT(El * P == E && static_cast<double>(m.sent) < 16777216.0, "expert layout or row count out of range");
  std::vector<float> all(static_cast<size_t>(E) * P);
  if (ctx.expert != nullptr) {
    Tensor mine(dev, E, 1), gathered_counts(dev, static_cast<int64_t>(E) * P, 1);
    dev.upload(counts.data(), mine.data(), counts.size());
    dev.synchronize();
    ctx.expert->all_gather(mine.data(), gathered_counts.data(), static_cast<size_t>(E));
    dev.download(gathered_counts.data(), all.data(), all.size());
  } else {
    all = counts;
  }
  // Split tokens: every expert-tensor member's counts (member j's at [j·P·E ..)), since the
  // experts run on the rows each of them received.
  const bool split = moe_split(ctx, sh);
  const int J = split ? ctx.expert_tensor->size() : 1, me = split ? ctx.expert_tensor->rank() : 0;
  std::vector<float> members = all;
  if (split) {
    members.resize(all.size() * static_cast<size_t>(J));
    Tensor mine(dev, static_cast<int64_t>(all.size()), 1), got(dev, static_cast<int64_t>(members.size()), 1);
    dev.upload(all.data(), mine.data(), all.size());
    dev.synchronize();
    ctx.expert_tensor->all_gather(mine.data(), got.data(), all.size());
    dev.download(got.data(), members.data(), members.size());
  }
  auto count_of = [&](int j, int r, int le) {
    return static_cast<size_t>(members[(static_cast<size_t>(j) * P + static_cast<size_t>(r)) * E +
                                       static_cast<size_t>(sh.moe_first_expert + le)]);
  };
  m.send_rows.assign(static_cast<size_t>(P), 0);
  m.recv_rows.assign(static_cast<size_t>(P), 0);
  m.expert_rows.assign(static_cast<size_t>(El), 0);
  m.gather_rows.assign(split ? static_cast<size_t>(J) : 0, 0);
  for (int e = 0; e < E; ++e) m.send_rows[static_cast<size_t>(e / El)] += static_cast<size_t>(counts[static_cast<size_t>(e)]);
  // Received rows: from member r, its rows for my experts in expert order (split tokens: member
  // j's received rows after member j − 1's). Grouped by expert: for each of my experts, every
  // (j, r)'s rows in order (perm: grouped row ← received row).
  std::vector<size_t> at(static_cast<size_t>(J) * P * El);
  size_t received = 0;
  for (int j = 0; j < J; ++j)
    for (int r = 0; r < P; ++r)
      for (int le = 0; le < El; ++le) {
        const size_t n = count_of(j, r, le);
        at[(static_cast<size_t>(j) * P + static_cast<size_t>(r)) * El + static_cast<size_t>(le)] = received;
        received += n;
        if (j == me) m.recv_rows[static_cast<size_t>(r)] += n;
        if (split) m.gather_rows[static_cast<size_t>(j)] += n;
        m.expert_rows[static_cast<size_t>(le)] += n;
      }
  m.runs.clear();
  for (int le = 0; le < El; ++le)
    for (int j = 0; j < J; ++j)
      for (int r = 0; r < P; ++r) {
        const size_t n = count_of(j, r, le);
        if (n > 0) m.runs.push_back({at[(static_cast<size_t>(j) * P + static_cast<size_t>(r)) * El + static_cast<size_t>(le)], n});
      }
  m.received = received;
  m.local_received = 0;
  for (size_t n : m.recv_rows) m.local_received += n;
}

// Rows of `src` [n, width] in received order to grouped order (or back).
void regroup(Device& dev, const MoeActivations& m, const float* src, float* dst, size_t width, bool to_grouped) {
  size_t g = 0;
  for (const auto& [start, n] : m.runs) {
    if (to_grouped) dev.copy(src + start * width, dst + g * width, n * width);
    else dev.copy(src + g * width, dst + start * width, n * width);
    g += n;
  }
}

}  // namespace

void moe_forward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const float* x, float* out,
                 MoeActivations& m) {
  Device& dev = ctx.dev;
  const int T = moe_tokens(ctx, sh), h = sh.hidden, f = sh.moe_ffn_local;
  route(ctx, sh, w, x, m);
  const auto R = static_cast<int64_t>(m.received);
  m.x = Tensor(dev, R, h);
  if (sh.moe_allgather) {
    const Tensor all = gather_members(ctx, sh, x, T, h);
    for (size_t i = 0; i < m.received; ++i) dev.copy(all.data() + origin_row(m, i) * h, m.x.data() + i * h, h);
  } else {
    Tensor send(dev, static_cast<int64_t>(m.sent), h), recv(dev, static_cast<int64_t>(m.local_received), h);
    for (size_t a = 0; a < m.slot.size(); ++a)
      if (m.slot[a] >= 0) dev.copy(x + a / m.k * h, send.data() + static_cast<size_t>(m.slot[a]) * h, h);
    exchange(ctx, send.data(), m.send_rows, recv.data(), m.recv_rows, h);
    const Tensor gathered_rows = gather_received(ctx, m, std::move(recv), static_cast<size_t>(h));
    regroup(dev, m, gathered_rows.data(), m.x.data(), h, true);
  }
  m.fc1 = Tensor(dev, R, f);
  m.act = Tensor(dev, R, f);
  if (sh.swiglu) m.gate = Tensor(dev, R, f);
  Tensor y(dev, R, h);
  // Each expert's GEMMs are linear layers of their own (Transformer Engine's grouped linear keeps
  // FP8 scales per GEMM): FP8-emulated with the plan's recipe, amax histories keyed by its weights.
  m.fp8_input_scale.assign(static_cast<size_t>(sh.moe_local_experts), {1.0f, 1.0f, 1.0f});
  size_t row = 0;
  for (int le = 0; le < sh.moe_local_experts; ++le) {
    const int n = static_cast<int>(m.expert_rows[static_cast<size_t>(le)]);
    if (n == 0) continue;
    const float* xe = m.x.data() + row * h;
    float* fc1 = m.fc1.data() + row * f;
    float* act = m.act.data() + row * f;
    const auto le_ = static_cast<size_t>(le);
    std::array<float, 3>& scale = m.fp8_input_scale[le_];
    scale[0] = linear_forward(ctx, n, f, h, xe, w.expert_fc1[le_], fc1);
    dev.add_bias(n, f, bias_of(w.expert_fc1_bias, le_), fc1);
    if (sh.swiglu) {
      float* gate = m.gate.data() + row * f;
      scale[1] = linear_forward(ctx, n, f, h, xe, w.expert_gate[le_], gate);
      dev.add_bias(n, f, bias_of(w.expert_gate_bias, le_), gate);
      dev.swiglu_forward(static_cast<size_t>(n) * f, gate, fc1, act);
    } else {
      dev.gelu_forward(static_cast<size_t>(n) * f, fc1, act);
    }
    scale[2] = linear_forward(ctx, n, h, f, act, w.expert_fc2[le_], y.data() + row * h);
    // The replicated fc2 bias joins one expert-tensor rank's partial sums.
    if (sh.moe_etp_rank == 0) dev.add_bias(n, h, bias_of(w.expert_fc2_bias, le_), y.data() + row * h);
    row += static_cast<size_t>(n);
  }
  if (sh.moe_allgather) {  // weighted on the experts' rank, summed back to the tokens' rank
    Communicator* group = gather_group(ctx, sh);
    const int P = group != nullptr ? group->size() : 1;
    Tensor partial = Tensor::zeros(dev, static_cast<int64_t>(P) * T, h);
    for (size_t i = 0; i < m.received; ++i) dev.axpy(h, m.origin_prob[i], y.data() + i * h, partial.data() + origin_row(m, i) * h);
    scatter_members(ctx, sh, partial, out, T, h);
    m.y = std::move(y);
    return;
  }
  Tensor back(dev, R, h);
  regroup(dev, m, y.data(), back.data(), h, false);
  const Tensor mine = scatter_received(ctx, m, std::move(back), static_cast<size_t>(h));
  m.y = Tensor(dev, static_cast<int64_t>(m.sent), h);
  exchange(ctx, mine.data(), m.recv_rows, m.y.data(), m.send_rows, h);
  dev.fill(out, static_cast<size_t>(T) * h, 0.0f);
  for (size_t a = 0; a < m.slot.size(); ++a)
    if (m.slot[a] >= 0) dev.axpy(h, m.prob[a], m.y.data() + static_cast<size_t>(m.slot[a]) * h, out + a / m.k * h);
}

// dx (overwritten; partial over the tensor group like the dense MLP's) from dout [tokens, h].
void moe_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g, const float* x,
                  MoeActivations&& m, const float* dout, float* dx, DeferredWeightGrads* defer) {
  Device& dev = ctx.dev;
  const int T = moe_tokens(ctx, sh), h = sh.hidden, f = sh.moe_ffn_local, E = sh.moe_experts, k = m.k;
  const bool split = moe_split(ctx, sh);
  // The routing weights' gradients: dout · (expert output), summed over the tensor group (split
  // tokens: the outputs came back whole).
  std::vector<float> dp(m.slot.size(), 0.0f);
  const int P = gather_group(ctx, sh) != nullptr ? gather_group(ctx, sh)->size() : 1;
  Tensor dout_all;  // allgather: every member's output gradients
  auto dot = [h](const float* o, const float* y) {
    double s = 0;
    for (int i = 0; i < h; ++i) s += static_cast<double>(o[i]) * y[i];
    return static_cast<float>(s);
  };
  if (sh.moe_allgather) {  // on the experts' rank, then each pair's back to its token's rank
    dout_all = gather_members(ctx, sh, dout, T, h);
    std::vector<float> out_host(dout_all.size()), y_host(m.received * static_cast<size_t>(h));
    std::vector<float> dp_all(dp.size() * static_cast<size_t>(P), 0.0f);
    dev.download(dout_all.data(), out_host.data(), out_host.size());
    if (m.received > 0) dev.download(m.y.data(), y_host.data(), y_host.size());
    for (size_t i = 0; i < m.received; ++i)
      dp_all[static_cast<size_t>(m.origin[i].first) * dp.size() + m.origin[i].second] =
          dot(out_host.data() + origin_row(m, i) * h, y_host.data() + i * h);
    Tensor part = Tensor(dev, static_cast<int64_t>(dp_all.size()), 1), mine(dev, static_cast<int64_t>(dp.size()), 1);
    dev.upload(dp_all.data(), part.data(), dp_all.size());
    scatter_members(ctx, sh, part, mine.data(), static_cast<int>(dp.size()), 1);
    dev.download(mine.data(), dp.data(), dp.size());
  } else {
    std::vector<float> out_host(static_cast<size_t>(T) * h), y_host(m.sent * static_cast<size_t>(h));
    dev.download(dout, out_host.data(), out_host.size());
    if (m.sent > 0) dev.download(m.y.data(), y_host.data(), y_host.size());
    for (size_t a = 0; a < m.slot.size(); ++a)
      if (m.slot[a] >= 0)
        dp[a] = dot(out_host.data() + a / static_cast<size_t>(k) * h, y_host.data() + static_cast<size_t>(m.slot[a]) * h);
  }
  if (ctx.tp.size() > 1 && !split) {
    Tensor t(dev, static_cast<int64_t>(dp.size()), 1);
    dev.upload(dp.data(), t.data(), dp.size());
    ctx.tp_all_reduce(t.data(), dp.size());
    dev.download(t.data(), dp.data(), dp.size());
  }
  // The expert outputs' gradients travel to the experts.
  const auto R = static_cast<int64_t>(m.received);
  auto dy = std::make_shared<Tensor>(dev, R, h);
  if (sh.moe_allgather) {
    for (size_t i = 0; i < m.received; ++i) {
      float* row = dy->data() + i * h;
      dev.copy(dout_all.data() + origin_row(m, i) * h, row, h);
      dev.scale(h, m.origin_prob[i], row);
    }
    dout_all.reset();
  } else {
    Tensor dy_send(dev, static_cast<int64_t>(m.sent), h), dy_recv(dev, static_cast<int64_t>(m.local_received), h);
    for (size_t a = 0; a < m.slot.size(); ++a)
      if (m.slot[a] >= 0) {
        float* row = dy_send.data() + static_cast<size_t>(m.slot[a]) * h;
        dev.copy(dout + a / static_cast<size_t>(k) * h, row, h);
        dev.scale(h, m.prob[a], row);
      }
    exchange(ctx, dy_send.data(), m.send_rows, dy_recv.data(), m.recv_rows, h);
    const Tensor dy_rows = gather_received(ctx, m, std::move(dy_recv), static_cast<size_t>(h));
    regroup(dev, m, dy_rows.data(), dy->data(), h, true);
  }
  auto d_fc1 = std::make_shared<Tensor>(dev, R, f);
  auto d_gate = std::make_shared<Tensor>(sh.swiglu ? Tensor(dev, R, f) : Tensor());
  Tensor dx_grouped(dev, R, h);
  // Per local expert: the tensorwise scales its fc1's, gate's and fc2's output gradients were cast with.
  std::vector<std::array<float, 3>> grad_scale(static_cast<size_t>(sh.moe_local_experts), {1.0f, 1.0f, 1.0f});
  size_t row = 0;
  for (int le = 0; le < sh.moe_local_experts; ++le) {
    const int n = static_cast<int>(m.expert_rows[static_cast<size_t>(le)]);
    if (n == 0) continue;
    const size_t le_ = static_cast<size_t>(le);
    float* da = d_fc1->data() + row * f;
    float* dxe = dx_grouped.data() + row * h;
    grad_scale[le_][2] = linear_input_grad(ctx, n, f, h, dy->data() + row * h, w.expert_fc2[le_], da);
    if (sh.swiglu) {
      float* dg = d_gate->data() + row * f;
      dev.swiglu_backward(static_cast<size_t>(n) * f, m.gate.data() + row * f, m.fc1.data() + row * f, da, dg, da);
      grad_scale[le_][0] = linear_input_grad(ctx, n, h, f, da, w.expert_fc1[le_], dxe);
      grad_scale[le_][1] = linear_input_grad(ctx, n, h, f, dg, w.expert_gate[le_], dxe, 1.0f);
    } else {
      dev.gelu_backward(static_cast<size_t>(n) * f, m.fc1.data() + row * f, da, da);
      grad_scale[le_][0] = linear_input_grad(ctx, n, h, f, da, w.expert_fc1[le_], dxe);
    }
    row += static_cast<size_t>(n);
  }
  // The experts' weight gradients (held back by a split backward with what they read).
  {
    auto xs = std::make_shared<Tensor>(std::move(m.x));
    auto act = std::make_shared<Tensor>(std::move(m.act));
    std::vector<size_t> rows = m.expert_rows;
    const bool swiglu = sh.swiglu;
    auto task = [&ctx, &dev, h, f, rows, swiglu, xs, act, dy, d_fc1, d_gate, x_scale = std::move(m.fp8_input_scale),
                 grad_scale = std::move(grad_scale), wk = w, gw = g] {
      size_t at = 0;
      for (size_t le = 0; le < rows.size(); ++le) {
        const int n = static_cast<int>(rows[le]);
        if (n == 0) continue;
        const std::array<float, 3>&xsc = x_scale[le], &gsc = grad_scale[le];
        linear_weight_grad(ctx, wk.expert_fc2[le], n, f, h, act->data() + at * f, xsc[2], dy->data() + at * h, gsc[2], gw.expert_fc2[le]);
        linear_weight_grad(ctx, wk.expert_fc1[le], n, h, f, xs->data() + at * h, xsc[0], d_fc1->data() + at * f, gsc[0], gw.expert_fc1[le]);
        if (swiglu)
          linear_weight_grad(ctx, wk.expert_gate[le], n, h, f, xs->data() + at * h, xsc[1], d_gate->data() + at * f, gsc[1],
                             gw.expert_gate[le]);
        dev.add_bias_grad(n, h, dy->data() + at * h, bias_of(gw.expert_fc2_bias, le));
        dev.add_bias_grad(n, f, d_fc1->data() + at * f, bias_of(gw.expert_fc1_bias, le));
        if (swiglu) dev.add_bias_grad(n, f, d_gate->data() + at * f, bias_of(gw.expert_gate_bias, le));
        at += static_cast<size_t>(n);
      }
    };
    weight_grad(defer, task);
  }
  // The input gradients go back to the tokens' ranks.
  if (sh.moe_allgather) {
    Tensor partial = Tensor::zeros(dev, static_cast<int64_t>(P) * T, h);
    for (size_t i = 0; i < m.received; ++i) dev.axpy(h, 1.0f, dx_grouped.data() + i * h, partial.data() + origin_row(m, i) * h);
    scatter_members(ctx, sh, partial, dx, T, h);
  } else {
    Tensor dx_rows(dev, R, h), dx_send(dev, static_cast<int64_t>(m.sent), h);
    regroup(dev, m, dx_grouped.data(), dx_rows.data(), h, false);
    const Tensor dx_recv = scatter_received(ctx, m, std::move(dx_rows), static_cast<size_t>(h));
    exchange(ctx, dx_recv.data(), m.recv_rows, dx_send.data(), m.send_rows, h);
    dev.fill(dx, static_cast<size_t>(T) * h, 0.0f);
    for (size_t a = 0; a < m.slot.size(); ++a)
      if (m.slot[a] >= 0) dev.axpy(h, 1.0f, dx_send.data() + static_cast<size_t>(m.slot[a]) * h, dx + a / static_cast<size_t>(k) * h);
  }
  // Router: p = softmax over the chosen logits, so dlogit_i = p_i (dp_i − Σ_j p_j dp_j); with
  // the expert bias p_i = s_i / Σ_j s_j, s = σ(logit): dlogit_i = s_i (1 − s_i)(dp_i − Σ_j p_j dp_j) / Σ_j s_j
  // (k = 1: p = s, dlogit = s (1 − s) dp).
  std::vector<float> dl(static_cast<size_t>(T) * E, 0.0f);
  for (int t = 0; t < T && !m.score.empty(); ++t) {
    double s = 0;
    for (int j = 0; j < k; ++j) s += static_cast<double>(m.prob[static_cast<size_t>(t) * k + j]) * dp[static_cast<size_t>(t) * k + j];
    for (int j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(t) * k + j;
      const double sc = m.score[a], slope = sc * (1.0 - sc);
      dl[static_cast<size_t>(t) * E + m.choice[a]] =
          static_cast<float>(k > 1 ? slope * (dp[a] - s) / (static_cast<double>(m.score_sum[static_cast<size_t>(t)]) + 1e-20)
                                   : slope * dp[a]);
    }
  }
  for (int t = 0; t < T && m.score.empty(); ++t) {
    double s = 0;
    for (int j = 0; j < k; ++j) s += static_cast<double>(m.prob[static_cast<size_t>(t) * k + j]) * dp[static_cast<size_t>(t) * k + j];
    for (int j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(t) * k + j;
      dl[static_cast<size_t>(t) * E + m.choice[a]] = m.prob[a] * static_cast<float>(dp[a] - s);
    }
  }
  auto d_logits = std::make_shared<Tensor>(dev, T, E);
  dev.upload(dl.data(), d_logits->data(), dl.size());
  // Every tensor rank routes the same tokens: the router's input gradient joins dx on one of them
  // (dx is summed over the group afterwards); split tokens: each its own, whole.
  if (split || sh.tp_rank == 0) dev.gemm(Trans::No, Trans::Yes, T, h, E, 1.0f, d_logits->data(), E, w.router, E, 1.0f, dx, h);
  weight_grad(defer, [&dev, T, h, E, x, d_logits, gw = g.router] { matmul_at_acc(dev, h, E, T, x, d_logits->data(), gw); });
  m = MoeActivations();
}

}  // namespace ptdp::exec
