#include "core/csv.hpp"

#include <cmath>
#include <cstdio>

namespace ptdp {

std::string strip_utf8_bom(std::string text) {
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF && static_cast<unsigned char>(text[1]) == 0xBB &&
      static_cast<unsigned char>(text[2]) == 0xBF)
    text.erase(0, 3);
  return text;
}

std::string csv_field(std::string_view value) {
  const bool quote = value.find_first_of(",\"\r\n") != std::string_view::npos ||
                     (!value.empty() && (value.front() == ' ' || value.back() == ' '));
  if (!quote) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string csv_record(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    out += csv_field(fields[i]);
  }
  out += '\n';
  return out;
}

std::string csv_number(double value, int digits) {
  if (std::isnan(value)) return {};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, value);
  return buf;
}

bool csv_split(std::string_view line, std::vector<CsvCell>& cells) {
  cells.assign(1, CsvCell{});
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back().text += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        cells.back().text += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      cells.push_back(CsvCell{"", static_cast<int>(i) + 2});
    } else if (ch != '\r') {
      cells.back().text += ch;
    }
  }
  for (auto& c : cells) {
    const auto b = c.text.find_first_not_of(" \t"), e = c.text.find_last_not_of(" \t");
    c.text = b == std::string::npos ? "" : c.text.substr(b, e - b + 1);
  }
  return !quoted;
}

}  // namespace ptdp
