#include "core/units.hpp"

#include <gtest/gtest.h>

#include "core/error.hpp"

namespace ptdp {

TEST(Units, ParsesSizesBandwidthsTimesAndRates) {
  EXPECT_DOUBLE_EQ(parse_quantity("80GB", Quantity::Bytes), 80e9);
  EXPECT_DOUBLE_EQ(parse_quantity("1MiB", Quantity::Bytes), 1048576.0);
  EXPECT_DOUBLE_EQ(parse_quantity("300GBps", Quantity::Bandwidth), 300e9);
  EXPECT_DOUBLE_EQ(parse_quantity("200Gbps", Quantity::Bandwidth), 25e9);  // bits, not bytes
  EXPECT_DOUBLE_EQ(parse_quantity("1.5us", Quantity::Time), 1.5e-6);
  EXPECT_DOUBLE_EQ(parse_quantity("312TFLOPS", Quantity::Flops), 312e12);
  EXPECT_DOUBLE_EQ(parse_quantity("300B", Quantity::Count), 300e9);
  EXPECT_DOUBLE_EQ(parse_quantity("42", Quantity::Bytes), 42.0);
}

TEST(Units, RejectsUnknownUnitsWithSuggestion) {
  try {
    parse_quantity("25GBs", Quantity::Bandwidth);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown unit 'GBs'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_quantity("fast", Quantity::Time), ConfigError);
  EXPECT_THROW(parse_quantity("", Quantity::Bytes), ConfigError);
  EXPECT_THROW(parse_quantity("inf", Quantity::Bytes), ConfigError);
}

TEST(Units, FormatsWithUnits) {
  EXPECT_EQ(format_bytes(80e9), "80.0 GB");
  EXPECT_EQ(format_time(0.0123), "12.3 ms");
  EXPECT_EQ(format_bandwidth(25e9), "25.0 GB/s");
  EXPECT_EQ(format_flops(312e12), "312 TFLOP/s");
  // Parameter counts: GPT-3 and the tiny CPU model (which once printed "0.0 B").
  EXPECT_EQ(format_count(174.56e9), "174.6 B");
  EXPECT_EQ(format_count(790500), "790.5 K");
  EXPECT_EQ(format_count(1.008e12), "1.0 T");
  EXPECT_EQ(format_count(12), "12");
}

TEST(Units, ZeroIsWrittenWithoutPlaceholderDigits) {
  EXPECT_EQ(format_time(0), "0 s");  // not "0.00 ns"
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bandwidth(0), "0 B/s");
  EXPECT_EQ(format_time(1e-9), "1.00 ns");  // a real nanosecond keeps its unit
}

}  // namespace ptdp
