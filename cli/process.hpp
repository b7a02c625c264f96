// Running other programs from the CLI (plot scripts, mpirun): fork + exec, wait, exit status.
// The program runs in its own process group, which is killed as a whole (mpirun and the ranks it
// started) when ptdp is interrupted (SIGINT, SIGTERM, SIGHUP), when the timeout passes, or when
// ptdp dies (the child gets SIGTERM from the kernel: PR_SET_PDEATHSIG).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ptdp::cli {

/// Runs argv[0] (looked up on PATH) with its arguments and waits for it. With `output_path`,
/// its stdout and stderr go to that file; stdin is /dev/null. Returns the exit status (128 +
/// signal when killed). Throws EnvironmentError when the program cannot be started
/// (`install_hint` says how to get it) or ran longer than `timeout_s` (> 0; its process group
/// is killed first). On SIGINT/SIGTERM/SIGHUP the process group is killed and ptdp then dies of
/// the same signal.
int run_program(const std::vector<std::string>& argv, const std::string& output_path, const std::string& install_hint,
                double timeout_s = 0);


/// Progress for work that is usually quick but can take seconds (writing a large trace): says
/// `what` on stderr once the work has taken `delay` (never for sub-second work), and how long it
/// took when it ends.
class SlowNotice {
 public:
  explicit SlowNotice(std::string what, std::chrono::milliseconds delay = std::chrono::milliseconds(1000));
  ~SlowNotice();
  SlowNotice(const SlowNotice&) = delete;
  SlowNotice& operator=(const SlowNotice&) = delete;

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, shown_ = false;
  std::thread watcher_;
};

}  // namespace ptdp::cli
