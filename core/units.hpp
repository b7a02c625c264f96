// Parsing of quantities with units, as written in topology and scenario files:
// "80GB", "2.0TBps", "300GBps", "1.5us", "312TFLOPS", "200Gbps". Plain numbers are SI base units.
#pragma once

#include <string>
#include <string_view>

namespace ptdp {

enum class Quantity { Bytes, Bandwidth, Time, Flops, Count, Power };

/// Parses `text` as a quantity of kind `kind`, returning bytes, bytes/s, seconds, FLOP/s, a count or watts.
/// Throws ConfigError (without location; the caller adds it) naming the accepted units.
double parse_quantity(std::string_view text, Quantity kind);

/// Human-readable forms with units, for tables: "1.23 GB", "25.0 GB/s", "4.56 ms", "312 TFLOP/s".
std::string format_bytes(double bytes);
std::string format_bandwidth(double bytes_per_s);
std::string format_time(double seconds);
std::string format_flops(double flops_per_s);
/// The forms files take back (parse_quantity reads them exactly to 6 significant digits):
/// "80GB", "1GiB", "2TBps", "4us", "312TFLOPS", "700W"; Count: a plain number.
std::string quantity_text(double value, Quantity kind);
/// A plain number to 6 significant digits ("0.8", "1e+06").
std::string number_text(double value);

/// A count with one decimal and K, M, B or T: "174.6 B" parameters, "790.5 K".
std::string format_count(double n);

}  // namespace ptdp
