// Every Device call of the cuda device against the cpu device on random inputs (ctest label
// `gpu`; skipped without a GPU). Tolerances: fp32 GEMMs (no down-conversion) 1e-5 relative plus
// 1e-4 absolute on O(1)–O(10) values; element-wise kernels 1e-5 relative (CUDA's and glibc's
// tanhf/expf differ in the last bits); reductions 1e-5 relative; bf16 GEMMs a bound derived
// from bf16's 8-bit mantissa: 2·2⁻⁸·Σ|a||b| per element. The embedding gradient adds in the
// CPU's order and must match bit for bit.
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "tests/exec/cuda/gpu_vs_cpu.hpp"

namespace ptdp::exec::test {
namespace {

using Kernels = GpuVsCpu;

TEST_F(Kernels, GemmInEveryTranspositionWithStridesAndBeta) {
  const int m = 37, n = 29, k = 70, pad = 3;
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Trans tb : {Trans::No, Trans::Yes})
      for (float beta : {0.0f, 0.5f}) {
        const int a_rows = ta == Trans::No ? m : k, a_cols = (ta == Trans::No ? k : m) + pad;
        const int b_rows = tb == Trans::No ? k : n, b_cols = (tb == Trans::No ? n : k) + pad;
        const int ldc = n + pad;
        Mirrored a(gpu(), cpu(), static_cast<size_t>(a_rows) * a_cols, 1);
        Mirrored b(gpu(), cpu(), static_cast<size_t>(b_rows) * b_cols, 2);
        Mirrored c(gpu(), cpu(), static_cast<size_t>(m) * ldc, 3);
        for (Device* d : {&gpu(), &cpu()}) {
          const bool g = d == &gpu();
          d->gemm(ta, tb, m, n, k, 0.75f, (g ? a.gpu : a.cpu).data(), a_cols, (g ? b.gpu : b.cpu).data(), b_cols, beta,
                  (g ? c.gpu : c.cpu).data(), ldc);
        }
        compare(c, 1e-5, 1e-4,
                std::string("gemm ") + (ta == Trans::Yes ? "T" : "N") + (tb == Trans::Yes ? "T" : "N") + " beta " +
                    std::to_string(beta));
      }
}

TEST_F(Kernels, GemmWithEmptyInnerDimensionScalesC) {
  Mirrored c(gpu(), cpu(), 6 * 5, 4);
  Mirrored a(gpu(), cpu(), 1, 5), b(gpu(), cpu(), 1, 6);
  gpu().gemm(Trans::No, Trans::No, 6, 5, 0, 1.0f, a.gpu.data(), 1, b.gpu.data(), 5, 0.25f, c.gpu.data(), 5);
  cpu().gemm(Trans::No, Trans::No, 6, 5, 0, 1.0f, a.cpu.data(), 1, b.cpu.data(), 5, 0.25f, c.cpu.data(), 5);
  compare(c, 0, 0, "gemm with k = 0");
}

TEST_F(Kernels, Bf16TensorCoreGemmStaysWithinTheBf16RoundingBound) {
  cuda::CudaDeviceOptions o;
  o.precision = Precision::BF16;
  auto bf16 = cuda::make_cuda_device(o);
  const int m = 128, n = 96, k = 256;
  const auto av = random_values(static_cast<size_t>(m) * k, 7), bv = random_values(static_cast<size_t>(k) * n, 8);
  Tensor a(*bf16, m, k), b(*bf16, k, n), c(*bf16, m, n);
  bf16->upload(av.data(), a.data(), av.size());
  bf16->upload(bv.data(), b.data(), bv.size());
  bf16->gemm(Trans::No, Trans::No, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  std::vector<float> got(c.size());
  bf16->download(c.data(), got.data(), got.size());
  double worst = 0;
  bool rounded = false;  // bf16 inputs must actually change the result (tensor cores were used)
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double exact = 0, magnitude = 0;
      for (int q = 0; q < k; ++q) {
        exact += static_cast<double>(av[i * k + q]) * bv[q * n + j];
        magnitude += std::fabs(static_cast<double>(av[i * k + q]) * bv[q * n + j]);
      }
      const double err = std::fabs(got[i * n + j] - exact);
      worst = std::max(worst, err / (2 * std::ldexp(1.0, -8) * magnitude));
      rounded = rounded || err > 1e-6 * magnitude;
    }
  EXPECT_LE(worst, 1.0) << "bf16 GEMM error above 2·2⁻⁸·Σ|a||b|";
  EXPECT_TRUE(rounded) << "bf16 precision gave fp32-exact results: were the operands really rounded to bf16?";
}

TEST_F(Kernels, VectorOperations) {
  const size_t n = 100003;
  Mirrored x(gpu(), cpu(), n, 11), y(gpu(), cpu(), n, 12);
  gpu().axpy(n, -1.5f, x.gpu.data(), y.gpu.data());
  cpu().axpy(n, -1.5f, x.cpu.data(), y.cpu.data());
  compare(y, 1e-6, 1e-6, "axpy");
  gpu().scale(n, 0.3f, y.gpu.data());
  cpu().scale(n, 0.3f, y.cpu.data());
  compare(y, 1e-6, 1e-6, "scale");
  EXPECT_NEAR(gpu().sum_squares(n, y.gpu.data()), cpu().sum_squares(n, y.cpu.data()),
              1e-6 * cpu().sum_squares(n, y.cpu.data()));
  EXPECT_EQ(gpu().sum_squares(n, y.gpu.data()), gpu().sum_squares(n, y.gpu.data())) << "sum_squares is not deterministic";
  gpu().fill(x.gpu.data() + 10, 100, 2.5f);
  cpu().fill(x.cpu.data() + 10, 100, 2.5f);
  compare(x, 0, 0, "fill");
  gpu().copy(y.gpu.data(), x.gpu.data(), 5000);
  cpu().copy(y.cpu.data(), x.cpu.data(), 5000);
  compare(x, 0, 0, "copy");
  gpu().copy(x.gpu.data(), x.gpu.data() + 7, 3000);  // overlapping: memmove semantics
  cpu().copy(x.cpu.data(), x.cpu.data() + 7, 3000);
  compare(x, 0, 0, "overlapping copy");
}

TEST_F(Kernels, BiasAndBiasGradient) {
  const int rows = 300, cols = 70;  // rows span several reduction chunks
  Mirrored y(gpu(), cpu(), static_cast<size_t>(rows) * cols, 21), bias(gpu(), cpu(), cols, 22);
  gpu().add_bias(rows, cols, bias.gpu.data(), y.gpu.data());
  cpu().add_bias(rows, cols, bias.cpu.data(), y.cpu.data());
  compare(y, 0, 0, "add_bias");
  Mirrored db(gpu(), cpu(), cols, 23);  // accumulated onto existing values
  gpu().add_bias_grad(rows, cols, y.gpu.data(), db.gpu.data());
  cpu().add_bias_grad(rows, cols, y.cpu.data(), db.cpu.data());
  compare(db, 1e-5, 1e-4, "add_bias_grad");
  // The same accumulation onto the same values gives the same bits (fixed reduction order).
  Mirrored again(gpu(), cpu(), db.from_gpu(gpu()));
  gpu().add_bias_grad(rows, cols, y.gpu.data(), db.gpu.data());
  gpu().add_bias_grad(rows, cols, y.gpu.data(), again.gpu.data());
  EXPECT_EQ(db.from_gpu(gpu()), again.from_gpu(gpu())) << "add_bias_grad is not deterministic";
}

TEST_F(Kernels, LayerNormForwardAndBackward) {
  const int rows = 130, cols = 300;
  Mirrored x(gpu(), cpu(), static_cast<size_t>(rows) * cols, 31, 2.0f, 0.7f);
  Mirrored gamma(gpu(), cpu(), cols, 32, 0.2f, 1.0f), beta(gpu(), cpu(), cols, 33, 0.1f);
  Mirrored y(gpu(), cpu(), static_cast<size_t>(rows) * cols, 34), mean(gpu(), cpu(), rows, 35), rstd(gpu(), cpu(), rows, 36);
  gpu().layer_norm_forward(rows, cols, 1e-5f, x.gpu.data(), gamma.gpu.data(), beta.gpu.data(), y.gpu.data(),
                           mean.gpu.data(), rstd.gpu.data());
  cpu().layer_norm_forward(rows, cols, 1e-5f, x.cpu.data(), gamma.cpu.data(), beta.cpu.data(), y.cpu.data(),
                           mean.cpu.data(), rstd.cpu.data());
  compare(y, 1e-5, 1e-5, "layer_norm_forward y");
  compare(mean, 1e-5, 1e-6, "layer_norm_forward mean");
  compare(rstd, 1e-5, 0, "layer_norm_forward rstd");

  Mirrored dy(gpu(), cpu(), static_cast<size_t>(rows) * cols, 37), dx(gpu(), cpu(), static_cast<size_t>(rows) * cols, 38);
  Mirrored dgamma(gpu(), cpu(), cols, 39), dbeta(gpu(), cpu(), cols, 40);
  for (bool params : {true, false}) {
    gpu().layer_norm_backward(rows, cols, dy.gpu.data(), x.gpu.data(), gamma.gpu.data(), mean.gpu.data(),
                              rstd.gpu.data(), dx.gpu.data(), params ? dgamma.gpu.data() : nullptr,
                              params ? dbeta.gpu.data() : nullptr);
    cpu().layer_norm_backward(rows, cols, dy.cpu.data(), x.cpu.data(), gamma.cpu.data(), mean.cpu.data(),
                              rstd.cpu.data(), dx.cpu.data(), params ? dgamma.cpu.data() : nullptr,
                              params ? dbeta.cpu.data() : nullptr);
    compare(dx, 1e-4, 1e-5, "layer_norm_backward dx");
  }
  compare(dgamma, 1e-4, 1e-4, "layer_norm_backward dgamma");
  compare(dbeta, 1e-5, 1e-4, "layer_norm_backward dbeta");
}

TEST_F(Kernels, GeluForwardAndBackward) {
  const size_t n = 50000;
  Mirrored x(gpu(), cpu(), n, 41, 3.0f), y(gpu(), cpu(), n, 42), dy(gpu(), cpu(), n, 43);
  gpu().gelu_forward(n, x.gpu.data(), y.gpu.data());
  cpu().gelu_forward(n, x.cpu.data(), y.cpu.data());
  compare(y, 1e-5, 1e-6, "gelu_forward");
  gpu().gelu_backward(n, x.gpu.data(), dy.gpu.data(), dy.gpu.data());  // in place, as layers.cpp calls it
  cpu().gelu_backward(n, x.cpu.data(), dy.cpu.data(), dy.cpu.data());
  compare(dy, 1e-5, 1e-6, "gelu_backward");
}

void attention_case(Device& g, Device& c, const AttentionShape& sh, bool keep_probs, double rel, double abs,
                    const std::string& what) {
  const size_t tokens = static_cast<size_t>(sh.batch) * sh.seq;
  Mirrored qkv(g, c, tokens * sh.qkv_cols(), 51);
  Mirrored probs(g, c, sh.probs_count(), 52), ctx(g, c, tokens * sh.heads * sh.head_dim, 53);
  Mirrored dctx(g, c, tokens * sh.heads * sh.head_dim, 54), dqkv(g, c, tokens * sh.qkv_cols(), 55);
  g.attention_forward(sh, qkv.gpu.data(), keep_probs ? probs.gpu.data() : nullptr, ctx.gpu.data());
  c.attention_forward(sh, qkv.cpu.data(), keep_probs ? probs.cpu.data() : nullptr, ctx.cpu.data());
  expect_close(ctx.from_gpu(g), ctx.from_cpu(c), rel, abs, what + ": attention_forward ctx");
  if (keep_probs) expect_close(probs.from_gpu(g), probs.from_cpu(c), rel, abs, what + ": attention_forward probs");
  g.attention_backward(sh, qkv.gpu.data(), keep_probs ? probs.gpu.data() : nullptr, dctx.gpu.data(), dqkv.gpu.data());
  c.attention_backward(sh, qkv.cpu.data(), keep_probs ? probs.cpu.data() : nullptr, dctx.cpu.data(), dqkv.cpu.data());
  expect_close(dqkv.from_gpu(g), dqkv.from_cpu(c), rel, abs, what + ": attention_backward dqkv");
}

TEST_F(Kernels, CausalAttentionWithAndWithoutKeptProbabilities) {
  const AttentionShape sh{2, 37, 3, 16};  // seq not a multiple of 32
  attention_case(gpu(), cpu(), sh, true, 1e-4, 1e-5, "fp32, probabilities kept");
  attention_case(gpu(), cpu(), sh, false, 1e-4, 1e-5, "fp32, selective recompute");
}

TEST_F(Kernels, GroupedQueryAttention) {
  // 6 query heads in 2 key/value groups (3 per group) and multi-query attention (1 group).
  for (int groups : {2, 1}) {
    const AttentionShape sh{2, 37, 6, 16, groups};
    const std::string what = "fp32, " + std::to_string(groups) + " key/value group(s)";
    attention_case(gpu(), cpu(), sh, true, 1e-4, 1e-5, what + ", probabilities kept");
    attention_case(gpu(), cpu(), sh, false, 1e-4, 1e-5, what + ", selective recompute");
  }
}

TEST_F(Kernels, RmsNormForwardAndBackward) {
  const int rows = 130, cols = 300;
  Mirrored x(gpu(), cpu(), static_cast<size_t>(rows) * cols, 61, 2.0f, 0.7f), gamma(gpu(), cpu(), cols, 62, 0.2f, 1.0f);
  Mirrored y(gpu(), cpu(), static_cast<size_t>(rows) * cols, 63), rstd(gpu(), cpu(), rows, 64);
  gpu().rms_norm_forward(rows, cols, 1e-5f, x.gpu.data(), gamma.gpu.data(), y.gpu.data(), rstd.gpu.data());
  cpu().rms_norm_forward(rows, cols, 1e-5f, x.cpu.data(), gamma.cpu.data(), y.cpu.data(), rstd.cpu.data());
  compare(y, 1e-5, 1e-5, "rms_norm_forward y");
  compare(rstd, 1e-5, 0, "rms_norm_forward rstd");
  Mirrored dy(gpu(), cpu(), static_cast<size_t>(rows) * cols, 65), dx(gpu(), cpu(), static_cast<size_t>(rows) * cols, 66);
  Mirrored dgamma(gpu(), cpu(), cols, 67);
  for (bool params : {true, false}) {
    gpu().rms_norm_backward(rows, cols, dy.gpu.data(), x.gpu.data(), gamma.gpu.data(), rstd.gpu.data(), dx.gpu.data(),
                            params ? dgamma.gpu.data() : nullptr);
    cpu().rms_norm_backward(rows, cols, dy.cpu.data(), x.cpu.data(), gamma.cpu.data(), rstd.cpu.data(), dx.cpu.data(),
                            params ? dgamma.cpu.data() : nullptr);
    compare(dx, 1e-4, 1e-5, "rms_norm_backward dx");
  }
  compare(dgamma, 1e-4, 1e-4, "rms_norm_backward dgamma");
}

TEST_F(Kernels, SwigluForwardAndBackward) {
  const size_t n = 50000;
  Mirrored gate(gpu(), cpu(), n, 71, 3.0f), up(gpu(), cpu(), n, 72), y(gpu(), cpu(), n, 73), dy(gpu(), cpu(), n, 74);
  Mirrored dgate(gpu(), cpu(), n, 75);
  gpu().swiglu_forward(n, gate.gpu.data(), up.gpu.data(), y.gpu.data());
  cpu().swiglu_forward(n, gate.cpu.data(), up.cpu.data(), y.cpu.data());
  compare(y, 1e-5, 1e-6, "swiglu_forward");
  // dup in place of dy, as layers.cpp calls it.
  gpu().swiglu_backward(n, gate.gpu.data(), up.gpu.data(), dy.gpu.data(), dgate.gpu.data(), dy.gpu.data());
  cpu().swiglu_backward(n, gate.cpu.data(), up.cpu.data(), dy.cpu.data(), dgate.cpu.data(), dy.cpu.data());
  compare(dgate, 1e-5, 1e-6, "swiglu_backward dgate");
  compare(dy, 1e-5, 1e-6, "swiglu_backward dup");
}

TEST_F(Kernels, CausalAttentionInBf16) {
  cuda::CudaDeviceOptions o;
  o.precision = Precision::BF16;
  auto bf16 = cuda::make_cuda_device(o);
  // Scores of N(0, 1) inputs with head_dim 32 are O(1); bf16 operands give ~1% relative error.
  attention_case(*bf16, cpu(), AttentionShape{1, 64, 2, 32}, true, 3e-2, 3e-2, "bf16");
}

TEST_F(Kernels, VocabParallelEmbeddingMatchesBitForBit) {
  const int count = 200, rows = 50, cols = 40;
  const int64_t first_row = 100;
  std::vector<int32_t> tokens(count);
  std::mt19937 rng(61);
  for (int32_t& t : tokens) t = static_cast<int32_t>(80 + rng() % 90);  // in and out of [100, 150), repeats
  Mirrored table(gpu(), cpu(), static_cast<size_t>(rows) * cols, 62), out(gpu(), cpu(), static_cast<size_t>(count) * cols, 63);
  gpu().embedding_forward(count, tokens.data(), first_row, rows, cols, table.gpu.data(), out.gpu.data());
  cpu().embedding_forward(count, tokens.data(), first_row, rows, cols, table.cpu.data(), out.cpu.data());
  compare(out, 0, 0, "embedding_forward");
  Mirrored dtable(gpu(), cpu(), static_cast<size_t>(rows) * cols, 64);  // accumulated onto
  gpu().embedding_backward(count, tokens.data(), first_row, rows, cols, out.gpu.data(), dtable.gpu.data());
  cpu().embedding_backward(count, tokens.data(), first_row, rows, cols, out.cpu.data(), dtable.cpu.data());
  compare(dtable, 0, 0, "embedding_backward (same order of additions as the CPU)");
}

TEST_F(Kernels, VocabParallelCrossEntropyPieces) {
  const int rows = 70, cols = 160, valid = 150;  // the last 10 columns are vocabulary padding
  const int64_t first_col = 1000;
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>(first_col - 20 + (r * 37) % 190);  // some outside
  Mirrored logits(gpu(), cpu(), static_cast<size_t>(rows) * cols, 71, 3.0f);
  Mirrored row_max(gpu(), cpu(), rows, 72), stats(gpu(), cpu(), 2 * rows, 73), loss(gpu(), cpu(), rows, 74);
  gpu().logits_row_max(rows, cols, valid, logits.gpu.data(), row_max.gpu.data());
  cpu().logits_row_max(rows, cols, valid, logits.cpu.data(), row_max.cpu.data());
  compare(row_max, 0, 0, "logits_row_max");
  gpu().softmax_numerators(rows, cols, valid, row_max.gpu.data(), targets.data(), first_col, logits.gpu.data(), stats.gpu.data());
  cpu().softmax_numerators(rows, cols, valid, row_max.cpu.data(), targets.data(), first_col, logits.cpu.data(), stats.cpu.data());
  compare(logits, 1e-5, 1e-7, "softmax_numerators numerators");
  compare(stats, 1e-5, 1e-6, "softmax_numerators stats");
  gpu().cross_entropy_finish(rows, cols, stats.gpu.data(), logits.gpu.data(), loss.gpu.data());
  cpu().cross_entropy_finish(rows, cols, stats.cpu.data(), logits.cpu.data(), loss.cpu.data());
  compare(logits, 1e-5, 1e-7, "cross_entropy_finish probs");
  compare(loss, 1e-5, 1e-5, "cross_entropy_finish loss");
  gpu().cross_entropy_backward(rows, cols, targets.data(), first_col, 0.01f, logits.gpu.data(), logits.gpu.data());
  cpu().cross_entropy_backward(rows, cols, targets.data(), first_col, 0.01f, logits.cpu.data(), logits.cpu.data());
  compare(logits, 1e-5, 1e-9, "cross_entropy_backward");

  Mirrored none(gpu(), cpu(), 4, 75);  // a shard without valid columns: max −inf
  gpu().logits_row_max(2, 2, 0, none.gpu.data(), row_max.gpu.data());
  std::vector<float> m(2);
  gpu().download(row_max.gpu.data(), m.data(), 2);
  EXPECT_EQ(m[0], -std::numeric_limits<float>::infinity());
}

TEST_F(Kernels, AdamWStep) {
  const size_t n = 10007;
  Mirrored p(gpu(), cpu(), n, 81), g(gpu(), cpu(), n, 82), m(gpu(), cpu(), n, 83, 0.01f);
  Mirrored v(gpu(), cpu(), std::vector<float>(n, 0.0f));
  AdamStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.01f;
  s.bias_correction1 = 0.1f;
  s.bias_correction2 = 0.05f;
  s.grad_scale = 0.7f;
  for (int step = 0; step < 3; ++step) {
    gpu().adam_update(n, s, p.gpu.data(), g.gpu.data(), m.gpu.data(), v.gpu.data());
    cpu().adam_update(n, s, p.cpu.data(), g.cpu.data(), m.cpu.data(), v.cpu.data());
  }
  compare(p, 1e-6, 1e-7, "adam param");
  compare(m, 1e-6, 1e-9, "adam m");
  compare(v, 1e-6, 1e-12, "adam v");
}

TEST_F(Kernels, OverflowCheckFindsOneBadElement) {
  const size_t n = 1 << 20;
  Tensor a = Tensor::zeros(gpu(), static_cast<int64_t>(n), 1);
  EXPECT_FALSE(cuda::any_inf_or_nan(gpu(), {{a.data(), n}}));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  gpu().upload(&nan, a.data() + n - 1, 1);
  EXPECT_TRUE(cuda::any_inf_or_nan(gpu(), {{a.data(), n}}));
  gpu().fill(a.data(), n, 0.0f);
  gpu().upload(&inf, a.data() + 12345, 1);
  EXPECT_TRUE(cuda::any_inf_or_nan(gpu(), {{a.data(), 100}, {a.data() + 12000, 1000}}));
  EXPECT_FALSE(cuda::any_inf_or_nan(gpu(), {{a.data(), 12345}}));
}

TEST_F(Kernels, EventTimerMarksFollowTheDeviceWork) {
  auto timer = cuda::make_device_timer(gpu());
  const size_t n = size_t{1} << 26;  // 256 MiB: a fill that takes measurable time
  Tensor big(gpu(), static_cast<int64_t>(n), 1);
  timer->begin(50.0);
  timer->mark();
  gpu().fill(big.data(), n, 1.0f);
  timer->mark();
  const auto t = timer->resolve();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_GE(t[0], 50.0);
  EXPECT_GT(t[1], t[0]);
  EXPECT_LT(t[1], 60.0);
}

TEST(CudaMemory, OutOfMemorySaysWhichBufferHowBigAndThePlanEstimate) {
  PTDP_REQUIRE_GPU();
  cuda::CudaDeviceOptions o;
  o.plan_memory_bytes = 61.5 * 1073741824.0;
  auto gpu = cuda::make_cuda_device(o);
  cuda::MemoryLabel label("stage 3 activations");
  try {
    Tensor t(*gpu, int64_t{1} << 40, 8);  // 32 TiB
    FAIL() << "a 32 TiB allocation succeeded";
  } catch (const EnvironmentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of GPU memory"), std::string::npos) << m;
    EXPECT_NE(m.find("stage 3 activations"), std::string::npos) << m;
    EXPECT_NE(m.find("32768.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("the plan's memory estimate was 61.50 GiB per GPU"), std::string::npos) << m;
  }
  Tensor fine(*gpu, 1024, 1024);  // the device stays usable
  gpu->fill(fine.data(), fine.size(), 1.0f);
  EXPECT_DOUBLE_EQ(gpu->sum_squares(fine.size(), fine.data()), 1024.0 * 1024.0);
}

}  // namespace
}  // namespace ptdp::exec::test
