#include "core/error.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace ptdp {

std::string SourceLocation::str() const {
  if (file.empty()) return "";
  if (line <= 0) return file;
  if (column <= 0) return file + ":" + std::to_string(line);
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

ConfigError::ConfigError(std::string key_path, std::string message, SourceLocation where)
    : std::runtime_error(format(key_path, message, where)),
      key_path_(std::move(key_path)),
      message_(std::move(message)),
      where_(std::move(where)) {}

ConfigError ConfigError::located(SourceLocation where) const {
  ConfigError e(key_path_, message_, where);
  e.rule_ = rule_;
  return e;
}

ConfigError ConfigError::rule(std::string key_path, std::string message) {
  ConfigError e(std::move(key_path), std::move(message));
  e.rule_ = true;
  return e;
}

std::string ConfigError::format(const std::string& key, const std::string& msg, const SourceLocation& at) {
  std::string out;
  if (at.known()) out += at.str() + ": ";
  if (!key.empty()) out += key + ": ";
  out += msg;
  return out;
}

void assertion_failed(const char* expr, const char* file, int line, const std::string& detail) {
  throw InternalError(std::string("internal error (a bug in ptdp) at ") + file + ":" + std::to_string(line) +
                      ": assertion '" + expr + "' failed" + (detail.empty() ? "" : ": " + detail));
}

std::string printable(std::string_view text, size_t max_chars) {
  std::string out;
  size_t shown = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (shown++ >= max_chars) {
      out += "…";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    // A well-formed UTF-8 sequence (2–4 bytes) is kept as it is.
    const size_t len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
    bool utf8 = len > 1 && i + len <= text.size();
    for (size_t k = 1; utf8 && k < len; ++k) utf8 = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (utf8) {
      out.append(text.substr(i, len));
      i += len - 1;
    } else if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) len = 1, cp = c;
    else if (c >= 0xC2 && c < 0xE0) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c < 0xF0) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c < 0xF5) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > text.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    i += len;
  }
  return true;
}

static size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Accept at most a third of the word's length in edits (and at least 2), so suggestions make sense.
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string m = closest_match(word, candidates);
  return m.empty() ? std::string() : " (did you mean '" + m + "'?)";
}

}  // namespace ptdp
