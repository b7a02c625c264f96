// torchtitan 0.3's Python configs read as text (interop/torchtitan_py.hpp).
#include "interop/torchtitan_py.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/error.hpp"

namespace ptdp {
namespace {

constexpr size_t kMaxTokens = 1'000'000;
constexpr int kMaxDepth = 64;

struct Token {
  enum Kind { Name, Number, String, Op, Newline, End } kind = End;
  std::string text;
  SourceLocation where;
};

// Python's tokens, as far as configs need them: names, numbers, strings (', ", triple-quoted,
// with r/b/f prefixes), operators; comments dropped; NEWLINE at the end of each logical line
// (not inside brackets, nor after a backslash).
std::vector<Token> tokenize(const std::string& text, const std::string& source) {
  std::vector<Token> out;
  int line = 1, col = 1, depth = 0;
  size_t i = 0;
  auto at = [&] { return SourceLocation{source, line, col}; };
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && i < text.size(); ++k, ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
  };
  auto push = [&](Token::Kind kind, std::string s, SourceLocation w) {
    if (out.size() >= kMaxTokens) throw ConfigError("", "more than 1 M tokens (refused: larger than any config)", w);
    out.push_back(Token{kind, std::move(s), std::move(w)});
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') advance(1);
    } else if (c == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
      advance(2);
    } else if (c == '\n') {
      if (depth == 0 && !out.empty() && out.back().kind != Token::Newline) push(Token::Newline, "\n", at());
      advance(1);
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      advance(1);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80) {
      // A name, or a string prefix (r"…", f'…', b"…", rb'…').
      size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_' || static_cast<unsigned char>(text[j]) >= 0x80)) ++j;
      const std::string word = text.substr(i, j - i);
      std::string lower = word;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (j < text.size() && (text[j] == '"' || text[j] == '\'') && word.size() <= 2 &&
          lower.find_first_not_of("rbfu") == std::string::npos) {
        advance(word.size());  // the prefix; the string follows
        continue;
      }
      const SourceLocation w = at();
      advance(j - i);
      push(Token::Name, word, w);
    } else if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1])))) {
      size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_' || text[j] == '.' ||
                                 ((text[j] == '+' || text[j] == '-') && (text[j - 1] == 'e' || text[j - 1] == 'E'))))
        ++j;
      const SourceLocation w = at();
      std::string number = text.substr(i, j - i);
      advance(j - i);
      push(Token::Number, number, w);
    } else if (c == '"' || c == '\'') {
      const SourceLocation w = at();
      const bool triple = text.compare(i, 3, std::string(3, c)) == 0;
      const std::string close = triple ? std::string(3, c) : std::string(1, c);
      advance(close.size());
      std::string value;
      for (;;) {
        if (i >= text.size() || (!triple && text[i] == '\n')) throw ConfigError("", "a string that does not end", w);
        if (text.compare(i, close.size(), close) == 0) break;
        if (text[i] == '\\' && i + 1 < text.size()) {
          const char e = text[i + 1];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e;
          advance(2);
        } else {
          value += text[i];
          advance(1);
        }
      }
      advance(close.size());
      push(Token::String, value, w);
    } else {
      static const char* const two[] = {"->", "**", "//", "==", "!=", "<=", ">=", ":="};
      std::string op(1, c);
      for (const char* t : two)
        if (text.compare(i, 2, t) == 0) op = t;
      if (op == "(" || op == "[" || op == "{") ++depth;
      if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
      const SourceLocation w = at();
      advance(op.size());
      push(Token::Op, op, w);
    }
  }
  if (out.empty() || out.back().kind != Token::Newline) push(Token::Newline, "\n", at());
  push(Token::End, "", at());
  return out;
}

// A value of the config as written: literals, lists, calls (name and keyword arguments), a local
// name (resolved when read), or an expression ptdp does not evaluate (Opaque, its first token).
struct PyKwarg;

struct PyValue {
  enum Kind { None, Bool, Int, Float, Str, List, Dict, Call, Ref, Opaque } kind = Opaque;
  std::string text;  // Str: the string; Call/Ref: the (dotted) name; Opaque: what it starts with
  int64_t integer = 0;
  double number = 0;
  bool boolean = false;
  std::vector<PyValue> items;                           // List; Call: positional arguments
  std::vector<PyKwarg> kwargs;  // Call: keyword arguments
  SourceLocation where;
};

// A keyword argument (first: the name, second: the value, as a map's entries read).
struct PyKwarg {
  std::string first;
  PyValue second;
};

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& source) : t_(tokens), source_(source) {}

  // The functions `def NAME(...) ...:` of the module at top level (a def on column 1), each with
  // the token range of its body.
  struct Function {
    std::string name;
    size_t body = 0, end = 0;
    SourceLocation where;
  };
  std::vector<Function> functions() const {
    std::vector<Function> out;
    for (size_t k = 0; k + 1 < t_.size(); ++k) {
      if (t_[k].kind != Token::Name || t_[k].text != "def" || t_[k].where.column != 1 || t_[k + 1].kind != Token::Name) continue;
      size_t b = k + 2;
      while (b < t_.size() && t_[b].kind != Token::Newline && !(t_[b].kind == Token::Op && t_[b].text == ":" && t_[b + 1].kind == Token::Newline)) ++b;
      if (!out.empty()) out.back().end = k;
      out.push_back(Function{t_[k + 1].text, b + 1, t_.size() - 1, t_[k].where});
    }
    // A function ends at the next top-level statement (any token on column 1).
    for (Function& f : out)
      for (size_t k = f.body; k < f.end; ++k)
        if (t_[k].where.column == 1 && t_[k].kind != Token::Newline && t_[k].kind != Token::End) {
          f.end = k;
          break;
        }
    return out;
  }

  // Runs the body of `f` as far as configs go: `name = value` statements bind local names, the
  // `return` gives the result (a local name is resolved). Other statements are skipped.
  PyValue run(const Function& f) {
    pos_ = f.body;
    std::optional<PyValue> result;
    while (pos_ < f.end && !result) {
      if (peek().kind == Token::Newline) {
        ++pos_;
        continue;
      }
      if (peek().kind == Token::Name && peek().text == "return") {
        ++pos_;
        result = resolve(expression(0));
      } else if (peek().kind == Token::Name && t_[pos_ + 1].kind == Token::Op && t_[pos_ + 1].text == "=") {
        const std::string name = peek().text;
        pos_ += 2;
        locals_[name] = expression(0);
      } else if (peek().kind == Token::Name && (peek().text == "def" || peek().text == "class")) {
        skip_block();  // a nested function or class: not the config
        continue;
      } else {
        // Attribute assignments (config.x = …) change a config built elsewhere: recorded.
        if (peek().kind == Token::Name && t_[pos_ + 1].kind == Token::Op && t_[pos_ + 1].text == ".") modified_.push_back(peek().where);
        skip_statement();
        continue;
      }
      if (peek().kind != Token::Newline && !result) skip_statement();
    }
    if (!result) throw ConfigError("", "function " + f.name + " returns no config", f.where);
    return *result;
  }
  const std::vector<SourceLocation>& modified() const { return modified_; }
  PyValue resolve(const PyValue& v) const {
    if (v.kind != PyValue::Ref) return v;
    const auto it = locals_.find(v.text);
    return it == locals_.end() ? v : it->second;
  }

 private:
  const Token& peek() const { return t_[std::min(pos_, t_.size() - 1)]; }
  bool op(const char* s) const { return peek().kind == Token::Op && peek().text == s; }
  [[noreturn]] void fail(const std::string& what) const { throw ConfigError("", what, peek().where); }
  void expect(const char* s) {
    if (!op(s)) fail(std::string("expected '") + s + "', not '" + printable(peek().text, 20) + "'");
    ++pos_;
  }
  void skip_statement() {
    while (peek().kind != Token::Newline && peek().kind != Token::End) ++pos_;
    if (peek().kind == Token::Newline) ++pos_;
  }
  // A nested def/class: its header line, then every line indented deeper than it.
  void skip_block() {
    const int column = peek().where.column;
    skip_statement();
    while (peek().kind != Token::End && peek().where.column > column) skip_statement();
  }
  // Tokens up to the end of the enclosing item (a ',' or closing bracket at this depth, or the
  // line's end): an expression that is not read.
  PyValue opaque(SourceLocation where, std::string first) {
    int depth = 0;
    while (peek().kind != Token::End && peek().kind != Token::Newline) {
      if (peek().kind == Token::Op) {
        const std::string& s = peek().text;
        if (s == "(" || s == "[" || s == "{") ++depth;
        else if (s == ")" || s == "]" || s == "}") {
          if (depth == 0) break;
          --depth;
        } else if (s == "," && depth == 0) break;
      }
      ++pos_;
    }
    PyValue v;
    v.kind = PyValue::Opaque;
    v.text = std::move(first);
    v.where = std::move(where);
    return v;
  }

  PyValue expression(int depth) {
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth));
    const SourceLocation where = peek().where;
    const std::string first = peek().text;
    PyValue v = primary(depth);
    // An operator after a value (and, in, +, if … else, …): not evaluated.
    if (!(peek().kind == Token::Newline || peek().kind == Token::End || op(",") || op(")") || op("]") || op("}") || op(":")))
      return opaque(where, first);
    return v;
  }

  PyValue primary(int depth) {
    PyValue v;
    v.where = peek().where;
    const Token& tk = peek();
    if (tk.kind == Token::Number) {
      ++pos_;
      std::string digits;
      for (char c : tk.text)
        if (c != '_') digits += c;
      int64_t i = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), i);
      if (ec == std::errc() && end == digits.data() + digits.size()) {
        v.kind = PyValue::Int, v.integer = i, v.number = static_cast<double>(i), v.text = tk.text;
        return v;
      }
      char* stop = nullptr;
      const double d = std::strtod(digits.c_str(), &stop);
      if (stop != digits.c_str() + digits.size() || !std::isfinite(d)) throw ConfigError("", "not a number: '" + printable(tk.text, 30) + "'", tk.where);
      v.kind = PyValue::Float, v.number = d, v.text = tk.text;
      return v;
    }
    if (tk.kind == Token::String) {
      v.kind = PyValue::Str;
      while (peek().kind == Token::String) v.text += peek().text, ++pos_;  // implicit concatenation
      return v;
    }
    if (tk.kind == Token::Op && tk.text == "-" && t_[pos_ + 1].kind == Token::Number) {
      ++pos_;
      v = primary(depth + 1);
      v.integer = -v.integer, v.number = -v.number, v.text = "-" + v.text;
      return v;
    }
    if (tk.kind == Token::Op && (tk.text == "[" || tk.text == "(")) {
      const std::string close = tk.text == "[" ? "]" : ")";
      ++pos_;
      v.kind = PyValue::List;
      bool comma = false;
      while (!op(close.c_str())) {
        v.items.push_back(expression(depth + 1));
        if (op(",")) ++pos_, comma = true;
        else break;
      }
      expect(close.c_str());
      if (close == ")" && v.items.size() == 1 && !comma) return v.items[0];  // parentheses, not a tuple
      return v;
    }
    if (tk.kind == Token::Op && tk.text == "{") {
      ++pos_;
      v.kind = PyValue::Dict;
      while (!op("}")) {
        PyValue key = expression(depth + 1);
        if (!op(":")) {  // a set, or a comprehension: not read
          while (!op("}") && peek().kind != Token::End) {
            if (op("{") || op("(") || op("[")) (void)primary(depth + 1);
            else ++pos_;
          }
          expect("}");
          return opaque(v.where, "{");
        }
        expect(":");
        PyValue value = expression(depth + 1);
        v.kwargs.push_back(PyKwarg{key.text, std::move(value)});
        if (op(",")) ++pos_;
        else break;
      }
      expect("}");
      return v;
    }
    if (tk.kind == Token::Name) {
      if (tk.text == "True" || tk.text == "False") {
        ++pos_;
        v.kind = PyValue::Bool, v.boolean = tk.text == "True", v.text = tk.text;
        return v;
      }
      if (tk.text == "None") {
        ++pos_;
        v.kind = PyValue::None, v.text = "None";
        return v;
      }
      if (tk.text == "lambda" || tk.text == "not" || tk.text == "await" || tk.text == "yield") return opaque(v.where, tk.text);
      std::string name = tk.text;
      ++pos_;
      while (op(".") && t_[pos_ + 1].kind == Token::Name) name += "." + t_[pos_ + 1].text, pos_ += 2;
      if (!op("(")) {
        v.kind = PyValue::Ref, v.text = name;
        return v;
      }
      ++pos_;
      v.kind = PyValue::Call, v.text = name;
      while (!op(")")) {
        if (op("*") || op("**")) {
          const std::string star = peek().text;
          ++pos_;
          v.items.push_back(opaque(peek().where, star));
        } else if (peek().kind == Token::Name && t_[pos_ + 1].kind == Token::Op && t_[pos_ + 1].text == "=") {
          const std::string key = peek().text;
          pos_ += 2;
          v.kwargs.push_back(PyKwarg{key, expression(depth + 1)});
        } else {
          v.items.push_back(expression(depth + 1));
        }
        if (op(",")) ++pos_;
        else break;
      }
      expect(")");
      // A method called on the call's result (….Config().build()): not a config.
      if (op(".")) return opaque(v.where, name);
      return v;
    }
    return opaque(v.where, tk.text);
  }

  const std::vector<Token>& t_;
  const std::string& source_;
  size_t pos_ = 0;
  std::map<std::string, PyValue> locals_;
  std::vector<SourceLocation> modified_;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The TOML value of a literal; ConfigError naming `key` when it is not one.
TomlValue literal(const PyValue& v, const std::string& key) {
  TomlValue out;
  out.where = v.where;
  out.text = v.text;
  switch (v.kind) {
    case PyValue::Bool: out.kind = TomlValue::Boolean, out.boolean = v.boolean; return out;
    case PyValue::Int: out.kind = TomlValue::Integer, out.integer = v.integer, out.number = v.number; return out;
    case PyValue::Float: out.kind = TomlValue::Float, out.number = v.number; return out;
    case PyValue::Str: out.kind = TomlValue::String; return out;
    case PyValue::List:
      out.kind = TomlValue::Array;
      for (const PyValue& item : v.items) out.items.push_back(literal(item, key));
      return out;
    default: break;
  }
  throw ConfigError(key, "not a literal ('" + printable(v.text, 40) + "…'): ptdp reads the config as text and evaluates no Python; write the value itself",
                    v.where);
}

const char* kEffectless[] = {"loss", "optimizer", "lr_scheduler", "dataloader", "metrics", "profiler", "checkpoint", "validator",
                             "hf_assets_path", "comm", "debug", "fault_tolerance", "memory_estimation", "job"};

}  // namespace

bool is_torchtitan_python(const std::string& text) {
  return text.find("Trainer.Config(") != std::string::npos || text.find("-> Trainer.Config") != std::string::npos;
}

std::vector<std::string> torchtitan_python_configs(const std::string& text, const std::string& source) {
  const auto tokens = tokenize(text, source);
  Parser p(tokens, source);
  std::vector<std::string> out;
  for (const auto& f : p.functions()) {
    // A function whose `return` is a Trainer.Config(...) call (directly or through a local name).
    Parser q(tokens, source);
    try {
      const PyValue v = q.run(f);
      if (v.kind == PyValue::Call && ends_with(v.text, "Trainer.Config")) out.push_back(f.name);
    } catch (const ConfigError&) {
    }
  }
  return out;
}

std::map<std::string, TomlValue> parse_torchtitan_python(const std::string& text, const std::string& source, const std::string& function) {
  const auto tokens = tokenize(text, source);
  Parser p(tokens, source);
  const auto functions = p.functions();
  const std::vector<std::string> configs = torchtitan_python_configs(text, source);
  std::string list;
  for (const auto& c : configs) list += (list.empty() ? "" : ", ") + c;
  const SourceLocation file{source, 0, 0};
  std::string chosen = function;
  if (chosen.empty()) {
    if (configs.size() != 1)
      throw ConfigError("--config", configs.empty() ? "no function returns Trainer.Config(...) (a torchtitan 0.3 config_registry module)"
                                                    : "defines " + std::to_string(configs.size()) + " configs (" + printable(list, 300) +
                                                          "): name one with --config NAME",
                        file);
    chosen = configs.front();
  }
  const Parser::Function* f = nullptr;
  for (const auto& candidate : functions)
    if (candidate.name == chosen) f = &candidate;
  if (!f) throw ConfigError("--config", "no function '" + printable(chosen) + "' (configs: " + printable(list, 300) + ")", file);
  const PyValue result = p.run(*f);
  if (result.kind != PyValue::Call || !ends_with(result.text, "Trainer.Config"))
    throw ConfigError("--config", chosen + " derives its config from " +
                                      (result.kind == PyValue::Call ? "'" + result.text + "()'" : "'" + printable(result.text, 40) + "'") +
                                      " and changes it in code: ptdp reads configs that return Trainer.Config(...) whole (configs: " +
                                      printable(list, 300) + ")",
                      result.where);

  std::map<std::string, TomlValue> doc;
  auto text_value = [](const std::string& s, const SourceLocation& at) {
    TomlValue v;
    v.kind = TomlValue::String, v.text = s, v.where = at;
    return v;
  };
  // The model's name: the module model_registry comes from (`from torchtitan.models.llama3 import
  // model_registry`, or the folder of …/models/llama3/config_registry.py), else the function's
  // prefix (llama3_8b → llama3).
  std::string model = chosen.substr(0, chosen.find('_'));
  const std::string package = "from torchtitan.models.";
  const size_t imported = text.find(" import model_registry");
  const size_t from = imported == std::string::npos ? std::string::npos : text.rfind("from ", imported);
  if (from != std::string::npos && text.compare(from, package.size(), package) == 0 && imported > from + package.size()) {
    model = text.substr(from + package.size(), imported - from - package.size());
  } else if (const size_t m = source.rfind("models/"); m != std::string::npos && source.find('/', m + 7) != std::string::npos) {
    model = source.substr(m + 7, source.find('/', m + 7) - m - 7);
  }
  doc["model.name"] = text_value(model, f->where);
  // A dataclass constructor's keywords under `section`.
  auto section = [&](const std::string& name, const PyValue& call) {
    if (call.kind != PyValue::Call) throw ConfigError(name, "expected a config constructor, e.g. " + name + "=…Config(…), not '" + printable(call.text, 40) + "'", call.where);
    if (!call.items.empty()) throw ConfigError(name, "positional arguments to " + call.text + ": ptdp reads keyword arguments", call.items[0].where);
    for (const auto& [key, value] : call.kwargs) {
      const PyValue v = p.resolve(value);
      if (v.kind == PyValue::None) continue;  // the default
      std::string target = name + "." + key;
      if (name == "compile" && key == "enable_async_tensor_parallel") target = "parallelism.enable_async_tensor_parallel";
      doc[target] = literal(v, target);
    }
  };
  for (const auto& [key, raw] : result.kwargs) {
    const PyValue v = p.resolve(raw);
    if (key == "model_spec") {
      if (v.kind != PyValue::Call || !ends_with(v.text, "model_registry") || v.items.empty() || v.items[0].kind != PyValue::Str)
        throw ConfigError("model_spec", "expected model_registry(\"FLAVOR\", …), not '" + printable(v.text, 40) + "'", v.where);
      doc["model.flavor"] = literal(v.items[0], "model.flavor");
      for (const auto& [k, arg] : v.kwargs) {
        if (k != "converters") continue;
        const PyValue list = p.resolve(arg);
        if (list.kind == PyValue::None) continue;
        if (list.kind != PyValue::List) throw ConfigError("model.converters", "expected a list of converter configs", list.where);
        TomlValue names;
        names.kind = TomlValue::Array, names.where = list.where, names.text = "[…]";
        for (const PyValue& c : list.items) {
          if (c.kind != PyValue::Call) throw ConfigError("model.converters", "expected a converter's Config(…), not '" + printable(c.text, 40) + "'", c.where);
          const bool float8 = c.text.find("Float8LinearConverter") != std::string::npos;
          names.items.push_back(text_value(float8 ? "float8" : c.text, c.where));
          if (float8) {
            // 0.3's Float8 recipes: rowwise (the default) or rowwise_with_gw_hp.
            doc["float8.recipe_name"] = text_value("rowwise", c.where);
            for (const auto& [fk, fv] : c.kwargs)
              if (fk == "recipe_name") doc["float8.recipe_name"] = literal(p.resolve(fv), "float8.recipe_name");
          }
        }
        doc["model.converters"] = names;
      }
    } else if (key == "training" || key == "parallelism" || key == "compile") {
      section(key, v);
    } else if (key == "activation_checkpoint") {
      std::string mode;
      if (v.kind == PyValue::None) mode = "none";
      else if (v.kind == PyValue::Call && v.text.find("FullAC") != std::string::npos) mode = "full";
      else if (v.kind == PyValue::Call && v.text.find("SelectiveAC") != std::string::npos) mode = "selective";
      else
        throw ConfigError("activation_checkpoint", "'" + printable(v.text, 40) + "' is not modelled (SelectiveAC, FullAC or None are)", v.where);
      doc["activation_checkpoint.mode"] = text_value(mode, v.where);
      if (mode == "selective") doc["activation_checkpoint.selective_ac_option"] = text_value("op", v.where);  // 0.3's SAC is per op
    } else {
      bool quiet = false;
      for (const char* e : kEffectless) quiet = quiet || key == e;
      doc[(quiet ? "" : "trainer.") + key + (quiet ? ".config" : "")] = text_value(v.kind == PyValue::Str ? v.text : v.text + "(…)", v.where);
    }
  }
  return doc;
}

}  // namespace ptdp
