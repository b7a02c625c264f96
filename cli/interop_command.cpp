// `ptdp import megatron|deepspeed`, `ptdp export megatron`, `ptdp keys`: configurations of
// Megatron-LM and DeepSpeed in and out, and the table of every scenario key.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "interop/interop.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);

namespace {

// Launch scripts (and the files they source) are a few kilobytes; a larger one is not a script.
constexpr uint64_t kMaxLaunchScriptBytes = uint64_t{1} << 20;

// --out must not be the file read: `import megatron run.sh --out run.sh` would replace the
// user's launch script with the scenario.
void check_out(const std::string& out_path, const std::string& input) {
  std::error_code ec;
  if (!out_path.empty() && !input.empty() && std::filesystem::equivalent(out_path, input, ec) && !ec)
    throw ConfigError("--out", "'" + out_path + "' is the file being imported: give another file (it would be written over)",
                      SourceLocation{"command line", 0, 0});
}

void emit(const ImportResult& r, const std::string& out_path) {
  const std::string report = import_report(r);
  const std::string text = r.yaml + report;
  if (out_path.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    write_text_file(out_path, text, "scenario");
    std::cerr << "ptdp: wrote " << out_path << "\n";
  }
  // A count on stderr, so that the lists are noticed when stdout goes to a file.
  if (!r.unsupported.empty() || !r.unknown.empty())
    std::cerr << "ptdp: " << r.unsupported.size() << " setting(s) not modelled, " << r.unknown.size() << " unknown, "
              << r.no_effect.size() << " without effect on the plan: listed at the end of the scenario\n";
}

// The GPUs a script's #SBATCH lines ask for (nodes × GPUs per node), 0 when they do not say.
int64_t sbatch_gpus(const std::string& script) {
  int64_t nodes = 0, per_node = 0;
  std::istringstream lines(script);
  std::string line;
  auto number_after = [](const std::string& text, size_t at) -> int64_t {
    size_t end = at;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at || end - at > 9) return 0;
    return std::stoll(text.substr(at, end - at));
  };
  while (std::getline(lines, line)) {
    if (line.rfind("#SBATCH", 0) != 0) continue;
    for (const char* key : {"--nodes=", "-N "}) {
      const size_t at = line.find(key);
      if (at != std::string::npos) nodes = number_after(line, at + std::string(key).size());
    }
    for (const char* key : {"--gres=gpu:", "--gpus-per-node=", "--ntasks-per-node="}) {
      const size_t at = line.find(key);
      if (at != std::string::npos) per_node = std::max(per_node, number_after(line, at + std::string(key).size()));
    }
  }
  return nodes > 0 && per_node > 0 ? nodes * per_node : 0;
}

// The GPUs the launch command's own launcher asks for, from the words before the program (the
// first *.py): srun's -N/--nodes × --ntasks-per-node/--gpus-per-node/--gres=gpu:N or its
// -n/--ntasks, mpirun's/mpiexec's -np/-n; 0 when it does not say. With it, the hint text.
struct LauncherGpus {
  int64_t gpus = 0;
  std::string said;  // "the script's #SBATCH lines" or "its launcher (srun …)"
};
LauncherGpus launcher_gpus(const std::string& script, const std::vector<std::string>& words) {
  if (const int64_t g = sbatch_gpus(script)) return {g, "the script's #SBATCH lines"};
  auto number = [](const std::string& text) -> int64_t {
    if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); })) return 0;
    return std::stoll(text);
  };
  size_t program = 0;
  while (program < words.size() && !(words[program].size() > 3 && words[program].compare(words[program].size() - 3, 3, ".py") == 0)) ++program;
  if (program == words.size()) return {};
  for (size_t i = 0; i < program; ++i) {
    const std::string launcher = std::filesystem::path(words[i]).filename().string();
    if (launcher != "srun" && launcher != "mpirun" && launcher != "mpiexec") continue;
    int64_t nodes = 0, per_node = 0, tasks = 0;
    std::string shown = launcher;
    for (size_t k = i + 1; k < program; ++k) {
      std::string opt = words[k], value;
      if (const auto eq = opt.find('='); eq != std::string::npos && opt.rfind("--", 0) == 0) value = opt.substr(eq + 1), opt = opt.substr(0, eq);
      else if (opt.rfind("--gres", 0) != 0 && k + 1 < program) value = words[k + 1];
      int64_t* into = nullptr;
      if (launcher == "srun" && (opt == "-N" || opt == "--nodes")) into = &nodes;
      else if (launcher == "srun" && (opt == "--ntasks-per-node" || opt == "--gpus-per-node")) into = &per_node;
      else if (opt == "-n" || opt == "--ntasks" || opt == "-np" || opt == "--np") into = &tasks;
      else if (launcher == "srun" && opt.rfind("--gres=gpu:", 0) == 0) per_node = std::max(per_node, number(opt.substr(11)));
      if (into && number(value) > 0) {
        *into = number(value);
        shown += " " + words[k] + (words[k].find('=') == std::string::npos ? " " + value : "");
      }
    }
    const int64_t g = tasks > 0 ? tasks : nodes > 0 && per_node > 0 ? nodes * per_node : 0;
    if (g > 0) return {g, "the script's launcher (" + shown + ")"};
  }
  return {};
}

// A launch script that cannot be imported: the error says which line stopped the script
// (`exit`), what it skipped, and the --gpus its own #SBATCH lines or launcher imply.
ConfigError script_import_error(const ConfigError& e, const ShellRun& run, const std::string& script, const std::vector<std::string>& words,
                                const ImportOptions& options) {
  std::string message = e.message();
  if (!run.exit_where.empty())
    message += "; the script stopped at " + run.exit_where + " (`" + run.exit_command + "`) before the rest of its commands ran";
  for (const auto& note : run.notes)
    if (note.find("skipped") != std::string::npos || note.find("is false") != std::string::npos) message += "; " + note;
  if (options.gpus == 0)
    if (const LauncherGpus asked = launcher_gpus(script, words); asked.gpus > 0)
      message += "; " + asked.said + " ask" + (asked.said.find("launcher") != std::string::npos ? "s" : "") + " for " + std::to_string(asked.gpus) +
                 " GPUs: give --gpus " + std::to_string(asked.gpus);
  return ConfigError(e.key_path(), message, e.where());
}

}  // namespace

void add_import(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("import", "turn a Megatron-LM command line / launch script, a DeepSpeed config or a Hugging Face model "
                                           "config into a scenario");
  cmd->require_subcommand(1);
  static ImportOptions options;
  static std::string out_path, config_path;

  auto* mega = cmd->add_subcommand(
      "megatron",
      "ARGS…|SCRIPT: Megatron-LM arguments (--num-layers 24 --hidden-size 1024 …) or a launch script; prints the scenario YAML with "
      "the arguments it did not use listed");
  mega->allow_extras();
  mega->add_option("--topology", options.topology, "cluster.topology of the scenario (preset or file)")->capture_default_str();
  mega->add_option("--gpus", options.gpus, "cluster.gpus (default: torchrun's --nproc_per_node × --nnodes, else t·p)")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  mega->add_option("--out", out_path, "write the scenario to FILE instead of stdout")->type_name("FILE");
  static std::vector<std::string> env_values;
  mega->add_option("--env", env_values,
                   "NAME=VALUE: an environment variable the launch script reads (in its if conditions or ${NAME}), repeatable")
      ->type_name("NAME=VALUE");
  static std::string cwd;
  static bool assume_files = false;
  mega->add_option("--cwd", cwd, "the folder the script runs in: $PWD, `pwd` and file tests (default: the script's folder)")
      ->type_name("DIR");
  mega->add_flag("--assume-files", assume_files, "take the script's file tests ([ -f pretrain_gpt.py ], …) as true");
  mega->callback([&run, mega] {
    run = [mega] {
      std::map<std::string, std::string> env;
      for (const auto& item : env_values) {
        const auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0)
          throw ConfigError("--env", "'" + item + "' is not NAME=VALUE", SourceLocation{"command line", 0, 0});
        env[item.substr(0, eq)] = item.substr(eq + 1);
      }
      std::vector<std::string> args = mega->remaining();
      std::string source = "command line";
      if (args.size() == 1 && args[0].rfind("--", 0) != 0) {
        source = args[0];
        check_out(out_path, source);
        // `source FILE` / `. FILE`: relative to the script's folder (where launch scripts keep
        // their model and cluster settings), else to the current one.
        const std::filesystem::path folder = std::filesystem::path(source).parent_path();
        const ShellFileReader read = [folder](const std::string& path, std::string* name) {
          std::filesystem::path file(path);
          if (file.is_relative() && !folder.empty() && path_exists((folder / file).string())) file = folder / file;
          *name = file.string();
          return read_input_file(*name, "sourced script", kMaxLaunchScriptBytes);
        };
        ShellContext context;
        context.script_path = source;
        std::error_code ec;
        context.cwd = std::filesystem::absolute(cwd.empty() ? (folder.empty() ? std::filesystem::path(".") : folder)
                                                            : std::filesystem::path(cwd), ec)
                          .lexically_normal()
                          .string();
        if (context.cwd.size() > 1 && context.cwd.back() == '/') context.cwd.pop_back();
        context.assume_files = assume_files;
        const std::string text = read_input_file(source, "launch script", kMaxLaunchScriptBytes);
        ShellRun run_result = run_shell(text, source, env, read, context);
        args = std::move(run_result.words);
        ImportResult r;
        try {
          r = import_megatron(args, source, options);
        } catch (const ConfigError& e) {
          throw script_import_error(e, run_result, text, args, options);
        }
        r.notes.insert(r.notes.begin(), run_result.notes.begin(), run_result.notes.end());
        const LauncherGpus asked = options.gpus == 0 ? launcher_gpus(text, args) : LauncherGpus{};
        if (asked.gpus > 0 && std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) { return n.rfind("cluster.gpus = t·p", 0) == 0; })) {
          const std::string hint = asked.said + " ask" + (asked.said.find("launcher") != std::string::npos ? "s" : "") + " for " + std::to_string(asked.gpus) +
                                   " GPUs: give --gpus " + std::to_string(asked.gpus);
          r.notes.push_back(hint);
          std::cerr << "ptdp: note: " << hint << "\n";
        }
        if (!run_result.exit_where.empty())
          r.notes.push_back("the script stops at " + run_result.exit_where + " (" + run_result.exit_command + ")");
        emit(r, out_path);
        return 0;
      } else if (args.empty()) {
        throw ConfigError("import megatron", "give Megatron-LM arguments (--num-layers 24 …) or a launch script", SourceLocation{"command line", 0, 0});
      }
      emit(import_megatron(args, source, options), out_path);
      return 0;
    };
  });

  auto* ds = cmd->add_subcommand("deepspeed", "a DeepSpeed JSON config (batch sizes, zero_optimization, fp16/bf16) on a base scenario's model");
  ds->add_option("CONFIG", config_path, "DeepSpeed config")->required()->type_name("CONFIG.json");
  ds->add_option("--scenario", options.base_scenario, "the model and tensor/pipeline layout it trains (default: scenarios/gpt3-175b.yaml)")
      ->type_name("FILE");
  ds->add_option("--gpus", options.gpus, "cluster.gpus (default: the base scenario's)")->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  ds->add_option("--out", out_path, "write the scenario to FILE instead of stdout")->type_name("FILE");
  ds->callback([&run] {
    run = [] {
      check_out(out_path, config_path);
      emit(import_deepspeed(read_input_file(config_path, "DeepSpeed config"), config_path, options), out_path);
      return 0;
    };
  });

  auto* hf = cmd->add_subcommand("hf", "a Hugging Face model config.json (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, GPT-2, BLOOM) as the model keys");
  hf->add_option("CONFIG", config_path, "the model's config.json")->required()->type_name("CONFIG.json");
  hf->add_option("--scenario", options.base_scenario, "take the cluster, tensor/pipeline sizes and batch from this scenario")->type_name("FILE");
  hf->add_option("--topology", options.topology, "cluster.topology without --scenario (preset or file)")->capture_default_str();
  hf->add_option("--gpus", options.gpus, "cluster.gpus (default: the base scenario's, else 8)")->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  hf->add_option("--out", out_path, "write the scenario to FILE instead of stdout")->type_name("FILE");
  hf->callback([&run] {
    run = [] {
      check_out(out_path, config_path);
      emit(import_hf(read_input_file(config_path, "Hugging Face config"), config_path, options), out_path);
      return 0;
    };
  });

  auto* tt = cmd->add_subcommand("torchtitan", "a torchtitan train.toml (0.1, 0.2) or 0.3 Python config (model flavour, parallel degrees, FSDP, "
                                               "batch, activation checkpointing, precision, Float8)");
  tt->add_option("CONFIG", config_path, "the training config")->required()->type_name("TRAIN.toml|CONFIG.py");
  tt->add_option("--topology", options.topology, "cluster.topology of the scenario (preset or file)")->capture_default_str();
  tt->add_option("--gpus", options.gpus, "cluster.gpus (needed when data_parallel_shard_degree is -1; default: the product of the degrees)")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  tt->add_option("--out", out_path, "write the scenario to FILE instead of stdout")->type_name("FILE");
  tt->add_option("--config", options.config_function,
                 "torchtitan 0.3 (a Python config_registry module): the function to read (default: the only one)")
      ->type_name("NAME");
  tt->callback([&run] {
    run = [] {
      check_out(out_path, config_path);
      emit(import_torchtitan(read_input_file(config_path, "torchtitan config"), config_path, options), out_path);
      return 0;
    };
  });
}

void add_export(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("export", "print a plan as another tool's configuration");
  cmd->require_subcommand(1);
  static ScenarioArgs args;
  auto* mega = cmd->add_subcommand("megatron", "the Megatron-LM launch line (torchrun … pretrain_gpt.py …) of the scenario's plan");
  add_scenario_args(mega, args, true);
  mega->callback([&run] {
    run = [] {
      const Scenario sc = load_scenario(args.path, overrides_of(args));
      std::vector<std::string> caveats;
      std::fputs(export_megatron(sc, &caveats).c_str(), stdout);
      for (const auto& c : caveats) std::cerr << "ptdp: note: " << c << "\n";
      return 0;
    };
  });
  auto* titan = cmd->add_subcommand("torchtitan", "the plan as a torchtitan job: 0.3's Python config function, or 0.2/0.1's train.toml (FSDP / HSDP, TP, PP "
                                                    "schedule, CP, activation checkpointing)");
  add_scenario_args(titan, args, true);
  static std::string titan_version = "0.3";
  titan->add_option("--torchtitan-version", titan_version, "0.3 (default, the newest: a Python config_registry function), 0.2 (TOML: "
                                                           "[quantize.linear.float8], checkpoint.enable) or 0.1 (TOML: [float8], "
                                                           "checkpoint.enable_checkpoint)")
      ->capture_default_str();
  titan->callback([&run] {
    run = [] {
      const Scenario sc = load_scenario(args.path, overrides_of(args));
      std::vector<std::string> caveats;
      std::fputs(export_torchtitan(sc, &caveats, titan_version).c_str(), stdout);
      for (const auto& c : caveats) std::cerr << "ptdp: note: " << c << "\n";
      return 0;
    };
  });
  static std::string config_out;
  auto* ds = cmd->add_subcommand("deepspeed",
                                 "a ZeRO plan for Megatron-DeepSpeed: a launch script that writes the DeepSpeed JSON config and runs deepspeed … "
                                 "pretrain_gpt.py");
  add_scenario_args(ds, args, true);
  ds->add_option("--config", config_out, "also write the DeepSpeed JSON config alone to FILE (for ptdp import deepspeed, HF Trainer, …)")
      ->type_name("FILE");
  ds->callback([&run] {
    run = [] {
      const Scenario sc = load_scenario(args.path, overrides_of(args));
      std::vector<std::string> caveats;
      std::fputs(export_deepspeed(sc, &caveats).c_str(), stdout);
      if (!config_out.empty()) write_text_file(config_out, deepspeed_config_json(sc), "DeepSpeed config");
      for (const auto& c : caveats) std::cerr << "ptdp: note: " << c << "\n";
      return 0;
    };
  });
}

void add_keys(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("keys", "list every scenario key (--set KEY=VALUE, --vary) with its type, range and default");
  static std::string filter;
  cmd->add_option("PREFIX", filter, "only keys starting with PREFIX (e.g. parallel, cluster.topology.gpu)");
  cmd->callback([&run] {
    run = [] {
      size_t wk = 3, wt = 4, wr = 5;
      std::vector<const KeyInfo*> rows;
      for (const auto& k : scenario_key_table())
        if (k.key.rfind(filter, 0) == 0) rows.push_back(&k);
      if (rows.empty()) {
        std::vector<std::string> names;
        for (const auto& k : scenario_key_table()) names.push_back(k.key);
        throw ConfigError("keys", "no key starts with '" + filter + "'" + did_you_mean(filter, names), SourceLocation{"command line", 0, 0});
      }
      auto width = [](const std::string& s) {  // display width: count UTF-8 code points
        size_t n = 0;
        for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
        return n;
      };
      for (const auto* k : rows) wk = std::max(wk, width(k->key)), wt = std::max(wt, width(k->type)), wr = std::max(wr, width(k->range));
      auto cell = [&](const std::string& s, size_t w) { return s + std::string(w - width(s) + 2, ' '); };
      std::printf("%s%s%s%s\n", cell("key", wk).c_str(), cell("type", wt).c_str(), cell("range", wr).c_str(), "default");
      for (const auto* k : rows)
        std::printf("%s%s%s%s%s%s\n", cell(k->key, wk).c_str(), cell(k->type, wt).c_str(), cell(k->range, wr).c_str(), k->fallback.c_str(),
                    k->meaning.empty() ? "" : "  — ", k->meaning.c_str());
      return 0;
    };
  });
}

}  // namespace ptdp::cli
