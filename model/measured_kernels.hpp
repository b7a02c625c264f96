// What a calibrated CPU profile measured of the executor's own kernels, as the cost model uses
// it: GEMM rates per shape (exact at the measured shapes, the efficiency curve corrected by the
// nearest measurements elsewhere) and element-wise bandwidth by working set (caches against
// memory). Profiles without these measurements (every GPU preset) price with the curves alone.
#pragma once

#include <cstdint>

#include "model/gpu.hpp"

namespace ptdp {

/// GEMM efficiency (of gpu.peak_flops) at (m, n, k): `curve` (the efficiency model's value) when
/// the profile has no gemm_rates; the measured rate at a measured shape; elsewhere the curve times
/// the measured/curve ratio of the nearest measured shapes (in log m, n, k; weighted by inverse
/// squared distance), fading to the curve alone beyond a factor of ~2 from every measured shape.
double measured_gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k, double curve);

/// Element-wise kernels a host computes at a cost of their own (GpuSpec::swiglu_s, …): which one
/// an op runs. None: priced by its bytes.
enum class HostKernel : uint8_t { None, Swiglu, SwigluBackward, Rotary };

/// Seconds per element of `kernel` on this device: the profile's measured time, or 0 (none
/// measured: the op is priced by its bytes).
double host_kernel_time_s(const GpuSpec& gpu, HostKernel kernel);

/// Bandwidth of element-wise kernels moving `bytes` (read + written) per call: interpolated
/// log-log in gpu.elementwise_bandwidth (clamped at its ends), else hbm · elementwise_efficiency.
double elementwise_bandwidth(const GpuSpec& gpu, double bytes);

}  // namespace ptdp
