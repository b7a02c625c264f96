#include "exec/runtime/cuda/loss_scaler.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace ptdp::exec::cuda {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions o) : o_(o), scale_(o.initial_scale), hysteresis_tracker_(o.hysteresis) {
  auto fail = [](const char* key, const std::string& what) { throw ConfigError(std::string("loss_scale.") + key, what); };
  if (!(o.min_scale > 0)) fail("min_scale", "must be positive (got " + std::to_string(o.min_scale) + ")");
  if (!(o.max_scale >= o.min_scale)) fail("max_scale", "must be at least min_scale (got " + std::to_string(o.max_scale) + ")");
  if (!(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale))
    fail("initial_scale", "must lie in [min_scale, max_scale] (got " + std::to_string(o.initial_scale) + ")");
  if (!(o.growth_factor > 1)) fail("growth_factor", "must exceed 1 (got " + std::to_string(o.growth_factor) + ")");
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    fail("backoff_factor", "must lie in (0, 1) (got " + std::to_string(o.backoff_factor) + ")");
  if (o.growth_interval < 1) fail("growth_interval", "must be at least 1 (got " + std::to_string(o.growth_interval) + ")");
  if (o.hysteresis < 1) fail("hysteresis", "must be at least 1 (got " + std::to_string(o.hysteresis) + ")");
}

void DynamicLossScaler::restore(const State& s) {
  if (!(s.scale >= o_.min_scale && s.scale <= o_.max_scale) || s.growth_tracker < 0 || s.growth_tracker >= o_.growth_interval ||
      s.hysteresis_tracker > o_.hysteresis || s.skipped < 0)
    throw ConfigError("checkpoint", "its loss scaler state (scale " + std::to_string(s.scale) + ", clean steps " +
                                        std::to_string(s.growth_tracker) + ") does not fit this run's loss-scaling options");
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
  skipped_ = s.skipped;
}

bool DynamicLossScaler::update(bool found_overflow) {
  if (found_overflow) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * o_.backoff_factor, o_.min_scale);
    ++skipped_;
    return true;
  }
  if (++growth_tracker_ == o_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = o_.hysteresis;
    scale_ = std::min(scale_ * o_.growth_factor, o_.max_scale);
  }
  return false;
}

}  // namespace ptdp::exec::cuda
