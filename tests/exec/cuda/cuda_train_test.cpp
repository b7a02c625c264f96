// Training with --backend cuda against --backend cpu, through mpirun like the executor's other
// multi-rank tests (tests/exec/mpi_train_test.cpp), on the tiny GPT of those tests.
//   - GPU tests (label gpu): for every (t, p, d) layout the machine has GPUs for, cuda with fp32
//     GEMMs (parallel.precision and PTDP_CUDA_PRECISION fp32) gives the cpu losses within 1e-4
//     relative and the parameters within 2e-4; cuda in bf16 gives losses within 2e-2 relative.
//     The same for sharded data parallelism (ZeRO stages 1–3, hybrid, offload).
//   - Without a GPU (label mpi, runs everywhere): --backend cuda stops every rank with exit code
//     1 and one message, promptly.
#include <gtest/gtest.h>

#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/runtime/cuda/cuda.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace ptdp::exec;

struct MpiRun {
  int exit_code = -1;
  std::string output;
  json result;
  double seconds = 0;
};

MpiRun run_ranks(int np, const std::string& env, const std::string& args) {
  static int counter = 0;
  const fs::path dir = ptdp::testing::scratch_dir("ptdp-cuda-test");
  const std::string out = (dir / (std::to_string(counter++) + ".json")).string();
  const std::string cmd = std::string("timeout 300 ") + PTDP_MPIEXEC + " --allow-run-as-root --oversubscribe " + env +
                          " -np " + std::to_string(np) + " " + PTDP_TRAIN_DRIVER + " " + args + " --timeout 60 --out " + out +
                          " 2>&1";
  MpiRun r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) r.output += buf;
  const int status = ::pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(out);
  if (in) r.result = json::parse(in);
  return r;
}

struct Layout {
  int t, p, d, v;
  int ranks() const { return t * p * d; }
  std::string args() const {
    return "--t " + std::to_string(t) + " --p " + std::to_string(p) + " --d " + std::to_string(d) + " --v " +
           std::to_string(v);
  }
};

void expect_losses_close(const MpiRun& on_cpu, const MpiRun& on_gpu, double rel, const std::string& what) {
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.output;
  ASSERT_EQ(on_gpu.exit_code, 0) << what << ":\n" << on_gpu.output;
  EXPECT_EQ(on_gpu.result["backend"], "cuda");
  const auto a = on_cpu.result["losses"].get<std::vector<double>>(), b = on_gpu.result["losses"].get<std::vector<double>>();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::fabs(a[i] - b[i]), rel * std::fabs(a[i])) << what << ": loss of step " << i + 1;
}

TEST(CudaTraining, EveryLayoutTrainsLikeTheCpuBackendInFp32) {
  const int gpus = cuda::cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  int ran = 0;
  for (Layout l : {Layout{1, 1, 1, 1}, Layout{2, 1, 1, 1}, Layout{1, 2, 1, 1}, Layout{1, 1, 2, 1}, Layout{2, 2, 1, 1},
                   Layout{1, 2, 1, 2}, Layout{2, 2, 2, 1}}) {
    if (l.ranks() > gpus) continue;  // NCCL needs one GPU per rank
    const std::string what = "t " + std::to_string(l.t) + ", p " + std::to_string(l.p) + ", d " + std::to_string(l.d) +
                             ", v " + std::to_string(l.v);
    const MpiRun on_cpu = run_ranks(l.ranks(), "", "--backend cpu " + l.args());
    const MpiRun on_gpu = run_ranks(l.ranks(), "-x PTDP_CUDA_PRECISION=fp32", "--backend cuda --precision fp32 " + l.args());
    expect_losses_close(on_cpu, on_gpu, 1e-4, what);
    if (HasFailure()) continue;
    EXPECT_NEAR(on_gpu.result["grad_norm"].get<double>(), on_cpu.result["grad_norm"].get<double>(),
                1e-4 * on_cpu.result["grad_norm"].get<double>())
        << what;
    double worst = 0;
    std::string where;
    for (auto& [name, values] : on_cpu.result["params"].items()) {
      const auto a = values.get<std::vector<float>>(), b = on_gpu.result["params"][name].get<std::vector<float>>();
      ASSERT_EQ(a.size(), b.size()) << what << ": " << name;
      for (size_t i = 0; i < a.size(); ++i)
        if (std::fabs(a[i] - b[i]) > worst) worst = std::fabs(a[i] - b[i]), where = name;
    }
    EXPECT_LE(worst, 2e-4) << what << ": parameters differ by up to " << worst << " in " << where;
    ++ran;
  }
  RecordProperty("layouts_run", ran);
  std::printf("ran %d layout(s) on %d GPU(s)\n", ran, gpus);
}

TEST(CudaTraining, LlamaArchitectureAndUnevenStagesTrainLikeTheCpuBackendInFp32) {
  // GQA, SwiGLU, RMSNorm, untied output layer; 3 layers on 2 stages.
  const int gpus = cuda::cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  const std::string llama = "--layers 3 --hidden 32 --heads 4 --groups 2 --ffn 48 --mlp swiglu --norm rmsnorm --untied 1 ";
  for (const std::string layout : {"--t 1 --p 1 --d 1", "--t 2 --p 1 --d 1", "--t 1 --p 2 --d 1 --stage-layers 1,2"}) {
    const int ranks = layout.find("--t 2") != std::string::npos || layout.find("--p 2") != std::string::npos ? 2 : 1;
    if (ranks > gpus) continue;
    const MpiRun on_cpu = run_ranks(ranks, "", "--backend cpu " + llama + layout);
    const MpiRun on_gpu = run_ranks(ranks, "-x PTDP_CUDA_PRECISION=fp32", "--backend cuda --precision fp32 " + llama + layout);
    expect_losses_close(on_cpu, on_gpu, 1e-4, "llama " + layout);
  }
}

TEST(CudaTraining, SequenceParallelismThroughNcclTrainsLikeTheCpuBackendInFp32) {
  // Reduce-scatter and all-gather through NCCL, sequence-split norms and positions, with
  // selective and full recompute, against the CPU backend's sequence-parallel run (MPI).
  const int gpus = cuda::cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  if (gpus < 2) GTEST_SKIP() << "sequence parallelism needs 2 GPUs (found " << gpus << ")";
  for (const std::string layout : {"--t 2 --p 1 --d 1 --sp 1", "--t 2 --p 1 --d 1 --sp 1 --recompute selective",
                                   "--t 2 --p 1 --d 1 --sp 1 --recompute full", "--t 2 --p 2 --d 1 --sp 1"}) {
    const int ranks = layout.find("--p 2") != std::string::npos ? 4 : 2;
    if (ranks > gpus) continue;
    const MpiRun on_cpu = run_ranks(ranks, "", "--backend cpu " + layout);
    const MpiRun on_gpu = run_ranks(ranks, "-x PTDP_CUDA_PRECISION=fp32", "--backend cuda --precision fp32 " + layout);
    expect_losses_close(on_cpu, on_gpu, 1e-4, "sequence parallel " + layout);
  }
}

// A layout run on the cpu and on the cuda back end (fp32) with the same arguments.
struct Case {
  int ranks;
  std::string args;
};

// Runs every case that fits on the GPUs both ways: the losses, the gradient norm and a measured
// device memory must agree / exist. Prints and returns how many ran.
int compare_with_cpu(const std::vector<Case>& cases, int gpus, const char* what) {
  int ran = 0;
  for (const Case& c : cases) {
    if (c.ranks > gpus) continue;
    const MpiRun on_cpu = run_ranks(c.ranks, "", "--backend cpu " + c.args);
    const MpiRun on_gpu = run_ranks(c.ranks, "-x PTDP_CUDA_PRECISION=fp32", "--backend cuda --precision fp32 " + c.args);
    expect_losses_close(on_cpu, on_gpu, 1e-4, c.args);
    if (::testing::Test::HasFailure()) continue;
    EXPECT_NEAR(on_gpu.result["grad_norm"].get<double>(), on_cpu.result["grad_norm"].get<double>(),
                1e-4 * on_cpu.result["grad_norm"].get<double>())
        << c.args;
    EXPECT_GT(on_gpu.result["memory_measured_bytes"].get<double>(), 0) << c.args;
    ++ran;
  }
  std::printf("ran %d %s layout(s) on %d GPU(s)\n", ran, what, gpus);
  return ran;
}

TEST(CudaTraining, ShardedDataParallelismTrainsLikeTheCpuBackendInFp32) {
  // ZeRO stages 1–3 through NCCL reduce-scatter / all-gather (stage-3 gathers prefetched on the
  // sharding group's stream), hybrid sharding and offload, against the same run on the cpu.
  const int gpus = cuda::cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  compare_with_cpu({Case{2, "--d 2 --zero 1"}, Case{2, "--d 2 --zero 2"}, Case{2, "--d 2 --zero 3"},
                    Case{2, "--d 2 --zero 3 --offload optimizer_and_params"}, Case{4, "--t 2 --d 2 --zero 3"},
                    Case{4, "--p 2 --d 2 --zero 2"}, Case{4, "--d 4 --zero 3 --sharding-group node --node-gpus 2"}},
                   gpus, "sharded");
}

TEST(CudaTraining, DualPipeTrainsLikeTheCpuBackendInFp32) {
  // DualPipe's copies sum their gradients through the NCCL mirror group (ranks r and p − 1 − r),
  // folded into the data-parallel reduce-scatter / all-gather.
  const int gpus = cuda::cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  compare_with_cpu({Case{2, "--p 2 --v 2 --schedule dualpipe"}, Case{4, "--p 4 --v 2 --global 16 --schedule dualpipe"},
                    Case{4, "--p 2 --d 2 --v 2 --global 16 --schedule dualpipe"},
                    Case{4, "--p 2 --d 2 --v 2 --global 16 --zero 1 --schedule dualpipe"}},
                   gpus, "dualpipe");
}

TEST(CudaTraining, Bf16TensorCoreTrainingTracksTheCpuLosses) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "no usable GPU: " << cuda::cuda_status();
  const Layout serial{1, 1, 1, 1};
  const MpiRun on_cpu = run_ranks(1, "", "--backend cpu --steps 6 " + serial.args());
  const MpiRun on_gpu = run_ranks(1, "-x PTDP_CUDA_PRECISION=bf16", "--backend cuda --precision bf16 --steps 6 " + serial.args());
  expect_losses_close(on_cpu, on_gpu, 2e-2, "bf16");
  if (HasFailure()) return;
  const auto b = on_gpu.result["losses"].get<std::vector<double>>();
  EXPECT_LT(b.back(), b.front()) << "bf16 training does not lower the loss";
}

TEST(CudaTraining, BackendCudaWithoutAGpuStopsEveryRankWithOneMessage) {
  if (cuda::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: " << cuda::cuda_status();
  const MpiRun r = run_ranks(2, "", "--backend cuda --t 2 --p 1 --d 1 --v 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string message = cuda::kCudaCompiled ? "no usable GPU" : "ptdp was built without CUDA";
  size_t count = 0;
  for (size_t pos = r.output.find(message); pos != std::string::npos; pos = r.output.find(message, pos + 1)) ++count;
  EXPECT_EQ(count, 1u) << r.output;
  EXPECT_LT(r.seconds, 60.0) << "took " << r.seconds << " s:\n" << r.output;
}

}  // namespace
