// SimGrid allows one engine per process, so each reduced or full simulation runs in a forked
// child that sends its result back over a pipe; callers may simulate as often as they like.
#include <sys/prctl.h>
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

SimulationResult deserialize(const std::string& text, const Schedule& s) {
  const auto j = nlohmann::json::parse(text);
  SimulationResult r;
  r.report = report_from_json(j["report"].dump(), "simulation");
  r.warnings = j["warnings"].get<std::vector<std::string>>();
  r.timeline = timeline_from_json(j["timeline"].dump(), "simulation");
  r.schedule = s;
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

}  // namespace

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
    std::string out;
    try {
      out = "OK" + serialize(run_simgrid_here(in, s, fidelity, keep_timeline, costs));
    } catch (const ConfigError& e) {
      out = std::string("EC") + e.what();
    } catch (const ScheduleError& e) {
      out = std::string("ES") + e.what();
    } catch (const EnvironmentError& e) {
      out = std::string("EE") + e.what();
    } catch (const std::exception& e) {
      out = std::string("EI") + e.what();
    }
    write_all(fds[1], out);
    ::close(fds[1]);
    std::_Exit(0);
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
  if (tag == "OK") return deserialize(body, schedule);
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
