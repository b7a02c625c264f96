// FP8 emulation (training.precision fp8): the numerics of Transformer Engine's FP8 linear layers
// on a device without FP8 tensor cores. A GEMM operand is scaled, rounded to e4m3 (forward:
// inputs and weights) or e5m2 (hybrid format: output gradients), and scaled back; the GEMM then
// multiplies those values with fp32 accumulation, as the tensor cores accumulate FP8 products.
// The scale follows training.fp8_recipe:
//   tensorwise  one scale per tensor from an amax history (delayed scaling: the scale of a use is
//               fp8_max / the history's amax, the use's own amax enters the history afterwards;
//               an empty history, the first use, takes the tensor's own amax);
//   rowwise     one scale per row of the GEMM's reduction (torchao's rowwise: per token for
//               activations and gradients, per output channel for weights), the current amax;
//   blockwise   DeepSeek-V3's: 1×128 blocks along the reduction for activations and gradients,
//               128×128 blocks for weights, the current amax;
//   mxfp8       OCP microscaling: 32-element blocks along the reduction with power-of-two
//               (E8M0) scales 2^(emax − ⌊log2 amax⌋).
// Values beyond the format's range saturate (Transformer Engine's casts saturate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "model/plan.hpp"

namespace ptdp::exec {

enum class Fp8Type : uint8_t { E4M3, E5M2 };

/// Largest finite value: 448 (e4m3, OCP E4M3FN) or 57344 (e5m2).
float fp8_max(Fp8Type t);
/// x rounded to the nearest FP8 value (ties to even), saturated to ±fp8_max; NaN stays NaN.
float round_fp8(float x, Fp8Type t);

/// One operand's cast: a row-major rows×cols matrix whose GEMM reduction runs along its rows
/// (`reduce_along_rows`: the k×n weight of X·W, or the T×k input of a weight gradient) or its
/// columns. `weight` selects the recipe's weight blocks (blockwise: 128×128).
struct Fp8Cast {
  Fp8Recipe recipe = Fp8Recipe::Tensorwise;
  Fp8Type type = Fp8Type::E4M3;
  int rows = 0, cols = 0;
  bool reduce_along_rows = false;
  bool weight = false;
  /// Tensorwise: the scale to use (from the amax history); ignored by the other recipes.
  float tensor_scale = 1;
};

/// dst = round(src·scale)/scale with the cast's scales (dst may alias src). Returns the tensor's
/// amax (max |src|), which delayed scaling records. Host memory.
float fp8_cast_host(const Fp8Cast& cast, const float* src, float* dst);

/// Delayed scaling's amax history of one tensor: the last `length` amaxes; the reference amax is
/// their maximum (Transformer Engine's "max") or the most recent ("most_recent").
class AmaxHistory {
 public:
  AmaxHistory(int length, bool most_recent) : length_(length), most_recent_(most_recent) {}
  bool empty() const { return amax_.empty(); }
  void record(float amax);
  float reference() const;
  /// The recorded amaxes, oldest first (what a checkpoint saves).
  const std::deque<float>& amaxes() const { return amax_; }

 private:
  int length_;
  bool most_recent_;
  std::deque<float> amax_;
};

/// The FP8 state of a run: the recipe and the amax histories of the linear layers' operands,
/// keyed by the layer's weight (its device pointer) and the operand's role.
class Fp8Emulation {
 public:
  enum class Role : uint8_t { Input, Weight, OutputGrad };
  /// Megatron's defaults: --fp8-amax-history-len 1, --fp8-amax-compute-algo most_recent, margin 0.
  Fp8Emulation(Fp8Recipe recipe, Fp8Format format, int history_length = 1, bool most_recent = true)
      : recipe_(recipe), format_(format), history_length_(history_length), most_recent_(most_recent) {}
  Fp8Recipe recipe() const { return recipe_; }
  /// e4m3 for inputs and weights; output gradients e5m2 in the hybrid format, else e4m3.
  Fp8Type type(Role role) const { return role == Role::OutputGrad && format_ == Fp8Format::Hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3; }
  /// Tensorwise delayed scaling: the scale of the next use of (key, role), and whether the
  /// history has none yet (then the caller scales by the tensor's own amax).
  bool has_history(const void* key, Role role) const;
  float delayed_scale(const void* key, Role role) const;
  /// Records a use's amax (not while `frozen`: a recompute re-runs a forward whose amaxes were
  /// recorded once, as Transformer Engine reuses the forward's scales).
  void record(const void* key, Role role, float amax);
  bool frozen = false;

  /// Delayed scaling's state, for checkpoints: every (key, role) with a history, its amaxes
  /// oldest first. `restore` sets one history to saved amaxes (the newest history_length kept).
  struct History {
    const void* key;
    Role role;
    std::vector<float> amaxes;
  };
  std::vector<History> histories() const;
  void restore(const void* key, Role role, const std::vector<float>& amaxes);
  int history_length() const { return history_length_; }
  bool most_recent() const { return most_recent_; }

 private:
  Fp8Recipe recipe_;
  Fp8Format format_;
  int history_length_;
  bool most_recent_;
  std::map<std::pair<const void*, Role>, AmaxHistory> histories_;
};

/// "input", "weight", "output_grad": the role's name in checkpoints.
const char* to_string(Fp8Emulation::Role role);

/// The scale that maps `amax` onto the format's largest value (1 for amax 0 or not finite).
float fp8_scale_for(float amax, Fp8Type t);

}  // namespace ptdp::exec
