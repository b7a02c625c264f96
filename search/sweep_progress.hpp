// Progress of a sweep's long phases on stderr (enumeration, analytic pass, refinement), shared by
// search/sweep.cpp and search/sweep_candidates.cpp. Internal to search/.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ptdp::sweep_detail {

// A progress bar on stderr: redrawn in place on a terminal, a line per quarter otherwise.
class Progress {
 public:
  Progress(std::string what, size_t total, bool enabled)
      : what_(std::move(what)), total_(total), enabled_(enabled), tty_(::isatty(2) != 0) {}
  void tick(size_t done) {
    if (!enabled_ || done == reported_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    if (!tty_) {
      if (done < total_ && 4 * done / std::max<size_t>(1, total_) == 4 * reported_ / std::max<size_t>(1, total_)) return;
      std::fprintf(stderr, "%-9s %zu/%zu\n", what_.c_str(), done, total_);
      reported_ = done;
      return;
    }
    reported_ = done;
    last_ = now;
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r%-9s [%s%s] %zu/%zu", what_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total_);
    if (done >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string what_;
  size_t total_;
  bool enabled_;
  bool tty_;
  size_t reported_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace ptdp::sweep_detail
