#include "exec/runtime/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstring>

#include "core/error.hpp"

namespace ptdp::exec {
namespace {

struct Fp8Format_ {
  int mantissa_bits;
  int max_exponent;  // of the largest finite value
  float max;
  float min_normal;       // 2^emin
  float subnormal_round;  // 2^(emin − m + 23): its fp32 ulp is the subnormal quantum
};

Fp8Format_ format_of(Fp8Type t) {
  // E4M3FN: bias 7, no infinities, 1.75·2⁸ = 448, emin −6; E5M2: bias 15, 1.75·2¹⁵ = 57344, emin −14.
  return t == Fp8Type::E4M3 ? Fp8Format_{3, 8, 448.0f, 0x1p-6f, 0x1p14f} : Fp8Format_{2, 15, 57344.0f, 0x1p-14f, 0x1p7f};
}

// The scale of a block: fp8_max / amax, or for microscaling the power of two 2^(emax − ⌊log2 amax⌋).
float block_scale(float amax, Fp8Type t, bool power_of_two) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  if (!power_of_two) return fp8_scale_for(amax, t);
  int e = 0;
  std::frexp(amax, &e);  // amax = f·2^e, f ∈ [0.5, 1): ⌊log2 amax⌋ = e − 1
  return std::ldexp(1.0f, format_of(t).max_exponent - (e - 1));
}

}  // namespace

float fp8_max(Fp8Type t) { return format_of(t).max; }

float fp8_scale_for(float amax, Fp8Type t) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  return fp8_max(t) / amax;
}

namespace {
// round_fp8 with the format's constants at hand: branch-free, so the cast loops vectorise.
inline float round_to(float x, const Fp8Format_& f) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const float a = std::bit_cast<float>(mag);
  // Subnormal range: multiples of 2^(emin − m). Adding C = 2^(emin − m + 23), whose fp32 ulp is
  // that quantum, rounds to it (ties to even) in the addition (exact IEEE arithmetic: not folded
  // without -ffast-math).
  const float sub = (a + f.subnormal_round) - f.subnormal_round;
  // Normal range: keep the top m mantissa bits, round to nearest even on the dropped ones (a
  // carry into the exponent is the next binade's value); beyond the largest value, saturate
  // (infinity too).
  const int drop = 23 - f.mantissa_bits;
  const uint32_t v = (mag + ((1u << (drop - 1)) - 1u) + ((mag >> drop) & 1u)) & ~((1u << drop) - 1u);
  const float normal = std::min(std::bit_cast<float>(v), f.max);
  const float r = a < f.min_normal ? sub : normal;
  const float rounded = std::bit_cast<float>(std::bit_cast<uint32_t>(r) | sign);
  return mag > 0x7f800000u ? x : rounded;  // NaN stays NaN
}
}  // namespace

float round_fp8(float x, Fp8Type t) { return round_to(x, format_of(t)); }

float fp8_cast_host(const Fp8Cast& c, const float* src, float* dst) {
  PTDP_ASSERT(c.rows >= 0 && c.cols >= 0, "fp8 cast of a negative shape");
  const size_t n = static_cast<size_t>(c.rows) * static_cast<size_t>(c.cols);
  float amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(src[i]);
    amax = a > amax ? a : amax;
  }
  // The block of one scale: (block_rows, block_cols).
  int along = 0, across = 1;  // block length along the reduction and across it
  bool power_of_two = false;
  switch (c.recipe) {
    case Fp8Recipe::Tensorwise: break;
    case Fp8Recipe::Rowwise: along = c.reduce_along_rows ? c.rows : c.cols; break;
    case Fp8Recipe::Blockwise:
      along = 128;
      across = c.weight ? 128 : 1;
      break;
    case Fp8Recipe::MXFP8:
      along = 32;
      power_of_two = true;
      break;
  }
  const Fp8Format_ f = format_of(c.type);
  if (c.recipe == Fp8Recipe::Tensorwise) {
    const float s = c.tensor_scale, inv = 1.0f / s;
    for (size_t i = 0; i < n; ++i) dst[i] = round_to(src[i] * s, f) * inv;
    return amax;
  }
  const int block_rows = std::max(1, c.reduce_along_rows ? along : across);
  const int block_cols = std::max(1, c.reduce_along_rows ? across : along);
  for (int r0 = 0; r0 < c.rows; r0 += block_rows)
    for (int c0 = 0; c0 < c.cols; c0 += block_cols) {
      const int r1 = std::min(c.rows, r0 + block_rows), c1 = std::min(c.cols, c0 + block_cols);
      float block_amax = 0;
      for (int r = r0; r < r1; ++r)
        for (int k = c0; k < c1; ++k) block_amax = std::max(block_amax, std::fabs(src[static_cast<size_t>(r) * c.cols + k]));
      const float s = block_scale(block_amax, c.type, power_of_two), inv = 1.0f / s;
      for (int r = r0; r < r1; ++r)
        for (int k = c0; k < c1; ++k) {
          const size_t i = static_cast<size_t>(r) * c.cols + k;
          dst[i] = round_to(src[i] * s, f) * inv;
        }
    }
  return amax;
}

void AmaxHistory::record(float amax) {
  amax_.push_back(amax);
  while (static_cast<int>(amax_.size()) > std::max(1, length_)) amax_.pop_front();
}

float AmaxHistory::reference() const {
  if (amax_.empty()) return 0;
  if (most_recent_) return amax_.back();
  return *std::max_element(amax_.begin(), amax_.end());
}

bool Fp8Emulation::has_history(const void* key, Role role) const {
  auto it = histories_.find({key, role});
  return it != histories_.end() && !it->second.empty();
}

float Fp8Emulation::delayed_scale(const void* key, Role role) const {
  auto it = histories_.find({key, role});
  return it == histories_.end() ? 1.0f : fp8_scale_for(it->second.reference(), type(role));
}

void Fp8Emulation::record(const void* key, Role role, float amax) {
  if (frozen) return;
  auto it = histories_.try_emplace({key, role}, history_length_, most_recent_).first;
  it->second.record(amax);
}

std::vector<Fp8Emulation::History> Fp8Emulation::histories() const {
  std::vector<History> out;
  for (const auto& [at, h] : histories_)
    if (!h.empty()) out.push_back({at.first, at.second, std::vector<float>(h.amaxes().begin(), h.amaxes().end())});
  return out;
}

void Fp8Emulation::restore(const void* key, Role role, const std::vector<float>& amaxes) {
  AmaxHistory h(history_length_, most_recent_);
  for (float a : amaxes) h.record(a);
  histories_.insert_or_assign({key, role}, std::move(h));
}

const char* to_string(Fp8Emulation::Role role) {
  switch (role) {
    case Fp8Emulation::Role::Input: return "input";
    case Fp8Emulation::Role::Weight: return "weight";
    case Fp8Emulation::Role::OutputGrad: return "output_grad";
  }
  return "?";
}

}  // namespace ptdp::exec
