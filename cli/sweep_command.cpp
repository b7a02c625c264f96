// `ptdp sweep`: what-if sweeps over parallel plans. Every configuration is evaluated with the
// analytic critical path (threads), the best K again with SimGrid reduced fidelity (child
// processes, --jobs at a time). Under mpirun the configurations are split across ranks and the
// results gathered on rank 0.
#include <mpi.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);
int run_plot_script(const std::string& script, const std::vector<std::string>& args);

namespace {

using nlohmann::json;

struct Candidate {
  std::vector<Override> sets;  // relative to the base scenario
  Scenario scenario;
};

struct Outcome {
  std::vector<Override> sets;
  ParallelPlan plan;
  std::string status;  // ok | oom | error
  std::string error;
  json analytic;       // report JSON
  json reduced;        // report JSON (top K), or null
};

std::string label_of(const ParallelPlan& p) {
  std::ostringstream o;
  o << "t" << p.tensor << " p" << p.pipeline << " d" << p.data << " b" << p.micro_batch << " " << to_string(p.schedule);
  if (p.schedule == ScheduleKind::Interleaved) o << " v" << p.virtual_stages;
  o << " rc-" << to_string(p.recompute);
  if (p.partition == Partition::Balanced) o << " balanced";
  return o.str();
}

// Counts rule violations by key and message with the numbers taken out.
std::string reason_of(const ConfigError& e) {
  // Numbers standing alone become N ("p2p" keeps its digit).
  const std::string& in = e.message();
  std::string msg;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool digit = std::isdigit(static_cast<unsigned char>(in[i]));
    const bool in_word = i > 0 && std::isalpha(static_cast<unsigned char>(in[i - 1]));
    if (digit && !in_word) {
      msg += 'N';
      while (i + 1 < in.size() && (std::isdigit(static_cast<unsigned char>(in[i + 1])) || in[i + 1] == '.')) ++i;
    } else {
      msg += in[i];
    }
  }
  return e.key_path() + ": " + msg;
}

// A progress bar on stderr: redrawn in place on a terminal, a line per quarter otherwise.
class Progress {
 public:
  Progress(const char* what, size_t total, bool enabled)
      : what_(what), total_(total), enabled_(enabled), tty_(::isatty(2) != 0) {}
  void tick(size_t done) {
    if (!enabled_ || done == reported_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    if (!tty_) {
      if (done < total_ && 4 * done / std::max<size_t>(1, total_) == 4 * reported_ / std::max<size_t>(1, total_)) return;
      std::fprintf(stderr, "%-9s %zu/%zu\n", what_, done, total_);
      reported_ = done;
      return;
    }
    reported_ = done;
    last_ = now;
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r%-9s [%s%s] %zu/%zu", what_, std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total_);
    if (done >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  const char* what_;
  size_t total_;
  bool enabled_;
  bool tty_;
  size_t reported_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// Every (tensor, pipeline, data, micro_batch, virtual_stages, schedule, recompute) of the
// scenario's model, GPU count and global batch; invalid ones are counted by reason.
std::vector<Candidate> auto_candidates(const Scenario& base, std::map<std::string, size_t>& invalid) {
  std::vector<Candidate> out;
  const int64_t n = base.gpus, B = base.plan.global_batch, l = base.model.num_layers;
  const ComputeProfile gpu = compute_profile(base.cluster);
  for (int64_t t : divisors(n, n))
    for (int64_t p : divisors(n / t, l)) {
      const int64_t d = n / (t * p);
      for (int64_t b : divisors(B, B))
        for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
          std::vector<int64_t> vs = {1};
          if (kind == ScheduleKind::Interleaved) {
            vs.clear();
            for (int64_t v : divisors(l, l))
              if (v >= 2) vs.push_back(v);
          }
          for (int64_t v : vs)
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
            for (Partition part : {Partition::Uniform, Partition::Balanced}) {
              // The partition is chosen too: uniform where p·v divides the layers, balanced always
              // (when it differs from uniform). The scenario's own partition keys give way.
              if (part == Partition::Balanced && p == 1) continue;
              Candidate c{{}, base};
              ParallelPlan& plan = c.scenario.plan;
              plan.layers_per_stage.clear();
              plan.first_stage_layers = plan.last_stage_layers = 0;
              plan.partition = part;
              plan.tensor = t;
              plan.pipeline = p;
              plan.data = d;
              plan.micro_batch = b;
              plan.schedule = kind;
              plan.virtual_stages = v;
              plan.recompute = rc;
              plan.microbatch_group = 0;
              try {
                validate_plan(c.scenario.model, plan, n);
              } catch (const ConfigError& e) {
                ++invalid[reason_of(e)];
                continue;
              }
              resolve_partition(c.scenario.model, plan, gpu);
              if (part == Partition::Balanced && l % (p * v) == 0 &&
                  plan.balanced_layers == std::vector<int64_t>(static_cast<size_t>(p * v), l / (p * v)))
                continue;  // the same plan as uniform
              c.sets = {{"parallel.tensor", std::to_string(t)},        {"parallel.pipeline", std::to_string(p)},
                        {"parallel.data", std::to_string(d)},          {"training.micro_batch", std::to_string(b)},
                        {"parallel.schedule", to_string(kind)},        {"parallel.virtual_stages", std::to_string(v)},
                        {"parallel.recompute", to_string(rc)},         {"parallel.partition", to_string(part)}};
              if (!base.plan.layers_per_stage.empty()) c.sets.push_back({"parallel.layers_per_stage", "[]"});
              if (base.plan.first_stage_layers != 0) c.sets.push_back({"parallel.first_stage_layers", "0"});
              if (base.plan.last_stage_layers != 0) c.sets.push_back({"parallel.last_stage_layers", "0"});
              c.scenario.config_json = scenario_config_json(c.scenario, c.sets);  // the plan changed
              out.push_back(std::move(c));
            }
        }
    }
  return out;
}

std::vector<Candidate> vary_candidates(const ScenarioArgs& args, const std::vector<std::string>& vary,
                                       std::map<std::string, size_t>& invalid) {
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  const auto& keys = scenario_keys();
  for (const auto& v : vary) {
    const auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--vary", "expects KEY=V1,V2,… e.g. --vary parallel.tensor=1,2,4,8 (got '" + v + "')");
    const std::string key = v.substr(0, eq);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      throw ConfigError(key, "--vary: unknown key" + did_you_mean(key, keys));
    std::vector<std::string> values;
    std::stringstream ss(v.substr(eq + 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) throw ConfigError(key, "--vary: empty value in '" + v + "'");
      values.push_back(item);
    }
    if (values.empty()) throw ConfigError(key, "--vary: no values in '" + v + "'");
    axes.emplace_back(key, values);
  }
  const auto base_sets = overrides_of(args);
  std::vector<Candidate> out;
  std::vector<size_t> idx(axes.size(), 0);
  for (;;) {
    std::vector<Override> sets;
    for (size_t a = 0; a < axes.size(); ++a) sets.push_back({axes[a].first, axes[a].second[idx[a]]});
    std::vector<Override> all = base_sets;
    all.insert(all.end(), sets.begin(), sets.end());
    // (A scenario that leaves parallel.data out gets data = gpus / (t·p) for each combination.)
    try {
      out.push_back(Candidate{sets, load_scenario(args.path, all)});
    } catch (const ConfigError& e) {
      if (!e.is_rule_violation()) throw;  // a malformed value stops the sweep, naming the key
      ++invalid[reason_of(e)];
    }
    size_t a = 0;
    while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
    if (a == axes.size()) break;
  }
  return out;
}

json evaluate_analytic(const Candidate& c, Outcome& out) {
  const Scenario& sc = c.scenario;
  SimulationInput in{sc.model, sc.plan, sc.cluster, sc.train_tokens, sc.config_json};
  // Memory first, from the schedule's in-flight counts: plans that do not fit are not simulated.
  Schedule s;
  switch (sc.plan.schedule) {
    case ScheduleKind::GPipe: s = make_gpipe(sc.plan.pipeline, sc.plan.num_microbatches()); break;
    case ScheduleKind::OneFOneB: s = make_1f1b(sc.plan.pipeline, sc.plan.num_microbatches()); break;
    case ScheduleKind::Interleaved:
      s = make_interleaved(sc.plan.pipeline, sc.plan.virtual_stages, sc.plan.num_microbatches(),
                           GeneratorOptions{static_cast<int>(sc.plan.microbatch_group)});
      break;
  }
  const auto mem = peak_memory(memory_per_rank(sc.model, sc.plan, peak_inflight_activations(s)));
  if (mem.total_bytes > sc.cluster.gpu.memory_bytes) {
    out.status = "oom";
    return json{{"peak_memory_bytes", mem.total_bytes}, {"fits_in_memory", false}, {"gpus", sc.gpus},
                {"gpu_memory_bytes", sc.cluster.gpu.memory_bytes}};
  }
  out.status = "ok";
  return json::parse(report_to_json(simulate(in, Fidelity::Analytic, false).report));
}

std::string key_of(const std::vector<Override>& sets) {
  std::string k;
  for (const auto& s : sets) k += s.key + "=" + s.value + ";";
  return k;
}

std::string serialize(const std::vector<Outcome>& outs) {
  json j = json::array();
  for (const auto& o : outs) {
    json sets = json::array();
    for (const auto& s : o.sets) sets.push_back({s.key, s.value});
    const ParallelPlan& p = o.plan;
    j.push_back({{"sets", sets},
                 {"status", o.status},
                 {"error", o.error},
                 {"analytic", o.analytic},
                 {"reduced", o.reduced},
                 {"plan", {p.tensor, p.pipeline, p.data, p.micro_batch, p.virtual_stages, static_cast<int>(p.schedule),
                           static_cast<int>(p.recompute), p.global_batch, static_cast<int>(p.partition)}}});
  }
  return j.dump();
}

void deserialize_into(const std::string& text, std::vector<Outcome>& outs) {
  for (const auto& e : json::parse(text)) {
    Outcome o;
    for (const auto& s : e["sets"]) o.sets.push_back({s[0], s[1]});
    o.status = e["status"];
    o.error = e["error"];
    o.analytic = e["analytic"];
    o.reduced = e["reduced"];
    const auto& p = e["plan"];
    o.plan.tensor = p[0];
    o.plan.pipeline = p[1];
    o.plan.data = p[2];
    o.plan.micro_batch = p[3];
    o.plan.virtual_stages = p[4];
    o.plan.schedule = static_cast<ScheduleKind>(p[5].get<int>());
    o.plan.recompute = static_cast<Recompute>(p[6].get<int>());
    o.plan.global_batch = p[7];
    o.plan.partition = static_cast<Partition>(p[8].get<int>());
    outs.push_back(std::move(o));
  }
}

// Gathers each rank's string on rank 0 (returned there in rank order; elsewhere empty).
std::vector<std::string> gather_strings(const std::string& mine, int rank, int size) {
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), displs(size);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < size; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

double num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN; }

}  // namespace

void add_sweep(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("sweep", "rank parallel plans by predicted throughput (what-if sweeps)");
  static ScenarioArgs args;
  static std::vector<std::string> vary;
  static bool automatic = false;
  static int top = 10, jobs = 0;
  static std::string fidelity = "reduced", csv_path, plot_path;
  add_scenario_args(cmd, args, true);
  cmd->add_option("--vary", vary, "sweep a key over values, e.g. --vary parallel.tensor=1,2,4,8 (repeatable; cartesian product)")
      ->type_name("KEY=V1,V2,…");
  cmd->add_flag("--auto", automatic,
                "every valid (tensor, pipeline, data, micro_batch, virtual_stages, schedule, recompute) for the "
                "scenario's model, GPU count and global batch");
  cmd->add_option("--top", top, "re-simulate the best K with --fidelity")->capture_default_str()->check(CLI::Range(0, 100000));
  cmd->add_option("--fidelity", fidelity, "fidelity of the top-K runs: reduced, full or analytic (no re-run)")->capture_default_str();
  cmd->add_option("--jobs", jobs, "simulations at once (default: number of cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--csv", csv_path, "write one row per configuration with every report key");
  cmd->add_option("--plot", plot_path, "write a PNG chart: throughput by (t, p) for each micro batch size");
  cmd->callback([&run] {
    run = [] {
      // Distributed when launched by mpirun.
      const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
      int rank = 0, size = 1;
      if (under_mpi) {
        MPI_Init(nullptr, nullptr);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
      }
      struct Finalize {
        bool on;
        ~Finalize() {
          if (on) MPI_Finalize();
        }
      } finalize{under_mpi};
      const Fidelity top_fidelity = parse_fidelity(fidelity);
      if (!automatic && vary.empty()) throw ConfigError("--vary", "give --vary KEY=V1,V2,… or --auto");
      const auto t0 = std::chrono::steady_clock::now();
      const Scenario base = load_scenario(args.path, overrides_of(args));

      std::map<std::string, size_t> invalid;
      std::vector<Candidate> cands = automatic ? auto_candidates(base, invalid) : vary_candidates(args, vary, invalid);
      if (automatic && !vary.empty()) {
        std::map<std::string, size_t> more;
        auto extra = vary_candidates(args, vary, more);
        for (auto& c : extra) cands.push_back(std::move(c));
        for (auto& [k, v] : more) invalid[k] += v;
      }
      size_t invalid_total = 0;
      for (const auto& [k, v] : invalid) invalid_total += v;
      if (cands.empty()) {
        std::ostringstream msg;
        msg << "no valid configuration among " << invalid_total << " (skipped by reason:";
        for (const auto& [k, v] : invalid) msg << "\n  " << v << " × " << k;
        msg << ")";
        throw ConfigError("--vary", msg.str());
      }

      // Analytic phase: this rank's share, on threads.
      std::vector<size_t> mine;
      for (size_t i = rank; i < cands.size(); i += size) mine.push_back(i);
      std::vector<Outcome> local(mine.size());
      const int threads = std::max(1, jobs > 0 ? jobs : static_cast<int>(std::thread::hardware_concurrency()));
      std::atomic<size_t> next{0}, done{0};
      Progress bar("analytic", mine.size(), rank == 0);
      std::mutex bar_mutex;
      auto worker = [&] {
        for (size_t k; (k = next++) < mine.size();) {
          Outcome& o = local[k];
          const Candidate& c = cands[mine[k]];
          o.sets = c.sets;
          o.plan = c.scenario.plan;
          try {
            o.analytic = evaluate_analytic(c, o);
          } catch (const std::exception& e) {
            o.status = "error";
            o.error = e.what();
          }
          ++done;
          if (rank == 0 && bar_mutex.try_lock()) {
            bar.tick(done);
            bar_mutex.unlock();
          }
        }
      };
      std::vector<std::thread> pool;
      for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
      for (auto& th : pool) th.join();
      bar.tick(mine.size());
      const double analytic_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      std::vector<Outcome> outs;
      if (size > 1) {
        const auto parts = gather_strings(serialize(local), rank, size);
        for (const auto& p : parts) deserialize_into(p, outs);
      } else {
        outs = std::move(local);
      }
      // Rank by analytic throughput; the top K again at the chosen fidelity.
      std::vector<size_t> order;
      for (size_t i = 0; i < outs.size(); ++i)
        if (outs[i].status == "ok") order.push_back(i);
      // Ties (e.g. GPipe and 1F1B often take the same time) break by configuration, so the
      // ranking does not depend on how the work was split across ranks.
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const double ta = num(outs[a].analytic, "tokens_per_s"), tb = num(outs[b].analytic, "tokens_per_s");
        return ta != tb ? ta > tb : key_of(outs[a].sets) < key_of(outs[b].sets);
      });
      // Only rank 0 holds every outcome; the others learn the top K from its broadcast below.
      size_t k = top_fidelity == Fidelity::Analytic ? 0 : std::min<size_t>(top, order.size());
      {
        std::vector<size_t> my_top;
        for (size_t i = rank; i < k; i += size) my_top.push_back(order[i]);
        if (size > 1) {
          // Every rank needs the outcomes it re-runs: broadcast the ranking from rank 0.
          std::string ranking = rank == 0 ? serialize([&] {
            std::vector<Outcome> v;
            for (size_t i = 0; i < k; ++i) v.push_back(outs[order[i]]);
            return v;
          }())
                                          : std::string();
          int len = static_cast<int>(ranking.size());
          MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
          ranking.resize(len);
          MPI_Bcast(ranking.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
          if (rank != 0) {
            outs.clear();
            deserialize_into(ranking, outs);
            k = outs.size();
            order.clear();
            for (size_t i = 0; i < outs.size(); ++i) order.push_back(i);
            my_top.clear();
            for (size_t i = rank; i < k; i += size) my_top.push_back(order[i]);
          }
        }
        Progress bar2(to_string(top_fidelity).c_str(), my_top.size(), rank == 0 && !my_top.empty());
        std::vector<SimulationJob> running;
        std::vector<size_t> running_idx;
        size_t started = 0, finished = 0;
        const size_t parallel = static_cast<size_t>(std::max(1, jobs > 0 ? jobs : static_cast<int>(std::thread::hardware_concurrency())));
        auto scenario_of = [&](const Outcome& o) {
          std::vector<Override> all = overrides_of(args);
          all.insert(all.end(), o.sets.begin(), o.sets.end());
          return load_scenario(args.path, all);
        };
        while (finished < my_top.size()) {
          while (started < my_top.size() && running.size() < parallel) {
            Outcome& o = outs[my_top[started]];
            try {
              const Scenario sc = scenario_of(o);
              SimulationInput in{sc.model, sc.plan, sc.cluster, sc.train_tokens, sc.config_json};
              running.push_back(start_simulation(in, top_fidelity, false));
              running_idx.push_back(my_top[started]);
            } catch (const std::exception& e) {
              o.reduced = json{{"error", e.what()}};
              ++finished;
            }
            ++started;
          }
          if (running.empty()) continue;
          std::vector<pollfd> fds;
          for (auto& j : running) fds.push_back(pollfd{j.fd, POLLIN, 0});
          ::poll(fds.data(), fds.size(), 500);
          for (size_t i = 0; i < running.size();) {
            if (fds.size() > i && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !running[i].read_some()) {
              Outcome& o = outs[running_idx[i]];
              try {
                o.reduced = json::parse(report_to_json(running[i].finish().report));
              } catch (const std::exception& e) {
                o.reduced = json{{"error", e.what()}};  // reported for this configuration; the sweep goes on
              }
              running.erase(running.begin() + static_cast<long>(i));
              running_idx.erase(running_idx.begin() + static_cast<long>(i));
              fds.erase(fds.begin() + static_cast<long>(i));
              ++finished;
              bar2.tick(finished);
              continue;
            }
            ++i;
          }
        }
        if (size > 1) {
          std::vector<Outcome> top_local;
          for (size_t i : my_top) top_local.push_back(outs[i]);
          const auto parts = gather_strings(serialize(top_local), rank, size);
          if (rank == 0) {
            std::vector<Outcome> back;
            for (const auto& p : parts) deserialize_into(p, back);
            for (auto& b : back)
              for (size_t i = 0; i < k; ++i)
                if (key_of(outs[order[i]].sets) == key_of(b.sets)) outs[order[i]].reduced = b.reduced;
          }
        }
      }
      if (rank != 0) return 0;
      const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      // Table.
      size_t oom = 0, errors = 0;
      for (const auto& o : outs) {
        oom += o.status == "oom";
        errors += o.status == "error";
      }
      std::printf("ptdp sweep: %s on %lld × %s — %zu valid configurations (%zu ranked, %zu do not fit in %s, %zu failed), "
                  "%zu invalid skipped\n",
                  base.model.name.c_str(), static_cast<long long>(base.gpus), base.cluster.gpu.name.c_str(), outs.size(),
                  order.size(), oom, format_bytes(base.cluster.gpu.memory_bytes).c_str(), errors, invalid_total);
      for (const auto& [reason, count] : invalid) std::printf("  skipped %6zu × %s\n", count, reason.c_str());
      std::printf("  analytic: %zu configurations in %.2f s (%.0f per second%s; %zu critical paths, %zu memory checks only)\n",
                  outs.size(), analytic_s, outs.size() / analytic_s, size > 1 ? ", all ranks" : "", order.size() + errors,
                  oom);
      const size_t shown = std::min<size_t>(order.size(), std::max<size_t>(static_cast<size_t>(top), 10));
      std::printf("\n  %4s  %-40s %11s %11s %10s %8s %9s  %s\n", "rank", "configuration", "analytic", to_string(top_fidelity).c_str(),
                  "iteration", "bubble", "memory", "bottleneck");
      std::printf("  %4s  %-40s %11s %11s %10s %8s %9s\n", "", "", "TFLOP/s/GPU", "TFLOP/s/GPU", "s", "%", "GB/GPU");
      // Final order: re-simulated configurations by their refined throughput, then the rest.
      std::vector<size_t> final_order(order.begin(), order.end());
      std::stable_sort(final_order.begin(), final_order.begin() + static_cast<long>(k), [&](size_t a, size_t b) {
        return num(outs[a].reduced, "tokens_per_s") > num(outs[b].reduced, "tokens_per_s");
      });
      for (size_t i = 0; i < shown; ++i) {
        const Outcome& o = outs[final_order[i]];
        const json& r = o.reduced.is_object() && o.reduced.contains("iteration_time_s") ? o.reduced : o.analytic;
        char refined[32] = "-";
        if (o.reduced.is_object() && o.reduced.contains("tflops_per_gpu"))
          std::snprintf(refined, sizeof refined, "%.1f", num(o.reduced, "tflops_per_gpu"));
        else if (o.reduced.is_object() && o.reduced.contains("error"))
          std::snprintf(refined, sizeof refined, "failed");
        std::printf("  %4zu  %-40s %11.1f %11s %10.3f %8.1f %9.1f  %s\n", i + 1, label_of(o.plan).c_str(),
                    num(o.analytic, "tflops_per_gpu"), refined, num(r, "iteration_time_s"), 100 * num(r, "bubble_fraction"),
                    num(r, "peak_memory_bytes") / 1e9, r.value("bottleneck", "").c_str());
        if (o.reduced.is_object() && o.reduced.contains("error"))
          std::printf("        %s failed: %s\n", to_string(top_fidelity).c_str(), o.reduced["error"].get<std::string>().c_str());
      }
      std::printf("  total %.1f s\n", total_s);

      if (!csv_path.empty()) {
        std::ofstream csv(csv_path);
        if (!csv) throw EnvironmentError("cannot write '" + csv_path + "'");
        const std::vector<std::string> cols = {"iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction",
                                               "peak_memory_bytes", "gpu_memory_bytes", "fits_in_memory", "tokens_per_s",
                                               "training_days", "parameters", "gpus", "bottleneck", "fidelity"};
        csv << "rank,status,tensor,pipeline,data,micro_batch,virtual_stages,schedule,recompute,overrides";
        for (const auto& c : cols) csv << "," << c;
        csv << ",exposed_tp_s,exposed_pp_s,exposed_dp_s";
        for (const auto& c : cols) csv << ",refined_" << c;
        csv << ",error\n";
        std::map<size_t, size_t> rank_of;
        for (size_t i = 0; i < final_order.size(); ++i) rank_of[final_order[i]] = i + 1;
        // Rows: ranked configurations first, then the rest by configuration.
        std::vector<size_t> rows(final_order.begin(), final_order.end());
        std::vector<size_t> rest;
        for (size_t i = 0; i < outs.size(); ++i)
          if (!rank_of.count(i)) rest.push_back(i);
        std::sort(rest.begin(), rest.end(), [&](size_t a, size_t b) { return key_of(outs[a].sets) < key_of(outs[b].sets); });
        rows.insert(rows.end(), rest.begin(), rest.end());
        for (size_t i : rows) {
          const Outcome& o = outs[i];
          const ParallelPlan& plan = o.plan;
          std::string sets;
          for (const auto& s : o.sets) sets += (sets.empty() ? "" : ";") + s.key + "=" + s.value;
          csv << (rank_of.count(i) ? std::to_string(rank_of[i]) : "") << "," << o.status << "," << plan.tensor << ","
              << plan.pipeline << "," << plan.data << "," << plan.micro_batch << "," << plan.virtual_stages << ","
              << to_string(plan.schedule) << "," << to_string(plan.recompute) << ",\"" << sets << "\"";
          auto cell = [&](const json& j, const std::string& c) {
            if (!j.is_object() || !j.contains(c) || j[c].is_null()) return std::string();
            if (j[c].is_string()) return j[c].get<std::string>();
            if (j[c].is_boolean()) return std::string(j[c].get<bool>() ? "true" : "false");
            std::ostringstream v;
            v.precision(10);
            v << j[c].get<double>();
            return v.str();
          };
          for (const auto& c : cols) csv << "," << cell(o.analytic, c);
          for (const char* cls : {"tp", "pp", "dp"}) {
            csv << ",";
            if (o.analytic.is_object() && o.analytic.contains("exposed_comm_s")) csv << o.analytic["exposed_comm_s"].value(cls, 0.0);
          }
          for (const auto& c : cols) csv << "," << cell(o.reduced, c);
          std::string err = o.error.empty() && o.reduced.is_object() && o.reduced.contains("error")
                                ? o.reduced["error"].get<std::string>()
                                : o.error;
          std::replace(err.begin(), err.end(), '"', '\'');
          csv << ",\"" << err << "\"\n";
        }
        csv.close();  // complete on disk before the plot script reads it
        if (!csv) throw EnvironmentError("failed writing '" + csv_path + "'");
        std::fprintf(stderr, "wrote %zu rows to %s\n", outs.size(), csv_path.c_str());
        if (!plot_path.empty()) {
          const int rc = run_plot_script("plot_sweep.py", {csv_path, plot_path, base.model.name + " on " + std::to_string(base.gpus) + " GPUs"});
          if (rc != 0) throw EnvironmentError("plot script failed (exit " + std::to_string(rc) + ")");
        }
      } else if (!plot_path.empty()) {
        throw ConfigError("--plot", "needs --csv FILE (the chart is drawn from the CSV)");
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
