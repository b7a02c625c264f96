// The TOML reader (interop/toml.hpp): a recursive-descent parser over the text, located errors.
#include "interop/toml.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace ptdp {
namespace {

constexpr int kMaxNesting = 64;

class TomlParser {
 public:
  TomlParser(const std::string& text, std::string source) : s_(text), source_(std::move(source)) {}

  std::map<std::string, TomlValue> document() {
    std::string table;
    for (;;) {
      skip_blank_lines();
      if (pos_ >= s_.size()) break;
      if (s_[pos_] == '[') {
        const SourceLocation at = here();
        if (peek(1) == '[') fail("arrays of tables ([[…]]) are not read", at);
        ++pos_, ++col_;
        spaces();
        table = dotted_key();
        spaces();
        if (peek(0) != ']') fail("expected ']' to close the table name", here());
        ++pos_, ++col_;
        if (!tables_.insert(table).second) fail("table [" + table + "] is defined twice", at);
        if (out_.count(table)) fail("[" + table + "] names a key defined before", at);
        end_of_line();
        continue;
      }
      const SourceLocation at = here();
      const std::string key = dotted_key();
      spaces();
      if (peek(0) != '=') fail("expected '=' after the key '" + printable(key, 40) + "'", here());
      ++pos_, ++col_;
      spaces();
      TomlValue v = value(0);
      const std::string full = table.empty() ? key : table + "." + key;
      if (tables_.count(full)) fail("'" + printable(full, 60) + "' is a table already", at);
      if (!out_.emplace(full, std::move(v)).second) fail("duplicate key '" + printable(full, 60) + "'", at);
      end_of_line();
    }
    return std::move(out_);
  }

 private:
  char peek(size_t k) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  SourceLocation here() const { return SourceLocation{source_, line_, col_}; }
  [[noreturn]] void fail(const std::string& what, const SourceLocation& at) const { throw ConfigError("", what, at); }
  void advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void spaces() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) advance();
  }
  void comment() {
    if (peek(0) == '#')
      while (pos_ < s_.size() && s_[pos_] != '\n') advance();
  }
  void skip_blank_lines() {
    for (;;) {
      spaces();
      comment();
      if (peek(0) == '\r' && peek(1) == '\n') advance();
      if (peek(0) != '\n') return;
      advance();
    }
  }
  // Inside arrays: blanks, newlines and comments.
  void skip_all() {
    for (;;) {
      spaces();
      comment();
      if (peek(0) == '\n' || peek(0) == '\r') {
        advance();
        continue;
      }
      return;
    }
  }
  void end_of_line() {
    spaces();
    comment();
    if (peek(0) == '\r') advance();
    if (pos_ < s_.size() && s_[pos_] != '\n') fail("unexpected '" + printable(std::string(1, s_[pos_])) + "' after the value", here());
    if (pos_ < s_.size()) advance();
  }

  std::string simple_key() {
    const SourceLocation at = here();
    if (peek(0) == '"' || peek(0) == '\'') return string_value(at);
    std::string key;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' || s_[pos_] == '-')) {
      key += s_[pos_];
      advance();
    }
    if (key.empty()) fail(pos_ >= s_.size() ? "expected a key, found the end of the file" : "expected a key, found '" + printable(std::string(1, s_[pos_])) + "'", at);
    return key;
  }
  std::string dotted_key() {
    std::string key = simple_key();
    for (;;) {
      spaces();
      if (peek(0) != '.') return key;
      advance();
      spaces();
      key += "." + simple_key();
    }
  }

  std::string string_value(const SourceLocation& at) {
    const char quote = s_[pos_];
    if (peek(1) == quote && peek(2) == quote) {  // multi-line string
      for (int k = 0; k < 3; ++k) advance();
      if (peek(0) == '\n') advance();
      std::string out;
      while (pos_ < s_.size() && !(s_[pos_] == quote && peek(1) == quote && peek(2) == quote)) {
        if (quote == '"' && s_[pos_] == '\\') {
          out += escape(at);
          continue;
        }
        out += s_[pos_];
        advance();
      }
      if (pos_ >= s_.size()) fail("unterminated multi-line string", at);
      for (int k = 0; k < 3; ++k) advance();
      return out;
    }
    advance();
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote && s_[pos_] != '\n') {
      if (quote == '"' && s_[pos_] == '\\') {
        out += escape(at);
        continue;
      }
      out += s_[pos_];
      advance();
    }
    if (pos_ >= s_.size() || s_[pos_] != quote) fail("unterminated string", at);
    advance();
    return out;
  }

  std::string escape(const SourceLocation& at) {
    advance();  // the backslash
    if (pos_ >= s_.size()) fail("unterminated string", at);
    const char c = s_[pos_];
    advance();
    switch (c) {
      case 'n': return "\n";
      case 't': return "\t";
      case 'r': return "\r";
      case 'b': return "\b";
      case 'f': return "\f";
      case '"': return "\"";
      case '\\': return "\\";
      case '\n':  // line-ending backslash in a multi-line string
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) advance();
        return "";
      case 'u':
      case 'U': {
        const int digits = c == 'u' ? 4 : 8;
        uint32_t code = 0;
        for (int k = 0; k < digits; ++k) {
          if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) fail("a \\u escape needs hexadecimal digits", at);
          const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(s_[pos_])));
          code = code * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : h - 'a' + 10);
          advance();
        }
        if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) fail("a \\u escape outside Unicode scalar values", at);
        std::string out;
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xC0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else if (code < 0x10000) {
          out += static_cast<char>(0xE0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (code >> 18));
          out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        }
        return out;
      }
      default: fail("unknown escape \\" + printable(std::string(1, c)), at);
    }
  }

  TomlValue value(int depth) {
    if (depth > kMaxNesting) fail("values nested more than " + std::to_string(kMaxNesting) + " deep", here());
    TomlValue v;
    v.where = here();
    const char c = peek(0);
    if (c == '"' || c == '\'') {
      v.kind = TomlValue::String;
      v.text = string_value(v.where);
      return v;
    }
    if (c == '[') {
      v.kind = TomlValue::Array;
      advance();
      for (;;) {
        skip_all();
        if (peek(0) == ']') {
          advance();
          break;
        }
        if (pos_ >= s_.size()) fail("unterminated array", v.where);
        v.items.push_back(value(depth + 1));
        if (v.items.size() > 100'000) fail("an array of more than 100000 items", v.where);
        skip_all();
        if (pos_ >= s_.size()) fail("unterminated array", v.where);
        if (peek(0) == ',') {
          advance();
          continue;
        }
        if (peek(0) == ']') {
          advance();
          break;
        }
        fail("expected ',' or ']' in the array", here());
      }
      v.text = "[…]";
      return v;
    }
    if (c == '{') {
      v.kind = TomlValue::Table;
      advance();
      spaces();
      if (peek(0) == '}') {
        advance();
        return v;
      }
      for (;;) {
        spaces();
        const SourceLocation at = here();
        const std::string key = dotted_key();
        spaces();
        if (peek(0) != '=') fail("expected '=' in the inline table", here());
        advance();
        spaces();
        if (!v.table.emplace(key, value(depth + 1)).second) fail("duplicate key '" + printable(key, 40) + "' in the inline table", at);
        spaces();
        if (peek(0) == ',') {
          advance();
          continue;
        }
        if (peek(0) == '}') {
          advance();
          break;
        }
        fail("expected ',' or '}' in the inline table", here());
      }
      v.text = "{…}";
      return v;
    }
    // A bare value up to the end of the value: booleans, numbers.
    std::string word;
    while (pos_ < s_.size() && !std::isspace(static_cast<unsigned char>(s_[pos_])) && s_[pos_] != ',' && s_[pos_] != ']' && s_[pos_] != '}' &&
           s_[pos_] != '#') {
      word += s_[pos_];
      advance();
    }
    v.text = word;
    if (word.empty()) fail(pos_ >= s_.size() ? "expected a value, found the end of the file" : "expected a value", v.where);
    if (word == "true" || word == "false") {
      v.kind = TomlValue::Boolean;
      v.boolean = word == "true";
      return v;
    }
    if (word == "inf" || word == "+inf" || word == "-inf" || word == "nan" || word == "+nan" || word == "-nan")
      fail("'" + word + "' is not a usable number here", v.where);
    std::string digits;
    for (size_t k = 0; k < word.size(); ++k) {
      if (word[k] == '_') {
        if (k == 0 || k + 1 == word.size() || !std::isdigit(static_cast<unsigned char>(word[k - 1])) ||
            !std::isdigit(static_cast<unsigned char>(word[k + 1])))
          fail("'_' must sit between digits (got '" + printable(word, 40) + "')", v.where);
        continue;
      }
      digits += word[k];
    }
    const bool is_float = digits.find_first_of(".eE") != std::string::npos && digits.rfind("0x", 0) != 0;
    errno = 0;
    char* end = nullptr;
    if (!is_float) {
      int base = 10;
      std::string body = digits;
      if (body.rfind("0x", 0) == 0) base = 16, body = body.substr(2);
      else if (body.rfind("0o", 0) == 0) base = 8, body = body.substr(2);
      else if (body.rfind("0b", 0) == 0) base = 2, body = body.substr(2);
      if (body.empty() || (base == 10 && body.find_first_not_of("+-0123456789") != std::string::npos))
        fail("expected a value (a string needs quotes; got '" + printable(word, 40) + "')", v.where);
      const long long x = std::strtoll(body.c_str(), &end, base);
      if (end == body.c_str() || *end != '\0') fail("expected a value (a string needs quotes; got '" + printable(word, 40) + "')", v.where);
      if (errno == ERANGE) fail("the integer " + printable(word, 40) + " is out of range", v.where);
      v.kind = TomlValue::Integer;
      v.integer = x;
      v.number = static_cast<double>(x);
      return v;
    }
    const double x = std::strtod(digits.c_str(), &end);
    if (end == digits.c_str() || *end != '\0' || digits.find_first_of("xXpP") != std::string::npos)
      fail("expected a value (a string needs quotes; got '" + printable(word, 40) + "')", v.where);
    if (errno == ERANGE || !std::isfinite(x)) fail("the number " + printable(word, 40) + " is out of range", v.where);
    v.kind = TomlValue::Float;
    v.number = x;
    return v;
  }

  const std::string& s_;
  std::string source_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  std::map<std::string, TomlValue> out_;
  std::set<std::string> tables_;
};

}  // namespace

std::map<std::string, TomlValue> parse_toml(const std::string& text, const std::string& source) {
  return TomlParser(text, source).document();
}

const char* toml_kind_name(TomlValue::Kind kind) {
  switch (kind) {
    case TomlValue::String: return "a string";
    case TomlValue::Integer: return "an integer";
    case TomlValue::Float: return "a number";
    case TomlValue::Boolean: return "true or false";
    case TomlValue::Array: return "an array";
    case TomlValue::Table: return "a table";
  }
  return "a value";
}

}  // namespace ptdp
