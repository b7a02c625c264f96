#include "exec/speed_probe.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "exec/runtime/cpu_time.hpp"

namespace ptdp::exec {
namespace {

constexpr int kGemmM = 256, kGemmN = 512, kGemmK = 128;
constexpr int kGemmRounds = 31;
constexpr size_t kGemmEvictBytes = size_t{4} << 20;   // a rank's weights and gradients of the tiny GPT: 2-6 MiB

// One float written per cache line of `bytes`: what was touched before leaves the caches.
void evict(std::vector<float>& other) {
  for (size_t i = 0; i < other.size(); i += 16) other[i] += 1.0f;
}

}  // namespace

double median_over_ranks(Communicator& world, double mine) {
  std::vector<double> all(static_cast<size_t>(world.size()), 0.0);
  all[static_cast<size_t>(world.rank())] = mine;
  world.all_reduce(all.data(), all.size(), ReduceOp::Sum);
  return median(std::move(all));
}

SpeedProbe time_speed_probe(Communicator& world, Device& dev) {
  const bool oversubscribed = world.size() > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SpeedProbe p;
  {
    Tensor a(dev, kGemmM, kGemmK), b(dev, kGemmK, kGemmN), c(dev, kGemmM, kGemmN);
    dev.fill(a.data(), a.size(), 0.5f);
    dev.fill(b.data(), b.size(), 0.25f);
    std::vector<float> other(kGemmEvictBytes / sizeof(float), 0.0f);
    auto gemm = [&] { dev.gemm(Trans::No, Trans::No, kGemmM, kGemmN, kGemmK, 1.0f, a.data(), kGemmK, b.data(), kGemmN, 0.0f, c.data(), kGemmN); };
    gemm();
    world.barrier();
    std::vector<double> rounds;
    for (int r = 0; r < kGemmRounds; ++r) {
      evict(other);
      if (oversubscribed) sched_yield();
      const double t0 = thread_cpu_s();
      gemm();
      rounds.push_back(thread_cpu_s() - t0);
    }
    p.gemm_s = median_over_ranks(world, median(std::move(rounds)));
  }
  return p;
}

void ProbedMoments::close(const std::vector<double*>& times, const std::vector<double*>& rates) {
  const double before = samples.back();
  samples.push_back(probe());
  const double moment = 0.5 * (before + samples.back()), first = samples.front();
  if (!(moment > 0 && first > 0)) return;
  for (double* t : times) *t *= first / moment;
  for (double* r : rates) *r *= moment / first;
}

}  // namespace ptdp::exec
