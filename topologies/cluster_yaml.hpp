// Writing a ClusterSpec back as YAML, in the schema of topologies/*.yaml (calibration profiles).
#pragma once

#include <string>

#include "topologies/cluster.hpp"

namespace ptdp {

/// The topology as YAML that the scenario loader reads back; `comment` lines start the file.
/// Quantities carry units ("25GBps", "1.5us", "1GiB").
std::string to_yaml(const ClusterSpec& c, const std::string& comment);

}  // namespace ptdp
