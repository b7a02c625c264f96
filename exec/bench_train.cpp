// Executor benchmark (not a test; figures go to docs/BENCHMARKS.md).
//
//   ptdp_exec_bench step  [--hidden 512 --layers 4 --heads 8 --seq 256 --micro 4 --steps 4 --rounds 3]
//       One rank: achieved FLOP/s of a training step (paper counting without recompute:
//       72·B·s·l·h²·(1 + s/6h + V/12lh)) against this machine's Eigen GEMM FLOP/s measured, in
//       the same run, on exactly the GEMMs of one step (forward, input- and weight-gradient).
//   mpirun -np N ptdp_exec_bench tiny --t T --p P --d D [--steps 6]
//       The tiny scenario (4 layers, h 128, 4 heads, s 64, V 256; b 4, B 16): tokens/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "exec/runtime/cpu_time.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "exec/train.hpp"
#include "model/cost.hpp"
#include "model/flops.hpp"

namespace {

using namespace ptdp;
using exec::Trans;

struct Gemm {
  Trans ta, tb;
  int m, n, k, batch;  // batch: how many times the step runs this shape
  double flops() const { return 2.0 * m * n * k * batch; }
};

// Which operand the executor stores transposed in each GEMM of the description (its layouts:
// activations token-major, weights input-major, the tied embedding vocabulary-major): only the
// layout; shapes and counts come from the layer description.
std::pair<Trans, Trans> layout_of(const std::string& name) {
  auto ends = [&](const char* suffix) {
    const std::string x = suffix;
    return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
  };
  if (name == "attn.qk" || name == "logits" || name == "attn.av.dgrad") return {Trans::No, Trans::Yes};  // ·Kᵀ, ·Eᵀ, ·Vᵀ
  if (name == "attn.qk.dgrad" || name == "logits.dgrad") return {Trans::No, Trans::No};                // dS·K, dlogits·E
  if (ends(".wgrad") || ends(".dgrad2")) return {Trans::Yes, Trans::No};                                 // xᵀ·dy
  if (ends(".dgrad")) return {Trans::No, Trans::Yes};                                                      // dy·Wᵀ
  return {Trans::No, Trans::No};
}

// The GEMMs one training step of the CPU executor runs (t = 1, no recompute), read from the layer
// description (model/cost.hpp): each layer's forward and backward GEMMs, the output layer's.
std::vector<Gemm> step_gemms(const TransformerSpec& spec, const ParallelPlan& plan) {
  std::vector<Gemm> g;
  auto add = [&](const std::vector<Op>& ops, int64_t times) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::Attention) {
        // The CPU executor runs the fused attention op as its products per head: Q·Kᵀ and P·V
        // forward; dP = dC·Vᵀ, dV = Pᵀ·dC, dQ = dS·K, dK = dSᵀ·Q backward.
        const int s = static_cast<int>(op.seq), hd = static_cast<int>(op.head_dim), n = static_cast<int>(op.batch * times);
        if (!op.backward) {
          g.push_back({Trans::No, Trans::Yes, s, s, hd, n});
          g.push_back({Trans::No, Trans::No, s, hd, s, n});
        } else {
          g.push_back({Trans::No, Trans::Yes, s, s, hd, n});
          g.push_back({Trans::Yes, Trans::No, s, hd, s, n});
          g.push_back({Trans::No, Trans::No, s, hd, s, n});
          g.push_back({Trans::Yes, Trans::No, s, hd, s, n});
        }
        continue;
      }
      if (op.kind != OpKind::Gemm) continue;
      const auto [ta, tb] = layout_of(op.name);
      g.push_back({ta, tb, static_cast<int>(op.m), static_cast<int>(op.n), static_cast<int>(op.k), static_cast<int>(op.batch * times)});
    }
  };
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    add(layer_ops(spec, plan, pass), spec.num_layers);
    add(head_ops(spec, plan, pass), 1);
  }
  return g;
}

// The GEMMs of one step on random operands, allocated once.
class GemmPass {
 public:
  GemmPass(exec::Device& dev, std::vector<Gemm> gemms) : dev_(dev), gemms_(std::move(gemms)) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (const Gemm& g : gemms_) {
      Buffers x{exec::Tensor(dev, g.m, g.k), exec::Tensor(dev, g.k, g.n), exec::Tensor(dev, g.m, g.n)};
      for (exec::Tensor* t : {&x.a, &x.b, &x.c})
        for (size_t i = 0; i < t->size(); ++i) t->data()[i] = u(rng);
      bufs_.push_back(std::move(x));
    }
  }
  double flops() const {
    double f = 0;
    for (const Gemm& g : gemms_) f += g.flops();
    return f;
  }
  size_t shapes() const { return gemms_.size(); }
  /// Seconds for one pass over all the GEMMs of a step.
  double run() {
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < gemms_.size(); ++i) {
      const Gemm& g = gemms_[i];
      const int lda = g.ta == Trans::No ? g.k : g.m, ldb = g.tb == Trans::No ? g.n : g.k;
      for (int rep = 0; rep < g.batch; ++rep)
        dev_.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, bufs_[i].a.data(), lda, bufs_[i].b.data(), ldb, 0.0f,
                  bufs_[i].c.data(), g.n);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  struct Buffers {
    exec::Tensor a, b, c;
  };
  exec::Device& dev_;
  std::vector<Gemm> gemms_;
  std::vector<Buffers> bufs_;
};

using exec::median;

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 2; i + 1 < argc; i += 2) a[std::string(argv[i]).substr(2)] = argv[i + 1];
  return a;
}

int step_benchmark(const std::map<std::string, std::string>& a) {
  auto get = [&](const char* k, int def) { return a.count(k) ? std::atoi(a.at(k).c_str()) : def; };
  TransformerSpec spec;
  spec.num_layers = get("layers", 4);
  spec.hidden_size = get("hidden", 512);
  spec.num_attention_heads = get("heads", 8);
  spec.seq_length = get("seq", 256);
  spec.vocab_size = 256;
  ParallelPlan plan;
  plan.micro_batch = get("micro", 4);
  plan.global_batch = plan.micro_batch;
  plan.precision = Precision::FP32;
  exec::TrainOptions opt;
  opt.steps = get("steps", 4);
  std::printf("model: l %lld, h %lld, heads %lld, s %lld, V %lld, b %lld (one rank, fp32, one thread)\n",
              static_cast<long long>(spec.num_layers), static_cast<long long>(spec.hidden_size),
              static_cast<long long>(spec.num_attention_heads), static_cast<long long>(spec.seq_length),
              static_cast<long long>(spec.vocab_size), static_cast<long long>(plan.micro_batch));
  // Rounds alternate training and the GEMM passes, so that load from other processes hits both
  // alike; the figures are medians over rounds.
  const int rounds = get("rounds", 3);
  const double model_flops = iteration_flops(spec, plan.global_batch, false);
  auto dev = exec::make_cpu_device();
  GemmPass pass(*dev, step_gemms(spec, plan));
  pass.run();  // warm-up
  std::vector<double> step_s, gemm_s;
  Report r;
  for (int round = 0; round < rounds; ++round) {
    r = exec::train(spec, plan, opt);
    step_s.push_back(r.iteration_time_s);
    double g = 0;
    for (int i = 0; i < 2; ++i) g += pass.run() / 2;
    gemm_s.push_back(g);
    std::printf("round %d: step %.4f s (%.2f GFLOP/s), GEMMs %.4f s (%.2f GFLOP/s)\n", round + 1, step_s.back(),
                model_flops / step_s.back() / 1e9, g, pass.flops() / g / 1e9);
  }
  const double step = median(step_s), gemm = median(gemm_s);
  const double achieved = model_flops / step, gemm_rate = pass.flops() / gemm;
  std::printf("training step:   %8.4f s  %8.2f GFLOP/s  (%.3g model FLOPs per step; median of rounds, each the mean of steps 2..%lld)\n",
              step, achieved / 1e9, model_flops, static_cast<long long>(opt.steps));
  std::printf("step GEMMs only: %8.4f s  %8.2f GFLOP/s  (%zu shapes, %.3g FLOPs; median of rounds of 2 passes)\n", gemm,
              gemm_rate / 1e9, pass.shapes(), pass.flops());
  std::printf("ratio:           %8.1f %%  of the Eigen GEMM rate\n", 100.0 * achieved / gemm_rate);
  std::printf("peak memory:     %8.1f MiB\n", r.peak_memory_bytes / (1 << 20));
  return 0;
}

int tiny_benchmark(exec::MpiSession& mpi, const std::map<std::string, std::string>& a) {
  auto get = [&](const char* k, int def) { return a.count(k) ? std::atoi(a.at(k).c_str()) : def; };
  TransformerSpec spec;
  spec.num_layers = 4;
  spec.hidden_size = 128;
  spec.num_attention_heads = 4;
  spec.seq_length = 64;
  spec.vocab_size = 256;
  ParallelPlan plan;
  plan.tensor = get("t", 1);
  plan.pipeline = get("p", 1);
  plan.data = get("d", 1);
  plan.micro_batch = 4;
  plan.global_batch = 16;
  plan.precision = Precision::FP32;
  exec::TrainOptions opt;
  opt.steps = get("steps", 6);
  const Report r = exec::train(spec, plan, opt);
  if (mpi.rank() == 0)
    std::printf("tiny scenario t %lld p %lld d %lld (%d ranks): %.4f s/iteration, %.0f tokens/s, loss %.3f -> %.3f\n",
                static_cast<long long>(plan.tensor), static_cast<long long>(plan.pipeline),
                static_cast<long long>(plan.data), mpi.size(), r.iteration_time_s, r.tokens_per_s, r.losses.front(),
                r.losses.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  exec::MpiSession mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "step";
  try {
    if (mode == "step") return step_benchmark(parse(argc, argv));
    if (mode == "tiny") return tiny_benchmark(mpi, parse(argc, argv));
    std::fprintf(stderr, "usage: ptdp_exec_bench step|tiny [--key value]...\n");
    return 2;
  } catch (const exec::CommunicationError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    mpi.abort(1);
  } catch (const std::exception& e) {
    if (mpi.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
