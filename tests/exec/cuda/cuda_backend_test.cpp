// The parts of the CUDA back end that run on every machine: what the build says about itself,
// the error a GPU-less machine gives, the shared element-wise formulas, dynamic loss scaling,
// the device timer and overflow check behind the portable interface, and the calibration
// profile (read back by the scenario loader, as `ptdp simulate` would).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/error.hpp"
#include "exec/runtime/cuda/calibrate.hpp"
#include "topologies/cluster_yaml.hpp"
#include "exec/runtime/cuda/cuda.hpp"
#include "exec/runtime/cuda/loss_scaler.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/elementwise_math.hpp"
#include "model/cost.hpp"
#include "model/efficiency_fit.hpp"
#include "scenarios/scenario.hpp"

namespace {

using namespace ptdp;
using namespace ptdp::exec;
namespace fs = std::filesystem;

// --- what was built, what is usable -------------------------------------------------------------

TEST(CudaStatus, SaysWhetherCudaWasCompiledAndWhatIsUsable) {
  const std::string s = cuda::cuda_status();
  if (!cuda::kCudaCompiled) {
    EXPECT_EQ(s, "cuda: not compiled (built with PTDP_ENABLE_CUDA=OFF)");
    EXPECT_EQ(cuda::cuda_device_count(), 0);
    return;
  }
  EXPECT_EQ(s.rfind("cuda: compiled for sm_80, sm_90 (CUDA runtime ", 0), 0u) << s;
  EXPECT_NE(s.find("NCCL 2."), std::string::npos) << s;
  if (cuda::cuda_device_count() == 0) {
    EXPECT_NE(s.find("no device ("), std::string::npos) << s;
  } else {
    EXPECT_NE(s.find(std::to_string(cuda::cuda_device_count()) + " device"), std::string::npos) << s;
    EXPECT_NE(s.find("CUDA driver "), std::string::npos) << s;
  }
}

// Whether a library whose file name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

// The CUDA libraries are loaded by the first call that needs the back end, not at start-up: a
// process that plans or trains on the cpu device never pays for them (ctest runs each test in
// its own process; run alone, an earlier test may have loaded them already).
TEST(CudaStatus, CudaLibrariesAreLoadedOnFirstUseOnly) {
  if (mapped("libptdp_cuda.so")) GTEST_SKIP() << "an earlier test of this process loaded the back end";
  EXPECT_FALSE(mapped("libcudart")) << "the CUDA runtime is loaded at start-up";
  EXPECT_FALSE(mapped("libcublas")) << "cuBLAS is loaded at start-up";
  auto cpu = make_cpu_device();
  auto timer = cuda::make_device_timer(*cpu);  // asked of every device: must not load CUDA
  const std::vector<float> host = {1.0f, 2.0f};
  float* buf = cpu->allocate(host.size());
  cpu->upload(host.data(), buf, host.size());
  EXPECT_FALSE(cuda::any_inf_or_nan(*cpu, {{buf, host.size()}}));
  cpu->release(buf, host.size());
  EXPECT_FALSE(mapped("libcudart")) << "a cpu device loaded the CUDA runtime";
  const std::string status = cuda::cuda_status();
  EXPECT_EQ(mapped("libcudart"), cuda::kCudaCompiled) << status;
  EXPECT_EQ(status.find("not loadable"), std::string::npos) << status;
}

// A back end that cannot be loaded (moved away, another build's) reads as no usable GPU, with
// the reason, never as a crash at start-up.
TEST(CudaStatus, AModuleThatCannotBeLoadedIsOneClearEnvironmentError) {
  if (!cuda::kCudaCompiled) GTEST_SKIP() << "this build has no CUDA module";
  if (mapped("libptdp_cuda.so")) GTEST_SKIP() << "an earlier test of this process loaded the back end";
  const std::string not_a_library = std::filesystem::temp_directory_path() / ("ptdp-not-a-module-" + std::to_string(::getpid()) + ".so");
  std::ofstream(not_a_library) << "not an ELF file\n";
  ::setenv("PTDP_CUDA_MODULE", not_a_library.c_str(), 1);
  const std::string status = cuda::cuda_status();
  EXPECT_EQ(status.rfind("cuda: compiled, back end not loadable (", 0), 0u) << status;
  EXPECT_EQ(cuda::cuda_device_count(), 0);
  try {
    make_device("cuda");
    FAIL() << "make_device(\"cuda\") succeeded without its back end";
  } catch (const EnvironmentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot be loaded"), std::string::npos) << m;
    EXPECT_NE(m.find(not_a_library), std::string::npos) << m;
    EXPECT_NE(m.find("--backend cpu"), std::string::npos) << m;
  }
  ::unsetenv("PTDP_CUDA_MODULE");
  std::filesystem::remove(not_a_library);
}

TEST(CudaStatus, BackendCudaWithoutAGpuIsOneClearEnvironmentError) {
  if (cuda::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: " << cuda::cuda_status();
  try {
    make_device("cuda");
    FAIL() << "make_device(\"cuda\") succeeded without a GPU";
  } catch (const EnvironmentError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("--backend cpu"), std::string::npos) << m;
    if (cuda::kCudaCompiled) EXPECT_NE(m.find("no usable GPU (CUDA driver: "), std::string::npos) << m;
    else EXPECT_NE(m.find("ptdp was built without CUDA"), std::string::npos) << m;
  }
}

TEST(CudaStatus, StubEntryPointsSayTheBuildHasNoCuda) {
  if (cuda::kCudaCompiled) GTEST_SKIP() << "this build has CUDA";
  auto cpu = make_cpu_device();
  EXPECT_THROW(cuda::make_nccl_groups(*cpu, ProcessGroups{}, 1.0), EnvironmentError);
  auto world = make_self_communicator("world");
  try {
    cuda::calibrate_cuda(*world);
    FAIL() << "calibrate_cuda ran without CUDA";
  } catch (const EnvironmentError& e) {
    EXPECT_NE(std::string(e.what()).find("ptdp was built without CUDA"), std::string::npos) << e.what();
  }
}

// --- shared element-wise formulas ----------------------------------------------------------------

TEST(ElementwiseMath, GeluAndItsDerivativeMatchTheTanhFormulaAndFiniteDifferences) {
  for (double x = -6; x <= 6; x += 0.37) {
    const double ref = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(math::gelu(static_cast<float>(x)), ref, 2e-6 * (1 + std::fabs(ref))) << x;
    const double h = 1e-4;
    auto g = [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); };
    EXPECT_NEAR(math::gelu_grad(static_cast<float>(x)), (g(x + h) - g(x - h)) / (2 * h), 2e-5) << x;
  }
}

TEST(ElementwiseMath, LayerNormInputGradientMatchesFiniteDifferences) {
  // f(x) = Σ dy·LN(x) over one row; df/dx_i from layer_norm_dx against central differences.
  std::mt19937 rng(3);
  std::normal_distribution<double> n01;
  const int cols = 24;
  const float eps = 1e-5f;
  std::vector<double> x(cols), dy(cols), gamma(cols);
  for (int i = 0; i < cols; ++i) x[i] = 2 * n01(rng) + 0.5, dy[i] = n01(rng), gamma[i] = 1 + 0.3 * n01(rng);
  auto f = [&](const std::vector<double>& v) {
    double mu = 0, var = 0;
    for (double e : v) mu += e;
    mu /= cols;
    for (double e : v) var += (e - mu) * (e - mu);
    const double rs = 1 / std::sqrt(var / cols + eps);
    double s = 0;
    for (int i = 0; i < cols; ++i) s += dy[i] * (v[i] - mu) * rs * gamma[i];
    return s;
  };
  double mu = 0, var = 0;
  for (double e : x) mu += e;
  mu /= cols;
  for (double e : x) var += (e - mu) * (e - mu);
  const float rs = math::layer_norm_rstd(static_cast<float>(var / cols), eps);
  EXPECT_NEAR(rs, 1 / std::sqrt(var / cols + eps), 1e-6 * rs);
  double mean_g = 0, mean_gx = 0;
  for (int i = 0; i < cols; ++i) {
    mean_g += dy[i] * gamma[i] / cols;
    mean_gx += dy[i] * gamma[i] * (x[i] - mu) * rs / cols;
  }
  for (int i = 0; i < cols; ++i) {
    std::vector<double> xp = x, xm = x;
    const double h = 1e-5;
    xp[i] += h;
    xm[i] -= h;
    const double numeric = (f(xp) - f(xm)) / (2 * h);
    const float dx = math::layer_norm_dx(static_cast<float>(dy[i] * gamma[i]), static_cast<float>((x[i] - mu) * rs),
                                         static_cast<float>(mean_g), static_cast<float>(mean_gx), rs);
    EXPECT_NEAR(dx, numeric, 1e-4 * (1 + std::fabs(numeric))) << "element " << i;
  }
}

TEST(ElementwiseMath, ShiftedExponentialIsZeroForAFullyMaskedRow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::exp_shifted(-inf, -inf), 0.0f);
  EXPECT_FLOAT_EQ(math::exp_shifted(1.5f, 1.5f), 1.0f);
  EXPECT_FLOAT_EQ(math::exp_shifted(0.0f, 2.0f), std::exp(-2.0f));
}

TEST(ElementwiseMath, AdamElementFollowsTheDocumentedAdamWStep) {
  AdamStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.bias_correction1 = 1 - 0.9f * 0.9f;     // step 2
  s.bias_correction2 = 1 - 0.95f * 0.95f;
  s.grad_scale = 0.5f;
  const math::AdamConstants c = math::adam_constants(s);
  float p = 0.7f, m = 0.02f, v = 0.003f;
  const float g = -0.4f;
  math::adam_element(c, p, m, v, g);
  // exec/runtime/device.hpp: p ← p(1 − lr·wd); m ← β1m + (1−β1)g'; v ← β2v + (1−β2)g'²; p ← p − lr(m/bc1)/(√(v/bc2) + eps)
  const double gs = g * 0.5, m_ref = 0.9 * 0.02 + 0.1 * gs, v_ref = 0.95 * 0.003 + 0.05 * gs * gs;
  const double p_ref = 0.7 * (1 - 1e-3) - 1e-2 * (m_ref / s.bias_correction1) / (std::sqrt(v_ref / s.bias_correction2) + 1e-8);
  EXPECT_NEAR(m, m_ref, 1e-7);
  EXPECT_NEAR(v, v_ref, 1e-8);
  EXPECT_NEAR(p, p_ref, 1e-6);
}

// --- dynamic loss scaling ----------------------------------------------------------------------

TEST(DynamicLossScaler, GrowsAfterTheIntervalAndBacksOffAfterHysteresisOverflows) {
  cuda::LossScalerOptions o;
  o.initial_scale = 1024;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 256;
  cuda::DynamicLossScaler s(o);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));  // third clean step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_TRUE(s.update(true));  // first overflow: skipped, hysteresis absorbs it
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_TRUE(s.update(true));  // second: backs off
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256);  // the floor
  EXPECT_EQ(s.skipped_steps(), 5);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512);  // growth resets the hysteresis
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
}

TEST(DynamicLossScaler, RejectsOptionsThatCannotWork) {
  cuda::LossScalerOptions o;
  o.growth_factor = 1.0;
  EXPECT_THROW(cuda::DynamicLossScaler{o}, ConfigError);
  o = {};
  o.backoff_factor = 1.5;
  EXPECT_THROW(cuda::DynamicLossScaler{o}, ConfigError);
  o = {};
  o.initial_scale = 0.5;  // below min_scale 1
  EXPECT_THROW(cuda::DynamicLossScaler{o}, ConfigError);
}

// --- portable timer and overflow check (what a cuda device does on the GPU) ---------------------

TEST(DeviceTimer, HostClockMarksAreOrderedAndTiedToTheGivenClock) {
  auto cpu = make_cpu_device();
  auto timer = cuda::make_device_timer(*cpu);
  timer->begin(100.0);
  EXPECT_EQ(timer->mark(), 0);
  ::usleep(2000);
  EXPECT_EQ(timer->mark(), 1);
  const auto t = timer->resolve();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_GE(t[0], 100.0);
  EXPECT_LT(t[0], 100.5);
  EXPECT_GE(t[1] - t[0], 0.0015);
}

TEST(OverflowCheck, FindsInfAndNanAnywhereInTheBuffers) {
  auto cpu = make_cpu_device();
  Tensor a = Tensor::zeros(*cpu, 1000, 1), b = Tensor::zeros(*cpu, 10, 1);
  EXPECT_FALSE(cuda::any_inf_or_nan(*cpu, {{a.data(), a.size()}, {b.data(), b.size()}}));
  b.data()[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(cuda::any_inf_or_nan(*cpu, {{a.data(), a.size()}, {b.data(), b.size()}}));
  b.data()[7] = 0;
  a.data()[999] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(cuda::any_inf_or_nan(*cpu, {{a.data(), a.size()}}));
}

// --- calibration: fit and profile -------------------------------------------------------------------

// bf16 GEMM rates (launch included, as calibrate_cuda measures them) of a GPU whose efficiency
// follows model/cost.hpp with the dgx-a100 parameters.
GpuSpec dgx_a100_truth() {
  GpuSpec p;
  p.peak_flops = 312e12;
  p.gemm_max_efficiency = 0.8115;
  p.gemm_half_dim = 141.2;
  p.gemm_half_k = 110.1;
  p.gemm_thin_exponent = 2.06;
  return p;
}

std::vector<GemmSample> synthetic_gemms(const GpuSpec& truth, double launch_s) {
  std::vector<GemmSample> out;
  const std::vector<std::array<int64_t, 3>> shapes = {
      {8192, 3072, 1024}, {8192, 4096, 1024},  {8192, 1024, 4096},  {8192, 12288, 4096}, {8192, 16384, 4096},
      {8192, 36864, 12288}, {2048, 12288, 4096}, {2048, 2048, 64},  {2048, 64, 2048},    {2048, 2048, 128},
      {2048, 128, 2048},   {128, 128, 128},     {256, 256, 256},    {512, 512, 512},     {1024, 1024, 1024},
      {4096, 4096, 4096}};
  for (const auto& [m, n, k] : shapes) {
    const double flops = 2.0 * m * n * k;
    const double seconds = flops / (truth.peak_flops * gemm_efficiency(truth, m, n, k)) + launch_s;
    out.push_back(GemmSample{m, n, k, flops / seconds});
  }
  return out;
}

cuda::CalibrationResult measured_two_nodes() {
  cuda::CalibrationResult r;
  r.gpu_name = "NVIDIA A100-SXM4-80GB";
  r.memory_bytes = 85899345920.0;
  r.peak_flops = 312e12;
  r.hbm_nominal_Bps = 2.039e12;
  r.stream_Bps = 1.55e12;
  r.kernel_launch_s = 3.1e-6;
  r.gemm = synthetic_gemms(dgx_a100_truth(), 3.1e-6);
  r.nodes = 2;
  r.gpus_per_node = 8;
  r.intra_small_s = 29e-6;
  r.inter_small_s = 37e-6;
  const double mib = 1048576.0;
  r.intra_allreduce = {{mib, 70e-6, 26e9}, {64 * mib, 560e-6, 210e9}, {1024 * mib, 8.1e-3, 231e9}};
  r.inter_allreduce = {{mib, 100e-6, 19e9}, {64 * mib, 1.1e-3, 110e9}, {1024 * mib, 16e-3, 125e9}};
  r.intra_p2p_latency_s = 6e-6;
  r.inter_p2p_latency_s = 9e-6;
  r.intra_p2p = {{mib, 20e-6, 52e9}, {1024 * mib, 4.5e-3, 238e9}};
  r.inter_p2p = {{mib, 60e-6, 17e9}, {1024 * mib, 45e-3, 23.5e9}};
  return r;
}

TEST(Calibration, ProfileIsATopologyTheScenarioLoaderReadsBack) {
  const ClusterSpec base = load_topology("dgx-a100");
  const cuda::CalibrationResult r = measured_two_nodes();
  const ClusterSpec c = cuda::profile_from(r, base);
  const fs::path file = fs::temp_directory_path() / ("ptdp-calibrated-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << to_yaml(c, "test profile\nsecond comment line");
  const ClusterSpec back = load_topology(file.string());
  fs::remove(file);

  auto near = [](double got, double want) { return std::fabs(got - want) <= 1e-5 * std::fabs(want); };
  EXPECT_EQ(back.gpu.name, "NVIDIA A100-SXM4-80GB");
  EXPECT_TRUE(near(back.gpu.memory_bytes, r.memory_bytes)) << back.gpu.memory_bytes;
  EXPECT_TRUE(near(back.gpu.peak_flops, 312e12));
  EXPECT_TRUE(near(back.gpu.hbm_Bps, 2.039e12));
  EXPECT_TRUE(near(back.gpu.elementwise_efficiency, 1.55 / 2.039)) << back.gpu.elementwise_efficiency;
  EXPECT_TRUE(near(back.gpu.kernel_launch_s, 3.1e-6));
  // The fit (launch time taken out) predicts the efficiency the synthetic GPU had.
  GpuSpec fitted;
  fitted.gemm_max_efficiency = back.gpu.gemm_max_efficiency;
  fitted.gemm_half_dim = back.gpu.gemm_half_dim;
  fitted.gemm_half_k = back.gpu.gemm_half_k;
  fitted.gemm_thin_exponent = back.gpu.gemm_thin_exponent;
  for (const GemmSample& g : r.gemm) {
    const double want = gemm_efficiency(dgx_a100_truth(), g.m, g.n, g.k);
    EXPECT_NEAR(gemm_efficiency(fitted, g.m, g.n, g.k), want, 0.02 * want) << g.m << "x" << g.n << "x" << g.k;
  }
  EXPECT_TRUE(near(back.gpu.iteration_overhead_s, base.gpu.iteration_overhead_s));  // not measured: kept
  EXPECT_EQ(back.gpus_per_node, 8);
  EXPECT_TRUE(near(back.nvlink.bw_Bps, 238e9));
  EXPECT_TRUE(near(back.nvlink.latency_s, 6e-6));
  EXPECT_TRUE(near(back.nic.bw_Bps, 23.5e9));
  EXPECT_TRUE(near(back.nic.latency_s, 9e-6));
  EXPECT_EQ(back.nics_per_node, base.nics_per_node);
  ASSERT_EQ(back.intra_node_allreduce.points.size(), 3u);
  EXPECT_TRUE(near(back.intra_node_allreduce.points[0].first, 1048576.0));
  EXPECT_TRUE(near(back.intra_node_allreduce.points[2].second, 231e9));
  EXPECT_TRUE(near(back.intra_node_allreduce.small_message_s, 29e-6));
  ASSERT_EQ(back.inter_node_allreduce.points.size(), 3u);
  EXPECT_TRUE(near(back.inter_node_allreduce.points[1].second, 110e9));
  EXPECT_EQ(back.inter_node_reference_gpus_per_node, 8);
  EXPECT_EQ(back.intra_node_reference_gpus, 8);
  EXPECT_EQ(back.fabric.leaf_radix, base.fabric.leaf_radix);
}

TEST(Calibration, OneNodeKeepsTheBaseNetworkFigures) {
  const ClusterSpec base = load_topology("dgx-a100");
  cuda::CalibrationResult r = measured_two_nodes();
  r.nodes = 1;
  r.inter_allreduce.clear();
  r.inter_p2p.clear();
  const ClusterSpec c = cuda::profile_from(r, base);
  EXPECT_EQ(c.nic.bw_Bps, base.nic.bw_Bps);
  EXPECT_EQ(c.inter_node_allreduce.points, base.inter_node_allreduce.points);
  EXPECT_NE(c.intra_node_allreduce.points, base.intra_node_allreduce.points);
}

}  // namespace
