#include "exec/calibrate_cpu.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <thread>

#include "core/units.hpp"
#include "exec/runtime/cpu_time.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "topologies/cluster_yaml.hpp"

namespace ptdp::exec {
namespace {

using Clock = std::chrono::steady_clock;

// Runs f repeatedly for at least `min_s` (and at least twice) and returns seconds per call: CPU
// seconds of this process (a kernel's cost, whatever else runs on the machine; the executor's
// computation is measured with the same clock), or with `wall` the wall clock.
template <class F>
double time_per_call(F&& f, double min_s = 0.05, bool wall = false) {
  auto now = [wall] { return wall ? std::chrono::duration<double>(Clock::now().time_since_epoch()).count() : process_cpu_s(); };
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

double gemm_flops(Device& dev, int64_t m, int64_t n, int64_t k, bool wall = false) {
  Tensor a(dev, m, k), b(dev, k, n), c(dev, m, n);
  dev.fill(a.data(), a.size(), 0.5f);
  dev.fill(b.data(), b.size(), 0.25f);
  const double s = time_per_call([&] {
    dev.gemm(Trans::No, Trans::No, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(),
             static_cast<int>(k), b.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
  }, 0.05, wall);
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / s;
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

void measure_compute(Device& dev, CpuCalibration& p, const Progress& progress, const std::vector<std::array<int64_t, 3>>& shapes) {
  if (!shapes.empty()) {
    if (progress) progress(line("calibrate: timing the %zu GEMM shapes given on one rank…", shapes.size()));
    for (const auto& [m, n, k] : shapes) p.gemms.push_back({m, n, k, gemm_flops(dev, m, n, k)});
  } else {
    if (progress) progress("calibrate: timing GEMMs (m, n 16 … 1024, k 8 … 512) on one rank…");
    const std::vector<int64_t> sides = {16, 64, 256, 1024};
    for (int64_t m : sides)
      for (int64_t n : sides)
        for (int64_t k : {int64_t{8}, int64_t{32}, int64_t{128}, int64_t{512}}) {
          if (m * n * k > int64_t{1} << 28) continue;
          p.gemms.push_back({m, n, k, gemm_flops(dev, m, n, k)});
        }
  }
  for (const auto& g : p.gemms) p.peak_flops = std::max(p.peak_flops, g.flops_per_s);
  p.fit = fit_gemm_efficiency(p.gemms, p.peak_flops);
  if (progress)
    progress(line("calibrate: %zu GEMM shapes, best %.1f GFLOP/s, fit rms error %.1f%%", p.gemms.size(),
                 p.peak_flops / 1e9, 100 * p.fit.rms_log_error));

  // Streaming bandwidth (copy reads and writes every byte) and what the executor's own
  // element-wise kernels reach (LayerNorm reads x, writes y: ~2 passes; GELU likewise).
  if (progress) progress("calibrate: memory bandwidth and element-wise kernels…");
  const size_t count = 16u << 20;  // 64 MB per array
  Tensor x(dev, 1, count), y(dev, 1, count);
  dev.fill(x.data(), count, 1.0f);
  const double copy_s = time_per_call([&] { dev.copy(x.data(), y.data(), count); }, 0.2);
  p.stream_Bps = 2.0 * 4 * count / copy_s;
  const double gelu_s = time_per_call([&] { dev.gelu_forward(count, x.data(), y.data()); }, 0.2);
  const int rows = 4096, cols = static_cast<int>(count / 4096);
  Tensor gamma(dev, 1, cols), beta(dev, 1, cols), mean(dev, 1, rows), rstd(dev, 1, rows);
  dev.fill(gamma.data(), cols, 1.0f);
  dev.fill(beta.data(), cols, 0.0f);
  const double ln_s = time_per_call(
      [&] { dev.layer_norm_forward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data()); },
      0.2);
  const double bytes = 2.0 * 4 * count;
  p.elementwise_eff = std::min(1.0, 0.5 * (bytes / gelu_s + bytes / ln_s) / p.stream_Bps);
  Tensor tiny(dev, 1, 16), tiny_out(dev, 1, 16);
  dev.fill(tiny.data(), 16, 1.0f);
  p.launch_s = time_per_call([&] { dev.gelu_forward(16, tiny.data(), tiny_out.data()); }, 0.02);
  if (progress)
    progress(line("calibrate: stream %s, element-wise kernels at %.0f%% of it", format_bandwidth(p.stream_Bps).c_str(),
                 100 * p.elementwise_eff));
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
                             const std::vector<std::array<int64_t, 3>>& gemm_shapes) {
  const bool rank0 = world.rank() == 0;
  const Progress progress = rank0 ? progress_all : Progress{};
  CpuCalibration p;
  auto dev = make_cpu_device();
  // Alone: rank 0 measures while the others wait.
  if (rank0) measure_compute(*dev, p, progress, gemm_shapes);
  world.barrier();
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
                                          " MPI rank(s) on this host.\nEvery rank is a device of one node; node.cores is "
                                          "how many ranks compute at full speed at once.");
}


}  // namespace ptdp::exec
