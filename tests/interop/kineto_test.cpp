// PyTorch profiler (Kineto) traces read as kernels by class (interop/kineto.hpp). The traces are
// written here from the format torch.profiler's export_chrome_trace documents: GPU kernels
// ("cat": "kernel") linked by "correlation" to the CUDA runtime launch on a CPU thread, CPU
// operators ("cpu_op") that enclose the launches, thread names ("ph": "M"), NCCL kernels with
// the "External id" of the collective's record_param_comms operator and its process group.
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "interop/kineto.hpp"

namespace ptdp {
namespace {

// Rank 1 of 8: one profiler step of 3 ms; a forward GEMM (500 µs) launched from the main thread,
// a backward GEMM (1 ms) launched on the autograd thread inside MmBackward0, a tensor-parallel
// all-reduce (200 µs, its group named), a pipeline SendRecv (100 µs) and an all-reduce of an
// unnamed group (200 µs).
const char* kTrace = R"({
  "schemaVersion": 1,
  "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 8},
  "traceEvents": [
    {"ph": "M", "name": "thread_name", "pid": 100, "tid": 101, "args": {"name": "python"}},
    {"ph": "M", "name": "thread_name", "pid": 100, "tid": 102, "args": {"name": "pt_autograd_0"}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 100, "tid": 101, "ts": 1000, "dur": 3000},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 101, "ts": 1010, "dur": 20, "args": {"External id": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": 1015, "dur": 5, "args": {"correlation": 11}},
    {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_nn", "pid": 0, "tid": 7, "ts": 1100, "dur": 500, "args": {"correlation": 11}},
    {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": 100, "tid": 103, "ts": 1650, "dur": 40},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 103, "ts": 1660, "dur": 5, "args": {"correlation": 12}},
    {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_nt", "pid": 0, "tid": 7, "ts": 1700, "dur": 1000, "args": {"correlation": 12}},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 101, "ts": 2705, "dur": 10, "args": {"External id": 9, "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP"}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 20, "ts": 2800, "dur": 200, "args": {"External id": 9}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 21, "ts": 3100, "dur": 100},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 22, "ts": 3300, "dur": 200}
  ]
})";

TEST(Kineto, KernelsAreClassedByTheirLaunchAndTheirProcessGroup) {
  ASSERT_TRUE(is_kineto_trace(kTrace));
  const KernelTrace k = read_kineto_trace(kTrace, "rank1.json");
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.world_size, 8);
  EXPECT_EQ(k.kernels, 5);
  EXPECT_EQ(k.nccl_kernels, 3);
  EXPECT_NEAR(k.forward_s, 500e-6, 1e-12);
  EXPECT_NEAR(k.backward_s, 1000e-6, 1e-12);  // inside MmBackward0 on a thread not named pt_autograd
  EXPECT_NEAR(k.busy_s, 1500e-6, 1e-12);
  EXPECT_NEAR(k.comm_s.at("tp"), 200e-6, 1e-12);
  EXPECT_NEAR(k.comm_s.at("pp"), 100e-6, 1e-12);
  EXPECT_NEAR(k.comm_s.at("nccl"), 200e-6, 1e-12);
  EXPECT_EQ(k.steps, 1);
  EXPECT_NEAR(k.iteration_s(), 3e-3, 1e-12);
  EXPECT_NEAR(k.span_s, 2.4e-3, 1e-12);
}

TEST(Kineto, OverlappingKernelsCountOnceAndTheAutogradThreadIsBackward) {
  // Two forward kernels on two streams overlapping by 100 µs; a kernel launched from the autograd
  // thread outside any named backward operator; no profiler step (the span is the iteration).
  const std::string t = R"({"traceEvents": [
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "pt_autograd_0"}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 0, "dur": 1, "args": {"correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 0, "dur": 300},
    {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 8, "ts": 200, "dur": 300},
    {"ph": "X", "cat": "kernel", "name": "c", "pid": 0, "tid": 7, "ts": 600, "dur": 100, "args": {"correlation": 5}}
  ]})";
  const KernelTrace k = read_kineto_trace(t, "t.json");
  EXPECT_NEAR(k.forward_s, 500e-6, 1e-12);
  EXPECT_NEAR(k.backward_s, 100e-6, 1e-12);
  EXPECT_NEAR(k.busy_s, 600e-6, 1e-12);
  EXPECT_EQ(k.steps, 0);
  EXPECT_NEAR(k.iteration_s(), 700e-6, 1e-12);
}

TEST(Kineto, WhatIsNotAProfilerTraceIsOneClearError) {
  auto refusal = [](const std::string& text) {
    try {
      read_kineto_trace(text, "x.json");
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.where().file, "x.json");
      return std::string(e.what());
    }
    ADD_FAILURE() << text << ": accepted";
    return std::string();
  };
  EXPECT_NE(refusal("{\"iteration_time_s\": 1}").find("expected a PyTorch profiler (Kineto) trace"), std::string::npos);
  EXPECT_NE(refusal("[1, 2").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("{\"schemaVersion\": 1, \"traceEvents\": []}").find("was the profiler run with ProfilerActivity.CUDA?"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": -5, "dur": 1}]})").find("traceEvents[0].ts"),
            std::string::npos);
  EXPECT_FALSE(is_kineto_trace("{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"compute\"}]}"));  // ptdp's own trace
}

}  // namespace
}  // namespace ptdp
