// Cluster presets and the Megatron rank layout.
#include "topologies/cluster.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "topologies/cluster_yaml.hpp"

namespace ptdp {
namespace {

TEST(Presets, DgxA100MatchesTheHardwareFacts) {
  const ClusterSpec c = load_topology("dgx-a100");
  EXPECT_DOUBLE_EQ(c.gpu.peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(c.gpu.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(c.gpu.hbm_Bps, 2.0e12);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(c.nvlink.bw_Bps, 300e9);  // per direction
  EXPECT_DOUBLE_EQ(c.nic.bw_Bps, 25e9);      // HDR 200 Gb/s
  EXPECT_EQ(c.nics_per_node, 8);
  EXPECT_EQ(c.intra_node_allreduce.points.size(), 6u);
  EXPECT_EQ(c.inter_node_allreduce.points.size(), 6u);
  EXPECT_NO_THROW(validate_cluster(c));
}

TEST(Presets, DgxH100Loads) {
  const ClusterSpec c = load_topology("dgx-h100");
  EXPECT_DOUBLE_EQ(c.gpu.peak_flops, 989e12);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_NO_THROW(validate_cluster(c));
}

TEST(Presets, UnknownPresetSuggestsTheClosest) {
  try {
    load_topology("dgx-a10");
    FAIL() << "loaded a preset that does not exist";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'dgx-a100'"), std::string::npos) << e.what();
  }
}

TEST(ValidateCluster, RejectsNonPositiveBandwidthWithItsKey) {
  ClusterSpec c = load_topology("dgx-a100");
  c.nvlink.bw_Bps = 0;
  try {
    validate_cluster(c);
    FAIL() << "accepted a zero NVLink bandwidth";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "cluster.topology.node.nvlink.bandwidth");
  }
  c = load_topology("dgx-a100");
  c.max_nodes = 4;
  EXPECT_NO_THROW(validate_cluster_for(c, 32));
  EXPECT_THROW(validate_cluster_for(c, 40), ConfigError);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
// Sizes in a written profile scale to a readable unit: 8 GB is "8GB", not "7812500KiB" (8e9 is a
// multiple of 1024 but not of 1 MiB); exact binary sizes stay binary when that reads shorter.
TEST(TopologyYaml, SizesScaleToAReadableUnit) {
  ClusterSpec c = load_topology("dgx-a100");
  c.gpu.memory_bytes = 8e9;
  std::string y = to_yaml(c, "test");
  EXPECT_NE(y.find("memory: 8GB"), std::string::npos) << y;
  EXPECT_EQ(y.find("KiB"), std::string::npos) << y;
  c.gpu.memory_bytes = 16.0 * 1024 * 1024 * 1024;
  y = to_yaml(c, "test");
  EXPECT_NE(y.find("memory: 16GiB"), std::string::npos) << y;
  const std::string path = ::testing::TempDir() + "ptdp-16gib.yaml";
  { std::ofstream(path) << y; }
  EXPECT_DOUBLE_EQ(load_topology(path).gpu.memory_bytes, c.gpu.memory_bytes);
}
}  // namespace ptdp

namespace ptdp {
// A profile written from a preset (what `calibrate --measured` writes with the fitted values)
// keeps every field it did not fit: the offload paths (host link, host memory and its
// bandwidth) and the GPU's MXFP8 capability read back as the preset has them.
TEST(TopologyYaml, AWrittenProfileKeepsEveryPresetField) {
  for (const char* preset : {"dgx-h100", "dgx-b200"}) {
    const ClusterSpec c = load_topology(preset);
    const std::string path = ::testing::TempDir() + std::string("ptdp-roundtrip-") + preset + ".yaml";
    { std::ofstream(path) << to_yaml(c, "round trip"); }
    const ClusterSpec back = load_topology(path);
    EXPECT_DOUBLE_EQ(back.host_link.bw_Bps, c.host_link.bw_Bps) << preset;
    EXPECT_DOUBLE_EQ(back.host_link.latency_s, c.host_link.latency_s) << preset;
    EXPECT_DOUBLE_EQ(back.host_memory_bytes, c.host_memory_bytes) << preset;
    EXPECT_DOUBLE_EQ(back.host_memory_Bps, c.host_memory_Bps) << preset;
    EXPECT_EQ(back.gpu.mx_formats, c.gpu.mx_formats) << preset;
    EXPECT_GT(c.host_memory_bytes, 0) << preset;
  }
  EXPECT_TRUE(load_topology("dgx-b200").gpu.mx_formats);
  EXPECT_FALSE(load_topology("dgx-h100").gpu.mx_formats);
}
}  // namespace ptdp

namespace ptdp {
// One GPU description: every field of GpuSpec's table is written by to_yaml when it differs from
// the default, read back by the topology reader to the same value, range-checked under its own
// key, listed by `ptdp keys` and, when it has calibration bounds, a parameter calibration fits.
TEST(GpuFields, EveryFieldRoundTripsThroughAWrittenProfile) {
  const ClusterSpec base = load_topology("dgx-h100");
  const GpuSpec defaults;
  for (const auto& f : gpu_fields()) {
    ClusterSpec c = base;
    // A value inside the range, different from the preset's and the default's.
    double v = f.kind == GpuFieldKind::Flag ? (gpu_field_value(c.gpu, f) != 0 ? 0 : 1)
                                            : (f.lower_open || f.lower > 0 ? f.lower : 0) + 0.37 * (std::min(f.upper, 1e6) - f.lower);
    if (f.kind == GpuFieldKind::Integer) v = std::floor(v) + 3;
    set_gpu_field(c.gpu, f, v);
    ASSERT_NE(gpu_field_value(c.gpu, f), gpu_field_value(defaults, f)) << f.key;
    validate_cluster(c);  // inside the range: accepted
    const std::string path = ::testing::TempDir() + "ptdp-gpu-field-" + f.key + ".yaml";
    const std::string yaml = to_yaml(c, "field round trip");
    EXPECT_NE(yaml.find(std::string("  ") + f.key + ": "), std::string::npos) << f.key << "\n" << yaml;
    { std::ofstream(path) << yaml; }
    const ClusterSpec back = load_topology(path);
    EXPECT_NEAR(gpu_field_value(back.gpu, f), gpu_field_value(c.gpu, f), 1e-5 * std::fabs(gpu_field_value(c.gpu, f))) << f.key;
  }
}

TEST(GpuFields, EveryFieldIsRangeCheckedUnderItsOwnKey) {
  for (const auto& f : gpu_fields()) {
    if (f.kind == GpuFieldKind::Flag) continue;
    ClusterSpec c = load_topology("dgx-a100");
    set_gpu_field(c.gpu, f, f.upper * 2 + 1);
    try {
      validate_cluster(c);
      ADD_FAILURE() << f.key << " beyond its range was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("cluster.topology.gpu.") + f.key), std::string::npos) << e.what();
    }
  }
}

TEST(GpuFields, KeysListEveryFieldWithTheDefaultsValue) {
  const GpuSpec defaults;
  for (const auto& f : gpu_fields()) {
    const std::string key = std::string("cluster.topology.gpu.") + f.key;
    const auto& table = scenario_key_table();
    const auto it = std::find_if(table.begin(), table.end(), [&](const KeyInfo& k) { return k.key == key; });
    ASSERT_NE(it, table.end()) << key;
    EXPECT_EQ(it->fallback, gpu_field_text(defaults, f)) << key;
  }
  EXPECT_EQ(find_gpu_field("gemm_half_k")->number, &GpuSpec::gemm_half_k);
  EXPECT_EQ(find_gpu_field("no_such_field"), nullptr);
}
}  // namespace ptdp

namespace ptdp {
namespace {
// calibrate --backend cpu's per-shape GEMM rates and element-wise bandwidth curve: written,
// read back to the same values, and bad ones refused under their key.
TEST(TopologyYaml, MeasuredKernelTablesRoundTripAndAreChecked) {
  ClusterSpec c = load_topology("cpu-host");
  c.gpu.gemm_rates = {{256, 512, 128, 41.5e9}, {64, 64, 32, 3.25e9}};
  c.gpu.elementwise_bandwidth = {{16384, 38e9}, {67108864, 11e9}};
  const std::string path = ::testing::TempDir() + "ptdp-measured-kernels.yaml";
  { std::ofstream(path) << to_yaml(c, "measured kernels"); }
  const ClusterSpec back = load_topology(path);
  ASSERT_EQ(back.gpu.gemm_rates.size(), 2u);
  EXPECT_EQ(back.gpu.gemm_rates[1].m, 64);
  EXPECT_EQ(back.gpu.gemm_rates[1].k, 32);
  EXPECT_NEAR(back.gpu.gemm_rates[0].flops_per_s, 41.5e9, 1e-4 * 41.5e9);
  ASSERT_EQ(back.gpu.elementwise_bandwidth.size(), 2u);
  EXPECT_NEAR(back.gpu.elementwise_bandwidth[1].first, 67108864, 1);
  EXPECT_NEAR(back.gpu.elementwise_bandwidth[0].second, 38e9, 1e-4 * 38e9);

  ClusterSpec bad = c;
  bad.gpu.elementwise_bandwidth = {{1e6, 10e9}, {1e5, 20e9}};
  try {
    validate_cluster(bad);
    FAIL() << "decreasing sizes accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpu.elementwise_bandwidth[1]"), std::string::npos) << e.what();
  }
  bad = c;
  bad.gpu.gemm_rates[0].flops_per_s = 0;
  try {
    validate_cluster(bad);
    FAIL() << "a zero GEMM rate accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpu.gemm_rates[0]"), std::string::npos) << e.what();
  }
  // A malformed row in a file names its place.
  const std::string bad_path = ::testing::TempDir() + "ptdp-bad-gemm-rates.yaml";
  { std::ofstream(bad_path) << "name: x\ngpu:\n  gemm_rates: [[256, 512, 40GFLOPS]]\n"; }
  try {
    load_topology(bad_path);
    FAIL() << "a three-element row accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gemm_rates[0]"), std::string::npos) << what;
    EXPECT_NE(what.find(":3:"), std::string::npos) << what;
  }
}
}  // namespace
}  // namespace ptdp
