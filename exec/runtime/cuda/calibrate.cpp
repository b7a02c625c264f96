// The measuring half of `ptdp calibrate --backend cuda` (see calibrate.hpp). Every rank measures
// its own GPU at the same time (the figures kept are world rank 0's), then NCCL collectives run
// over the node-local and the world communicators, and point-to-point transfers between world
// rank 0 and a rank on its node and on the next node. The NCCL communicators here are blocking
// (a timed loop must not poll): if a rank dies, mpirun ends the job.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "core/error.hpp"
#include "core/units.hpp"
#include "exec/runtime/cuda/calibrate.hpp"
#include "exec/runtime/cuda/check.hpp"
#include "exec/runtime/cuda/cuda_device.hpp"
#include "exec/runtime/cuda/kernels.hpp"

namespace ptdp::exec::cuda {
namespace {

constexpr double kMiB = 1048576.0;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { PTDP_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256))); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class EventPair {
 public:
  EventPair() {
    PTDP_CUDA_CHECK(cudaEventCreate(&start_));
    PTDP_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Seconds per call of `op` (queued on `stream`) over `repeats` back-to-back calls.
  template <class Op>
  double seconds_per_call(cudaStream_t stream, int repeats, Op&& op) {
    PTDP_CUDA_CHECK(cudaEventRecord(start_, stream));
    for (int i = 0; i < repeats; ++i) op();
    PTDP_CUDA_CHECK(cudaEventRecord(stop_, stream));
    PTDP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    PTDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) * 1e-3 / repeats;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Local work: warm-up, one timed call to size the loop (about 0.2 s, within [3, repeats]), the loop.
template <class Op>
double time_op(cudaStream_t stream, const CalibrationOptions& o, Op&& op) {
  EventPair ev;
  for (int i = 0; i < o.warmup; ++i) op();
  const double once = ev.seconds_per_call(stream, 1, op);
  const int n = std::clamp(static_cast<int>(0.2 / std::max(once, 1e-7)), 3, std::max(3, o.repeats));
  return ev.seconds_per_call(stream, n, op);
}

// Communication: every participant must issue the same number of operations, so the counts are
// fixed (warm-up, then `repeats`).
template <class Op>
double time_comm(cudaStream_t stream, const CalibrationOptions& o, Op&& op) {
  EventPair ev;
  for (int i = 0; i < o.warmup; ++i) op();
  return ev.seconds_per_call(stream, std::max(1, o.repeats), op);
}

class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : comm_(c) {}
  ~NcclComm() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclComm(NcclComm&& o) noexcept : comm_(o.comm_) { o.comm_ = nullptr; }
  NcclComm& operator=(NcclComm&&) = delete;
  ncclComm_t get() const { return comm_; }
  int size() const {
    int n = 0;
    PTDP_NCCL_CHECK(ncclCommCount(comm_, &n));
    return n;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

std::vector<std::array<int64_t, 3>> default_shapes() {
  std::vector<std::array<int64_t, 3>> s;
  for (int64_t h : {1024, 2048, 4096, 8192, 12288}) {  // the forward GEMMs of a layer, 8192 tokens, t = 1
    s.push_back({8192, 3 * h, h});
    s.push_back({8192, h, h});
    s.push_back({8192, 4 * h, h});
    s.push_back({8192, h, 4 * h});
  }
  for (int64_t tokens : {2048, 4096}) {  // fewer tokens (small micro batches)
    s.push_back({tokens, 3 * 4096, 4096});
    s.push_back({tokens, 4096, 4 * 4096});
  }
  for (int64_t d : {64, 128}) {  // one attention head over 2048 tokens: QKᵀ and P·V
    s.push_back({2048, 2048, d});
    s.push_back({2048, d, 2048});
  }
  for (int64_t c : {128, 256, 512, 1024, 2048, 4096}) s.push_back({c, c, c});
  return s;
}

std::vector<double> default_sizes() {
  std::vector<double> s;
  for (double b = kMiB; b <= 1024 * kMiB; b *= 4) s.push_back(b);
  return s;
}

// Dense bf16 tensor-core peak: the data sheet for known parts, else SMs × clock × rate per SM.
std::pair<double, std::string> peak_flops_of(int ordinal, const std::string& name, int cc) {
  static const std::pair<const char*, double> sheet[] = {
      {"A100", 312e12}, {"A800", 312e12}, {"H100 PCIe", 756e12}, {"H100", 989.4e12}, {"H800", 989.4e12}, {"H200", 989.4e12}};
  for (const auto& [part, flops] : sheet)
    if (name.find(part) != std::string::npos)
      return {flops, "NVIDIA data sheet figure for " + std::string(part) + " (dense bf16)"};
  int sms = 0, clock_khz = 0;
  PTDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal));
  PTDP_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal));
  const double per_sm = cc == 80 ? 2048 : cc == 90 ? 4096 : 0;  // dense bf16 FLOP per clock per SM
  if (per_sm > 0 && sms > 0 && clock_khz > 0)
    return {per_sm * sms * clock_khz * 1e3,
            std::to_string(sms) + " SMs x " + std::to_string(clock_khz / 1000) + " MHz x " +
                std::to_string(static_cast<int>(per_sm)) + " bf16 FLOP per clock"};
  return {0, ""};
}

// Node of each world rank (by host name, in order of first appearance) and its node-local rank.
struct Placement {
  std::vector<int> node, local;
  int nodes = 1;
};

Placement place(Communicator& world) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string mine(host);
  const auto all = world.gather_bytes(std::vector<char>(mine.begin(), mine.end()), 0);
  const int n = world.size();
  std::vector<int32_t> table(2 * static_cast<size_t>(n) + 1);
  if (world.rank() == 0) {
    std::map<std::string, int> index;
    std::vector<int> count;
    for (int r = 0; r < n; ++r) {
      const std::string h(all[r].begin(), all[r].end());
      auto [it, added] = index.emplace(h, static_cast<int>(index.size()));
      if (added) count.push_back(0);
      table[2 * r] = it->second;
      table[2 * r + 1] = count[it->second]++;
    }
    table[2 * n] = static_cast<int32_t>(index.size());
  }
  world.broadcast(table.data(), table.size() * sizeof(int32_t), 0);
  Placement p;
  for (int r = 0; r < n; ++r) {
    p.node.push_back(table[2 * r]);
    p.local.push_back(table[2 * r + 1]);
  }
  p.nodes = table[2 * n];
  return p;
}

// Every rank throws the lowest failing rank's EnvironmentError (none hangs in a collective).
void agree(Communicator& world, const std::string& error) {
  double first = error.empty() ? world.size() : world.rank();
  world.all_reduce(&first, 1, ReduceOp::Min);
  if (first >= world.size()) return;
  const int root = static_cast<int>(first);
  std::string text = world.rank() == root ? error : std::string();
  uint64_t len = text.size();
  world.broadcast(&len, sizeof len, root);
  text.resize(len);
  world.broadcast(text.data(), len, root);
  throw EnvironmentError(root == world.rank() ? text : "world rank " + std::to_string(root) + ": " + text);
}

double slowest(Communicator& world, double seconds) {
  world.all_reduce(&seconds, 1, ReduceOp::Max);
  return seconds;
}

std::string percent(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

// This GPU's kernel launch floor and HBM bandwidth.
void measure_launch_and_hbm(cudaStream_t stream, const CalibrationOptions& o, CalibrationResult& r, const std::function<void(const std::string&)>& say) {
  {
    EventPair ev;  // back-to-back empty kernels: the launch floor of every kernel
    for (int i = 0; i < 100; ++i) kernels::empty(stream);
    r.kernel_launch_s = ev.seconds_per_call(stream, 2000, [&] { kernels::empty(stream); });
  }
  say("kernel launch: " + format_time(r.kernel_launch_s));
  {
    const size_t n = size_t{1} << 28;  // 1 GiB of floats read, 1 GiB written
    DeviceBuffer x(n * sizeof(float)), y(n * sizeof(float));
    kernels::fill(stream, x.floats(), n, 1.0f);
    const double t = time_op(stream, o, [&] { kernels::stream_scale(stream, n, x.floats(), y.floats()); });
    r.stream_Bps = 2.0 * n * sizeof(float) / t;
    say("HBM: " + format_bandwidth(r.stream_Bps) + " measured (read + write), " + format_bandwidth(r.hbm_nominal_Bps) +
        " nominal");
  }
}

// This GPU's bf16 GEMMs at `o.gemm_shapes`, and the peak they are a fraction of.
void measure_gemms(int ordinal, cudaStream_t stream, const CalibrationOptions& o, CalibrationResult& r, const std::function<void(const std::string&)>& say) {
  {
    size_t a_max = 0, b_max = 0, c_max = 0;
    for (const auto& [m, n, k] : o.gemm_shapes) {
      a_max = std::max<size_t>(a_max, static_cast<size_t>(m * k));
      b_max = std::max<size_t>(b_max, static_cast<size_t>(k * n));
      c_max = std::max<size_t>(c_max, static_cast<size_t>(m * n));
    }
    DeviceBuffer a(a_max * 2), b(b_max * 2), c(c_max * 2);  // bf16
    kernels::fill_bf16_pattern(stream, a.get(), a_max, 1);
    kernels::fill_bf16_pattern(stream, b.get(), b_max, 2);
    cublasHandle_t handle = nullptr;
    PTDP_CUBLAS_CHECK(cublasCreate(&handle));
    struct Destroy {
      cublasHandle_t h;
      ~Destroy() { cublasDestroy(h); }
    } destroy{handle};
    PTDP_CUBLAS_CHECK(cublasSetStream(handle, stream));
    auto [peak, source] = peak_flops_of(ordinal, r.gpu_name, r.compute_capability);
    double best = 0;
    for (const auto& [m, n, k] : o.gemm_shapes) {
      const float alpha = 1.0f, beta = 0.0f;
      const double seconds = time_op(stream, o, [&] {
        PTDP_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                                       static_cast<int>(k), &alpha, a.get(), CUDA_R_16BF, static_cast<int>(m), b.get(),
                                       CUDA_R_16BF, static_cast<int>(k), &beta, c.get(), CUDA_R_16BF,
                                       static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      const double rate = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / seconds;
      best = std::max(best, rate);
      r.gemm.push_back(GemmSample{m, n, k, rate});
      say("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ": " + format_flops(rate) +
          (peak > 0 ? " (" + percent(rate / peak) + " of peak)" : ""));
    }
    if (o.peak_flops > 0) {
      peak = o.peak_flops;
      source = "given with --peak-flops";
    } else if (peak <= 0) {
      peak = best;
      source = "the best measured GEMM (no tensor-core rate known for sm_" + std::to_string(r.compute_capability) +
               "; pass the data-sheet peak to calibrate)";
    }
    r.peak_flops = peak;
    r.peak_source = source;
  }
}

// NCCL all-reduce and point-to-point curves inside the node and across nodes.
void measure_nccl(Communicator& world, const CalibrationOptions& o, CalibrationResult& r, const std::function<void(const std::string&)>& say) {
  const Placement where = place(world);
  const int me = world.rank();
  r.nodes = where.nodes;
  r.gpus_per_node = static_cast<int>(std::count(where.node.begin(), where.node.end(), where.node[0]));
  ncclUniqueId id{};
  if (me == 0) PTDP_NCCL_CHECK(ncclGetUniqueId(&id));
  world.broadcast(&id, sizeof id, 0);
  ncclComm_t raw = nullptr;
  PTDP_NCCL_CHECK(ncclCommInitRank(&raw, world.size(), id, me));
  NcclComm world_comm(raw);
  PTDP_NCCL_CHECK(ncclCommSplit(world_comm.get(), where.node[me], where.local[me], &raw, nullptr));
  NcclComm node_comm(raw);
  cudaStream_t comm_stream = nullptr;
  PTDP_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
  struct DestroyStream {
    cudaStream_t s;
    ~DestroyStream() { cudaStreamDestroy(s); }
  } destroy_stream{comm_stream};
  const double max_bytes = *std::max_element(o.message_sizes.begin(), o.message_sizes.end());
  DeviceBuffer buf(static_cast<size_t>(max_bytes));
  PTDP_CUDA_CHECK(cudaMemset(buf.get(), 0, static_cast<size_t>(max_bytes)));

  auto all_reduce_curve = [&](const NcclComm& comm, const char* label, double& small_s, std::vector<BandwidthSample>& out) {
    const int n = comm.size();
    small_s = slowest(world, time_comm(comm_stream, o, [&] {
      PTDP_NCCL_CHECK(ncclAllReduce(buf.get(), buf.get(), 2, ncclFloat, ncclSum, comm.get(), comm_stream));
    }));
    say(std::string(label) + " all-reduce, 8 B: " + format_time(small_s));
    for (double bytes : o.message_sizes) {
      const size_t count = static_cast<size_t>(bytes) / sizeof(float);
      const double t = slowest(world, time_comm(comm_stream, o, [&] {
        PTDP_NCCL_CHECK(ncclAllReduce(buf.get(), buf.get(), count, ncclFloat, ncclSum, comm.get(), comm_stream));
      }));
      const double busbw = bytes / t * 2.0 * (n - 1) / n;
      out.push_back(BandwidthSample{bytes, t, busbw});
      say(std::string(label) + " all-reduce, " + format_bytes(bytes) + ": " + format_time(t) + ", busbw " +
          format_bandwidth(busbw));
    }
  };
  // Transfers between world ranks a and b (the others only join the barriers and the max).
  auto p2p_curve = [&](int a, int b, const char* label, double& latency_s, std::vector<BandwidthSample>& out) {
    const bool in = me == a || me == b;
    const int peer = me == a ? b : a;
    world.barrier();
    double t = 0;
    if (in) {
      t = time_comm(comm_stream, o, [&] {  // ping-pong of 8 bytes
        if (me == a) {
          PTDP_NCCL_CHECK(ncclSend(buf.get(), 2, ncclFloat, peer, world_comm.get(), comm_stream));
          PTDP_NCCL_CHECK(ncclRecv(buf.get(), 2, ncclFloat, peer, world_comm.get(), comm_stream));
        } else {
          PTDP_NCCL_CHECK(ncclRecv(buf.get(), 2, ncclFloat, peer, world_comm.get(), comm_stream));
          PTDP_NCCL_CHECK(ncclSend(buf.get(), 2, ncclFloat, peer, world_comm.get(), comm_stream));
        }
      }) / 2;
    }
    latency_s = slowest(world, t);
    say(std::string(label) + " p2p latency: " + format_time(latency_s));
    for (double bytes : o.message_sizes) {
      const size_t count = static_cast<size_t>(bytes) / sizeof(float);
      world.barrier();
      double s = 0;
      if (in)
        s = time_comm(comm_stream, o, [&] {
          if (me == a) PTDP_NCCL_CHECK(ncclSend(buf.get(), count, ncclFloat, peer, world_comm.get(), comm_stream));
          else PTDP_NCCL_CHECK(ncclRecv(buf.get(), count, ncclFloat, peer, world_comm.get(), comm_stream));
        });
      s = slowest(world, s);
      out.push_back(BandwidthSample{bytes, s, bytes / s});
      say(std::string(label) + " p2p, " + format_bytes(bytes) + ": " + format_bandwidth(bytes / s));
    }
  };

  if (r.gpus_per_node > 1) {
    all_reduce_curve(node_comm, "intra-node", r.intra_small_s, r.intra_allreduce);
    const int neighbour = static_cast<int>(std::find(where.node.begin() + 1, where.node.end(), where.node[0]) - where.node.begin());
    p2p_curve(0, neighbour, "intra-node", r.intra_p2p_latency_s, r.intra_p2p);
  }
  if (r.nodes > 1) {
    all_reduce_curve(world_comm, "inter-node", r.inter_small_s, r.inter_allreduce);
    const int other = static_cast<int>(std::find(where.node.begin(), where.node.end(), 1) - where.node.begin());
    p2p_curve(0, other, "inter-node", r.inter_p2p_latency_s, r.inter_p2p);
  }
  PTDP_CUDA_CHECK(cudaStreamSynchronize(comm_stream));
  world.barrier();
}

}  // namespace

CalibrationResult calibrate_cuda(Communicator& world, const CalibrationOptions& options) {
  CalibrationOptions o = options;
  if (o.gemm_shapes.empty()) o.gemm_shapes = default_shapes();
  if (o.message_sizes.empty()) o.message_sizes = default_sizes();
  const std::function<void(const std::string&)> say = [&](const std::string& line) {
    if (world.rank() == 0 && o.progress) o.progress(line);
  };

  std::unique_ptr<Device> device;
  std::string error;
  try {
    device = make_cuda_device();
  } catch (const EnvironmentError& e) {
    error = e.what();
  }
  agree(world, error);
  CudaDevice& dev = *as_cuda_device(*device);
  const int ordinal = dev.ordinal();
  const cudaStream_t stream = dev.compute_stream();

  CalibrationResult r;
  cudaDeviceProp prop{};
  PTDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  r.gpu_name = prop.name;
  r.compute_capability = prop.major * 10 + prop.minor;
  r.memory_bytes = static_cast<double>(prop.totalGlobalMem);
  int mem_khz = 0, bus_bits = 0;
  PTDP_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, ordinal));
  PTDP_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal));
  r.hbm_nominal_Bps = 2.0 * mem_khz * 1e3 * bus_bits / 8.0;  // double data rate

  measure_launch_and_hbm(stream, o, r, say);
  measure_gemms(ordinal, stream, o, r, say);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/infiniband", ec))
    r.ib_devices.push_back(entry.path().filename().string());
  std::sort(r.ib_devices.begin(), r.ib_devices.end());
  world.barrier();

  measure_nccl(world, o, r, say);
  return r;
}

}  // namespace ptdp::exec::cuda
