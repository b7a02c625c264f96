#include "model/layout.hpp"

#include <cctype>

#include "core/error.hpp"

namespace ptdp {
namespace {

constexpr size_t kMaxSymbols = 100'000;

// One symbol of the expanded layout and where it was written (1-based).
struct Symbol {
  char c;
  size_t pos;
};

class LayoutParser {
 public:
  LayoutParser(const std::string& text, const std::string& key) : text_(text), key_(key) {}

  std::vector<Symbol> expand() {
    std::vector<Symbol> out;
    while (i_ < text_.size()) {
      if (text_[i_] == ')') fail(i_, "')' closes no group");
      if (text_[i_] == '(') {
        const size_t open = i_++;
        std::vector<Symbol> group;
        while (i_ < text_.size() && text_[i_] != ')') {
          if (text_[i_] == '(') fail(i_, "a group inside a group: Megatron's layouts repeat one level of (…)*N");
          symbol(group);
        }
        if (i_ >= text_.size()) fail(open, "'(' is not closed");
        ++i_;  // ')'
        if (i_ >= text_.size() || text_[i_] != '*') fail(open, "a group (…) must be followed by *N, its repeat count");
        append(out, group, count(), open);
      } else {
        symbol(out);
      }
    }
    return out;
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw ConfigError(key_, "position " + std::to_string(at + 1) + " of \"" + quoted_text() + "\": " + what);
  }

 private:
  // One symbol (with its repeat) or a comma, appended to `out`.
  void symbol(std::vector<Symbol>& out) {
    const char c = text_[i_];
    if (c == ',') {
      ++i_;
      return;
    }
    if (c == '*') fail(i_, "'*' repeats nothing (write a symbol or a group before it)");
    if (std::isdigit(static_cast<unsigned char>(c))) fail(i_, "a count without '*' before it");
    if (c != 'E' && c != 't' && c != 'm' && c != 'L' && c != '|')
      fail(i_, "'" + shown(c) + "' is not a layout symbol (E embedding, t decoder layer, m multi-token-prediction layer, L loss, "
                                "| stage boundary, X*N or (…)*N repeats, commas ignored)");
    const size_t at = i_++;
    if (i_ < text_.size() && text_[i_] == '*') {
      append(out, {Symbol{c, at + 1}}, count(), at);
    } else {
      append(out, {Symbol{c, at + 1}}, 1, at);
    }
  }

  // The count after '*' (i_ at the '*').
  int64_t count() {
    const size_t star = i_++;
    int64_t n = 0;
    size_t digits = 0;
    while (i_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[i_]))) {
      if (++digits > 7) fail(star, "repeat count too large (at most " + std::to_string(kMaxSymbols) + " symbols in all)");
      n = n * 10 + (text_[i_++] - '0');
    }
    if (digits == 0) fail(star, "'*' must be followed by a repeat count");
    return n;
  }

  void append(std::vector<Symbol>& out, const std::vector<Symbol>& what, int64_t times, size_t at) {
    if (static_cast<double>(out.size()) + static_cast<double>(what.size()) * static_cast<double>(times) > static_cast<double>(kMaxSymbols))
      fail(at, "expands to more than " + std::to_string(kMaxSymbols) + " symbols");
    for (int64_t k = 0; k < times; ++k) out.insert(out.end(), what.begin(), what.end());
  }

  static std::string shown(char c) { return ptdp::printable(std::string(1, c)); }
  std::string quoted_text() const { return ptdp::printable(text_, 80); }

  const std::string& text_;
  const std::string& key_;
  size_t i_ = 0;
};

}  // namespace

std::vector<LayoutStage> parse_pipeline_layout(const std::string& text, const std::string& key) {
  LayoutParser parser(text, key);
  if (text.empty()) throw ConfigError(key, "is empty: give Megatron's layout, e.g. \"Et|(tt|)*30mL\"");
  const std::vector<Symbol> symbols = parser.expand();
  std::vector<LayoutStage> stages(1);
  size_t embedding_at = 0, loss_at = 0, first_mtp_at = 0;
  int64_t mtp_stage = -1;
  auto stage_empty = [&](size_t at) {
    const LayoutStage& s = stages.back();
    if (!s.embedding && !s.loss && s.layers == 0 && s.mtp == 0)
      parser.fail(at, "stage " + std::to_string(stages.size() - 1) + " holds nothing (every stage needs E, t, m or L)");
  };
  for (const Symbol& sym : symbols) {
    LayoutStage& s = stages.back();
    const size_t at = sym.pos - 1;
    if (loss_at != 0 && sym.c != '|') parser.fail(at, "'" + std::string(1, sym.c) + "' after L: L (the loss) closes the last stage");
    switch (sym.c) {
      case '|':
        stage_empty(at);
        if (loss_at != 0) parser.fail(at, "a stage after L: L (the loss) closes the last stage");
        stages.emplace_back();
        break;
      case 'E':
        if (embedding_at != 0) parser.fail(at, "E (the embedding) appears twice (first at position " + std::to_string(embedding_at) + ")");
        if (stages.size() > 1 || s.layers > 0 || s.mtp > 0) parser.fail(at, "E (the embedding) must open the first stage");
        embedding_at = sym.pos;
        s.embedding = true;
        break;
      case 't':
        if (first_mtp_at != 0)
          parser.fail(at, "a decoder layer after the multi-token-prediction layer at position " + std::to_string(first_mtp_at) +
                              " (the m layers follow the whole decoder)");
        ++s.layers;
        break;
      case 'm':
        if (mtp_stage >= 0 && mtp_stage != static_cast<int64_t>(stages.size()) - 1)
          parser.fail(at, "multi-token-prediction layers in two stages (" + std::to_string(mtp_stage) + " and " +
                              std::to_string(stages.size() - 1) + "): ptdp places them on one stage");
        if (first_mtp_at == 0) first_mtp_at = sym.pos;
        mtp_stage = static_cast<int64_t>(stages.size()) - 1;
        ++s.mtp;
        break;
      case 'L':
        loss_at = sym.pos;
        s.loss = true;
        break;
      default:
        PTDP_ASSERT(false, "the parser admits E t m L | only");
    }
  }
  stage_empty(text.size());
  if (embedding_at == 0) parser.fail(0, "no E: the embedding must open the first stage");
  if (loss_at == 0) parser.fail(text.size() - 1, "no L: the loss must close the last stage");
  return stages;
}

namespace {
std::string repeated(char c, int64_t n) {
  if (n <= 0) return "";
  if (n <= 2) return std::string(static_cast<size_t>(n), c);
  return std::string(1, c) + "*" + std::to_string(n);
}
}  // namespace

std::string format_pipeline_layout(const std::vector<int64_t>& layers, const std::vector<int64_t>& mtp) {
  PTDP_ASSERT(layers.size() == mtp.size() && !layers.empty(), "one layer and one MTP count per stage");
  const size_t S = layers.size();
  std::vector<std::string> stage(S);
  for (size_t s = 0; s < S; ++s)
    stage[s] = (s == 0 ? "E" : "") + repeated('t', layers[s]) + repeated('m', mtp[s]) + (s + 1 == S ? "L" : "");
  std::string out;
  for (size_t s = 0; s < S;) {
    size_t run = 1;
    while (s + run + 1 < S && stage[s + run] == stage[s]) ++run;  // the last stage (L) never repeats
    if (run > 1) {
      out += "(" + stage[s] + "|)*" + std::to_string(run);
    } else {
      out += stage[s];
      if (s + 1 < S) out += "|";
    }
    s += run;
  }
  return out;
}

}  // namespace ptdp
