// The parts of exec/runtime/cuda/cuda.hpp that are plain C++ and exist in every build: allocation
// labels, the host-clock DeviceTimer, the overflow check for devices other than cuda.
#include <chrono>
#include <cmath>

#include "core/error.hpp"
#include "exec/runtime/cuda/backend.hpp"
#include "exec/runtime/cuda/cuda.hpp"

namespace ptdp::exec::cuda {
namespace {

thread_local std::string current_label;

double host_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// synchronize() and the host clock: what the interpreter does today, behind the same interface.
class HostClockTimer final : public DeviceTimer {
 public:
  explicit HostClockTimer(Device& dev) : dev_(dev) {}
  void begin(double host_now) override {
    dev_.synchronize();
    offset_s_ = host_now - host_now_s();
    marks_.clear();
  }
  int mark() override {
    dev_.synchronize();
    marks_.push_back(host_now_s() + offset_s_);
    return static_cast<int>(marks_.size()) - 1;
  }
  std::vector<double> resolve() override { return marks_; }

 private:
  Device& dev_;
  double offset_s_ = 0;
  std::vector<double> marks_;
};

}  // namespace

MemoryLabel::MemoryLabel(std::string what) : previous_(std::move(current_label)) { current_label = std::move(what); }
MemoryLabel::~MemoryLabel() { current_label = std::move(previous_); }
const std::string& MemoryLabel::current() { return current_label; }

std::unique_ptr<DeviceTimer> make_device_timer(Device& device) {
  if (auto timer = detail::make_event_timer(device)) return timer;
  return std::make_unique<HostClockTimer>(device);
}

bool any_inf_or_nan(Device& device, const std::vector<std::pair<const float*, size_t>>& buffers) {
  if (const auto on_gpu = detail::device_any_inf_or_nan(device, buffers)) return *on_gpu;
  std::vector<float> host;
  for (const auto& [data, count] : buffers) {
    host.resize(count);
    device.download(data, host.data(), count);
    for (float v : host)
      if (!std::isfinite(v)) return true;
  }
  return false;
}

}  // namespace ptdp::exec::cuda
