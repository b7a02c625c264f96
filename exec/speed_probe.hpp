// The speed probe: a fixed GEMM of the executor's, timed on every rank at once, that says how
// fast this host computes at a given moment. `calibrate --backend cpu` times it before its kernel
// measurements and after each group of them, sets each group's figures to the first sample's
// speed and writes that sample into the profile; `train --speed-probe` times it before the run
// and after each iteration. Their ratio scales the profile's computation to the row's moment
// (validate): on a machine shared with other work a kernel's CPU time moves with what shares the
// cores' caches and memory bandwidth, and that load changes within minutes.
#pragma once

#include <functional>
#include <vector>

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

/// The speed probe through a run of kernel measurements (calibrate --backend cpu): sampled before
/// them and after each group of kernels; each group's figures set to the speed of the first
/// sample: a time × (the first sample ÷ the mean of the two samples around the group), a rate ×
/// its inverse. A kernel timed while another process slowed the host is priced as if timed at the
/// first sample's speed, and the profile's probe is that sample. In one calibration (one rank,
/// load 8-11) the probe read 265-414 us from one group to the next; the suite's GEMM rates,
/// multiplied by their calibration's probe, differed by 14-27 % among three calibrations of one
/// rank count, 2-11 % with this (docs/ACCURACY.md, session 40).
struct ProbedMoments {
  std::function<double()> probe;  // times the probe (calibrate: a collective, every rank at the same points)
  std::vector<double> samples;    // the first taken before the first group

  /// After a group of kernels: a sample, and the group's figures (`times` in seconds, `rates`
  /// per second) set to the first sample's speed.
  void close(const std::vector<double*>& times, const std::vector<double*>& rates);
};

/// The median over the ranks of each rank's value (collective).
double median_over_ranks(Communicator& world, double mine);

/// Times the probe on every rank of `world` at once (collective; the same result on every rank).
/// With more ranks than hardware threads each timed GEMM follows a yield of the core, as in
/// calibrate's GEMMs.
SpeedProbe time_speed_probe(Communicator& world, Device& dev);

}  // namespace ptdp::exec
