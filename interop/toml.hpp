// A reader of the TOML that training configs use (torchtitan's train.toml): tables, dotted
// table names, key = value with strings, integers, floats, booleans, arrays and inline tables,
// comments. Every value keeps its line and column for error messages.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace ptdp {

struct TomlValue {
  enum Kind { String, Integer, Float, Boolean, Array, Table } kind = String;
  std::string text;               // String; for others the value as written (for messages)
  int64_t integer = 0;
  double number = 0;              // Float (and Integer, converted)
  bool boolean = false;
  std::vector<TomlValue> items;   // Array
  std::map<std::string, TomlValue> table;  // Table (inline)
  SourceLocation where;
};

/// A TOML document as "table.key" → value (keys of the top level have no dot; an inline table
/// is one Table value). Throws ConfigError at file:line:col for a syntax error, a duplicate key
/// or table, a construct it does not read (arrays of tables, dates), or a value out of range.
std::map<std::string, TomlValue> parse_toml(const std::string& text, const std::string& source);

/// "string", "integer", … for messages.
const char* toml_kind_name(TomlValue::Kind kind);

}  // namespace ptdp
