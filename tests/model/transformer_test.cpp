// Parameter counts (paper Eq. 2) and the vocabulary padding Megatron-LM applies.
#include "model/transformer.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace ptdp {
namespace {

TransformerSpec gpt(int64_t heads, int64_t hidden, int64_t layers) {
  TransformerSpec s;
  s.num_layers = layers;
  s.hidden_size = hidden;
  s.num_attention_heads = heads;
  s.seq_length = 2048;
  s.vocab_size = 51200;
  return s;
}

// P = 12lh²(1 + 13/(12h) + (V+s)/(12lh)), written out independently of the library.
double eq2(const TransformerSpec& s) {
  const double l = static_cast<double>(s.num_layers), h = static_cast<double>(s.hidden_size),
               V = static_cast<double>(s.vocab_size), sq = static_cast<double>(s.seq_length);
  return 12 * l * h * h * (1 + 13 / (12 * h) + (V + sq) / (12 * l * h));
}

struct Table1Row {
  int64_t heads, hidden, layers;
  double billions;
};

// Narayanan et al. SC'21, Table 1 (V = 51200, s = 2048).
constexpr Table1Row kTable1[] = {
    {24, 2304, 24, 1.7},      {32, 3072, 30, 3.6},      {32, 4096, 36, 7.5},    {48, 6144, 40, 18.4},
    {64, 8192, 48, 39.1},     {80, 10240, 60, 76.1},    {96, 12288, 80, 145.6}, {128, 16384, 96, 310.1},
    {128, 20480, 105, 529.6}, {160, 25600, 128, 1008.0},
};

TEST(ParameterCount, ReproducesAllTenModelsOfPaperTable1ToOneDecimal) {
  for (const auto& row : kTable1) {
    const double billions = parameter_count(gpt(row.heads, row.hidden, row.layers)) / 1e9;
    // "to 0.1 B": the count rounds to the published figure.
    EXPECT_NEAR(billions, row.billions, 0.05 + 1e-9) << "h " << row.hidden << ", l " << row.layers << ": got " << billions;
    EXPECT_DOUBLE_EQ(std::round(billions * 10) / 10, row.billions) << "h " << row.hidden << ", l " << row.layers;
  }
}

TEST(ParameterCount, FollowsEquation2) {
  // The library also counts the final LayerNorm (2h), which Eq. 2 leaves out: a relative
  // difference below 1e-5 for every Table 1 model.
  for (const auto& row : kTable1) {
    const TransformerSpec s = gpt(row.heads, row.hidden, row.layers);
    EXPECT_NEAR(parameter_count(s) / eq2(s), 1.0, 1e-5) << "h " << row.hidden;
  }
  // GPT-3 175B (l 96, h 12288): the well-known 174.6 B.
  EXPECT_NEAR(parameter_count(gpt(96, 12288, 96)) / 1e9, 174.6, 0.05);
}

TEST(ParameterCount, LayerCountIsTwelveHSquaredPlusThirteenH) {
  const TransformerSpec s = gpt(32, 4096, 36);
  const double h = 4096;
  EXPECT_DOUBLE_EQ(layer_parameter_count(s), 12 * h * h + 13 * h);
  // A non-default FFN width changes the MLP only: 4h² + 2h·ffn weights, 9h + ffn biases/LN.
  TransformerSpec narrow = s;
  narrow.ffn_hidden_size = 2 * 4096;
  EXPECT_DOUBLE_EQ(layer_parameter_count(narrow), 4 * h * h + 2 * h * (2 * h) + 9 * h + 2 * h);
  EXPECT_LT(parameter_count(narrow), parameter_count(s));
}

TEST(PaddedVocab, IsAMultipleOf128TimesTensorParallelSize) {
  TransformerSpec s = gpt(32, 4096, 36);
  s.vocab_size = 50257;  // GPT-2 BPE vocabulary
  EXPECT_EQ(s.padded_vocab(1), 50304);  // Megatron-LM's well-known padded size
  EXPECT_EQ(s.padded_vocab(2), 50432);
  EXPECT_EQ(s.padded_vocab(8), 51200);
  s.vocab_size = 51200;
  EXPECT_EQ(s.padded_vocab(8), 51200);  // already a multiple of 1024
  EXPECT_EQ(s.padded_vocab(16), 51200);
  EXPECT_EQ(s.padded_vocab(3), 51456);  // 134 × 384
}

}  // namespace
}  // namespace ptdp
