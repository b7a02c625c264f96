// RFC 4180 CSV: the one writer behind every CSV ptdp produces (sweeps, validation), and a
// record splitter for the CSVs it reads (measured runs).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ptdp {

/// `text` without a leading UTF-8 byte-order mark (spreadsheets on Windows write one).
std::string strip_utf8_bom(std::string text);

/// A field as RFC 4180 wants it: quoted (with doubled quotes) when it holds a comma, a quote,
/// CR or LF or begins/ends with a space; as is otherwise.
std::string csv_field(std::string_view value);
/// One record: the fields joined by commas, terminated by CRLF-free "\n" (as most tools expect).
std::string csv_record(const std::vector<std::string>& fields);
/// One field of a record read back, with the 1-based character column where it starts (for
/// FILE:ROW:COL messages). Surrounding blanks are trimmed.
struct CsvCell {
  std::string text;
  int column = 1;
};
/// Splits one record (RFC 4180 quoting: commas and doubled quotes inside quotes). Returns false
/// when a quoted field is not closed.
bool csv_split(std::string_view line, std::vector<CsvCell>& cells);

/// A number with `digits` significant digits ("" for NaN, so spreadsheets see an empty cell).
std::string csv_number(double value, int digits = 10);

}  // namespace ptdp
