// What the plain C++ parts of exec/cuda (cuda.cpp) ask of the CUDA build; stub.cpp answers
// them in a build without CUDA. Internal header, no CUDA types.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "exec/runtime/cuda/cuda.hpp"

namespace ptdp::exec::cuda::detail {

/// An event timer when `dev` is a cuda device, else null.
std::unique_ptr<DeviceTimer> make_event_timer(Device& dev);
/// The overflow check on the GPU when `dev` is a cuda device, else nullopt.
std::optional<bool> device_any_inf_or_nan(Device& dev, const std::vector<std::pair<const float*, size_t>>& buffers);
/// The message for "no usable device" (stub: "ptdp was built without CUDA …").
std::string unavailable_reason();

}  // namespace ptdp::exec::cuda::detail
