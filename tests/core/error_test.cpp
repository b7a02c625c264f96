#include "core/error.hpp"

#include <gtest/gtest.h>

namespace ptdp {

TEST(ConfigError, ReadsFileLineColKeyMessage) {
  ConfigError e("parallel.tensor", "12 does not divide num_attention_heads (96)", SourceLocation{"scenarios/x.yaml", 12, 7});
  EXPECT_STREQ(e.what(), "scenarios/x.yaml:12:7: parallel.tensor: 12 does not divide num_attention_heads (96)");
  ConfigError bare("model.hidden_size", "must be positive (got 0)");
  EXPECT_STREQ(bare.what(), "model.hidden_size: must be positive (got 0)");
  EXPECT_STREQ(bare.located(SourceLocation{"a.yaml", 3, 4}).what(), "a.yaml:3:4: model.hidden_size: must be positive (got 0)");
}

TEST(ConfigError, SuggestsTheClosestKnownWord) {
  EXPECT_EQ(closest_match("tensr", {"tensor", "pipeline", "data"}), "tensor");
  EXPECT_EQ(closest_match("zzzzzz", {"tensor", "pipeline", "data"}), "");
  EXPECT_EQ(did_you_mean("pipline", {"tensor", "pipeline"}), " (did you mean 'pipeline'?)");
}

TEST(Assertion, ThrowsInternalErrorWithFileAndLine) {
  try {
    PTDP_ASSERT(1 + 1 == 3, "arithmetic");
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("error_test.cpp:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("arithmetic"), std::string::npos);
  }
}

}  // namespace ptdp
