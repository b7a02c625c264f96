#include "exec/calibrate_cpu.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include "core/units.hpp"
#include "exec/runtime/cpu_time.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/fp8.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "topologies/cluster_yaml.hpp"

namespace ptdp::exec {
namespace {

using Clock = std::chrono::steady_clock;

// Runs f repeatedly for at least `min_s` (and at least twice) and returns seconds per call: CPU
// seconds of the calling thread (a kernel's cost, whatever else runs on the machine; the
// executor's computation is measured with the same clock), or with `wall` the wall clock.
template <class F>
double time_per_call(F&& f, double min_s = 0.05, bool wall = false) {
  auto now = [wall] { return wall ? std::chrono::duration<double>(Clock::now().time_since_epoch()).count() : thread_cpu_s(); };
  f();  // warm up
  int calls = 0;
  const double t0 = now();
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = now() - t0;
  } while (elapsed < min_s || calls < 2);
  return elapsed / calls;
}

// Times a collective operation: every rank runs it the same number of times (chosen by rank 0
// from a trial run, at least once per block), in 7 blocks; the slowest rank's time per call in
// each block, and the median block, is returned everywhere. Small collectives whose ranks may sleep in their waits run in
// spells of fast and slow calls. In four calibrations minutes apart, one mean over the whole time
// read the sleeping curve at 106–589 MB/s (4 KiB) and 570–1720 MB/s (64 KiB); the median block
// at 417–651 and 616–1568 MB/s: some spells outlast a block.
template <class F>
double time_collective(Communicator& world, F&& f, double min_s) {
  constexpr int kBlocks = 7;
  f();
  world.barrier();
  const auto t0 = Clock::now();
  f();
  double trial = std::chrono::duration<double>(Clock::now() - t0).count();
  world.all_reduce(&trial, 1, ReduceOp::Max);
  const int reps = std::clamp(static_cast<int>(min_s / kBlocks / std::max(trial, 1e-7)), 1, 100000);
  std::vector<double> blocks;
  for (int b = 0; b < kBlocks; ++b) {
    world.barrier();
    const auto t1 = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    double s = std::chrono::duration<double>(Clock::now() - t1).count() / reps;
    world.all_reduce(&s, 1, ReduceOp::Max);
    blocks.push_back(s);
  }
  std::nth_element(blocks.begin(), blocks.begin() + kBlocks / 2, blocks.end());
  return blocks[kBlocks / 2];
}


// time_per_call in `rounds` rounds of `min_s` each, the median: a spell of another process's
// load slows a round, not the figure.
template <class F>
double median_time_per_call(F&& f, int rounds = 5, double min_s = 0.008) {
  std::vector<double> t;
  for (int r = 0; r < rounds; ++r) t.push_back(time_per_call(f, min_s));
  return median(std::move(t));
}

// FLOP/s of one GEMM shape, timed for at least `min_s`. With `evict` (not empty), a pass that
// writes one float per cache line of it precedes every call and is not timed: the operands come
// from beyond the per-core caches, as a weight does in a training step, which streams the rank's
// other weights and gradients between two uses of it. This machine (2 MiB of L2 per
// core), five GEMM shapes of the tiny GPT ran at about 0.95, 0.85 and 0.6 of the warm
// rate after 1, 4 and 32 MiB of other traffic.
double gemm_flops(Device& dev, int64_t m, int64_t n, int64_t k, bool wall = false, double min_s = 0.05,
                  std::vector<float>* evict = nullptr, bool yield = false) {
  Tensor a(dev, m, k), b(dev, k, n), c(dev, m, n);
  dev.fill(a.data(), a.size(), 0.5f);
  dev.fill(b.data(), b.size(), 0.25f);
  auto gemm = [&] {
    dev.gemm(Trans::No, Trans::No, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(),
             static_cast<int>(k), b.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
  };
  double s = 0;
  if (evict == nullptr || evict->empty()) {
    s = time_per_call(gemm, min_s, wall);
  } else {
    gemm();
    double timed = 0;
    int calls = 0;
    while ((timed < min_s && calls < 8) || calls < 2) {  // the passes cost more than the calls: 8 at most
      for (size_t i = 0; i < evict->size(); i += 16) (*evict)[i] += 1.0f;
      if (yield) sched_yield();
      const double t0 = thread_cpu_s();
      gemm();
      timed += thread_cpu_s() - t0;
      ++calls;
    }
    s = timed / calls;
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / s;
}

// Median rate of each GEMM shape over `rounds` rounds, every round timing every shape in turn
// (~8 ms each): whatever else runs on the machine slows all shapes alike instead of the few timed
// while it ran. One 50 ms timing per shape under load (load average 8–14) put shapes of equal
// speed 40 % apart (fc1 83 %, fc2 51 % of the best).
//
// With more ranks than hardware threads (`yield`), each timed call also follows a yield of the
// core: a rank of an oversubscribed run gives up its core at every wait for a message and
// resumes after another rank ran there. Four processes on this machine's two cores, each timing
// a 256×128×128 GEMM after a 2 MiB pass: 93.5-97.9 GFLOP/s back to back, 81.7-89.0 with a
// sched_yield before each call, 82.3-85.5 with a 200 µs sleep. Each round is a group of
// `moments` (the probe sampled after it, its rates set to the first sample's speed).
std::vector<double> gemm_rates_interleaved(Device& dev, const std::vector<std::array<int64_t, 3>>& shapes, int rounds,
                                           double evict_bytes, bool yield, ProbedMoments& moments) {
  std::vector<float> evict(static_cast<size_t>(evict_bytes / sizeof(float)), 0.0f);
  std::vector<std::vector<double>> rates(shapes.size(), std::vector<double>(static_cast<size_t>(rounds)));
  for (size_t r = 0; r < static_cast<size_t>(rounds); ++r) {
    std::vector<double*> round;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [m, n, k] = shapes[i];
      rates[i][r] = gemm_flops(dev, m, n, k, false, 0.008, &evict, yield);
      round.push_back(&rates[i][r]);
    }
    moments.close({}, round);
  }
  std::vector<double> out;
  for (auto& v : rates) out.push_back(median(std::move(v)));
  return out;
}

// The largest cache of this host (sysconf's level 3, else level 2), 64 MiB when it says none:
// a pass over that many bytes leaves what was touched before it in memory.
double last_level_cache_bytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
    if (const long bytes = ::sysconf(name); bytes > 0) return static_cast<double>(std::min(bytes, long{1} << 30));
  return 64.0 * (1 << 20);
}

using Progress = std::function<void(const std::string&)>;

std::string line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string line(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// The flash attention kernel (causal, 4 heads of 32, 4 sequences) at 64 and 256 tokens, forward
// and backward: seconds per call into p.attention_fwd_s / attention_bwd_s.
constexpr std::array<int, 2> kFlashSeq = {64, 256};
AttentionShape flash_shape(int seq) {
  AttentionShape sh;
  sh.batch = 4;
  sh.heads = 4;
  sh.head_dim = 32;
  sh.seq = seq;
  return sh;
}

void time_flash_attention(Device& dev, CpuCalibration& p) {
  for (int i = 0; i < 2; ++i) {
    const AttentionShape sh = flash_shape(kFlashSeq[static_cast<size_t>(i)]);
    const size_t rows = static_cast<size_t>(sh.batch) * sh.seq;
    Tensor qkv(dev, rows, sh.qkv_cols()), ctx(dev, rows, sh.heads * sh.head_dim), dctx(dev, rows, sh.heads * sh.head_dim),
        dqkv(dev, rows, sh.qkv_cols()), lse(dev, 1, static_cast<size_t>(sh.batch) * sh.heads * sh.seq);
    for (size_t j = 0; j < qkv.size(); ++j) qkv.data()[j] = 0.01f * static_cast<float>(j % 97);
    dev.fill(dctx.data(), dctx.size(), 0.5f);
    p.attention_fwd_s[static_cast<size_t>(i)] = median_time_per_call([&] { dev.flash_attention_forward(sh, qkv.data(), ctx.data(), lse.data()); });
    p.attention_bwd_s[static_cast<size_t>(i)] = median_time_per_call(
        [&] { dev.flash_attention_backward(sh, qkv.data(), ctx.data(), lse.data(), dctx.data(), dqkv.data()); });
  }
}

// Context parallelism's attention as the executor runs it (exec/model/context_attention.cpp): a
// rank of a context group of 2 holds 2 of the 4 load-balanced chunks of a 128-token sequence
// (4 sequences, 4 query heads of 32 in 2 groups) and runs the block kernel on its own keys and
// on the other rank's, forward and backward. The rates are FLOP/s of the cost model's count for
// the rank's attention (2·b·h·s_rank·s·head_dim forward, 2.5× that backward): the block kernel
// computes the whole block's scores and then walks each query's visible keys one by one, unlike
// the flash kernel's tiles (priced by the flash curve, the context-parallel blocks were under
// their CPU time by 17–43 %).
void time_context_attention(Device& dev, CpuCalibration& p) {
  constexpr int cp = 2;
  AttentionShape sh = flash_shape(64);  // 64 tokens per rank: a 128-token sequence
  sh.kv_heads = 2;
  const size_t rows = static_cast<size_t>(sh.batch) * sh.seq, cols = static_cast<size_t>(sh.heads) * sh.head_dim;
  Tensor qkv(dev, rows, sh.qkv_cols()), kv(dev, rows, sh.qkv_cols()), ctx(dev, rows, cols), dctx(dev, rows, cols),
      dqkv(dev, rows, sh.qkv_cols()), dkv(dev, rows, sh.qkv_cols()), lse(dev, 1, static_cast<size_t>(sh.batch) * sh.heads * sh.seq);
  for (size_t j = 0; j < qkv.size(); ++j) {
    qkv.data()[j] = 0.01f * static_cast<float>(j % 97);
    kv.data()[j] = 0.01f * static_cast<float>(j % 89);
  }
  dev.fill(dctx.data(), dctx.size(), 0.5f);
  std::array<std::vector<int32_t>, cp> pos;  // LayerShape::position: chunks r and 2·cp − 1 − r
  const int chunk = sh.seq / 2;
  for (int r = 0; r < cp; ++r)
    for (int i = 0; i < sh.seq; ++i) pos[static_cast<size_t>(r)].push_back(i < chunk ? r * chunk + i : (2 * cp - 1 - r) * chunk + i - chunk);
  auto forward = [&] {
    dev.fill(lse.data(), lse.size(), -std::numeric_limits<float>::infinity());
    for (int r = 0; r < cp; ++r)
      dev.attention_block_forward(sh, qkv.data(), pos[0].data(), r == 0 ? qkv.data() : kv.data(), pos[static_cast<size_t>(r)].data(),
                                  ctx.data(), lse.data());
  };
  const double fwd_s = median_time_per_call(forward);
  const double bwd_s = median_time_per_call([&] {
    for (int r = 0; r < cp; ++r)
      dev.attention_block_backward(sh, qkv.data(), pos[0].data(), r == 0 ? qkv.data() : kv.data(), pos[static_cast<size_t>(r)].data(),
                                   ctx.data(), lse.data(), dctx.data(), dqkv.data(), dkv.data());
  });
  const double flops = 2.0 * sh.batch * sh.heads * sh.seq * (cp * sh.seq) * sh.head_dim;
  p.context_attention_flops = flops / fwd_s;
  p.context_attention_backward_flops = 2.5 * flops / bwd_s;
}

// The flash kernel's times as the cost model's flash curve (model/cost.hpp: attention_efficiency)
// with the GPU presets' block and head-dim terms: the ceiling and walk length that reproduce both
// lengths, relative to p.peak_flops.
void fit_flash_attention(CpuCalibration& p) {
  const GpuSpec curve;  // attention_block, attention_head_dim_half
  auto fit = [&](bool backward, double& max_eff, double& seq_half) {
    std::array<double, 2> walk{}, g{};
    for (int i = 0; i < 2; ++i) {
      const AttentionShape sh = flash_shape(kFlashSeq[static_cast<size_t>(i)]);
      const double s = (backward ? p.attention_bwd_s : p.attention_fwd_s)[static_cast<size_t>(i)];
      const double seq = sh.seq, flops = (backward ? 2.5 : 1.0) * 2.0 * sh.batch * sh.heads * seq * seq * sh.head_dim;
      const double hd = (32.0 / (32.0 + curve.attention_head_dim_half)) / (128.0 / (128.0 + curve.attention_head_dim_half));
      walk[i] = seq / 2;
      g[i] = flops / (s * p.peak_flops) / (seq / (seq + curve.attention_block) * hd);
    }
    // 1/g = 1/max + (half/max)/walk: a line through the two lengths.
    const double b = (1 / g[0] - 1 / g[1]) / (1 / walk[0] - 1 / walk[1]), a = 1 / g[1] - b / walk[1];
    max_eff = a > 0 ? 1 / a : 1.0;
    seq_half = a > 0 ? std::max(0.0, b / a) : 0.0;
    if (max_eff > 1) {  // keep the ceiling in range; the walk length then matches the short sequence
      max_eff = 1;
      seq_half = std::max(0.0, walk[0] * (1 / g[0] - 1));
    }
    if (b < 0) {  // no walk-length effect measured: the mean
      seq_half = 0;
      max_eff = std::min(1.0, 0.5 * (g[0] + g[1]));
    }
  };
  fit(false, p.attention_fwd_max_eff, p.attention_fwd_seq_half);
  fit(true, p.attention_bwd_max_eff, p.attention_bwd_seq_half);
}

// Times the executor's kernels into `p` (this rank's figures; calibrate_cpu takes the median
// over ranks and fits the models to it).
// Each round of GEMMs and each group of other kernels closes a group of `moments` (the speed
// probe sampled after it; its figures set to the first sample's speed). The optimizer step's is
// kept as timed: validate prices OPTIM as calibrated.
void measure_compute(Device& dev, CpuCalibration& p, const std::vector<std::array<int64_t, 3>>& shapes, bool oversubscribed,
                     ProbedMoments& moments) {
  std::vector<std::array<int64_t, 3>> timed = shapes;
  if (shapes.empty()) {
    const std::vector<int64_t> sides = {16, 64, 256, 1024};
    for (int64_t m : sides)
      for (int64_t n : sides)
        for (int64_t k : {int64_t{8}, int64_t{32}, int64_t{128}, int64_t{512}})
          if (m * n * k <= int64_t{1} << 28) timed.push_back({m, n, k});
  }
  const std::vector<double> rates = gemm_rates_interleaved(dev, timed, 5, p.gemm_evict_bytes, oversubscribed, moments);
  for (size_t i = 0; i < timed.size(); ++i) p.gemms.push_back({timed[i][0], timed[i][1], timed[i][2], rates[i]});

  // Streaming bandwidth (copy reads and writes every byte) and what the executor's own
  // element-wise kernels reach (LayerNorm reads x, writes y: ~2 passes; GELU likewise).
  const size_t count = 16u << 20;  // 64 MB per array
  Tensor x(dev, 1, count), y(dev, 1, count);
  dev.fill(x.data(), count, 1.0f);
  const double copy_s = median_time_per_call([&] { dev.copy(x.data(), y.data(), count); }, 3, 0.06);
  p.stream_Bps = 2.0 * 4 * count / copy_s;
  const double gelu_s = median_time_per_call([&] { dev.gelu_forward(count, x.data(), y.data()); }, 3, 0.06);
  const int rows = 4096, cols = static_cast<int>(count / 4096);
  Tensor gamma(dev, 1, cols), beta(dev, 1, cols), mean(dev, 1, rows), rstd(dev, 1, rows);
  dev.fill(gamma.data(), cols, 1.0f);
  dev.fill(beta.data(), cols, 0.0f);
  const double ln_s = median_time_per_call(
      [&] { dev.layer_norm_forward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data()); }, 3,
      0.06);
  const double bytes = 2.0 * 4 * count;
  p.elementwise_eff = std::min(1.0, 0.5 * (bytes / gelu_s + bytes / ln_s) / p.stream_Bps);
  Tensor tiny(dev, 1, 16), tiny_out(dev, 1, 16);
  dev.fill(tiny.data(), 16, 1.0f);
  p.launch_s = median_time_per_call([&] { dev.gelu_forward(16, tiny.data(), tiny_out.data()); }, 3, 0.005);
  moments.close({&p.launch_s}, {&p.stream_Bps});

  // The same two kernels by working set (bytes read and written per call, 16 KiB … 64 MiB): a
  // kernel whose arrays stay in the caches runs faster than the streaming figure above, and the
  // executor's tensors of a small model do. Each size is timed repeatedly over the same arrays
  // (warm, as an op's input is just after the op that wrote it); the launch cost is taken out
  // (the cost model adds it per kernel).
  for (size_t bytes = size_t{16} << 10; bytes <= size_t{64} << 20; bytes *= 4) {
    const size_t n = bytes / 8;  // read x, write y: 8 bytes per element
    const int c = static_cast<int>(std::min<size_t>(n, 1024)), r = static_cast<int>(n / static_cast<size_t>(c));
    Tensor row_mean(dev, 1, r), row_rstd(dev, 1, r);
    std::vector<double> rounds;  // median of 3 rounds of both kernels
    for (int round = 0; round < 3; ++round) {
      const double gelu = time_per_call([&] { dev.gelu_forward(n, x.data(), y.data()); }, 0.01);
      const double norm = time_per_call(
          [&] { dev.layer_norm_forward(r, c, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), row_mean.data(), row_rstd.data()); },
          0.01);
      rounds.push_back(0.5 * (gelu + norm));
    }
    const double per_call = std::max(median(std::move(rounds)) - p.launch_s, 1e-9);
    p.elementwise_curve.emplace_back(static_cast<double>(bytes), static_cast<double>(bytes) / per_call);
  }
  {
    std::vector<double*> curve;
    for (auto& e : p.elementwise_curve) curve.push_back(&e.second);
    moments.close({}, curve);
  }

  time_flash_attention(dev, p);
  moments.close({&p.attention_fwd_s[0], &p.attention_fwd_s[1], &p.attention_bwd_s[0], &p.attention_bwd_s[1]}, {});
  time_context_attention(dev, p);
  moments.close({}, {&p.context_attention_flops, &p.context_attention_backward_flops});

  // The optimizer's step as the executor runs it: the gradients' sum of squares (the norm for
  // clipping) and AdamW over parameters, gradients and both moments, 1 Mi parameters (16 MiB of
  // state), each round after a pass over as many other bytes as the largest cache holds (not
  // timed). In a training step a whole step's traffic (the rank's weights, gradients and
  // activations, and on a shared machine the other processes') separates two optimizer steps,
  // so the state comes from memory. Timed back to back (the state in the last-level cache) the
  // step took 1.0–1.8 ns per parameter while the executor's OPTIM of the tiny GPT (0.83 M
  // parameters, one rank) took 1.8–2.7 ns, all of it in the two kernels (perf: 1.42 ms of AdamW
  // and 0.34 ms of sum of squares per step); after a 64–512 MiB pass the step took 1.8–2.2 ns.
  {
    const size_t n = size_t{1} << 20;
    Tensor param(dev, 1, n), grad(dev, 1, n), m1(dev, 1, n), m2(dev, 1, n);
    dev.fill(param.data(), n, 0.5f);
    dev.fill(grad.data(), n, 1e-3f);
    dev.fill(m1.data(), n, 0.0f);
    dev.fill(m2.data(), n, 0.0f);
    AdamStep step;
    step.lr = 1e-4f;
    step.weight_decay = 0.1f;
    std::vector<float> other(static_cast<size_t>(last_level_cache_bytes() / sizeof(float)), 0.0f);
    std::vector<double> rounds;
    for (int r = 0; r < 7; ++r) {
      for (size_t i = 0; i < other.size(); i += 16) other[i] += 1.0f;
      const double t0 = thread_cpu_s();
      (void)dev.sum_squares(n, grad.data());
      dev.adam_update(n, step, param.data(), grad.data(), m1.data(), m2.data());
      rounds.push_back(thread_cpu_s() - t0);
    }
    p.adam_step_s = median(std::move(rounds)) / static_cast<double>(n);
  }
  moments.close({}, {});

  // Element-wise kernels bound by their arithmetic on the host (scalar exp, trigonometry), not by
  // their bytes: SwiGLU forward and backward over 128 Ki activations (3.2–6.2 ns per element on
  // this machine against 0.45 for GELU's), and the rotary embedding of a GQA layer's queries and
  // keys (4 sequences of 64 tokens, 4 heads of 32 in 2 groups; its table and its copies included).
  {
    const size_t n = size_t{1} << 17;
    Tensor gate(dev, 1, n), up(dev, 1, n), dy(dev, 1, n), out(dev, 1, n), dgate(dev, 1, n);
    for (size_t i = 0; i < n; ++i) {
      gate.data()[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
      up.data()[i] = 0.02f * static_cast<float>(i % 89) - 0.8f;
    }
    dev.fill(dy.data(), n, 0.1f);
    const double per = 1.0 / static_cast<double>(n);
    p.swiglu_s = per * std::max(median_time_per_call([&] { dev.swiglu_forward(n, gate.data(), up.data(), out.data()); }) - p.launch_s, 0.0);
    p.swiglu_backward_s =
        per * std::max(median_time_per_call([&] { dev.swiglu_backward(n, gate.data(), up.data(), dy.data(), dgate.data(), out.data()); }) -
                           p.launch_s,
                       0.0);
    AttentionShape sh = flash_shape(64);
    sh.kv_heads = 2;
    std::vector<int32_t> positions(static_cast<size_t>(sh.seq));
    for (int i = 0; i < sh.seq; ++i) positions[static_cast<size_t>(i)] = i;
    Tensor qkv(dev, static_cast<int64_t>(sh.batch) * sh.seq, sh.qkv_cols());
    dev.fill(qkv.data(), qkv.size(), 0.5f);
    const double rotated = static_cast<double>(sh.batch) * sh.seq * (sh.heads + sh.groups()) * sh.head_dim;
    p.rotary_s =
        std::max(median_time_per_call([&] { dev.rotary(sh, sh.head_dim, 10000.0, positions.data(), false, qkv.data()); }) - p.launch_s,
                 0.0) /
        rotated;
  }
  moments.close({&p.swiglu_s, &p.swiglu_backward_s, &p.rotary_s}, {});

  // Low precision emulated on the host, per element: FP8's cast (scale, round, amax: one call per
  // operand of an FP8 GEMM with a delayed tensorwise scale) and a bf16 GEMM's rounded copy of its
  // operands (timed as a bf16 GEMM less the same fp32 GEMM, on a shape whose operands outweigh
  // its products).
  {
    const int rows = 512, cols = 512;
    Fp8Cast cast{Fp8Recipe::Tensorwise, Fp8Type::E4M3, rows, cols, false, false, 1.0f};
    p.fp8_cast_s = median_time_per_call([&] { dev.fp8_cast(cast, x.data(), y.data()); }) / (rows * cols);
    const int64_t m = 4096, n = 4, k = 256;
    std::vector<double> extra;  // interleaved rounds of both, the median difference
    for (int r = 0; r < 5; ++r) {
      const double fp32_s = 2.0 * m * n * k / gemm_flops(dev, m, n, k, false, 0.01);
      const GemmOperands saved = dev.gemm_operands();
      dev.set_gemm_operands(GemmOperands::BF16);
      const double bf16_s = 2.0 * m * n * k / gemm_flops(dev, m, n, k, false, 0.01);
      dev.set_gemm_operands(saved);
      extra.push_back(bf16_s - fp32_s);
    }
    p.operand_rounding_s = std::max(median(std::move(extra)), 0.0) / static_cast<double>(m * k + k * n);
  }
  moments.close({&p.fp8_cast_s, &p.operand_rounding_s}, {});
}

// Every figure measure_compute takes, in one order on every rank.
std::vector<double*> compute_figures(CpuCalibration& p) {
  std::vector<double*> f;
  for (auto& g : p.gemms) f.push_back(&g.flops_per_s);
  for (auto& e : p.elementwise_curve) f.push_back(&e.second);
  for (double* x : {&p.stream_Bps, &p.elementwise_eff, &p.launch_s, &p.attention_fwd_s[0], &p.attention_fwd_s[1],
                    &p.attention_bwd_s[0], &p.attention_bwd_s[1], &p.adam_step_s, &p.swiglu_s, &p.swiglu_backward_s, &p.rotary_s,
                    &p.fp8_cast_s, &p.operand_rounding_s, &p.context_attention_flops, &p.context_attention_backward_flops})
    f.push_back(x);
  return f;
}

// Replaces every rank's figures by their median over the ranks (collective).
void median_over_ranks(Communicator& world, CpuCalibration& p) {
  const std::vector<double*> mine = compute_figures(p);
  const size_t n = mine.size(), ranks = static_cast<size_t>(world.size()), me = static_cast<size_t>(world.rank());
  std::vector<double> all(n * ranks, 0.0);
  for (size_t i = 0; i < n; ++i) all[me * n + i] = *mine[i];
  world.all_reduce(all.data(), all.size(), ReduceOp::Sum);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> column;
    for (size_t r = 0; r < ranks; ++r) column.push_back(all[r * n + i]);
    *mine[i] = median(std::move(column));
  }
}

// The models fitted to the (median) figures, and what was measured, on rank 0's progress.
void fit_compute(CpuCalibration& p, const Progress& progress) {
  p.peak_flops = 0;
  for (const auto& g : p.gemms) p.peak_flops = std::max(p.peak_flops, g.flops_per_s);
  p.fit = fit_gemm_efficiency(p.gemms, p.peak_flops);
  fit_flash_attention(p);
  if (!progress) return;
  progress(line("calibrate: %zu GEMM shapes (operands evicted by %.0f MiB between calls%s), best %.1f GFLOP/s, fit rms error %.1f%%",
                p.gemms.size(), p.gemm_evict_bytes / (1 << 20), p.gemm_yield ? ", the core yielded before each" : "",
                p.peak_flops / 1e9, 100 * p.fit.rms_log_error));
  progress(line("calibrate: stream %s, element-wise kernels at %.0f%% of it", format_bandwidth(p.stream_Bps).c_str(),
                100 * p.elementwise_eff));
  progress(line("calibrate: element-wise kernels %s at 64 KiB, %s at 4 MiB, %s at 64 MiB",
                format_bandwidth(p.elementwise_curve[1].second).c_str(), format_bandwidth(p.elementwise_curve[4].second).c_str(),
                format_bandwidth(p.elementwise_curve.back().second).c_str()));
  progress(line("calibrate: flash attention ceiling %.2f (forward), %.2f (backward) of the GEMM peak, walks of %.0f / %.0f keys at half",
                p.attention_fwd_max_eff, p.attention_bwd_max_eff, p.attention_fwd_seq_half, p.attention_bwd_seq_half));
  progress(line("calibrate: context-parallel attention blocks %.1f GFLOP/s (forward), %.1f GFLOP/s (backward)",
                p.context_attention_flops / 1e9, p.context_attention_backward_flops / 1e9));
  progress(line("calibrate: optimizer step %.2f ns per parameter (its state from memory)", 1e9 * p.adam_step_s));
  progress(line("calibrate: SwiGLU %.2f ns (forward), %.2f ns (backward) per element, rotary embedding %.2f ns per element",
                1e9 * p.swiglu_s, 1e9 * p.swiglu_backward_s, 1e9 * p.rotary_s));
  progress(line("calibrate: emulated FP8 cast %.2f ns per element, bf16 operand rounding %.2f ns per element", 1e9 * p.fp8_cast_s,
                1e9 * p.operand_rounding_s));
}

void measure_communication(Communicator& world, CpuCalibration& p, const Progress& progress) {
  if (progress) progress(line("calibrate: MPI point-to-point and all-reduce over %d ranks…", world.size()));
  const int rank = world.rank();
  p.ranks = world.size();
  // Ping-pong between ranks 0 and 1.
  std::vector<double> sizes = {8, 1024, 16384, 262144, 1 << 22, 1 << 24};
  std::vector<std::pair<double, double>> pingpong;  // (bytes, one-way seconds)
  for (double bytes : sizes) {
    const size_t count = std::max<size_t>(1, static_cast<size_t>(bytes / 4));
    std::vector<float> buf(count, 1.0f);
    const double round_trip = time_collective(
        world,
        [&] {
          if (rank == 0) {
            world.isend(buf.data(), count, 1, 1)->wait();
            world.irecv(buf.data(), count, 1, 2)->wait();
          } else if (rank == 1) {
            world.irecv(buf.data(), count, 0, 1)->wait();
            world.isend(buf.data(), count, 0, 2)->wait();
          }
        },
        0.1);
    pingpong.emplace_back(bytes, round_trip / 2);
  }
  // On a loaded machine the 8-byte round trip can take as long as the 16 MiB one (a rank waits
  // for a core, not for the wire): the latency is capped at half the largest transfer's time, so
  // the bandwidth stays between one and two times the largest transfer's bytes per second
  // instead of dividing by a difference of noise (it reached 1.7e19 B/s under load).
  const double largest_s = std::max(1e-12, pingpong.back().second);
  p.p2p_latency_s = std::min(pingpong.front().second, largest_s / 2);
  p.p2p_Bps = pingpong.back().first / (largest_s - p.p2p_latency_s);
  // All-reduce over every rank (bus bandwidth as nccl-tests reports it).
  const double n = p.ranks;
  // Twice, in the two modes of the executor's waits: polling first (a core per rank: the
  // intra-node curve) and sleeping (more ranks than cores: the oversubscribed curve, and how late
  // a sleeping rank wakes up).
  const bool mode = set_mpi_poll_first(true);
  for (bool sleeping : {false, true}) {
    set_mpi_poll_first(!sleeping);
    auto& curve = sleeping ? p.allreduce_busbw_sleeping : p.allreduce_busbw;
    for (double bytes : {4096.0, 65536.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0}) {
      std::vector<float> buf(static_cast<size_t>(bytes / 4), 1.0f);
      const double s = time_collective(world, [&] { world.all_reduce(buf.data(), buf.size(), ReduceOp::Sum); }, 0.15);
      curve.emplace_back(bytes, 2 * (n - 1) / n * bytes / s);
    }
    float one = 1;
    const double small_s = time_collective(world, [&] { world.all_reduce(&one, 1, ReduceOp::Sum); }, 0.05);
    if (!sleeping) {
      p.allreduce_small_s = small_s;
      continue;
    }
    p.allreduce_small_sleeping_s = small_s;
    // The wake-up: rank 0 joins a one-value all-reduce 1 ms late; rank 1 waits for it, sleeping.
    // The ranks share this host's monotonic clock, so rank 1's wake-up is when it got the result
    // minus when rank 0 posted its part, minus the all-reduce itself (median of 100).
    std::vector<double> late;
    auto now_s = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
    for (int i = 0; i < 100; ++i) {
      world.barrier();
      double posted = 0;
      if (rank == 0) {
        const double until = now_s() + 1e-3;
        while (now_s() < until) {
        }
        posted = now_s();
      }
      world.all_reduce(&one, 1, ReduceOp::Sum);
      const double done = now_s();
      world.all_reduce(&posted, 1, ReduceOp::Max);
      late.push_back(done - posted - small_s);
    }
    std::nth_element(late.begin(), late.begin() + 50, late.end());
    double wake = rank == 1 ? std::max(0.0, late[50]) : 0.0;
    world.all_reduce(&wake, 1, ReduceOp::Max);
    p.wakeup_s = wake;
  }
  set_mpi_poll_first(mode);
  if (progress)
    progress(line("calibrate: p2p %s, latency %s; all-reduce over %d ranks %s at 64 MiB; a sleeping rank wakes %s late",
                 format_bandwidth(p.p2p_Bps).c_str(), format_time(p.p2p_latency_s).c_str(), p.ranks,
                 format_bandwidth(p.allreduce_busbw.back().second).c_str(), format_time(p.wakeup_s).c_str()));
}

}  // namespace

CpuCalibration calibrate_cpu(Communicator& world, const std::function<void(const std::string&)>& progress_all,
                             const std::vector<std::array<int64_t, 3>>& gemm_shapes, double gemm_evict_bytes) {
  const bool rank0 = world.rank() == 0;
  const Progress progress = rank0 ? progress_all : Progress{};
  CpuCalibration p;
  p.gemm_evict_bytes = std::max(0.0, gemm_evict_bytes);
  auto dev = make_cpu_device();
  // Every rank times the same kernels at once, as the executor's ranks compute side by side: a
  // rank's CPU time per kernel depends on what the other ranks run on the shared cores and caches
  // (timed on rank 0 while rank 1 polled in a barrier, SwiGLU read 3.48–9.36 ns per element
  // across five calibrations). The median over ranks.
  if (progress)
    progress(line("calibrate: timing the executor's kernels on all %d rank(s) at once (%s, median of rounds and ranks)…", world.size(),
                  gemm_shapes.empty() ? "GEMMs m, n 16 … 1024, k 8 … 512" : (std::to_string(gemm_shapes.size()) + " GEMM shapes given").c_str()));
  world.barrier();
  p.gemm_yield = p.gemm_evict_bytes > 0 && world.size() > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The speed probe before the kernels and after each round of GEMMs and each group of other
  // kernels, every group's figures set to the speed of the first sample (ProbedMoments). Timed
  // only before and after the kernels (their mean), a calibration whose load changed between its
  // ends set the profile against a probe of neither moment: one suite's two-rank rows read 3-17 %
  // under, with probe ratios of 0.91-1.22 (docs/ACCURACY.md, session 39).
  ProbedMoments moments{[&] { return time_speed_probe(world, *dev).gemm_s; }, {}};
  moments.samples.push_back(moments.probe());
  measure_compute(*dev, p, gemm_shapes, p.gemm_yield, moments);
  const auto [fastest, slowest] = std::minmax_element(moments.samples.begin(), moments.samples.end());
  const double lo = *fastest, hi = *slowest;
  p.probe.gemm_s = moments.samples.front();
  median_over_ranks(world, p);
  fit_compute(p, progress);
  if (progress)
    progress(line("calibrate: speed probe (a GEMM) %.1f us; each of %zu groups of kernels set to that speed by the probe "
                  "around it (%zu samples, %.1f … %.1f us, median %.1f)",
                  1e6 * p.probe.gemm_s, moments.samples.size() - 1, moments.samples.size(), 1e6 * lo, 1e6 * hi,
                  1e6 * median(moments.samples)));
  // Together: every rank runs the same GEMM at once; the slowdown tells how many cores the
  // ranks really have.
  {
    if (progress) progress(line("calibrate: %d ranks computing at once…", world.size()));
    // Wall clock: sharing cores slows the wall clock, not the CPU seconds.
    const double alone = rank0 ? gemm_flops(*dev, 512, 512, 512, true) : 0.0;
    world.barrier();
    double together = gemm_flops(*dev, 512, 512, 512, true);
    world.all_reduce(&together, 1, ReduceOp::Sum);
    if (rank0) {
      p.concurrent_gemm_share = together / world.size() / alone;
      p.cores = std::clamp(together / alone, 1.0, static_cast<double>(world.size()));
      if (progress)
        progress(line("calibrate: %d ranks computing at once reach %.0f%% of one rank's speed each → %.2f cores", world.size(),
                      100 * p.concurrent_gemm_share, p.cores));
    }
  }
  if (world.size() > 1) {
    measure_communication(world, p, progress);
  } else {
    p.cores = std::max(1u, std::thread::hardware_concurrency());  // not measured with one rank
    if (progress) progress("calibrate: one rank: no communication measured (run under mpirun -np 2 for that)");
  }
  return p;
}

// The measured figures as a topology: every rank is a device of one node sharing its cores.
ClusterSpec cpu_profile(const CpuCalibration& p) {
  ClusterSpec c;
  c.name = "local-cpu";
  c.gpu.name = "cpu-rank";
  c.gpu.memory_bytes = 8e9;
  c.gpu.peak_flops = p.peak_flops;
  c.gpu.hbm_Bps = p.stream_Bps;
  c.gpu.gemm_max_efficiency = p.fit.max_efficiency;
  c.gpu.gemm_half_dim = p.fit.half_dim;
  c.gpu.gemm_half_k = p.fit.half_k;
  c.gpu.gemm_thin_exponent = p.fit.thin_exponent;
  c.gpu.elementwise_efficiency = p.elementwise_eff;
  c.gpu.kernel_launch_s = p.launch_s;
  for (const auto& g : p.gemms) c.gpu.gemm_rates.push_back({g.m, g.n, g.k, g.flops_per_s});
  c.gpu.elementwise_bandwidth = p.elementwise_curve;
  c.gpu.fp8_cast_s = p.fp8_cast_s;
  c.gpu.adam_step_s = p.adam_step_s;
  c.gpu.context_attention_flops = p.context_attention_flops;
  c.gpu.context_attention_backward_flops = p.context_attention_backward_flops;
  c.gpu.swiglu_s = p.swiglu_s;
  c.gpu.swiglu_backward_s = p.swiglu_backward_s;
  c.gpu.rotary_s = p.rotary_s;
  c.gpu.attention_fwd_max_efficiency = p.attention_fwd_max_eff;
  c.gpu.attention_bwd_max_efficiency = p.attention_bwd_max_eff;
  c.gpu.attention_fwd_seq_half = p.attention_fwd_seq_half;
  c.gpu.attention_bwd_seq_half = p.attention_bwd_seq_half;
  c.gpu.operand_rounding_s = p.operand_rounding_s;
  c.gpu.speed_probe_gemm_s = p.probe.gemm_s;
  c.gpu.iteration_overhead_s = 0;
  c.gpus_per_node = 64;
  c.cores_per_node = p.cores;
  c.wakeup_latency_s = p.wakeup_s;
  c.nvlink = LinkSpec{p.p2p_Bps > 0 ? p.p2p_Bps : 1e9, p.p2p_latency_s};
  c.nic = c.nvlink;
  c.nics_per_node = 1;
  c.fabric.levels = 1;
  c.fabric.leaf_radix = 64;
  c.fabric.switch_latency_s = 0;
  c.intra_node_allreduce.points = p.allreduce_busbw;
  c.intra_node_allreduce.small_message_s = p.allreduce_small_s;
  c.oversubscribed_allreduce.points = p.allreduce_busbw_sleeping;
  c.oversubscribed_allreduce.small_message_s = p.allreduce_small_sleeping_s;
  c.intra_node_reference_gpus = p.ranks;
  c.measured_on = CalibrationLinks{c.nvlink, c.nic, c.pcie, c.fabric.switch_latency_s, true};
  validate_cluster(c);
  return c;
}

std::string cpu_profile_yaml(const CpuCalibration& p) {
  return to_yaml(cpu_profile(p), "Measured by `ptdp calibrate --backend cpu` with " + std::to_string(p.ranks) +
                                          " MPI rank(s) on this host, the kernels on every rank at once, the GEMMs with their operands evicted by " +
                                          std::to_string(static_cast<long long>(p.gemm_evict_bytes / (1 << 20))) +
                                          " MiB of other traffic between calls.\nEvery rank is a device of one node; node.cores is "
                                          "how many ranks compute at full speed at once.");
}


}  // namespace ptdp::exec
