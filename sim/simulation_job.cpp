// SimGrid allows one engine per process, so each reduced or full simulation runs in a forked
// child that sends its result back over a pipe; callers may simulate as often as they like.
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "report/timeline.hpp"
#include "sim/costing.hpp"
#include "sim/platform.hpp"
#include "sim/simgrid_run.hpp"

namespace ptdp {

namespace {

std::string serialize(const SimulationResult& r) {
  nlohmann::json j;
  j["report"] = nlohmann::json::parse(report_to_json(r.report));
  j["warnings"] = r.warnings;
  j["timeline"] = nlohmann::json::parse(timeline_to_json(r.timeline));
  return j.dump();
}

SimulationResult deserialize(const std::string& text, Schedule s) {
  const auto j = nlohmann::json::parse(text);
  SimulationResult r;
  r.report = report_from_json(j["report"].dump(), "simulation");
  r.warnings = j["warnings"].get<std::vector<std::string>>();
  r.timeline = timeline_from_json(j["timeline"].dump(), "simulation");
  r.schedule = std::move(s);
  return r;
}

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// A simulation process's work: the result (or the error) written to `fd`, then exit. Without a
// schedule, the plan's own (make_costed_schedule) is made here.
[[noreturn]] void simulate_and_exit(int fd, const SimulationInput& in, const Schedule* s, Fidelity fidelity, bool keep_timeline,
                                    const PlanCosts* costs) {
  std::string out;
  try {
    const Schedule made = s ? Schedule{} : make_costed_schedule(in.model, in.plan, in.cluster);
    out = "OK" + serialize(run_simgrid_here(in, s ? *s : made, fidelity, keep_timeline, costs));
  } catch (const ConfigError& e) {
    out = std::string("EC") + e.what();
  } catch (const ScheduleError& e) {
    out = std::string("ES") + e.what();
  } catch (const EnvironmentError& e) {
    out = std::string("EE") + e.what();
  } catch (const std::exception& e) {
    out = std::string("EI") + e.what();
  }
  write_all(fd, out);
  ::close(fd);
  std::_Exit(0);
}

// SimulationPool's requests: which input, at which fidelity, with the pipe's write end passed
// along (SCM_RIGHTS).
struct PoolRequest {
  uint64_t index = 0;
  int32_t fidelity = 0;
};

bool send_request(int sock, const PoolRequest& r, int fd) {
  iovec iov{const_cast<PoolRequest*>(&r), sizeof r};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof r);
  }
}

bool receive_request(int sock, PoolRequest& r, int& fd) {
  iovec iov{&r, sizeof r};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  fd = -1;
  for (;;) {
    const ssize_t n = ::recvmsg(sock, &m, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof r)) return false;
    break;
  }
  if (const cmsghdr* c = CMSG_FIRSTHDR(&m); c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return true;
}

bool send_pid(int sock, int32_t pid) {
  for (;;) {
    const ssize_t n = ::send(sock, &pid, sizeof pid, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof pid);
  }
}

// The pool's server: SimGrid's engine and the platform's hosts and links once, then per request
// a simulation process forked from here that becomes the owner's child (double fork: the owner
// is a child-subreaper), whose pid goes back to the owner once it is the owner's.
[[noreturn]] void serve(int sock, const PlatformShape& shape, const std::vector<const SimulationInput*>& inputs,
                        const std::vector<const Schedule*>& schedules, pid_t owner) {
  bool ready = true;
  try {
    prepare_simgrid_platform(shape);
  } catch (const std::exception&) {
    ready = false;  // every request answered -1: the owner forks those plans itself
  }
  for (;;) {
    PoolRequest req;
    int fd = -1;
    if (!receive_request(sock, req, fd)) std::_Exit(0);  // the pool is done (or its owner died)
    int32_t pid = -1;
    int pid_pipe[2];
    if (ready && fd >= 0 && req.index < inputs.size() && inputs[req.index] && ::pipe(pid_pipe) == 0) {
      const pid_t middle = ::fork();
      if (middle == 0) {
        ::close(pid_pipe[0]);
        const pid_t self = ::getpid();
        const pid_t child = ::fork();
        if (child == 0) {
          ::close(pid_pipe[1]);
          ::close(sock);
          // Wait until this process is the owner's (its parent exits at once), then die with it.
          for (pid_t parent = ::getppid(); parent != owner; parent = ::getppid()) {
            if (parent != self) std::_Exit(1);
            ::usleep(20);
          }
          ::prctl(PR_SET_PDEATHSIG, SIGKILL);
          if (::getppid() != owner) std::_Exit(1);
          simulate_and_exit(fd, *inputs[req.index], schedules[req.index], static_cast<Fidelity>(req.fidelity), false, nullptr);
        }
        const int32_t sent = child;
        write_all(pid_pipe[1], std::string(reinterpret_cast<const char*>(&sent), sizeof sent));
        std::_Exit(0);
      }
      ::close(pid_pipe[1]);
      if (middle > 0) {
        int status = 0;
        while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
        }
        // Once the middle process is gone its child is the owner's (reparented as it exited).
        int32_t got = -1;
        if (::read(pid_pipe[0], &got, sizeof got) == static_cast<ssize_t>(sizeof got)) pid = got;
      }
      ::close(pid_pipe[0]);
    }
    if (fd >= 0) ::close(fd);
    if (!send_pid(sock, pid)) std::_Exit(0);
  }
}

}  // namespace

SimulationPool::SimulationPool(std::vector<const SimulationInput*> inputs, std::vector<const Schedule*> schedules)
    : inputs_(std::move(inputs)), schedules_(std::move(schedules)), served_(inputs_.size(), false) {
  schedules_.resize(inputs_.size(), nullptr);
  const SimulationInput* first = nullptr;
  for (const SimulationInput* in : inputs_)
    if (in && !first) first = in;
  if (!first) return;
  const PlatformShape shape = platform_shape(first->cluster, first->plan.gpus());
  size_t same = 0;
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i] && platform_shape(inputs_[i]->cluster, inputs_[i]->plan.gpus()) == shape) {
      served_[i] = true;
      ++same;
    }
  int sv[2];
  if (same < 2 || ::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {  // one plan gains nothing from a server
    served_.assign(served_.size(), false);
    return;
  }
  ::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper_);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t owner = ::getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(sv[0]);
    if (::getppid() != owner) std::_Exit(0);
    serve(sv[1], shape, inputs_, schedules_, owner);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    ::prctl(PR_SET_CHILD_SUBREAPER, was_subreaper_);
    served_.assign(served_.size(), false);
    return;
  }
  server_pid_ = pid;
  socket_ = sv[0];
}

SimulationPool::~SimulationPool() {
  if (socket_ >= 0) ::close(socket_);  // the server exits when it reads the end
  if (server_pid_ > 0)
    while (::waitpid(server_pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  if (server_pid_ > 0) ::prctl(PR_SET_CHILD_SUBREAPER, was_subreaper_);
}

SimulationJob SimulationPool::start(size_t i, Fidelity fidelity) {
  PTDP_ASSERT(i < inputs_.size() && inputs_[i], "SimulationPool::start: no input " + std::to_string(i));
  PTDP_ASSERT(fidelity != Fidelity::Analytic, "SimulationPool runs SimGrid");
  if (serves(i)) {
    int fds[2];
    if (::pipe(fds) != 0) throw EnvironmentError(std::string("cannot create a pipe for the simulation: ") + std::strerror(errno));
    PoolRequest req;
    req.index = i;
    req.fidelity = static_cast<int32_t>(fidelity);
    int32_t pid = -1;
    const bool sent = send_request(socket_, req, fds[1]);
    ::close(fds[1]);
    if (sent) {
      for (;;) {
        const ssize_t n = ::recv(socket_, &pid, sizeof pid, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n != static_cast<ssize_t>(sizeof pid)) pid = -1;
        break;
      }
    }
    if (pid > 0) {
      SimulationJob job;
      job.pid = pid;
      job.fd = fds[0];
      return job;
    }
    // The server could not: this plan and the ones after it are forked here, as without a pool.
    ::close(fds[0]);
    served_.assign(served_.size(), false);
  }
  const SimulationInput& in = *inputs_[i];
  if (schedules_[i]) return start_simulation_job(in, *schedules_[i], fidelity, false, nullptr);
  return start_simulation_job(in, make_costed_schedule(in.model, in.plan, in.cluster), fidelity, false, nullptr);
}

SimulationJob start_simulation_job(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                   const PlanCosts* costs) {
  int fds[2];
  if (::pipe(fds) != 0) throw EnvironmentError(std::string("cannot create a pipe for the simulation: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError(std::string("cannot fork the simulation process: ") + std::strerror(errno));
  if (pid == 0) {
    // Never outlive the ptdp that started it (a sweep stopped by a signal or a timeout).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    simulate_and_exit(fds[1], in, &s, fidelity, keep_timeline, costs);
  }
  ::close(fds[1]);
  SimulationJob job;
  job.pid = pid;
  job.fd = fds[0];
  job.schedule = s;
  return job;
}

bool SimulationJob::read_some() {
  if (fd < 0) return false;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fd = -1;
      return false;
    }
    data.append(buf, static_cast<size_t>(n));
    return true;
  }
}

SimulationResult SimulationJob::finish() {
  while (read_some()) {
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    throw EnvironmentError("the SimGrid simulation process died (signal " + std::to_string(WTERMSIG(status)) + ", " +
                           strsignal(WTERMSIG(status)) + ")");
  if (data.size() < 2) throw EnvironmentError("the SimGrid simulation process ended without a result");
  const std::string tag = data.substr(0, 2), body = data.substr(2);
  if (tag == "OK") return deserialize(body, std::move(schedule));  // once: the result takes the schedule
  if (tag == "EC") throw ConfigError("", body);
  if (tag == "ES") throw ScheduleError(body);
  if (tag == "EE") throw EnvironmentError(body);
  throw InternalError(body);
}

SimulationResult simulate_simgrid(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs) {
  return start_simulation_job(in, s, fidelity, keep_timeline, costs).finish();
}

}  // namespace ptdp
