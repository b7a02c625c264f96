#include "cli/process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.hpp"

namespace ptdp::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;
extern "C" void remember_signal(int sig) { g_signal = sig; }

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

// Kills the child's process group: SIGTERM, then SIGKILL after a grace period.
void kill_group(pid_t pid, int& status) {
  ::kill(-pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ::kill(-pid, SIGKILL);  // stragglers of the group (ranks mpirun did not reap)
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

int run_program(const std::vector<std::string>& argv_s, const std::string& output_path, const std::string& install_hint,
                double timeout_s) {
  std::vector<std::string> args = argv_s;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError("cannot start " + args[0] + ": " + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);                        // its own group: killed as a whole
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);     // …and when ptdp dies without cleaning up
    if (::getppid() != parent) std::_Exit(128 + SIGTERM);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, 0);
      ::close(null_fd);
    }
    if (!output_path.empty()) {
      const int fd = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    ::execvp(argv[0], argv.data());
    std::_Exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent: no race with the kill below

  // While the child runs, SIGINT/SIGTERM/SIGHUP are remembered and forwarded to its group.
  struct sigaction on{}, old[3];
  on.sa_handler = remember_signal;
  sigemptyset(&on.sa_mask);
  g_signal = 0;
  for (int i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &on, &old[i]);
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (g_signal != 0) {
      kill_group(pid, status);
      break;
    }
    if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      timed_out = true;
      kill_group(pid, status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &old[i], nullptr);
  if (g_signal != 0) {
    const int sig = g_signal;
    g_signal = 0;
    std::fprintf(stderr, "ptdp: interrupted: stopped %s and its process group\n", args[0].c_str());
    std::raise(sig);  // the previous disposition (default: ptdp dies of the same signal)
  }
  if (timed_out)
    throw EnvironmentError(args[0] + " ran longer than " + std::to_string(static_cast<long long>(timeout_s)) +
                           " s (--timeout): its process group was killed");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) throw EnvironmentError(args[0] + " not found: " + install_hint);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace ptdp::cli

namespace ptdp::cli {

SlowNotice::SlowNotice(std::string what, std::chrono::milliseconds delay)
    : what_(std::move(what)), start_(std::chrono::steady_clock::now()) {
  watcher_ = std::thread([this, delay] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, delay, [this] { return done_; })) return;
    shown_ = true;
    std::fprintf(stderr, "ptdp: %s…\n", what_.c_str());
  });
}

SlowNotice::~SlowNotice() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
  watcher_.join();
  if (shown_)
    std::fprintf(stderr, "ptdp: %s: done in %.1f s\n", what_.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

}  // namespace ptdp::cli
