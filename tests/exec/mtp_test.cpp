// The multi-token-prediction modules (exec/model/mtp.hpp) in one process: every gradient of the
// model with two modules against finite differences of the loss trained, and the modules'
// labels shifted by their depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "exec/model/gpt.hpp"
#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/fp8.hpp"

namespace ptdp::exec {
namespace {

struct MtpModel {
  std::unique_ptr<Device> dev = make_cpu_device();
  std::unique_ptr<Communicator> tp = make_self_communicator("tensor-parallel group");
  LayerContext ctx{*dev, *tp, {}, {}};
  TransformerSpec spec;
  std::unique_ptr<ModelShard> model;
  std::vector<int32_t> tokens, targets;
  static constexpr int kBatch = 2;

  explicit MtpModel(NormKind norm) {
    spec.num_layers = 1;
    spec.hidden_size = 8;
    spec.num_attention_heads = 2;
    spec.seq_length = 6;
    spec.vocab_size = 16;
    spec.normalization = norm;
    spec.position_embedding = PositionKind::Rope;
    spec.dropout = 0;
    spec.tie_embeddings = false;
    spec.mtp_layers = 2;
    spec.mtp_loss_scale = 0.5;
    model = std::make_unique<ModelShard>(*dev, spec, kBatch, 0, 1, std::vector<int64_t>{1}, std::vector<int>{0}, 3);
    std::mt19937 rng(5);
    // Weights far from the 0.02-wide initialisation: gradients well above fp32's rounding of the loss.
    std::normal_distribution<float> n(0.0f, 0.4f);
    Stage& st = model->stage(0);
    for (const ParamInfo& p : st.params())
      for (size_t i = 0; i < p.count(); ++i) st.values()[p.offset + i] = (p.init == TensorInit::Ones ? 1.0f : 0.0f) + n(rng);
    for (int i = 0; i < kBatch * spec.seq_length; ++i) {
      tokens.push_back(static_cast<int32_t>(rng() % 16));
      targets.push_back(static_cast<int32_t>(rng() % 16));
    }
  }
  // The loss trained (LM + scale/D Σ MTP) and, in `mtp`, the modules' mean loss.
  double loss(double* mtp = nullptr) {
    StageActivations a;
    const double l = model->forward(ctx, 0, tokens.data(), targets.data(), Tensor(), a, RecomputeMode::None);
    if (mtp != nullptr) *mtp = a.mtp_loss;
    return l;
  }
};

TEST(Mtp, EveryGradientMatchesFiniteDifferencesOfTheLossTrained) {
  for (NormKind norm : {NormKind::LayerNorm, NormKind::RMSNorm}) {
    MtpModel m(norm);
    Stage& st = m.model->stage(0);
    m.model->zero_grads();
    StageActivations a;
    m.model->forward(m.ctx, 0, m.tokens.data(), m.targets.data(), Tensor(), a, RecomputeMode::None);
    // The mean loss's gradient: 1/(b·s) per token, as the interpreter scales one microbatch.
    m.model->backward(m.ctx, 0, m.tokens.data(), m.targets.data(), Tensor(), a, 1.0f / (MtpModel::kBatch * 6),
                      RecomputeMode::None, false);
    std::mt19937 rng(7);
    int checked = 0;
    for (const ParamInfo& p : st.params()) {
      const bool mtp = p.name.rfind("mtp.", 0) == 0;
      if (!mtp && p.name != "embedding.word_embeddings.weight" && p.name != "output_layer.weight") continue;
      float* x = st.values() + p.offset;
      const float* g = st.grads() + p.offset;
      double scale = 1e-4;
      for (size_t i = 0; i < p.count(); ++i) scale = std::max(scale, static_cast<double>(std::fabs(g[i])));
      std::vector<size_t> idx(p.count());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      std::shuffle(idx.begin(), idx.end(), rng);
      idx.resize(std::min<size_t>(idx.size(), 12));
      for (size_t i : idx) {
        const float keep = x[i], step = 1e-2f;
        x[i] = keep + step;
        const double up = m.loss();
        x[i] = keep - step;
        const double down = m.loss();
        x[i] = keep;
        EXPECT_NEAR(g[i], (up - down) / (2.0 * step), 2e-2 * scale) << p.name << "[" << i << "]";
      }
      checked += mtp ? 1 : 0;
    }
    EXPECT_GE(checked, 10);  // both modules' norms, projections, layers and final norms
  }
}

TEST(Mtp, ModuleKPredictsTheTokenKPlacesFurtherAndLeavesTheRolledPositionsOut) {
  MtpModel m(NormKind::RMSNorm);
  double mtp0 = 0, mtp1 = 0;
  const double l0 = m.loss(&mtp0);
  EXPECT_NEAR(l0 - 0.5 * mtp0, m.loss() - 0.5 * mtp0, 1e-12);
  // Label 0 of a sequence is the main loss's alone: depth k reads labels k, k + 1, ….
  m.targets[0] = (m.targets[0] + 1) % 16;
  const double l1 = m.loss(&mtp1);
  EXPECT_NE(l1, l0);
  EXPECT_EQ(mtp1, mtp0);
  // The sequence's last label is every depth's (at position s − 1 − k).
  m.targets[5] = (m.targets[5] + 1) % 16;
  double mtp2 = 0;
  m.loss(&mtp2);
  EXPECT_NE(mtp2, mtp1);
  // Token s − 1 of the first sequence is read by each module (rolled to position s − 1 − k);
  // the rolled-in positions past the end are not in any module's loss.
  const int32_t keep = m.tokens[5];
  m.tokens[5] = (keep + 3) % 16;
  double mtp3 = 0;
  m.loss(&mtp3);
  EXPECT_NE(mtp3, mtp2);
}

TEST(Mtp, Fp8CastsEachProjectionsOperandsWithAmaxHistoriesOfTheirOwn) {
  MtpModel m(NormKind::RMSNorm);
  double fp32 = 0;
  m.loss(&fp32);
  Fp8Emulation fp8(Fp8Recipe::Tensorwise, Fp8Format::Hybrid);
  m.ctx.fp8 = &fp8;
  double cast = 0;
  m.loss(&cast);
  Stage& st = m.model->stage(0);
  for (const char* name : {"mtp.layers.0.eh_proj.weight", "mtp.layers.1.eh_proj.weight"}) {
    const int i = param_index(st.params(), name);
    ASSERT_GE(i, 0) << name;
    const float* w = st.values() + st.params()[static_cast<size_t>(i)].offset;
    EXPECT_TRUE(fp8.has_history(w, Fp8Emulation::Role::Input)) << name;  // [emb; hidden] cast, keyed by the weight
    EXPECT_TRUE(fp8.has_history(w, Fp8Emulation::Role::Weight)) << name;
  }
  EXPECT_NE(cast, fp32);
  EXPECT_NEAR(cast, fp32, 0.05 * fp32);
}

}  // namespace
}  // namespace ptdp::exec
