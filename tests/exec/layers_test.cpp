// The executor's math on the CPU device: each kernel and block against finite differences or a
// direct reference, the split (I/W) backward against the fused one, and sharded initialisation
// against the serial model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/fp8.hpp"
#include "exec/model/gpt.hpp"
#include "exec/model/layers.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"

namespace ptdp::exec {
namespace {

// The CPU device's memory is host memory, so the tests read and write tensors directly.
struct Env {
  std::unique_ptr<Device> dev = make_cpu_device();
  std::unique_ptr<Communicator> tp = make_self_communicator("tensor-parallel group");
  LayerContext ctx{*dev, *tp, {}, {}};
  std::mt19937 rng{12345};

  Tensor random(int64_t rows, int64_t cols, float scale = 1.0f, float shift = 0.0f) {
    Tensor t(*dev, rows, cols);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (size_t i = 0; i < t.size(); ++i) t.data()[i] = shift + scale * n(rng);
    return t;
  }
  Tensor zeros(int64_t rows, int64_t cols) { return Tensor::zeros(*dev, rows, cols); }
};

double dot(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic[i] against the central difference of f with respect to x[i] for `samples`
// random coordinates (all when fewer). Tolerance relative to the tensor's largest gradient.
void check_gradient(const char* what, float* x, const float* analytic, size_t n, const std::function<double()>& f,
                    std::mt19937& rng, int samples = 24, float step = 1e-2f, double tol = 2e-2) {
  double scale = 1e-3;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::fabs(analytic[i])));
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  if (idx.size() > static_cast<size_t>(samples)) idx.resize(samples);
  for (size_t i : idx) {
    const float keep = x[i];
    x[i] = keep + step;
    const double up = f();
    x[i] = keep - step;
    const double down = f();
    x[i] = keep;
    const double numeric = (up - down) / (2.0 * step);
    EXPECT_NEAR(analytic[i], numeric, tol * scale) << what << "[" << i << "]";
  }
}

TEST(CpuDevice, GemmMatchesNaiveProductForEveryTransposeAndStride) {
  Env e;
  const int m = 7, n = 5, k = 9, pad = 3;
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Trans tb : {Trans::No, Trans::Yes}) {
      const int ar = ta == Trans::No ? m : k, ac = ta == Trans::No ? k : m;
      const int br = tb == Trans::No ? k : n, bc = tb == Trans::No ? n : k;
      Tensor a = e.random(ar, ac + pad), b = e.random(br, bc + pad), c = e.random(m, n + pad);
      std::vector<float> c0(c.data(), c.data() + c.size());
      e.dev->gemm(ta, tb, m, n, k, 0.5f, a.data(), ac + pad, b.data(), bc + pad, 2.0f, c.data(), n + pad);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double ref = 2.0 * c0[i * (n + pad) + j];
          for (int l = 0; l < k; ++l) {
            const float av = ta == Trans::No ? a.data()[i * (ac + pad) + l] : a.data()[l * (ac + pad) + i];
            const float bv = tb == Trans::No ? b.data()[l * (bc + pad) + j] : b.data()[j * (bc + pad) + l];
            ref += 0.5 * av * bv;
          }
          EXPECT_NEAR(c.data()[i * (n + pad) + j], ref, 1e-4) << "trans " << int(ta) << int(tb);
        }
      for (int i = 0; i < m; ++i)  // the padding columns of C are untouched
        for (int j = n; j < n + pad; ++j) EXPECT_EQ(c.data()[i * (n + pad) + j], c0[i * (n + pad) + j]);
    }
}

TEST(CpuDevice, TensorsWhoseRowsFollowTheRoutingReuseAFewCachedBlocks) {
  // The experts' tensors follow the routing: a rank receives 244 rows in one microbatch, 252 in
  // the next. The second must reuse the block the first released, while the device counts the
  // floats asked for.
  Env e;
  const float* first = nullptr;
  {
    Tensor a(*e.dev, 244, 256);
    first = a.data();
    EXPECT_EQ(e.dev->bytes_in_use(), 244u * 256 * sizeof(float));
  }
  EXPECT_EQ(e.dev->bytes_in_use(), 0u);
  {
    Tensor b(*e.dev, 252, 256);
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(e.dev->peak_bytes(), 252u * 256 * sizeof(float));
    b.data()[b.size() - 1] = 1.0f;  // the whole tensor is writable
  }
  // A hundred microbatches of 200-300 rows each hold a handful of blocks between them, not one
  // per row count (each new block was fresh memory: page faults on every microbatch).
  std::set<const float*> blocks;
  std::uniform_int_distribution<int> rows(200, 300);
  for (int mb = 0; mb < 100; ++mb) {
    Tensor x(*e.dev, rows(e.rng), 256), act(*e.dev, rows(e.rng), 512);
    blocks.insert(x.data());
    blocks.insert(act.data());
  }
  EXPECT_LE(blocks.size(), 12u);
  // Small and odd sizes too, aligned for the vector kernels.
  for (int64_t n : {1, 3, 17, 1000, 1025, 4097, 100003}) {
    Tensor t(*e.dev, n, 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << n;
    t.data()[n - 1] = 1.0f;
  }
}

TEST(CpuDevice, Bf16AndFp16GemmsRoundTheOperandsAndAccumulateInFp32) {
  Env e;
  const int m = 6, n = 5, k = 300;
  Tensor a = e.random(m, k), b = e.random(k, n);
  a.data()[0] = 1.0f + 1.0f / 512;  // not a bf16 value: rounds to 1 (ties to even); exact in fp16
  b.data()[0] = 70000.0f;           // above fp16's largest finite value (65504)
  // Rounding by hand: bf16 keeps the upper 16 bits (nearest even), fp16 is the compiler's _Float16.
  auto bf16 = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
  };
  for (GemmOperands p : {GemmOperands::BF16, GemmOperands::FP16}) {
    auto dev = make_cpu_device(p);
    Tensor c(*dev, m, n);
    dev->gemm(Trans::No, Trans::No, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    double worst_vs_fp32 = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = 0, fp32 = 0;
        for (int l = 0; l < k; ++l) {
          const float x = a.data()[i * k + l], y = b.data()[l * n + j];
          const float rx = p == GemmOperands::BF16 ? bf16(x) : static_cast<float>(static_cast<_Float16>(x));
          const float ry = p == GemmOperands::BF16 ? bf16(y) : static_cast<float>(static_cast<_Float16>(y));
          ref += static_cast<double>(rx) * ry;
          fp32 += static_cast<double>(x) * y;
        }
        if (p == GemmOperands::FP16 && j == 0) {  // column 0 meets b[0] = 70000 → inf in fp16
          EXPECT_TRUE(std::isinf(c.data()[i * n + j]) || std::isnan(c.data()[i * n + j])) << i;
          continue;
        }
        EXPECT_NEAR(c.data()[i * n + j], ref, 1e-4 * (1 + std::fabs(ref)));
        if (i > 0) worst_vs_fp32 = std::max(worst_vs_fp32, std::fabs(c.data()[i * n + j] - fp32));
      }
    EXPECT_GT(worst_vs_fp32, 1e-4) << "the operands were not rounded";
  }
  EXPECT_EQ(bf16(1.0f + 1.0f / 512), 1.0f);
}

TEST(Fp8Emulation, RoundsToE4m3AndE5m2NearestEvenAndSaturates) {
  // E4M3: 3 mantissa bits, smallest normal 2⁻⁶, subnormal quantum 2⁻⁹, largest 448.
  EXPECT_EQ(round_fp8(1.0f, Fp8Type::E4M3), 1.0f);
  EXPECT_EQ(round_fp8(1.0625f, Fp8Type::E4M3), 1.0f);   // halfway 1 | 1.125: to the even mantissa
  EXPECT_EQ(round_fp8(1.1875f, Fp8Type::E4M3), 1.25f);  // halfway 1.125 | 1.25: to the even mantissa
  EXPECT_EQ(round_fp8(-1.2f, Fp8Type::E4M3), -1.25f);
  EXPECT_EQ(round_fp8(500.0f, Fp8Type::E4M3), 448.0f);  // saturates
  EXPECT_EQ(round_fp8(-1e30f, Fp8Type::E4M3), -448.0f);
  EXPECT_EQ(round_fp8(std::ldexp(1.0f, -10), Fp8Type::E4M3), 0.0f);                          // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(round_fp8(3 * std::ldexp(1.0f, -10), Fp8Type::E4M3), std::ldexp(1.0f, -8));      // 1.5 quanta: to 2
  EXPECT_EQ(round_fp8(std::ldexp(1.0f, -9), Fp8Type::E4M3), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(round_fp8(std::nanf(""), Fp8Type::E4M3)));
  // E5M2: 2 mantissa bits, largest 57344, subnormal quantum 2⁻¹⁶.
  EXPECT_EQ(round_fp8(1.125f, Fp8Type::E5M2), 1.0f);
  EXPECT_EQ(round_fp8(1.2f, Fp8Type::E5M2), 1.25f);
  EXPECT_EQ(round_fp8(60000.0f, Fp8Type::E5M2), 57344.0f);
  EXPECT_EQ(round_fp8(std::ldexp(1.0f, -16), Fp8Type::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_max(Fp8Type::E4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Type::E5M2), 57344.0f);
}

TEST(Fp8Emulation, RecipesScaleByTensorRowBlockOrPowerOfTwo) {
  // Two rows of very different magnitude: one tensor-wide scale flushes the small row, rowwise
  // and blockwise scales keep both to e4m3's relative precision (≤ 2⁻⁴).
  const int rows = 2, cols = 64;
  std::vector<float> x(static_cast<size_t>(rows) * cols), y(x.size());
  for (int c = 0; c < cols; ++c) {
    x[static_cast<size_t>(c)] = 100.0f + static_cast<float>(c);
    x[static_cast<size_t>(cols + c)] = 1e-4f * (1.0f + 0.01f * static_cast<float>(c));
  }
  auto cast = [&](Fp8Recipe r, bool along_rows, float tensor_scale) {
    return fp8_cast_host(Fp8Cast{r, Fp8Type::E4M3, rows, cols, along_rows, false, tensor_scale}, x.data(), y.data());
  };
  auto worst_relative = [&](int row) {
    double w = 0;
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(row) * cols + c;
      w = std::max(w, std::fabs(static_cast<double>(y[i]) - x[i]) / std::fabs(x[i]));
    }
    return w;
  };
  const float amax = cast(Fp8Recipe::Tensorwise, false, 1.0f);
  EXPECT_FLOAT_EQ(amax, 163.0f);
  cast(Fp8Recipe::Tensorwise, false, fp8_scale_for(amax, Fp8Type::E4M3));
  EXPECT_LE(worst_relative(0), 1.0 / 16);
  EXPECT_EQ(worst_relative(1), 1.0) << "the small row underflows a tensor-wide scale";
  for (Fp8Recipe r : {Fp8Recipe::Rowwise, Fp8Recipe::Blockwise, Fp8Recipe::MXFP8}) {
    SCOPED_TRACE(to_string(r));
    cast(r, false, 1.0f);
    EXPECT_GT(worst_relative(0), 0.0);
    EXPECT_LE(worst_relative(0), 1.0 / 16);
    EXPECT_LE(worst_relative(1), 1.0 / 16);
  }
  // Reduced along the rows (a weight of X·W, or a weight gradient's inputs): rowwise scales each
  // column over both rows, so the small row underflows again.
  cast(Fp8Recipe::Rowwise, true, 1.0f);
  EXPECT_EQ(worst_relative(1), 1.0);
  // MXFP8's scales are powers of two: a block of one power-of-two value comes back exactly; a
  // value of 448·1.5 in a block whose amax sets the scale saturates no further than e4m3 allows.
  std::fill(x.begin(), x.end(), 0.375f);
  cast(Fp8Recipe::MXFP8, false, 1.0f);
  EXPECT_EQ(y[5], 0.375f);
}

TEST(Fp8Emulation, DelayedScalingUsesTheHistoryBeforeThisUse) {
  AmaxHistory max3(3, false), recent(3, true);
  for (float a : {4.0f, 1.0f, 2.0f, 0.5f}) {
    max3.record(a);
    recent.record(a);
  }
  EXPECT_EQ(max3.reference(), 2.0f);  // 4 left the window of 3
  EXPECT_EQ(recent.reference(), 0.5f);
  Fp8Emulation e(Fp8Recipe::Tensorwise, Fp8Format::Hybrid);
  int key = 0;
  EXPECT_FALSE(e.has_history(&key, Fp8Emulation::Role::Input));
  e.record(&key, Fp8Emulation::Role::Input, 2.0f);
  EXPECT_FLOAT_EQ(e.delayed_scale(&key, Fp8Emulation::Role::Input), 224.0f);
  e.frozen = true;  // a recompute records nothing
  e.record(&key, Fp8Emulation::Role::Input, 8.0f);
  EXPECT_FLOAT_EQ(e.delayed_scale(&key, Fp8Emulation::Role::Input), 224.0f);
  EXPECT_EQ(e.type(Fp8Emulation::Role::OutputGrad), Fp8Type::E5M2);
  EXPECT_EQ(Fp8Emulation(Fp8Recipe::Tensorwise, Fp8Format::E4M3).type(Fp8Emulation::Role::OutputGrad), Fp8Type::E4M3);
}

TEST(Fp8Emulation, LayerForwardAndBackwardStayNearFp32) {
  // One Llama-style layer in fp32 and FP8-emulated (each recipe): outputs and input gradients
  // within e4m3/e5m2's precision of fp32, and not equal to it (the casts ran).
  for (Fp8Recipe r : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise, Fp8Recipe::Blockwise, Fp8Recipe::MXFP8}) {
    SCOPED_TRACE(to_string(r));
    Env e;
    LayerShape sh;
    sh.batch = 2; sh.seq = 8; sh.hidden = 32; sh.heads_local = 4; sh.head_dim = 8; sh.ffn_local = 64; sh.swiglu = true; sh.rms_norm = true;
    const int T = sh.tokens(), h = sh.hidden, f = sh.ffn_local, q3 = sh.qkv_cols();
    Tensor g1 = e.random(1, h, 0.1f, 1.0f), g2 = e.random(1, h, 0.1f, 1.0f), qkv = e.random(h, q3, 0.2f),
           proj = e.random(h, h, 0.2f), fc1 = e.random(h, f, 0.2f), gate = e.random(h, f, 0.2f), fc2 = e.random(f, h, 0.2f);
    LayerWeights w;
    w.ln1_gamma = g1.data(); w.ln2_gamma = g2.data(); w.qkv_weight = qkv.data(); w.proj_weight = proj.data();
    w.fc1_weight = fc1.data(); w.gate_weight = gate.data(); w.fc2_weight = fc2.data();
    Tensor x = e.random(T, h), dout = e.random(T, h);
    auto run = [&](Fp8Emulation* fp8, std::vector<float>& out, std::vector<float>& dx) {
      e.ctx.fp8 = fp8;
      std::vector<Tensor> grads;
      LayerWeights g;
      for (float** p : {&g.ln1_gamma, &g.ln2_gamma}) grads.push_back(Tensor::zeros(*e.dev, 1, h)), *p = grads.back().data();
      grads.push_back(Tensor::zeros(*e.dev, h, q3)), g.qkv_weight = grads.back().data();
      grads.push_back(Tensor::zeros(*e.dev, h, h)), g.proj_weight = grads.back().data();
      grads.push_back(Tensor::zeros(*e.dev, h, f)), g.fc1_weight = grads.back().data();
      grads.push_back(Tensor::zeros(*e.dev, h, f)), g.gate_weight = grads.back().data();
      grads.push_back(Tensor::zeros(*e.dev, f, h)), g.fc2_weight = grads.back().data();
      Tensor y(*e.dev, T, h), d(*e.dev, T, h);
      LayerActivations acts;
      layer_forward(e.ctx, sh, w, x.data(), y.data(), acts, true);
      layer_backward(e.ctx, sh, w, g, x.data(), std::move(acts), dout.data(), d.data(), nullptr);
      out.assign(y.data(), y.data() + y.size());
      dx.assign(d.data(), d.data() + d.size());
    };
    std::vector<float> y32, dx32, y8, dx8;
    run(nullptr, y32, dx32);
    Fp8Emulation fp8(r, Fp8Format::Hybrid);
    run(&fp8, y8, dx8);
    auto relative = [](const std::vector<float>& a, const std::vector<float>& b) {
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += static_cast<double>(b[i]) * b[i];
      return std::sqrt(num / den);
    };
    const double ey = relative(y8, y32), edx = relative(dx8, dx32);
    std::printf("%s: output %.3e, input gradient %.3e relative (rms) of fp32\n", to_string(r).c_str(), ey, edx);
    // e4m3 keeps 3 mantissa bits (relative spacing 2⁻³): a GEMM of two cast operands is ~4 % off
    // (rms), a layer's chain of them ~6 %; gradients (e5m2, 2 bits) ~10–16 %. Measured: output
    // 5.2–6.8 %, input gradient 10–16 % over the recipes.
    EXPECT_GT(ey, 1e-3);
    EXPECT_LT(ey, 0.1);
    EXPECT_GT(edx, 1e-3);
    EXPECT_LT(edx, 0.25);
    e.ctx.fp8 = nullptr;
  }
}

TEST(CpuDevice, LayerNormBackwardMatchesFiniteDifferences) {
  Env e;
  const int rows = 6, cols = 10;
  Tensor x = e.random(rows, cols, 2.0f, 0.5f), g = e.random(1, cols, 0.3f, 1.0f), b = e.random(1, cols, 0.3f);
  Tensor r = e.random(rows, cols), y(*e.dev, rows, cols), mean(*e.dev, rows, 1), rstd(*e.dev, rows, 1);
  auto f = [&] {
    e.dev->layer_norm_forward(rows, cols, kLayerNormEps, x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data());
    return dot(r.data(), y.data(), y.size());
  };
  f();
  for (int i = 0; i < rows; ++i) {  // normalised rows: mean 0, variance 1 before the affine map
    double mu = 0;
    for (int j = 0; j < cols; ++j) mu += x.data()[i * cols + j];
    EXPECT_NEAR(mean.data()[i], mu / cols, 1e-5);
  }
  Tensor dx(*e.dev, rows, cols), dg = e.zeros(1, cols), db = e.zeros(1, cols);
  e.dev->layer_norm_backward(rows, cols, r.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                             db.data());
  check_gradient("dx", x.data(), dx.data(), dx.size(), f, e.rng);
  check_gradient("dgamma", g.data(), dg.data(), dg.size(), f, e.rng);
  check_gradient("dbeta", b.data(), db.data(), db.size(), f, e.rng);
}

TEST(CpuDevice, GeluMatchesFormulaAndItsBackwardFiniteDifferences) {
  Env e;
  const int n = 64;
  Tensor x = e.random(n, 1, 2.0f), y(*e.dev, n, 1), r = e.random(n, 1), dx(*e.dev, n, 1);
  e.dev->gelu_forward(n, x.data(), y.data());
  for (int i = 0; i < n; ++i) {
    const double v = x.data()[i];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y.data()[i], ref, 1e-5);
  }
  // Elementwise, so each derivative is checked on its own element (tight tolerance).
  e.dev->gelu_backward(n, x.data(), r.data(), dx.data());
  const float step = 1e-3f;
  for (int i = 0; i < n; ++i) {
    float up = 0, down = 0, xu = x.data()[i] + step, xd = x.data()[i] - step;
    e.dev->gelu_forward(1, &xu, &up);
    e.dev->gelu_forward(1, &xd, &down);
    EXPECT_NEAR(dx.data()[i], r.data()[i] * (double(up) - down) / (2.0 * step), 1e-3) << "x = " << x.data()[i];
  }
}

TEST(CpuDevice, CausalAttentionMatchesReferenceAndBackwardFiniteDifferences) {
  Env e;
  const AttentionShape sh{2, 5, 2, 3};  // batch, seq, heads, head_dim
  const int T = sh.batch * sh.seq, q3 = 3 * sh.heads * sh.head_dim, ac = sh.heads * sh.head_dim;
  Tensor qkv = e.random(T, q3), ctx(*e.dev, T, ac), probs(*e.dev, static_cast<int64_t>(sh.probs_count()), 1);
  e.dev->attention_forward(sh, qkv.data(), probs.data(), ctx.data());
  // Reference in double: causal softmax(q·kᵀ/√d)·v per sequence and head.
  for (int b = 0; b < sh.batch; ++b)
    for (int j = 0; j < sh.heads; ++j)
      for (int i = 0; i < sh.seq; ++i) {
        auto q = [&](int tok, int c, int part) { return qkv.data()[(b * sh.seq + tok) * q3 + j * 3 * sh.head_dim + part * sh.head_dim + c]; };
        std::vector<double> w(i + 1);
        double mx = -1e30, sum = 0;
        for (int k = 0; k <= i; ++k) {
          double s = 0;
          for (int c = 0; c < sh.head_dim; ++c) s += q(i, c, 0) * q(k, c, 1);
          w[k] = s / std::sqrt(double(sh.head_dim));
          mx = std::max(mx, w[k]);
        }
        for (double& v : w) sum += (v = std::exp(v - mx));
        for (int c = 0; c < sh.head_dim; ++c) {
          double ref = 0;
          for (int k = 0; k <= i; ++k) ref += w[k] / sum * q(k, c, 2);
          EXPECT_NEAR(ctx.data()[(b * sh.seq + i) * ac + j * sh.head_dim + c], ref, 1e-5);
        }
      }
  Tensor r = e.random(T, ac), dqkv(*e.dev, T, q3), dqkv_recomputed(*e.dev, T, q3);
  e.dev->attention_backward(sh, qkv.data(), probs.data(), r.data(), dqkv.data());
  e.dev->attention_backward(sh, qkv.data(), nullptr, r.data(), dqkv_recomputed.data());
  for (size_t i = 0; i < dqkv.size(); ++i) EXPECT_EQ(dqkv.data()[i], dqkv_recomputed.data()[i]);
  auto f = [&] {
    e.dev->attention_forward(sh, qkv.data(), nullptr, ctx.data());
    return dot(r.data(), ctx.data(), ctx.size());
  };
  check_gradient("dqkv", qkv.data(), dqkv.data(), dqkv.size(), f, e.rng, 60);
}

// Flash attention (tiles of 64 queries × 64 keys, online softmax, log-sum-exp kept) equals the
// unfused kernels within 1e-5, forward and backward, for multi-head and grouped-query attention,
// at sequence lengths below, at and across the tile size.
TEST(CpuDevice, FlashAttentionEqualsUnfusedAttentionForwardAndBackward) {
  Env e;
  for (const AttentionShape sh : {AttentionShape{2, 5, 2, 8}, AttentionShape{1, 64, 4, 16, 2}, AttentionShape{2, 150, 4, 8, 1},
                                  AttentionShape{1, 200, 2, 32}}) {
    SCOPED_TRACE("seq " + std::to_string(sh.seq) + " heads " + std::to_string(sh.heads) + " groups " + std::to_string(sh.groups()));
    const int T = sh.batch * sh.seq, q3 = sh.qkv_cols(), ac = sh.heads * sh.head_dim;
    Tensor qkv = e.random(T, q3), ctx(*e.dev, T, ac), flash_ctx(*e.dev, T, ac), probs(*e.dev, static_cast<int64_t>(sh.probs_count()), 1);
    Tensor lse(*e.dev, static_cast<int64_t>(sh.batch) * sh.heads * sh.seq, 1);
    e.dev->attention_forward(sh, qkv.data(), probs.data(), ctx.data());
    e.dev->flash_attention_forward(sh, qkv.data(), flash_ctx.data(), lse.data());
    for (size_t i = 0; i < ctx.size(); ++i) ASSERT_NEAR(flash_ctx.data()[i], ctx.data()[i], 1e-5) << "ctx " << i;
    Tensor r = e.random(T, ac), dqkv(*e.dev, T, q3), flash_dqkv(*e.dev, T, q3);
    e.dev->attention_backward(sh, qkv.data(), probs.data(), r.data(), dqkv.data());
    e.dev->flash_attention_backward(sh, qkv.data(), flash_ctx.data(), lse.data(), r.data(), flash_dqkv.data());
    for (size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(flash_dqkv.data()[i], dqkv.data()[i], 1e-5) << "dqkv " << i;
  }
}

TEST(CpuDevice, AdamUpdateFollowsAdamWFormula) {
  Env e;
  const int n = 8;
  Tensor p = e.random(n, 1), g = e.random(n, 1), m = e.random(n, 1, 0.1f), v = e.random(n, 1, 0.1f, 0.5f);
  std::vector<float> p0(p.data(), p.data() + n), g0(g.data(), g.data() + n), m0(m.data(), m.data() + n),
      v0(v.data(), v.data() + n);
  AdamStep st;
  st.lr = 0.01f;
  st.weight_decay = 0.1f;
  st.bias_correction1 = 0.19f;
  st.bias_correction2 = 0.0975f;
  st.grad_scale = 0.5f;
  e.dev->adam_update(n, st, p.data(), g.data(), m.data(), v.data());
  for (int i = 0; i < n; ++i) {
    const double gs = g0[i] * 0.5, mm = 0.9 * m0[i] + 0.1 * gs, vv = 0.95 * v0[i] + 0.05 * gs * gs;
    const double ref = p0[i] * (1 - 0.01 * 0.1) - 0.01 * (mm / 0.19) / (std::sqrt(vv / 0.0975) + 1e-8);
    EXPECT_NEAR(m.data()[i], mm, 1e-6);
    EXPECT_NEAR(v.data()[i], vv, 1e-6);
    EXPECT_NEAR(p.data()[i], ref, 1e-5);
  }
}

// All parameters of one layer (t = 1) in one buffer, so the tests can perturb any of them.
// The default shape is GPT's (LayerNorm, multi-head attention, GELU); others choose RMSNorm,
// grouped-query attention and SwiGLU.
struct LayerFixture {
  Env e;
  LayerShape sh;
  Tensor values, grads;
  LayerWeights w, g;
  std::vector<std::pair<const char*, size_t>> sizes;

  explicit LayerFixture(LayerShape shape = LayerShape{2, 5, 8, 2, 4, 16}) : sh(shape) {  // batch, seq, hidden, heads, head_dim, ffn
    const size_t h = sh.hidden, q3 = sh.qkv_cols(), ac = sh.attn_cols(), f = sh.ffn_local;
    std::vector<std::pair<float**, float**>> ptrs;
    auto add = [&](const char* name, size_t n, float*& wv, float*& gv) {
      sizes.emplace_back(name, n);
      ptrs.emplace_back(&wv, &gv);
    };
    add("ln1_gamma", h, w.ln1_gamma, g.ln1_gamma);
    if (!sh.rms_norm) add("ln1_beta", h, w.ln1_beta, g.ln1_beta);
    if (sh.mla()) {  // multi-head latent attention's projections instead of the QKV GEMM
      const size_t qr = sh.mla_q_lora, kr = sh.mla_kv_lora, heads = sh.heads_local, qk = sh.head_dim;
      const size_t kv_up = heads * (qk - sh.mla_rope + sh.attention().v_dim());
      if (qr > 0) {
        add("q_down", h * qr, w.q_down, g.q_down);
        add("q_norm_gamma", qr, w.q_norm_gamma, g.q_norm_gamma);
        if (!sh.rms_norm) add("q_norm_beta", qr, w.q_norm_beta, g.q_norm_beta);
      }
      add("q_up", static_cast<size_t>(sh.mla_q_in()) * heads * qk, w.q_up, g.q_up);
      add("kv_down", h * (kr + sh.mla_rope), w.kv_down, g.kv_down);
      add("kv_norm_gamma", kr, w.kv_norm_gamma, g.kv_norm_gamma);
      if (!sh.rms_norm) add("kv_norm_beta", kr, w.kv_norm_beta, g.kv_norm_beta);
      add("kv_up", kr * kv_up, w.kv_up, g.kv_up);
    } else {
      add("qkv_weight", h * q3, w.qkv_weight, g.qkv_weight);
      add("qkv_bias", q3, w.qkv_bias, g.qkv_bias);
    }
    add("proj_weight", ac * h, w.proj_weight, g.proj_weight);
    add("proj_bias", h, w.proj_bias, g.proj_bias);
    add("ln2_gamma", h, w.ln2_gamma, g.ln2_gamma);
    if (!sh.rms_norm) add("ln2_beta", h, w.ln2_beta, g.ln2_beta);
    add("fc1_weight", h * f, w.fc1_weight, g.fc1_weight);
    add("fc1_bias", f, w.fc1_bias, g.fc1_bias);
    if (sh.swiglu) {
      add("gate_weight", h * f, w.gate_weight, g.gate_weight);
      add("gate_bias", f, w.gate_bias, g.gate_bias);
    }
    add("fc2_weight", f * h, w.fc2_weight, g.fc2_weight);
    add("fc2_bias", h, w.fc2_bias, g.fc2_bias);
    size_t total = 0;
    for (auto& s : sizes) total += s.second;
    values = e.random(static_cast<int64_t>(total), 1, 0.3f);
    grads = e.zeros(static_cast<int64_t>(total), 1);
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      *ptrs[i].first = values.data() + off;
      *ptrs[i].second = grads.data() + off;
      off += sizes[i].second;
    }
    for (float* gamma : {w.ln1_gamma, w.ln2_gamma})
      for (int i = 0; i < sh.hidden; ++i) gamma[i] += 1.0f;
    if (w.q_norm_gamma != nullptr)
      for (int i = 0; i < sh.mla_q_lora; ++i) w.q_norm_gamma[i] += 1.0f;
    if (w.kv_norm_gamma != nullptr)
      for (int i = 0; i < sh.mla_kv_lora; ++i) w.kv_norm_gamma[i] += 1.0f;
  }
};

// DeepSeek's attention, small: 2 heads of QK width 8 (4 non-rotary + 4 rotary channels) and
// value width 6, a query latent of 6 (0: queries from the hidden states), a key/value latent of 5.
LayerShape mla_shape(int q_lora, bool rms_norm) {
  LayerShape sh{2, 5, 8, 2, 8, 16};
  sh.groups_local = 2;
  sh.v_dim = 6;
  sh.mla_q_lora = q_lora;
  sh.mla_kv_lora = 5;
  sh.mla_rope = 4;
  sh.rotary_dim = 4;
  sh.rms_norm = rms_norm;
  sh.swiglu = rms_norm;
  return sh;
}

// Llama's layer: RMSNorm, 4 query heads in 2 groups (GQA), SwiGLU.
LayerShape llama_shape() {
  LayerShape sh{2, 5, 8, 4, 2, 12};
  sh.groups_local = 2;
  sh.swiglu = true;
  sh.rms_norm = true;
  return sh;
}

// Every parameter's and the input's gradient of one layer against finite differences.
void check_layer_gradients(LayerFixture& fx, int samples) {
  Env& e = fx.e;
  const int T = fx.sh.tokens(), h = fx.sh.hidden;
  Tensor x = e.random(T, h), r = e.random(T, h), out(*e.dev, T, h), dx(*e.dev, T, h);
  auto f = [&] {
    LayerActivations a;
    layer_forward(e.ctx, fx.sh, fx.w, x.data(), out.data(), a, true);
    return dot(r.data(), out.data(), out.size());
  };
  LayerActivations a;
  layer_forward(e.ctx, fx.sh, fx.w, x.data(), out.data(), a, true);
  EXPECT_EQ(a.ln1_mean.empty(), fx.sh.rms_norm);  // RMSNorm keeps no mean
  layer_backward(e.ctx, fx.sh, fx.w, fx.g, x.data(), std::move(a), r.data(), dx.data(), nullptr);
  check_gradient("dx", x.data(), dx.data(), dx.size(), f, e.rng, 40);
  size_t off = 0;
  for (auto& [name, n] : fx.sizes) {
    check_gradient(name, fx.values.data() + off, fx.grads.data() + off, n, f, e.rng, samples);
    off += n;
  }
}

TEST(Layers, TransformerLayerBackwardMatchesFiniteDifferences) {
  LayerFixture fx;
  check_layer_gradients(fx, 24);
}

TEST(Layers, LlamaLayerBackwardMatchesFiniteDifferences) {
  // GQA (keys and values shared by 2 query heads; then multi-query: all 4 share one), SwiGLU
  // and RMSNorm, each parameter checked.
  for (LayerShape sh : {llama_shape(), [] { LayerShape s = llama_shape(); s.groups_local = 1; return s; }()}) {
    LayerFixture fx(sh);
    check_layer_gradients(fx, 32);
  }
}

TEST(Layers, MultiHeadLatentAttentionLayerBackwardMatchesFiniteDifferences) {
  // With and without the query latent, RMSNorm and LayerNorm latents, all rotary channels and
  // half of them (rotary_percent 0.5), unfused and flash attention: every projection's, norm's
  // and the input's gradient.
  for (int q_lora : {6, 0})
    for (bool rms : {true, false}) {
      LayerShape sh = mla_shape(q_lora, rms);
      sh.flash = rms;
      if (!rms) sh.rotary_dim = 2;
      SCOPED_TRACE("q_lora " + std::to_string(q_lora) + (rms ? ", rmsnorm, flash" : ", layernorm, unfused, rotary 2"));
      LayerFixture fx(sh);
      check_layer_gradients(fx, 24);
    }
}

TEST(Layers, MultiHeadLatentAttentionSharesOneRotaryKeyRotatedAsMegatronsMlaRope) {
  // The attention input the layer builds: per head [query | key | value], every head's key ending
  // in the same rotary channels: kv_down's last 4 for the token, rotated as Megatron's MLA rope
  // does (rope_utils.py: channels 0::2 and 1::2 de-interleaved, then rotate-half), i.e. channel
  // pairs (2i, 2i + 1) by the angle position·base^(−2i/4).
  LayerShape sh = mla_shape(6, true);
  LayerFixture fx(sh);
  Env& e = fx.e;
  const int T = sh.tokens(), h = sh.hidden;
  Tensor x = e.random(T, h), out(*e.dev, T, h);
  LayerActivations a;
  layer_forward(e.ctx, sh, fx.w, x.data(), out.data(), a, true);
  const AttentionShape ash = sh.attention();
  ASSERT_EQ(ash.qkv_cols(), 2 * (8 + 8 + 6));
  ASSERT_EQ(sh.attn_cols(), 2 * 6);
  for (int row : {0, 7}) {  // row 7: the second sequence's position 2
    double ms = 0;
    for (int c = 0; c < h; ++c) ms += static_cast<double>(x.data()[row * h + c]) * x.data()[row * h + c];
    const double rstd = 1.0 / std::sqrt(ms / h + kLayerNormEps);
    double k[4];
    for (int c = 0; c < 4; ++c) {
      k[c] = 0;
      for (int i = 0; i < h; ++i) k[c] += x.data()[row * h + i] * rstd * fx.w.ln1_gamma[i] * fx.w.kv_down[i * 9 + 5 + c];
    }
    const int pos = row % sh.seq;
    for (int i = 0; i < 2; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / 4), c = std::cos(angle), sn = std::sin(angle);
      const double first = k[2 * i] * c - k[2 * i + 1] * sn, second = k[2 * i + 1] * c + k[2 * i] * sn;
      for (int head = 0; head < 2; ++head) {
        const float* key = a.qkv.data() + row * ash.qkv_cols() + ash.k_col(head) + 4;
        EXPECT_NEAR(key[2 * i], first, 1e-4) << "row " << row << ", pair " << i;
        EXPECT_NEAR(key[2 * i + 1], second, 1e-4) << "row " << row << ", pair " << i;
      }
    }
  }
}

TEST(CpuDevice, RotaryRotatesHalvesOfQueriesAndKeysAsMegatronAndItsInverseUndoesIt) {
  Env e;
  // 2 query heads in 1 group, head dim 4, rot_dim 2 of 4 (rotary_percent 0.5): channels 0 and 1
  // of each query and the key rotate as a pair, channels 2, 3 and the value pass.
  const AttentionShape ash{1, 3, 2, 4, 1};
  const int cols = ash.qkv_cols();  // (2 + 2) · 4
  Tensor qkv = e.random(3, cols);
  std::vector<float> before(qkv.data(), qkv.data() + qkv.size());
  const int32_t pos[3] = {0, 5, 2};
  e.dev->rotary(ash, 2, 100.0, pos, false, qkv.data());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < cols; ++c) {
      const int head = c / 4, ch = c % 4;  // heads 0, 1: queries; 2: key; 3: value
      const float* b = before.data() + r * cols;
      float want = b[c];
      if (head < 3 && ch < 2) {
        const double angle = pos[r];  // pair 0: base^0 = 1
        want = static_cast<float>(ch == 0 ? b[c] * std::cos(angle) - b[c + 1] * std::sin(angle)
                                          : b[c] * std::cos(angle) + b[c - 1] * std::sin(angle));
      }
      EXPECT_NEAR(qkv.data()[r * cols + c], want, 1e-6) << r << " " << c;
    }
  e.dev->rotary(ash, 2, 100.0, pos, true, qkv.data());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(qkv.data()[i], before[i], 1e-6);
  // Full rotation (rot_dim = head dim 4): pair (1, 3) turns by position · 100^(−1/2).
  Tensor full = e.random(3, cols);
  std::vector<float> b(full.data(), full.data() + full.size());
  e.dev->rotary(ash, 4, 100.0, pos, false, full.data());
  const double angle = 5 * 0.1;
  EXPECT_NEAR(full.data()[cols + 1], b[cols + 1] * std::cos(angle) - b[cols + 3] * std::sin(angle), 1e-6);
  EXPECT_NEAR(full.data()[cols + 3], b[cols + 3] * std::cos(angle) + b[cols + 1] * std::sin(angle), 1e-6);
}

TEST(Layers, RotaryLayerBackwardMatchesFiniteDifferences) {
  // Llama's layer with rope on every channel and on half of them, unfused and flash attention.
  for (int rot : {2, 4})
    for (bool flash : {false, true}) {
      LayerShape sh{2, 6, 16, 4, 4, 12};
      sh.groups_local = 2;
      sh.swiglu = sh.rms_norm = true;
      sh.rotary_dim = rot;
      sh.rotary_base = 10000;
      sh.flash = flash;
      SCOPED_TRACE("rotary_dim " + std::to_string(rot) + (flash ? " flash" : " unfused"));
      LayerFixture fx(sh);
      check_layer_gradients(fx, 24);
    }
}

TEST(Layers, SplitBackwardAndSelectiveRecomputeGiveTheFusedGradientsExactly) {
  for (LayerShape shape : {LayerShape{2, 5, 8, 2, 4, 16}, llama_shape()}) {
  LayerFixture fx(shape);
  Env& e = fx.e;
  const int T = fx.sh.tokens(), h = fx.sh.hidden;
  Tensor x = e.random(T, h), r = e.random(T, h), out(*e.dev, T, h), dx1(*e.dev, T, h), dx2(*e.dev, T, h);
  LayerActivations a;
  layer_forward(e.ctx, fx.sh, fx.w, x.data(), out.data(), a, true);
  layer_backward(e.ctx, fx.sh, fx.w, fx.g, x.data(), std::move(a), r.data(), dx1.data(), nullptr);
  std::vector<float> fused(fx.grads.data(), fx.grads.data() + fx.grads.size());

  e.dev->fill(fx.grads.data(), fx.grads.size(), 0.0f);
  DeferredWeightGrads defer;
  LayerActivations b;
  layer_forward(e.ctx, fx.sh, fx.w, x.data(), out.data(), b, /*keep_probs=*/false);
  layer_backward(e.ctx, fx.sh, fx.w, fx.g, x.data(), std::move(b), r.data(), dx2.data(), &defer);
  for (size_t i = 0; i < dx1.size(); ++i) ASSERT_EQ(dx1.data()[i], dx2.data()[i]);
  const size_t qkv_off = static_cast<size_t>(fx.g.qkv_weight - fx.grads.data());
  bool any_nonzero = false;  // weight gradients wait for W
  for (size_t i = 0; i < static_cast<size_t>(h) * fx.sh.qkv_cols(); ++i) any_nonzero |= fx.grads.data()[qkv_off + i] != 0;
  EXPECT_FALSE(any_nonzero);
  EXPECT_FALSE(defer.empty());
  defer.run();
  for (size_t i = 0; i < fused.size(); ++i) ASSERT_EQ(fused[i], fx.grads.data()[i]) << "parameter element " << i;
  }
}

// A tensor-parallel group of two whose collectives leave the data as it is, and which records,
// when each collective starts and when its wait returns, whether the watched weight gradients
// already hold something: whether the weight-gradient GEMM ran while the collective was on the
// wire.
class WatchingGroup final : public Communicator {
 public:
  std::vector<std::pair<const float*, size_t>> watched;
  std::vector<std::string> log;  // "start <nonzero watched>", "wait <nonzero watched>"
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  void all_reduce(float*, size_t, ReduceOp) override { log.push_back("blocking"); }
  void all_reduce(double*, size_t, ReduceOp) override {}
  void all_gather(const float* send, float* recv, size_t count) override {
    std::memmove(recv, send, count * sizeof(float));
    std::memmove(recv + count, send, count * sizeof(float));
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override { std::memmove(recv, send, count * sizeof(float)); }
  std::unique_ptr<Request> start_all_reduce(float*, size_t, ReduceOp) override {
    log.push_back("start " + std::to_string(filled()));
    return std::make_unique<Watched>(*this);
  }
  void broadcast(void*, size_t, int) override {}
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int) override { return {mine, mine}; }
  void barrier() override {}
  std::unique_ptr<Request> isend(const float*, size_t, int, int) override { return nullptr; }
  std::unique_ptr<Request> irecv(float*, size_t, int, int) override { return nullptr; }
  int max_tag() const override { return 0; }

 private:
  struct Watched final : Request {
    WatchingGroup& g;
    explicit Watched(WatchingGroup& group) : g(group) {}
    bool test() override { return true; }
    void wait() override { g.log.push_back("wait " + std::to_string(g.filled())); }
  };
  // How many watched gradients hold a non-zero element.
  int filled() const {
    int n = 0;
    for (auto [p, count] : watched) n += std::any_of(p, p + count, [](float v) { return v != 0.0f; });
    return n;
  }
  std::string name_ = "tensor-parallel group";
};

TEST(Layers, AWholeBackwardRunsTheWeightGradientGemmWhileTheInputGradientIsReduced) {
  // Megatron's asynchronous dgrad all-reduce (IR-2): a column-parallel layer's input-gradient
  // collective starts before its weight-gradient GEMM and is waited for after it, as a GPU
  // profile prices it hidden. A split backward's I has no weight gradient to run (its W does):
  // it starts and waits with the gradients still empty.
  for (const bool split : {false, true}) {
    LayerFixture fx(llama_shape());
    WatchingGroup group;
    LayerContext ctx{*fx.e.dev, group, {}, {}};
    const size_t h = static_cast<size_t>(fx.sh.hidden), f = static_cast<size_t>(fx.sh.ffn_local);
    group.watched = {{fx.g.fc1_weight, h * f}, {fx.g.qkv_weight, h * static_cast<size_t>(fx.sh.qkv_cols())}};
    const int T = fx.sh.tokens();
    Tensor x = fx.e.random(T, fx.sh.hidden), r = fx.e.random(T, fx.sh.hidden), out(*fx.e.dev, T, fx.sh.hidden),
           dx(*fx.e.dev, T, fx.sh.hidden);
    LayerActivations a;
    layer_forward(ctx, fx.sh, fx.w, x.data(), out.data(), a, true);
    group.log.clear();
    DeferredWeightGrads defer;
    layer_backward(ctx, fx.sh, fx.w, fx.g, x.data(), std::move(a), r.data(), dx.data(), split ? &defer : nullptr);
    // The MLP's (fc1 and gate) first, then the QKV's.
    const std::vector<std::string> expected =
        split ? std::vector<std::string>{"start 0", "wait 0", "start 0", "wait 0"}
              : std::vector<std::string>{"start 0", "wait 1", "start 1", "wait 2"};
    EXPECT_EQ(group.log, expected) << (split ? "split backward" : "whole backward");
  }
}

TEST(Layers, EmbeddingBackwardMatchesFiniteDifferencesAndIgnoresOtherShards) {
  Env e;
  LayerShape sh{2, 4, 6, 1, 6, 24};
  const int T = sh.tokens(), h = sh.hidden, rows = 5;
  Tensor word = e.random(rows, h), pos = e.random(sh.seq, h), dword = e.zeros(rows, h), dpos = e.zeros(sh.seq, h);
  // This shard holds vocabulary rows [10, 15); tokens 3 and 20 belong to other shards.
  std::vector<int32_t> tokens = {10, 11, 3, 14, 14, 20, 12, 10};
  EmbeddingWeights w{word.data(), pos.data(), 10, rows}, g{dword.data(), dpos.data(), 10, rows};
  Tensor out(*e.dev, T, h), r = e.random(T, h);
  auto f = [&] {
    embedding_forward(e.ctx, sh, w, tokens.data(), out.data());
    return dot(r.data(), out.data(), out.size());
  };
  f();
  for (int c = 0; c < h; ++c) EXPECT_EQ(out.data()[2 * h + c], pos.data()[2 * h + c]);  // token 3: position only
  embedding_backward(e.ctx, sh, g, tokens.data(), r.data(), nullptr);
  check_gradient("dword", word.data(), dword.data(), dword.size(), f, e.rng, 30);
  check_gradient("dpos", pos.data(), dpos.data(), dpos.size(), f, e.rng, 24);
}

TEST(Layers, VocabParallelCrossEntropyMatchesReferenceAndFiniteDifferences) {
  Env e;
  LayerShape sh{2, 3, 8, 2, 4, 32};
  const int T = sh.tokens(), h = sh.hidden, vc = 12, valid = 10;  // two padding columns
  Tensor lnf_g = e.random(1, h, 0.2f, 1.0f), lnf_b = e.random(1, h, 0.2f), word = e.random(vc, h, 0.5f);
  Tensor dg = e.zeros(1, h), db = e.zeros(1, h), dword = e.zeros(vc, h);
  HeadWeights w{lnf_g.data(), lnf_b.data(), word.data(), 0, vc, valid}, g{dg.data(), db.data(), dword.data(), 0, vc, valid};
  std::vector<int32_t> targets = {0, 9, 4, 4, 7, 1};
  Tensor x = e.random(T, h), dx(*e.dev, T, h);
  auto f = [&] {
    HeadActivations a;
    return head_forward(e.ctx, sh, w, x.data(), targets.data(), a);
  };
  // Reference loss in double: softmax over the 10 real columns only.
  {
    HeadActivations a;
    const double loss = head_forward(e.ctx, sh, w, x.data(), targets.data(), a);
    double ref = 0;
    for (int i = 0; i < T; ++i) {
      std::vector<double> z(valid);
      double mx = -1e30;
      for (int c = 0; c < valid; ++c) {
        double s = 0;
        for (int k = 0; k < h; ++k) s += a.lnf.data()[i * h + k] * word.data()[c * h + k];
        mx = std::max(mx, z[c] = s);
      }
      double sum = 0;
      for (double v : z) sum += std::exp(v - mx);
      ref += std::log(sum) + mx - z[targets[i]];
    }
    EXPECT_NEAR(loss, ref / T, 1e-5);
    for (int i = 0; i < T; ++i) EXPECT_EQ(a.probs.data()[i * vc + 11], 0.0f);  // padding has no mass
    head_backward(e.ctx, sh, w, g, x.data(), targets.data(), 1.0f / T, std::move(a), dx.data(), nullptr);
  }
  for (int c = valid; c < vc; ++c)
    for (int k = 0; k < h; ++k) EXPECT_EQ(dword.data()[c * h + k], 0.0f);
  check_gradient("dx", x.data(), dx.data(), dx.size(), f, e.rng, 30, 1e-2f);
  check_gradient("dgamma", lnf_g.data(), dg.data(), dg.size(), f, e.rng);
  check_gradient("dbeta", lnf_b.data(), db.data(), db.size(), f, e.rng);
  check_gradient("dword", word.data(), dword.data(), dword.size(), f, e.rng, 40);
}

TEST(ModelShard, TensorParallelShardsHoldSlicesOfTheSerialInitialisation) {
  auto dev = make_cpu_device();
  TransformerSpec gpt;
  gpt.num_layers = 3;
  gpt.hidden_size = 16;
  gpt.num_attention_heads = 4;
  gpt.seq_length = 8;
  gpt.vocab_size = 300;
  TransformerSpec llama = gpt;  // GQA (2 groups), SwiGLU, RMSNorm, untied output layer
  llama.num_query_groups = 2;
  llama.mlp = MlpKind::SwiGLU;
  llama.normalization = NormKind::RMSNorm;
  llama.tie_embeddings = false;
  llama.ffn_hidden_size = 24;
  for (const TransformerSpec& spec : {gpt, llama}) {
    SCOPED_TRACE(to_string(spec.mlp));
    ModelShard serial(*dev, spec, 1, 0, 1, {3}, {0}, 77);
    const auto& ref_params = serial.stage(0).params();
    auto serial_value = [&](const std::string& name, int64_t r, int64_t c) -> float {
      for (const ParamInfo& p : ref_params)
        if (p.name == name) return serial.stage(0).values()[p.offset + r * p.cols + c];
      ADD_FAILURE() << "no serial parameter " << name;
      return 0;
    };
    int compared = 0;
    std::set<std::string> names;
    for (int tp = 0; tp < 2; ++tp) {
      // t = 2, p = 2, uneven: stage 0 holds layer 0, stage 1 layers 1 and 2, the final norm and
      // the LM head (tied embedding copy, or the untied output layer).
      for (int st : {0, 1}) {
        ModelShard shard(*dev, spec, 1, tp, 2, {1, 2}, {st}, 77);
        EXPECT_EQ(shard.stage(st).slice().num_layers, st == 0 ? 1 : 2);
        EXPECT_EQ(shard.stage(st).slice().first_layer, st == 0 ? 0 : 1);
        for (const ParamInfo& p : shard.stage(st).params()) {
          names.insert(p.name);
          ASSERT_LE(p.row_offset + p.rows, p.global_rows) << p.name;
          for (int64_t r = 0; r < p.rows; ++r)
            for (int64_t c = 0; c < p.cols; ++c) {
              const int64_t gr = p.row_offset + r, gc = p.col_offset + c;
              if ((p.name.rfind("embedding.word", 0) == 0 || p.name == "output_layer.weight") && gr >= 384)
                continue;  // serial pads to 384, t = 2 to 512
              ASSERT_EQ(shard.stage(st).values()[p.offset + r * p.cols + c], serial_value(p.name, gr, gc))
                  << p.name << " (" << gr << ", " << gc << ") tp " << tp;
              ++compared;
            }
        }
      }
    }
    EXPECT_GT(compared, 2 * 3 * 16 * 16);
    const bool is_llama = spec.mlp == MlpKind::SwiGLU;
    EXPECT_EQ(names.count("output_layer.weight"), is_llama ? 1u : 0u);
    EXPECT_EQ(names.count("layers.2.mlp.gate.weight"), is_llama ? 1u : 0u);
    EXPECT_EQ(names.count("layers.2.ln1.bias"), is_llama ? 0u : 1u);
    // Weights are N(0, 0.02²)-like, not constant; the QKV has (a + 2·groups)·d columns.
    float mx = 0;
    for (const ParamInfo& p : ref_params)
      if (p.name == "layers.0.attention.qkv.weight") {
        EXPECT_EQ(p.global_cols, (4 + 2 * spec.query_groups()) * 4);
        for (size_t i = 0; i < p.count(); ++i) mx = std::max(mx, std::fabs(serial.stage(0).values()[p.offset + i]));
      }
    EXPECT_GT(mx, 0.02f);
    EXPECT_LT(mx, 0.2f);
  }
}

// The executor lays its parameters out from the layer description (model/tensors.hpp): every
// stage's shard, on every tensor rank, holds exactly the parameters the description counts for
// it (model/units.hpp: what memory, the gradient reductions and the sharded units read).
TEST(ModelShard, ShardTotalsEqualTheDescription) {
  auto dev = make_cpu_device();
  TransformerSpec gpt;
  gpt.num_layers = 4;
  gpt.hidden_size = 16;
  gpt.num_attention_heads = 4;
  gpt.seq_length = 8;
  gpt.vocab_size = 300;
  TransformerSpec llama = gpt;  // GQA, SwiGLU, RMSNorm, rotary, untied
  llama.num_query_groups = 2;
  llama.mlp = MlpKind::SwiGLU;
  llama.normalization = NormKind::RMSNorm;
  llama.tie_embeddings = false;
  llama.ffn_hidden_size = 24;
  TransformerSpec moe = llama;  // experts in layers 1 and 3 of 5 (stages of 3 and 2: unlike mixes), tied
  moe.tie_embeddings = true;
  moe.num_layers = 5;
  moe.moe.num_experts = 4;
  moe.moe.top_k = 2;
  moe.moe.first_dense_layers = 1;
  moe.moe.layer_frequency = 2;
  int checked = 0;
  for (const TransformerSpec& spec : {gpt, llama, moe}) {
    for (int t : {1, 2}) {
      ParallelPlan plan;
      plan.tensor = t;
      plan.pipeline = 2;
      plan.data = spec.has_moe() ? 2 : 1;
      plan.expert = spec.has_moe() ? 2 : 1;
      plan.global_batch = 4;
      if (spec.num_layers == 5) plan.layers_per_stage = {3, 2};
      const std::vector<int64_t> layers = stage_layers(spec, plan);
      for (int st = 0; st < 2; ++st) {
        SCOPED_TRACE(to_string(spec.mlp) + " experts " + std::to_string(spec.moe.num_experts) + " t " + std::to_string(t) +
                     " stage " + std::to_string(st));
        const StageParameters want = stage_parameters(spec, plan, st);
        for (int tp = 0; tp < t; ++tp) {
          ModelShard shard(*dev, spec, 1, tp, t, layers, {st}, 5, {}, false, 1, 0, static_cast<int>(plan.expert), 0);
          double total = 0, expert = 0, replicated = 0;
          for (const ParamInfo& p : shard.stage(st).params()) {
            total += static_cast<double>(p.count());
            if (p.expert) expert += static_cast<double>(p.count());
            if (p.tp_replicated && p.sequence_partial) replicated += static_cast<double>(p.count());
          }
          EXPECT_DOUBLE_EQ(total, want.total);
          EXPECT_DOUBLE_EQ(expert, want.expert);
          EXPECT_DOUBLE_EQ(replicated, want.replicated);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 3);
}

}  // namespace
}  // namespace ptdp::exec
