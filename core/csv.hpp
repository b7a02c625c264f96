// RFC 4180 CSV output: the one writer behind every CSV ptdp produces (sweeps, validation).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ptdp {

/// A field as RFC 4180 wants it: quoted (with doubled quotes) when it holds a comma, a quote,
/// CR or LF or begins/ends with a space; as is otherwise.
std::string csv_field(std::string_view value);
/// One record: the fields joined by commas, terminated by CRLF-free "\n" (as most tools expect).
std::string csv_record(const std::vector<std::string>& fields);
/// A number with `digits` significant digits ("" for NaN, so spreadsheets see an empty cell).
std::string csv_number(double value, int digits = 10);

}  // namespace ptdp
