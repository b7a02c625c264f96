#include "core/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace ptdp {
namespace {

struct Unit {
  const char* suffix;
  double scale;
};

// Suffixes are matched exactly (case-sensitive: "Gb" bits vs "GB" bytes).
const std::vector<Unit>& units_for(Quantity kind) {
  static const std::vector<Unit> bytes = {{"B", 1},       {"KB", 1e3},     {"MB", 1e6},      {"GB", 1e9},
                                          {"TB", 1e12},   {"KiB", 1024.0}, {"MiB", 1048576.0},
                                          {"GiB", 1073741824.0},           {"TiB", 1099511627776.0}};
  static const std::vector<Unit> bw = {{"Bps", 1},      {"KBps", 1e3},   {"MBps", 1e6},     {"GBps", 1e9},
                                       {"TBps", 1e12},  {"B/s", 1},      {"KB/s", 1e3},     {"MB/s", 1e6},
                                       {"GB/s", 1e9},   {"TB/s", 1e12},  {"bps", 0.125},    {"Kbps", 125.0},
                                       {"Mbps", 1.25e5}, {"Gbps", 1.25e8}, {"Tbps", 1.25e11}, {"Gb/s", 1.25e8}};
  static const std::vector<Unit> time = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}, {"min", 60}, {"h", 3600}};
  static const std::vector<Unit> flops = {{"FLOPS", 1},      {"GFLOPS", 1e9}, {"TFLOPS", 1e12}, {"PFLOPS", 1e15},
                                          {"FLOP/s", 1},     {"GFLOP/s", 1e9}, {"TFLOP/s", 1e12}, {"PFLOP/s", 1e15},
                                          {"f", 1},          {"Gf", 1e9},     {"Tf", 1e12}};
  static const std::vector<Unit> count = {{"K", 1e3}, {"M", 1e6}, {"B", 1e9}, {"T", 1e12}};
  static const std::vector<Unit> power = {{"W", 1}, {"kW", 1e3}, {"MW", 1e6}};
  switch (kind) {
    case Quantity::Bytes: return bytes;
    case Quantity::Bandwidth: return bw;
    case Quantity::Time: return time;
    case Quantity::Flops: return flops;
    case Quantity::Count: return count;
    case Quantity::Power: return power;
  }
  return count;
}

const char* kind_name(Quantity kind) {
  switch (kind) {
    case Quantity::Bytes: return "a size (e.g. 80GB, 512MiB)";
    case Quantity::Bandwidth: return "a bandwidth (e.g. 25GBps, 200Gbps)";
    case Quantity::Time: return "a time (e.g. 1.5us, 2ms)";
    case Quantity::Flops: return "a compute rate (e.g. 312TFLOPS)";
    case Quantity::Count: return "a number (e.g. 300B, 1.5M)";
    case Quantity::Power: return "a power (e.g. 400W, 3.3kW)";
  }
  return "a number";
}

// decimals < 0: 3 significant digits ("312 TFLOP/s", "25.0 GB/s", "1.50 ms"); else that many.
std::string fmt(double v, const char* unit, int decimals = -1) {
  char buf[64];
  if (decimals >= 0) std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, unit);
  else if (std::fabs(v) >= 100) std::snprintf(buf, sizeof buf, "%.0f %s", v, unit);
  else if (std::fabs(v) >= 10) std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, unit);
  return buf;
}

std::string scaled(double v, const std::vector<std::pair<double, const char*>>& steps, int decimals = -1) {
  if (v == 0) {  // "0 B", not "0.00 B"
    for (const auto& [scale, unit] : steps)
      if (scale == 1) return std::string("0 ") + unit;
  }
  for (const auto& [scale, unit] : steps)
    if (std::fabs(v) >= scale) return fmt(v / scale, unit, decimals);
  return fmt(v / steps.back().first, steps.back().second, decimals);
}

}  // namespace

double parse_quantity(std::string_view text, Quantity kind) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  s = s.substr(start);
  if (s.empty()) throw ConfigError("", std::string("expected ") + kind_name(kind) + " (got an empty value)");
  const char* begin = s.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin) throw ConfigError("", std::string("expected ") + kind_name(kind) + " (got '" + s + "')");
  std::string suffix(end);
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(suffix.begin());
  if (!std::isfinite(value)) throw ConfigError("", std::string("expected a finite number (got '") + s + "')");
  if (suffix.empty()) return value;
  std::vector<std::string> names;
  for (const auto& u : units_for(kind)) {
    if (suffix == u.suffix) return value * u.scale;
    names.emplace_back(u.suffix);
  }
  throw ConfigError("", std::string("unknown unit '") + suffix + "' in '" + s + "', expected " + kind_name(kind) +
                            did_you_mean(suffix, names));
}

std::string format_bytes(double b) {
  return scaled(b, {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}, {1, "B"}});
}
std::string format_bandwidth(double b) {
  return scaled(b, {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "KB/s"}, {1, "B/s"}});
}
std::string format_time(double s) {
  if (s == 0) return "0 s";  // not "0.00 ns"
  if (std::fabs(s) >= 86400) return fmt(s / 86400, "days");
  if (std::fabs(s) >= 1) return fmt(s, "s");
  return scaled(s, {{1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}});
}
std::string format_flops(double f) {
  return scaled(f, {{1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1e6, "MFLOP/s"}, {1, "FLOP/s"}});
}

std::string format_count(double n) {
  if (std::fabs(n) < 1e3) {  // "12": no unit
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", n);
    return buf;
  }
  return scaled(n, {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}}, 1);
}

namespace {

// "12.5GBps"-style: the largest unit the value reaches.
std::string unit_text(double v, const std::vector<std::pair<double, const char*>>& units) {
  for (const auto& [scale, suffix] : units)
    if (std::fabs(v) >= scale || scale == units.back().first) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g%s", v / scale, suffix);
      return buf;
    }
  return std::to_string(v);
}

std::string bytes_text(double b) {
  for (int p : {40, 30, 20, 10}) {  // exact binary sizes read best as MiB / GiB (not 7812500KiB)
    const double u = std::ldexp(1.0, p);
    if (b >= u && std::fmod(b, u) == 0 && b / u < 1024) {
      const char* names[] = {"KiB", "MiB", "GiB", "TiB"};
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f%s", b / u, names[p / 10 - 1]);
      return buf;
    }
  }
  return unit_text(b, {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}, {1, "B"}});
}

}  // namespace

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string quantity_text(double v, Quantity kind) {
  switch (kind) {
    case Quantity::Bytes: return bytes_text(v);
    case Quantity::Bandwidth: return unit_text(v, {{1e12, "TBps"}, {1e9, "GBps"}, {1e6, "MBps"}, {1e3, "KBps"}, {1, "Bps"}});
    case Quantity::Time: return unit_text(v, {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}});
    case Quantity::Flops: return unit_text(v, {{1e15, "PFLOPS"}, {1e12, "TFLOPS"}, {1e9, "GFLOPS"}, {1, "FLOPS"}});
    case Quantity::Power: return number_text(v) + "W";
    case Quantity::Count: break;
  }
  return number_text(v);
}

}  // namespace ptdp
