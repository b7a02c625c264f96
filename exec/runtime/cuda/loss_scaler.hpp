// Dynamic loss scaling for fp16 training (Megatron-LM's DynamicGradScaler): the loss is
// multiplied by `scale()` before backward so that small fp16 gradients do not flush to zero;
// after backward the gradients are checked for inf/NaN (any_inf_or_nan in exec/runtime/cuda/cuda.hpp,
// then a Max all-reduce of the flag over the model-parallel and data-parallel groups so every
// rank decides alike). On overflow the step is skipped and, after `hysteresis` overflows, the
// scale backs off; after `growth_interval` clean steps in a row it grows. Plain C++.
#pragma once

#include <cstdint>

namespace ptdp::exec::cuda {

struct LossScalerOptions {
  double initial_scale = 4294967296.0;  // 2³², as Megatron-LM
  double min_scale = 1.0;
  double max_scale = 16777216.0 * 16777216.0;  // 2⁴⁸: far above what fp16 gradients survive
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  // clean steps in a row before the scale grows
  int hysteresis = 2;              // overflows tolerated before the scale backs off
};

class DynamicLossScaler {
 public:
  /// Throws ConfigError for factors or bounds that make no sense (growth ≤ 1, backoff outside (0, 1), …).
  explicit DynamicLossScaler(LossScalerOptions options = {});

  /// The factor to multiply the loss by (and to divide the gradients by before the optimizer).
  double scale() const { return scale_; }
  double inverse_scale() const { return 1.0 / scale_; }

  /// Records one iteration's overflow check; returns true when the optimizer step must be
  /// skipped (the gradients overflowed).
  bool update(bool found_overflow);

  int64_t clean_steps() const { return growth_tracker_; }
  int64_t skipped_steps() const { return skipped_; }

  /// Everything update() changes: saved with a checkpoint so that a resumed run scales alike.
  struct State {
    double scale = 0;
    int64_t growth_tracker = 0;
    int hysteresis_tracker = 0;
    int64_t skipped = 0;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_, skipped_}; }
  /// Throws ConfigError("checkpoint", …) for a state no run of these options reaches.
  void restore(const State& s);

 private:
  LossScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int hysteresis_tracker_;
  int64_t skipped_ = 0;
};

}  // namespace ptdp::exec::cuda
