// The speed probe: a fixed GEMM of the executor's, timed on every rank at once, that says how
// fast this host computes at a given moment. `calibrate --backend cpu` times it before, through
// (after each group of kernels) and after its kernel measurements and writes the median into the
// profile; `train --speed-probe` times it before the run and after each iteration. Their ratio
// scales the profile's computation to the row's moment (validate):
// on a machine shared with other work a kernel's CPU time moves with what shares the cores'
// caches and memory bandwidth, and that load changes within minutes.
#pragma once

#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"

namespace ptdp::exec {

/// Seconds (thread CPU time) of one 256×512×128 GEMM (a tiny GPT's fc1 at 4 sequences of 64
/// tokens) after a 4 MiB pass that evicts its operands: the median over rounds on each rank, then
/// over the ranks. (An optimizer step over 256 Ki parameters with its state from memory was
/// probed too; its ratio did not follow the executor's OPTIM, docs/ACCURACY.md.)
struct SpeedProbe {
  double gemm_s = 0;
};

/// Times the probe on every rank of `world` at once (collective; the same result on every rank).
/// With more ranks than hardware threads each timed GEMM follows a yield of the core, as in
/// calibrate's GEMMs.
SpeedProbe time_speed_probe(Communicator& world, Device& dev);

}  // namespace ptdp::exec
