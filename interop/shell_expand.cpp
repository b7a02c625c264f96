// The launch-script interpreter's expansions (interop/shell_interpreter.hpp): words as bash
// expands them (quotes, parameters and ${…} operators, command substitutions the import can know,
// field splitting) and arithmetic $(( )) / (( )) / let.
#include <algorithm>
#include <cctype>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "interop/shell_interpreter.hpp"
#include "interop/shell_syntax.hpp"

namespace ptdp::shell_interpreter {

Expansion Shell::expand(const Word& w, bool split) {
  DepthGuard guard{++expand_depth_};
  if (expand_depth_ > kMaxDepth) fail("expansions nest more than " + std::to_string(kMaxDepth) + " deep");
  Expansion out;
  std::vector<Piece> pieces;
  for (const auto& s : w.segs) {
    if (s.quote == Quote::Single) {
      pieces.push_back(Piece{s.text, false, false, true});
    } else if (s.quote == Quote::None) {
      expand_text(s.text, false, false, pieces, out.unknown);
    } else {
      // "" is a word of its own, "${A[@]}" of an empty array is none.
      if (s.text.find("[@]") == std::string::npos && s.text.find("$@") == std::string::npos && s.text.find("${@") == std::string::npos)
        pieces.push_back(Piece{"", false, false, true});
      const size_t from = pieces.size();
      expand_text(s.text, true, false, pieces, out.unknown);
      for (size_t k = from; k < pieces.size(); ++k) pieces[k].quoted = !pieces[k].boundary;
    }
  }
  // Fields: unquoted expansion text splits on $IFS; quoted text joins the current field.
  const std::string separators = ifs();
  bool after_white = false;  // the last field was ended by IFS white space
  std::string current;
  bool open = false;
  size_t bytes = 0;
  for (const auto& p : pieces) {
    bytes += p.text.size();
    if (p.boundary) {
      if (!split) {
        current += ' ';
        open = true;
      } else if (open) {
        out.fields.push_back(std::move(current));
        current.clear();
        open = false;
      }
      continue;
    }
    if (!p.split || !split) {
      current += p.text;
      open = open || p.quoted || !p.text.empty() || !split;
      continue;
    }
    // Field splitting by $IFS, as bash: IFS white space (blank, tab, newline) separates and
    // is trimmed; any other IFS character ends a field, so that "a,,b" with IFS=, is a, "", b.
    for (char c : p.text) {
      if (separators.find(c) == std::string::npos) {
        current += c;
        open = true;
        after_white = false;
      } else if (is_blank(c)) {
        if (open) {
          out.fields.push_back(std::move(current));
          after_white = true;
        }
        current.clear();
        open = false;
      } else {
        if (open || !after_white) out.fields.push_back(std::move(current));
        current.clear();
        open = false;
        after_white = false;
      }
    }
  }
  if (open || (!split)) out.fields.push_back(std::move(current));
  expanded_bytes_ += bytes;
  if (expanded_bytes_ > kMaxExpanded) fail("the script expands more than 256 MiB of text (a loop that copies a large variable?)");
  charge_items(out.fields.size());
  for (const auto& f : out.fields)
    if (f.size() > kMaxValue) fail("a word grows beyond 1 MiB: a variable that doubles itself?");
  return out;
}

// A word as one string (assignment values, case subjects, test operands).
std::string Shell::string_of(const Word& w, Unknown* unknown) {
  Expansion x = expand(w, false);
  if (unknown && unknown->empty()) *unknown = x.unknown;
  return x.fields.empty() ? std::string() : x.fields[0];
}

// Unknown values in a condition are an error: bash would decide with a value the import lacks.
[[noreturn]] void Shell::unknown_condition(const Unknown& u, const std::string& what) const {
  if (u.name.empty())
    fail(what + " depends on " + u.reason + ", which an import does not run: give the value it decides with --env NAME=VALUE");
  fail(what + " depends on " + u.name + (u.reason.empty() ? ", which the script does not set (an environment variable)" : " (" + u.reason + ")") +
       ": give its value with --env " + u.name + "=VALUE");
}

std::string Shell::known_string(const Word& w, const std::string& what) {
  Unknown u;
  std::string value = string_of(w, &u);
  if (!u.empty()) unknown_condition(u, what);
  return value;
}

// A glob pattern from a word: quoted parts match literally.
std::string Shell::pattern_of(const Word& w) {
  std::string out;
  Unknown u;
  for (const auto& s : w.segs) {
    Word part{{s}, w.line, w.col};
    const std::string text = string_of(part, &u);
    out += s.quote == Quote::None ? text : glob_escape(text);
  }
  if (!u.empty()) unknown_condition(u, "the pattern");
  return out;
}

bool Shell::matches(const std::string& pattern, const std::string& text) {
  if (text.size() > kMaxMatch * 16 || pattern.size() > kMaxMatch) fail("a pattern match on more than 64 KiB of text");
  return glob_match(pattern, text);
}

// Appends the pieces of segment text `t`: literal text splits only where `literal_splits` (the
// operand of ${A:-a b} outside quotes), expansions outside double quotes split.
void Shell::expand_text(const std::string& t, bool in_double, bool literal_splits, std::vector<Piece>& out, Unknown& unknown) {
  const bool split = !in_double;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '`') {
      const size_t end = t.find('`', i + 1);
      const std::string sub = t.substr(i, end == std::string::npos ? std::string::npos : end - i + 1);
      if (end != std::string::npos)
        if (auto known = substitution(sub.substr(1, sub.size() - 2))) {
          out.push_back(Piece{*known, split, false});
          i += sub.size();
          continue;
        }
      if (unknown.empty()) unknown.reason = "the output of " + printable(sub, 40);
      out.push_back(Piece{sub, false, false});
      i += sub.size();
      continue;
    }
    if (t[i] != '$' || i + 1 >= t.size()) {
      size_t j = i;
      while (j < t.size() && t[j] != '$' && t[j] != '`') ++j;
      if (j == i) j = i + 1;
      out.push_back(Piece{t.substr(i, j - i), literal_splits && !in_double, false});
      i = j;
      continue;
    }
    const char n = t[i + 1];
    if (n == '(' && i + 2 < t.size() && t[i + 2] == '(') {
      const size_t end = closing(t, i + 1, '(', ')');
      const std::string expr = t.substr(i + 3, end - i - 4);
      const std::string written = t.substr(i, end - i + 1);
      try {
        out.push_back(Piece{std::to_string(arith_value(expr)), split, false});
      } catch (UnknownArith& u) {
        if (unknown.empty()) unknown = u.unknown;
        out.push_back(Piece{written, false, false});
      }
      i = end + 1;
    } else if (n == '(') {
      const size_t end = closing(t, i + 1, '(', ')');
      const std::string written = t.substr(i, end - i + 1);
      if (auto known = substitution(t.substr(i + 2, end - i - 2))) {
        out.push_back(Piece{*known, split, false});
      } else {
        if (unknown.empty()) unknown.reason = "the output of " + printable(written, 40);
        out.push_back(Piece{written, false, false});
      }
      i = end + 1;
    } else if (n == '{') {
      const size_t end = closing(t, i + 1, '{', '}');
      braced(t.substr(i + 2, end - i - 2), t.substr(i, end - i + 1), in_double, out, unknown);
      i = end + 1;
    } else if (is_name_start(n)) {
      size_t end = i + 1;
      while (end < t.size() && is_name_char(t[end])) ++end;
      simple_parameter(t.substr(i + 1, end - i - 1), t.substr(i, end - i), in_double, out, unknown);
      i = end;
    } else if (std::isdigit(static_cast<unsigned char>(n)) || std::string("@*#?$!-").find(n) != std::string::npos) {
      simple_parameter(std::string(1, n), t.substr(i, 2), in_double, out, unknown);
      i += 2;
    } else {
      out.push_back(Piece{"$", false, false});
      ++i;
    }
  }
}

// The index of the bracket closing the one at t[open_at] (the lexer checked it exists).
size_t Shell::closing(const std::string& t, size_t open_at, char open, char close) {
  int depth = 0;
  for (size_t k = open_at; k < t.size(); ++k) {
    const char c = t[k];
    if (c == '\\') {
      ++k;
    } else if (c == '\'' || c == '"') {
      const size_t end = t.find(c, k + 1);
      if (end == std::string::npos) return t.size() - 1;
      k = end;
    } else if (c == open) {
      ++depth;
    } else if (c == close && --depth == 0) {
      return k;
    }
  }
  return t.size() - 1;
}

// The values of a parameter: a variable, a positional parameter, or @ / * / # / ?.
// Returns false when it is unset.
bool Shell::lookup(const std::string& name, std::vector<std::string>& values, bool& multi, Unknown& unknown) {
  multi = false;
  unknown = Unknown{};
  const auto& args = frames_.back().args;
  if (name == "@" || name == "*") {
    values = args;
    multi = true;
    return true;
  }
  if (name == "#") {
    values = {std::to_string(args.size())};
    return true;
  }
  if (name == "?") {
    values = {"0"};
    return true;
  }
  if (!name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
    if (name == "0") {
      if (context_.script_path.empty()) return false;
      values = {context_.script_path};
      return true;
    }
    const size_t k = std::stoul(name.substr(0, 6));
    if (k == 0 || k > args.size()) return false;
    values = {args[k - 1]};
    return true;
  }
  const auto it = vars_.find(name);
  if (it == vars_.end()) return false;
  values = it->second.items;
  const Unknown& u = it->second.unknown;
  if (!u.empty()) unknown = u.reason.empty() ? u : Unknown{name, u.reason};
  return true;
}

void Shell::simple_parameter(const std::string& name, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
  std::vector<std::string> values;
  bool multi = false;
  Unknown why;
  if (!lookup(name, values, multi, why)) {
    // Unset: bash takes the environment's value; the import keeps the word as written.
    if (unknown.empty()) unknown.name = name;
    out.push_back(Piece{written, false, false});
    return;
  }
  if (!why.empty()) {  // a value the import does not know stays one word, as written
    if (unknown.empty()) unknown = why;
    in_double = true;
  }
  emit_values(values, multi, name == "*", in_double, out);
}

void Shell::emit_values(const std::vector<std::string>& values, bool multi, bool star, bool in_double, std::vector<Piece>& out) const {
  if (!multi) {
    out.push_back(Piece{values.empty() ? std::string() : values[0], !in_double, false});
    return;
  }
  for (size_t k = 0; k < values.size(); ++k) {
    if (k > 0) {
      if (star && in_double) out.push_back(Piece{ifs().substr(0, 1), false, false});  // "$*" joins with IFS's first character
      else out.push_back(Piece{"", false, true});
    }
    out.push_back(Piece{values[k], !in_double, false});
  }
}

// ${…}: the text inside the braces.
void Shell::braced(const std::string& inner, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
  const bool split = !in_double;
  size_t i = 0;
  bool length = false;
  if (inner.size() > 1 && inner[0] == '#') {
    length = true;
    i = 1;
  }
  if (inner.size() > 1 && inner[0] == '!') {  // indirection: not followed
    if (unknown.empty()) unknown.reason = "the indirection " + printable(written, 40);
    out.push_back(Piece{written, false, false});
    return;
  }
  std::string name;
  if (i < inner.size() && is_name_start(inner[i])) {
    while (i < inner.size() && is_name_char(inner[i])) name += inner[i++];
  } else if (i < inner.size() && std::isdigit(static_cast<unsigned char>(inner[i]))) {
    while (i < inner.size() && std::isdigit(static_cast<unsigned char>(inner[i]))) name += inner[i++];
  } else if (i < inner.size() && std::string("@*#?$!-").find(inner[i]) != std::string::npos) {
    name = inner[i++];
  }
  if (name.empty()) fail("bad substitution " + printable(written, 60));
  std::string subscript;
  bool has_subscript = false;
  if (i < inner.size() && inner[i] == '[') {
    const size_t end = inner.find(']', i);
    if (end == std::string::npos) fail("bad substitution " + printable(written, 60));
    subscript = inner.substr(i + 1, end - i - 1);
    has_subscript = true;
    i = end + 1;
  }
  const std::string op_text = inner.substr(i);
  std::vector<std::string> values;
  bool multi = false;
  Unknown why;
  bool set = lookup(name, values, multi, why);
  if (!why.empty()) in_double = true;  // a value the import does not know stays one word, as written
  // An array is never the environment's: unset, it has no items.
  if (!set && has_subscript && (subscript == "@" || subscript == "*")) set = true, values.clear();
  if (has_subscript) {
    if (subscript == "@" || subscript == "*") {
      multi = true;
    } else {
      long at = 0;
      try {
        at = arith_value(subscript);
      } catch (UnknownArith& u) {
        if (unknown.empty()) unknown = u.unknown;
        out.push_back(Piece{written, false, false});
        return;
      }
      if (at < 0) at += static_cast<long>(values.size());
      if (set && at >= 0 && static_cast<size_t>(at) < values.size()) values = {values[static_cast<size_t>(at)]};
      else set = false, values.clear();
      multi = false;
    }
  }
  const bool star = name == "*" || subscript == "*";
  if (length) {
    if (!op_text.empty()) fail("bad substitution " + printable(written, 60));
    if (!set && unknown.empty() && name != "@" && name != "*") {
      unknown.name = name;
      out.push_back(Piece{written, false, false});
      return;
    }
    const size_t count = multi ? values.size() : (values.empty() ? 0 : values[0].size());
    out.push_back(Piece{std::to_string(count), split, false});
    return;
  }
  const bool empty = !set || (multi ? values.empty() : values.empty() || values[0].empty());
  if (op_text.empty()) {
    if (!set) {
      if (unknown.empty()) unknown.name = name;
      out.push_back(Piece{written, false, false});
      return;
    }
    if (!why.empty() && unknown.empty()) unknown = why;
    emit_values(values, multi, star, in_double, out);
    return;
  }
  // ${A:-d} ${A-d} ${A:=d} ${A=d} ${A:+x} ${A+x} ${A:?m} ${A?m}
  const bool colon = op_text[0] == ':';
  if (op_text.size() > static_cast<size_t>(colon) && std::string("-=+?").find(op_text[colon]) != std::string::npos) {
    const char op = op_text[colon];
    const bool missing = colon ? empty : !set;
    const Word operand = operand_word(op_text.substr(colon + 1));
    if (op == '+') {
      if (!missing) expand_into(operand, in_double, out, unknown);
      return;
    }
    if (!missing) {
      if (!why.empty() && unknown.empty()) unknown = why;
      emit_values(values, multi, star, in_double, out);
      return;
    }
    if (op == '?') fail("${" + name + "} is not set: " + printable(string_of(operand, nullptr), 60));
    if (op == '=') {
      Unknown u;
      const std::string value = string_of(operand, &u);
      if (!is_name(name)) fail("cannot assign to $" + name + " in " + printable(written, 60));
      assign(name, Var{{value}, false, inherited(u)});
      if (unknown.empty()) unknown = u;
      out.push_back(Piece{value, split, false});
      return;
    }
    expand_into(operand, in_double, out, unknown);
    return;
  }
  if (!set) {
    if (unknown.empty()) unknown.name = name;
    out.push_back(Piece{written, false, false});
    return;
  }
  if (!why.empty() && unknown.empty()) unknown = why;
  value_operator(op_text, written, values, multi, star, in_double, out, unknown);
}

// ${A:offset:length}, ${A#p} ${A##p} ${A%p} ${A%%p}, ${A/p/r} (//, /#, /%), ${A^} ${A^^} ${A,}
// ${A,,} on each of `values` (one, or an array's items when `multi`), emitted into `out`.
void Shell::value_operator(const std::string& op_text, const std::string& written, std::vector<std::string>& values, bool multi, bool star,
                           bool in_double, std::vector<Piece>& out, Unknown& unknown) {
  const bool colon = op_text[0] == ':';
  // The remaining operators work on each value.
  auto each = [&](auto&& f) {
    for (auto& v : values) v = f(v);
    emit_values(values, multi, star, in_double, out);
  };
  if (colon) {  // ${A:offset} ${A:offset:length}
    const std::string rest = op_text.substr(1);
    const size_t sep = rest.find(':');
    long offset = 0, count = -1;
    try {
      offset = arith_value(rest.substr(0, sep));
      if (sep != std::string::npos) count = arith_value(rest.substr(sep + 1));
    } catch (UnknownArith& u) {
      if (unknown.empty()) unknown = u.unknown;
      out.push_back(Piece{written, false, false});
      return;
    }
    if (multi) {
      const long size = static_cast<long>(values.size());
      long from = offset < 0 ? std::max(0L, size + offset) : std::min(offset, size);
      long to = count < 0 ? (sep == std::string::npos ? size : std::max(from, size + count)) : std::min(size, from + count);
      values = std::vector<std::string>(values.begin() + from, values.begin() + std::max(from, to));
      emit_values(values, multi, star, in_double, out);
      return;
    }
    each([&](const std::string& v) {
      const long size = static_cast<long>(v.size());
      const long from = offset < 0 ? std::max(0L, size + offset) : std::min(offset, size);
      const long to = count < 0 ? (sep == std::string::npos ? size : std::max(from, size + count)) : std::min(size, from + count);
      return v.substr(static_cast<size_t>(from), static_cast<size_t>(std::max(0L, to - from)));
    });
    return;
  }
  const char op = op_text[0];
  if (op == '#' || op == '%') {
    const bool longest = op_text.size() > 1 && op_text[1] == op;
    const std::string pattern = pattern_of(operand_word(op_text.substr(longest ? 2 : 1)));
    each([&](const std::string& v) {
      if (v.size() > kMaxMatch) fail("a pattern operation on a value longer than 4 KiB");
      for (size_t k = 0; k <= v.size(); ++k) {
        const size_t len = longest ? v.size() - k : k;
        if (op == '#' ? matches(pattern, v.substr(0, len)) : matches(pattern, v.substr(v.size() - len)))
          return op == '#' ? v.substr(len) : v.substr(0, v.size() - len);
      }
      return v;
    });
    return;
  }
  if (op == '/') {
    size_t at = 1;
    const bool all = op_text.size() > 1 && op_text[1] == '/';
    const bool anchor_start = op_text.size() > 1 && op_text[1] == '#';
    const bool anchor_end = op_text.size() > 1 && op_text[1] == '%';
    if (all || anchor_start || anchor_end) at = 2;
    const std::string rest = op_text.substr(at);
    size_t slash = std::string::npos;
    for (size_t k = 0; k < rest.size(); ++k) {
      if (rest[k] == '\\') ++k;
      else if (rest[k] == '/') {
        slash = k;
        break;
      }
    }
    const std::string pattern = pattern_of(operand_word(rest.substr(0, slash)));
    const std::string replacement = slash == std::string::npos ? std::string() : string_of(operand_word(rest.substr(slash + 1)), &unknown);
    each([&](const std::string& v) {
      if (v.size() > kMaxMatch) fail("a pattern operation on a value longer than 4 KiB");
      if (pattern.empty()) return v;
      std::string r;
      size_t k = 0;
      while (k <= v.size()) {
        size_t best = std::string::npos;
        if (!anchor_end || true) {
          for (size_t len = v.size() - k + 1; len-- > 0;) {
            if (anchor_end && k + len != v.size()) continue;
            if (matches(pattern, v.substr(k, len))) {
              best = len;
              break;
            }
          }
        }
        if (best != std::string::npos && (best > 0 || pattern.empty())) {
          r += replacement;
          k += best;
          if (!all) return r + v.substr(k);
          continue;
        }
        if (anchor_start || k == v.size()) return r + v.substr(std::min(k, v.size()));
        r += v[k++];
      }
      return r;
    });
    return;
  }
  if (op == '^' || op == ',') {
    const bool upper = op == '^', whole = op_text.size() > 1 && op_text[1] == op;
    each([&](std::string v) {
      for (size_t k = 0; k < v.size() && (whole || k == 0); ++k)
        v[k] = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(v[k])) : std::tolower(static_cast<unsigned char>(v[k])));
      return v;
    });
    return;
  }
  fail("cannot expand " + printable(written, 60) + " (an operator ptdp does not read)");
}

// The operand of ${A:-…}: a word of its own (its quotes are the text's).
Word Shell::operand_word(const std::string& text) {
  Word w{{}, where_.line, where_.column};
  std::string plain;
  for (size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (c == '\'' || c == '"') {
      if (!plain.empty()) w.segs.push_back(Segment{Quote::None, plain}), plain.clear();
      size_t end = k + 1;
      while (end < text.size() && text[end] != c) end += (c == '"' && text[end] == '\\') ? 2 : 1;
      w.segs.push_back(Segment{c == '\'' ? Quote::Single : Quote::Double, text.substr(k + 1, std::min(end, text.size()) - k - 1)});
      k = end;
    } else if (c == '\\' && k + 1 < text.size()) {
      if (!plain.empty()) w.segs.push_back(Segment{Quote::None, plain}), plain.clear();
      w.segs.push_back(Segment{Quote::Single, std::string(1, text[++k])});
    } else if (c == '$' && k + 1 < text.size() && (text[k + 1] == '{' || text[k + 1] == '(')) {
      const size_t end = closing(text, k + 1, text[k + 1], text[k + 1] == '{' ? '}' : ')');
      plain += text.substr(k, end - k + 1);
      k = end;
    } else {
      plain += c;
    }
  }
  if (!plain.empty() || w.segs.empty()) w.segs.push_back(Segment{Quote::None, plain});
  return w;
}

void Shell::expand_into(const Word& w, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
  for (const auto& s : w.segs) {
    if (s.quote == Quote::Single) out.push_back(Piece{s.text, false, false, true});
    else expand_text(s.text, in_double || s.quote == Quote::Double, !in_double && s.quote == Quote::None, out, unknown);
  }
}

// The characters that split words: $IFS, or blank, tab and newline when it is unset.
std::string Shell::ifs() const {
  const auto it = vars_.find("IFS");
  if (it == vars_.end() || !it->second.unknown.empty()) return " \t\n";
  return it->second.items.empty() ? std::string() : it->second.items[0];
}

struct Shell::Arith {
  Shell& sh;
  std::string s;
  int depth = 0;
  size_t i = 0;
  // > 0 while parsing a branch bash does not evaluate (the right of `0 &&`, `1 ||`, the untaken
  // arm of `? :`): parsed for its syntax only — no assignment, no variable read, no error of
  // its values (division by 0, overflow).
  int skip = 0;
  struct Skipping {
    int& skip;
    bool on;
    Skipping(int& s, bool o) : skip(s), on(o) { skip += on ? 1 : 0; }
    ~Skipping() { skip -= on ? 1 : 0; }
  };
  long variable(const std::string& name) { return skip > 0 ? 0 : sh.arith_variable(name, depth); }
  void set(const std::string& name, long value) {
    if (skip == 0) sh.assign(name, Var{{std::to_string(value)}, false, {}});
  }

  [[noreturn]] void bad(const std::string& what) { sh.fail("arithmetic " + printable(s, 60) + ": " + what); }
  void blank() {
    while (i < s.size() && is_blank(s[i])) ++i;
  }
  // Takes operator `op` when it is next and not the start of a longer one (`<` of `<=`).
  bool eat(const char* op) {
    blank();
    const size_t n = std::char_traits<char>::length(op);
    if (s.compare(i, n, op) != 0) return false;
    if (n == 1 && i + 1 < s.size()) {
      const char c = op[0], next = s[i + 1];
      if (next == '=' && std::string("<>=!+-*/%&|^").find(c) != std::string::npos) return false;
      if (next == c && std::string("<>&|*+-").find(c) != std::string::npos) return false;
    }
    i += n;
    return true;
  }
  long parse() {
    DepthGuard guard{++sh.expand_depth_};
    if (sh.expand_depth_ > kMaxDepth) bad("nested too deep");
    long v = comma();
    blank();
    if (i != s.size()) bad("unexpected '" + printable(s.substr(i), 20) + "'");
    return v;
  }
  long comma() {
    long v = assignment();
    while (eat(",")) v = assignment();
    return v;
  }
  long assignment() {
    blank();
    const size_t start = i;
    if (i < s.size() && is_name_start(s[i])) {
      size_t end = i;
      while (end < s.size() && is_name_char(s[end])) ++end;
      const std::string name = s.substr(i, end - i);
      i = end;
      blank();
      static const char* ops[] = {"+=", "-=", "*=", "/=", "%=", "="};
      for (const char* op : ops) {
        if (s.compare(i, std::char_traits<char>::length(op), op) == 0 && !(op[0] == '=' && i + 1 < s.size() && s[i + 1] == '=')) {
          i += std::char_traits<char>::length(op);
          const long rhs = assignment();
          long value = rhs;
          if (op[0] != '=') value = binary(op[0], variable(name), rhs);
          set(name, value);
          return value;
        }
      }
      i = start;
    }
    return ternary();
  }
  // Short-circuit as bash: only the taken arm of `? :`, the right of && / || only when it decides.
  long ternary() {
    const long c = logical_or();
    if (!eat("?")) return c;
    long a = 0, b = 0;
    {
      Skipping off{skip, c == 0};
      a = assignment();
    }
    if (!eat(":")) bad("expected ':'");
    {
      Skipping off{skip, c != 0};
      b = assignment();
    }
    return c ? a : b;
  }
  long logical_or() {
    long v = logical_and();
    while (eat("||")) {
      Skipping off{skip, v != 0};
      const long r = logical_and();
      v = (v || r) ? 1 : 0;
    }
    return v;
  }
  long logical_and() {
    long v = bit_or();
    while (eat("&&")) {
      Skipping off{skip, v == 0};
      const long r = bit_or();
      v = (v && r) ? 1 : 0;
    }
    return v;
  }
  long bit_or() {
    long v = bit_xor();
    while (eat("|")) v |= bit_xor();
    return v;
  }
  long bit_xor() {
    long v = bit_and();
    while (eat("^")) v ^= bit_and();
    return v;
  }
  long bit_and() {
    long v = equality();
    while (eat("&")) v &= equality();
    return v;
  }
  long equality() {
    long v = relational();
    for (;;) {
      if (eat("==")) v = v == relational();
      else if (eat("!=")) v = v != relational();
      else return v;
    }
  }
  long relational() {
    long v = shift();
    for (;;) {
      if (eat("<=")) v = v <= shift();
      else if (eat(">=")) v = v >= shift();
      else if (eat("<")) v = v < shift();
      else if (eat(">")) v = v > shift();
      else return v;
    }
  }
  long shift() {
    long v = additive();
    for (;;) {
      // As bash on x86-64: the count taken modulo 64, an arithmetic shift of negative values
      // (-1 << 2 is -4); a left shift that loses bits is an overflow, as + and * are here.
      if (eat("<<")) {
        const long r = additive();
        const int n = static_cast<int>(static_cast<unsigned long>(r) & 63);
        const long shifted = static_cast<long>(static_cast<unsigned long>(v) << n);
        if ((shifted >> n) != v && skip == 0) bad("overflow");
        v = shifted;
      } else if (eat(">>")) {
        const long r = additive();
        v >>= static_cast<int>(static_cast<unsigned long>(r) & 63);
      } else {
        return v;
      }
    }
  }
  long binary(char op, long a, long b) {
    long r = 0;
    bool overflow = false;
    switch (op) {
      case '+': overflow = __builtin_add_overflow(a, b, &r); break;
      case '-': overflow = __builtin_sub_overflow(a, b, &r); break;
      case '*': overflow = __builtin_mul_overflow(a, b, &r); break;
      case '/':
      case '%':
        if (skip > 0 && (b == 0 || (a == std::numeric_limits<long>::min() && b == -1))) return 0;
        if (b == 0) bad("division by 0");
        if (a == std::numeric_limits<long>::min() && b == -1) bad("overflow");
        return op == '/' ? a / b : a % b;
      default: bad("operator");
    }
    if (overflow && skip == 0) bad("overflow");
    return r;
  }
  long additive() {
    long v = multiplicative();
    for (;;) {
      if (eat("+")) v = binary('+', v, multiplicative());
      else if (eat("-")) v = binary('-', v, multiplicative());
      else return v;
    }
  }
  long multiplicative() {
    long v = power();
    for (;;) {
      if (eat("*")) v = binary('*', v, power());
      else if (eat("/")) v = binary('/', v, power());
      else if (eat("%")) v = binary('%', v, power());
      else return v;
    }
  }
  long power() {
    const long base = unary();
    if (!eat("**")) return base;
    const long e = power();
    if (e < 0) {
      if (skip > 0) return 0;
      bad("exponent less than 0");
    }
    // 0, 1 and -1 as bases need no loop ((-1)**3 is -1); any other overflows by e = 64.
    if (base == 0) return e == 0 ? 1 : 0;
    if (base == 1) return 1;
    if (base == -1) return e % 2 == 0 ? 1 : -1;
    long r = 1;
    for (long k = 0; k < e && k < 64; ++k) r = binary('*', r, base);
    return r;
  }
  long unary() {
    blank();
    DepthGuard guard{++sh.expand_depth_};
    if (sh.expand_depth_ > kMaxDepth * 4) bad("nested too deep");
    if (eat("!")) return unary() ? 0 : 1;
    if (eat("~")) return ~unary();
    if (s.compare(i, 2, "++") == 0 || s.compare(i, 2, "--") == 0) {
      const char op = s[i];
      i += 2;
      blank();
      const size_t start = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      const std::string name = s.substr(start, i - start);
      if (!is_name(name)) bad("++/-- needs a variable");
      const long v = binary(op, variable(name), 1);
      set(name, v);
      return v;
    }
    if (eat("-")) return binary('-', 0, unary());
    if (eat("+")) return unary();
    return primary();
  }
  long primary() {
    blank();
    if (eat("(")) {
      DepthGuard guard{++sh.expand_depth_};
      if (sh.expand_depth_ > kMaxDepth * 4) bad("nested too deep");
      const long v = comma();
      if (!eat(")")) bad("expected ')'");
      return v;
    }
    if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      int base = 10;
      if (s[i] == '0' && i + 1 < s.size() && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        base = 16;
        i += 2;
      } else if (s[i] == '0') {
        base = 8;
      }
      long v = 0;
      size_t digits = 0;
      while (i < s.size() && std::isxdigit(static_cast<unsigned char>(s[i]))) {
        const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
        const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : c - 'a' + 10;
        if (d >= base) bad("value too great for base");
        if (__builtin_mul_overflow(v, static_cast<long>(base), &v) || __builtin_add_overflow(v, static_cast<long>(d), &v)) bad("overflow");
        ++i;
        ++digits;
      }
      if (base == 16 && digits == 0) bad("a hexadecimal number without digits");
      return v;
    }
    if (i < s.size() && is_name_start(s[i])) {
      const size_t start = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      const std::string name = s.substr(start, i - start);
      if (s.compare(i, 2, "++") == 0 || s.compare(i, 2, "--") == 0) {
        const char op = s[i];
        i += 2;
        const long v = variable(name);
        set(name, binary(op, v, 1));
        return v;
      }
      return variable(name);
    }
    if (i >= s.size()) bad("an operand is missing");
    bad("unexpected '" + printable(s.substr(i), 20) + "'");
  }
};

long Shell::arith_value(const std::string& expr) {
  Unknown u;
  Word w{{{Quote::Double, expr}}, where_.line, where_.column};
  const std::string text = string_of(w, &u);
  if (!u.empty()) throw UnknownArith{u};
  Arith a{*this, text};
  const long v = a.parse();
  return v;
}

long Shell::integer_of(const std::string& text) {
  long value = 0;
  if (!parse_integer(text, value)) fail("'" + printable(text, 40) + "' is not an integer");
  return value;
}

bool Shell::parse_integer(const std::string& raw, long& value) {
  size_t a = raw.find_first_not_of(" \t\n"), b = raw.find_last_not_of(" \t\n");
  if (a == std::string::npos) return false;
  const std::string t = raw.substr(a, b - a + 1);
  size_t i = (t[0] == '-' || t[0] == '+') ? 1 : 0;
  if (i == t.size() || t.size() - i > 18) return false;
  for (size_t k = i; k < t.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(t[k]))) return false;
  value = std::stol(t);
  return true;
}

// The value of a variable in arithmetic: unset or empty is 0, as in bash.
long Shell::arith_variable(const std::string& name, int depth) {
  std::vector<std::string> values;
  bool multi = false;
  Unknown why;
  if (!lookup(name, values, multi, why)) throw UnknownArith{Unknown{name, ""}};
  if (!why.empty()) throw UnknownArith{why};
  const std::string v = values.empty() ? std::string() : values[0];
  if (v.find_first_not_of(" \t\n") == std::string::npos) return 0;
  long value = 0;
  if (parse_integer(v, value)) return value;
  if (depth > 8) fail("arithmetic: " + name + " refers to itself");
  Arith inner{*this, v, depth + 1};
  return inner.parse();
}

}  // namespace ptdp::shell_interpreter
