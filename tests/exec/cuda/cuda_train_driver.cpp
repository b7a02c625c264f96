// A minimal `ptdp train --backend B` for the CUDA tests, run under mpirun: trains the tiny GPT of
// the executor tests with the given layout and back end and writes losses, gradient norm and the
// trained parameters as JSON (rank 0). Error handling as exec/train.hpp asks of main().
//
//   cuda_train_driver --backend cuda|cpu --t 2 --p 2 --d 1 [--v 2] [--steps 3] [--precision fp32] --out FILE
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "exec/mpi_communicator.hpp"
#include "exec/train.hpp"

int main(int argc, char** argv) {
  using namespace ptdp;
  exec::MpiSession mpi(&argc, &argv);
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[std::string(argv[i]).substr(2)] = argv[i + 1];
  auto get = [&](const std::string& k, const std::string& def) { return a.count(k) ? a[k] : def; };
  auto geti = [&](const std::string& k, long long def) { return std::stoll(get(k, std::to_string(def))); };

  TransformerSpec spec;  // the executor tests' tiny GPT
  spec.num_layers = 4;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.seq_length = 16;
  spec.vocab_size = 256;
  ParallelPlan plan;
  plan.tensor = geti("t", 1);
  plan.pipeline = geti("p", 1);
  plan.data = geti("d", 1);
  plan.virtual_stages = geti("v", 1);
  plan.micro_batch = 2;
  plan.global_batch = 8;
  plan.overlap_p2p = true;
  plan.schedule = plan.virtual_stages > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
  exec::TrainOptions opt;
  opt.backend = get("backend", "cpu");
  opt.steps = geti("steps", 3);
  opt.seed = 7;
  opt.comm_timeout_s = 60;
  exec::ParameterSet params;
  opt.parameters_out = &params;
  try {
    plan.precision = parse_precision(get("precision", "fp32"));  // the CPU computes in fp32 whatever it says
    const Report r = exec::train(spec, plan, opt);
    if (mpi.rank() == 0 && a.count("out")) {
      nlohmann::json j;
      j["losses"] = r.losses;
      j["grad_norm"] = r.extra.at("grad_norm");
      j["backend"] = r.backend;
      j["params"] = params;
      std::ofstream(a["out"]) << j.dump();
    }
  } catch (const exec::CommunicationError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    mpi.abort(1);
  } catch (const ConfigError& e) {
    if (mpi.rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    if (mpi.rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
