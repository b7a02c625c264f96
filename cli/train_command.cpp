// `mpirun -np N ptdp train SCENARIO …`: real training of the scenario's plan on the executor.
#include <fstream>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/process.hpp"
#include "core/error.hpp"
#include "exec/runtime/mpi_communicator.hpp"
#include "exec/train.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);

namespace {

void write_text(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path);
  if (!out) throw EnvironmentError(std::string("cannot write ") + what + " '" + path + "'");
  out << text;
  if (!out) throw EnvironmentError(std::string("failed writing ") + what + " '" + path + "'");
}

}  // namespace

void add_train(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("train", "train the scenario's model for real: mpirun -np N ptdp train SCENARIO (N = t·p·d)");
  static ScenarioArgs args;
  static exec::TrainOptions opt;
  static std::string json_path, trace_path, schedule_path;
  add_scenario_args(cmd, args, true);
  cmd->add_option("--schedule", schedule_path, kScheduleHelp)->type_name("FILE.csv");
  cmd->add_option("--backend", opt.backend, "cpu (Eigen + MPI) or cuda (cuBLAS + NCCL)")->capture_default_str();
  cmd->add_option("--steps", opt.steps, "iterations (a resumed run continues up to this count)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100'000'000}));
  cmd->add_option("--seed", opt.seed, "initialisation and data-sampling seed (same seed → same run for any t, p, d)")
      ->capture_default_str();
  cmd->add_option("--data", opt.data_path, "training data: any file as bytes (vocab 256), or a PTDPTOK1 token file");
  cmd->add_option("--checkpoint", opt.checkpoint_dir, "checkpoint directory");
  cmd->add_option("--save-every", opt.save_every, "save every K iterations (and always after the last)")
      ->check(CLI::Range(int64_t{0}, int64_t{100'000'000}));
  cmd->add_flag("--resume", opt.resume, "continue from the checkpoint directory's latest checkpoint");
  cmd->add_option("--init", opt.init_path,
                  "start from these weights: a safetensors state dict with Megatron-LM's names and shapes (a checkpoint's "
                  "model.safetensors) or a Hugging Face GPT-2 or Llama/Mistral model.safetensors (F32/F16/BF16; names, QKV and "
                  "gate/up packing converted); the optimizer starts afresh")
      ->type_name("FILE.safetensors");
  cmd->add_flag("--overwrite", opt.overwrite,
                "start afresh in a checkpoint directory holding another run's checkpoint (replaced at the first save)");
  cmd->add_option("--lr", opt.adam.lr, "Adam learning rate, in (0, 10]")->capture_default_str();
  // fp16's dynamic loss scaling, with Megatron-LM's flags and defaults.
  cmd->add_option("--initial-loss-scale", opt.loss_scaling.initial_scale, "fp16: the first loss scale")->capture_default_str();
  cmd->add_option("--min-loss-scale", opt.loss_scaling.min_scale, "fp16: the loss scale never backs off below this")
      ->capture_default_str();
  cmd->add_option("--loss-scale-window", opt.loss_scaling.growth_interval,
                  "fp16: clean steps in a row after which the loss scale doubles")
      ->capture_default_str();
  cmd->add_option("--hysteresis", opt.loss_scaling.hysteresis,
                  "fp16: gradient overflows (each a skipped step) before the loss scale halves")
      ->capture_default_str();
  cmd->add_option("--comm-timeout", opt.comm_timeout_s,
                  "seconds a blocking transfer may make no progress before the run stops (dead or hung peer)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1e6));
  cmd->add_option("--json", json_path, "write the measured report (with losses) as JSON")->type_name("FILE");
  cmd->add_option("--trace", trace_path, "write a Chrome trace of the last iteration, every rank")->type_name("FILE");
  cmd->add_option("--comm-ledger", opt.comm_ledger_path,
                  "write what each rank's process groups sent in the first iteration, per action, to "
                  "PREFIX.rank<N>.json (compared with the lowering of communication by `ctest -R Conformance`)")
      ->type_name("PREFIX");
  cmd->add_flag("--speed-probe", opt.speed_probe,
                "CPU back end: time a fixed GEMM on every rank before the run and after each iteration, into the report (speed_probe_gemm_s, the median; "
                "validate sets it against the profile's)");
  cmd->callback([&run] {
    run = [] {
      exec::MpiSession mpi(nullptr, nullptr);
      try {
        const Scenario sc = load_scenario(args.path, overrides_of(args));
        if (opt.resume && opt.checkpoint_dir.empty()) throw ConfigError("--resume", "needs --checkpoint DIR");
        if (opt.save_every > 0 && opt.checkpoint_dir.empty()) throw ConfigError("--save-every", "needs --checkpoint DIR");
        if (opt.speed_probe && opt.backend != "cpu")
          throw ConfigError("--speed-probe", "times the CPU executor's kernels: use it with --backend cpu, not " + opt.backend);
        const bool rank0 = mpi.rank() == 0;
        // The executor runs the hidden and embedding dropout (masks drawn by position, the same
        // in every layout), not the attention probabilities' dropout: said, not hidden.
        if (rank0 && sc.model.has_dropout())
          std::cerr << "ptdp: note: the executor runs model.dropout " << sc.model.dropout_rate()
                    << " on the embedding and each block's output, not on the attention probabilities (simulated: "
                       "that kernel's mask is in the prediction)"
                    << std::endl;
        // Megatron's other recompute modules change memory and time, not the arithmetic: the
        // executor's selective recompute re-runs the attention core only. Said, not hidden.
        if (rank0 && sc.plan.recompute == Recompute::Selective && sc.plan.recompute_modules != kRecomputeCoreAttn)
          std::cerr << "ptdp: note: the executor's selective recompute re-runs the attention core only; parallel.recompute_modules ["
                    << recompute_modules_string(sc.plan.recompute_modules)
                    << "] is priced by the simulator (the same training: its memory and time are those of [core_attn])" << std::endl;
        if (!schedule_path.empty()) {
          // Checked against the plan here too, so that bad input is a located error on every rank.
          opt.schedule = schedule_of(sc, schedule_path);
          opt.schedule_source = schedule_path;
        } else if (is_zero_bubble(sc.plan.schedule)) {
          opt.schedule = schedule_of(sc, "");  // placed from this scenario's costed times, as the simulator does
          opt.schedule_source = to_string(sc.plan.schedule) + " (costed)";
        }
        opt.progress = [](const std::string& line) { std::cerr << line << std::endl; };
        // Cost and energy of the measured run: the scenario's token budget, topology power, prices.
        opt.train_tokens = sc.train_tokens;
        opt.energy = energy_and_price(sc.cluster, sc.gpu_hour_usd, sc.energy_usd_per_kwh);
        Timeline timeline;
        Report r = exec::train(sc.model, sc.plan, opt, trace_path.empty() ? nullptr : &timeline);
        r.config_json = sc.config_json;
        r.schedule = schedule_path.empty() ? to_string(sc.plan.schedule) + " (generated)" : schedule_path;
        check_report(r);
        if (rank0) {
          std::string layout = "t " + std::to_string(sc.plan.tensor);
          if (sc.plan.context > 1) layout += " · cp " + std::to_string(sc.plan.context);
          layout += " · p " + std::to_string(sc.plan.pipeline) + " · d " + std::to_string(sc.plan.data);
          if (sc.plan.expert > 1) layout += " (ep " + std::to_string(sc.plan.expert) + ")";
          std::printf("ptdp train: %s, %lld steps on %d ranks (%s, %s), backend %s\n", sc.model.name.c_str(),
                      static_cast<long long>(r.losses.size()), mpi.size(), layout.c_str(), r.schedule.c_str(),
                      opt.backend.c_str());
          if (!r.losses.empty())
            std::printf("  loss               %.4f → %.4f\n", r.losses.front(), r.losses.back());
          std::printf("  iteration time     %.4f s (median, first step excluded)\n", r.iteration_time_s);
          std::printf("  throughput         %.0f tokens/s, %.2f GFLOP/s per rank\n", r.tokens_per_s, r.tflops_per_gpu * 1e3);
          std::printf("  pipeline bubble    %.1f%% of iteration time\n", 100 * r.bubble_fraction);
          if (sc.plan.zero_stage > 0)
            std::printf("  sharding           zero stage %d over %lld data-parallel ranks (%s group), offload %s\n",
                        sc.plan.zero_stage, static_cast<long long>(sc.plan.sharding_degree()),
                        to_string(sc.plan.sharding_group).c_str(), to_string(sc.plan.offload).c_str());
          std::printf("  peak memory        %.1f MB per rank (device allocator high-water mark, most on any rank)\n",
                      r.peak_memory_bytes / 1e6);
          if (r.extra.count("host_memory_measured_bytes") && r.extra.at("host_memory_measured_bytes") > 0)
            std::printf("  offloaded states   %.1f MB of host memory per rank\n", r.extra.at("host_memory_measured_bytes") / 1e6);
          if (!json_path.empty()) write_text(json_path, report_to_json(r) + "\n", "JSON report");
          if (!trace_path.empty()) {
            const SlowNotice notice("writing the trace " + trace_path + " (" + std::to_string(timeline.events.size()) + " events)");
            write_chrome_trace(timeline, trace_path);
          }
        }
        return 0;
      } catch (const exec::CommunicationError& e) {
        std::cerr << "ptdp: error (rank " << mpi.rank() << "): " << e.what() << std::endl;
        mpi.abort(1);
      } catch (const ConfigError& e) {
        if (mpi.rank() == 0) std::cerr << "ptdp: error: " << e.what() << std::endl;
        return 2;
      } catch (const std::exception& e) {
        if (mpi.rank() == 0) std::cerr << "ptdp: error: " << e.what() << std::endl;
        return 1;
      }
    };
  });
}

}  // namespace ptdp::cli
