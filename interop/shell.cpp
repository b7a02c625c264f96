// The shell words of a launch script (shell_words).
#include <cctype>
#include <map>
#include <sstream>

#include "core/error.hpp"
#include "interop/shell.hpp"

namespace ptdp {
namespace {

// ---------------------------------------------------------------------------------------------
// Shell words of a launch script.

std::string expand(const std::string& word, std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    if (word[i] != '$' || i + 1 == word.size()) {
      out += word[i];
      continue;
    }
    size_t start = i + 1, end;
    bool braced = word[start] == '{';
    if (braced) {
      // The matching brace (a default may hold ${OTHER}).
      int depth = 0;
      for (end = start; end < word.size(); ++end) {
        if (word[end] == '{') ++depth;
        else if (word[end] == '}' && --depth == 0) break;
      }
      if (end >= word.size()) {
        out += word.substr(i);
        break;
      }
      std::string name = word.substr(start + 1, end - start - 1);
      // ${NAME:-default} / ${NAME-default}: the default when NAME is unset (or empty, with ':');
      // ${NAME:=default} also assigns it, as bash does.
      size_t op = 0;
      while (op < name.size() && (std::isalnum(static_cast<unsigned char>(name[op])) || name[op] == '_')) ++op;
      if (op > 0 && op < name.size() && (name[op] == ':' || name[op] == '-')) {
        const bool colon = name[op] == ':';
        const size_t at = colon ? op + 1 : op;
        if (at < name.size() && (name[at] == '-' || name[at] == '=')) {
          const std::string var = name.substr(0, op);
          const auto it = vars.find(var);
          const bool use_default = it == vars.end() || (colon && it->second.empty());
          if (!use_default) {
            out += it->second;
          } else {
            const std::string value = expand(name.substr(at + 1), vars);
            if (name[at] == '=') vars[var] = value;
            out += value;
          }
          i = end;
          continue;
        }
      }
      if (const auto at = name.find('['); at != std::string::npos) name = name.substr(0, at);  // ${ARGS[@]}
      const auto it = vars.find(name);
      out += it != vars.end() ? it->second : word.substr(i, end - i + 1);
      i = end;
    } else {
      end = start;
      while (end < word.size() && (std::isalnum(static_cast<unsigned char>(word[end])) || word[end] == '_')) ++end;
      if (end == start) {
        out += '$';
        continue;
      }
      const std::string name = word.substr(start, end - start);
      const auto it = vars.find(name);
      out += it != vars.end() ? it->second : word.substr(i, end - i);
      i = end - 1;
    }
  }
  return out;
}

bool is_assignment(const std::string& word, std::string* name, std::string* value) {
  const auto eq = word.find('=');
  if (eq == std::string::npos || eq == 0 || word[0] == '-') return false;
  for (size_t i = 0; i < eq; ++i)
    if (!(std::isalnum(static_cast<unsigned char>(word[i])) || word[i] == '_')) return false;
  if (std::isdigit(static_cast<unsigned char>(word[0]))) return false;
  *name = word.substr(0, eq);
  *value = word.substr(eq + 1);
  return true;
}

bool is_integer(const std::string& text) {
  size_t i = text.size() > 1 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (i == text.size() || text.size() > 18) return false;
  for (; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

// The value of an operand of a test, or a ConfigError when it names a variable the script does
// not set: bash would take the environment's value, which an import cannot know.
std::string operand(const std::string& word, std::map<std::string, std::string>& vars, const SourceLocation& where) {
  const std::string value = expand(word, vars);
  for (size_t i = 0; i + 1 < value.size(); ++i) {
    if (value[i] != '$') continue;
    size_t start = i + 1 + (value[i + 1] == '{'), end = start;
    while (end < value.size() && (std::isalnum(static_cast<unsigned char>(value[end])) || value[end] == '_')) ++end;
    if (end == start) continue;
    const std::string name = value.substr(start, end - start);
    throw ConfigError("script", "the condition depends on " + name +
                                    ", which the script does not set (an environment variable): give its value with --env " + name +
                                    "=VALUE",
                      where);
  }
  return value;
}

// The condition of `if`/`elif` (`[ A == B ]`, `[[ A -gt B ]]`, `test A != B`, `[ -n A ]`), with
// `!` and `&&`-free forms; anything else is a ConfigError naming the line.
bool test_condition(const std::vector<std::string>& cmd, std::map<std::string, std::string>& vars, const SourceLocation& where) {
  std::vector<std::string> t(cmd.begin() + 1, cmd.end());
  if (!t.empty() && t.back() == "then") t.pop_back();
  bool negate = false;
  if (!t.empty() && t[0] == "!") {
    negate = true;
    t.erase(t.begin());
  }
  if (!t.empty() && (t[0] == "[" || t[0] == "[[" || t[0] == "test")) {
    const std::string close = t[0] == "[" ? "]" : t[0] == "[[" ? "]]" : "";
    t.erase(t.begin());
    if (!close.empty()) {
      if (t.empty() || t.back() != close) throw ConfigError("script", "a test without its closing " + close, where);
      t.pop_back();
    }
  } else {
    throw ConfigError("script", "cannot evaluate the condition '" + printable(t.empty() ? std::string() : t[0]) +
                                    "' (only [ ], [[ ]] and test are read): give the values it decides with --env NAME=VALUE", where);
  }
  if (!t.empty() && t[0] == "!") {
    negate = !negate;
    t.erase(t.begin());
  }
  bool holds = false;
  if (t.size() == 2 && (t[0] == "-n" || t[0] == "-z")) {
    const bool empty = operand(t[1], vars, where).empty();
    holds = t[0] == "-z" ? empty : !empty;
  } else if (t.size() == 1) {
    holds = !operand(t[0], vars, where).empty();
  } else if (t.size() == 3) {
    const std::string a = operand(t[0], vars, where), op = t[1], b = operand(t[2], vars, where);
    if (op == "=" || op == "==") {
      holds = a == b;
    } else if (op == "!=") {
      holds = a != b;
    } else if (op == "-eq" || op == "-ne" || op == "-gt" || op == "-lt" || op == "-ge" || op == "-le") {
      if (!is_integer(a) || !is_integer(b))
        throw ConfigError("script", "'" + printable(a) + " " + op + " " + printable(b) + "' compares a value that is not an integer", where);
      const long long x = std::stoll(a), y = std::stoll(b);
      holds = op == "-eq" ? x == y : op == "-ne" ? x != y : op == "-gt" ? x > y : op == "-lt" ? x < y : op == "-ge" ? x >= y : x <= y;
    } else {
      throw ConfigError("script", "cannot evaluate the test operator '" + printable(op) + "'", where);
    }
  } else {
    throw ConfigError("script", "cannot evaluate a test of " + std::to_string(t.size()) + " words", where);
  }
  return holds != negate;
}

}  // namespace

std::vector<std::string> shell_words(const std::string& script, const std::string& source,
                                     const std::map<std::string, std::string>& env) {
  // Raw words with their quoting removed; '\n' ends a command (for assignments). lines[c] is
  // the script line command c starts on, for errors.
  std::vector<std::vector<std::string>> commands(1);
  std::vector<int> lines(1, 1);
  int line = 1;
  std::string word;
  bool in_word = false;
  char quote = 0;
  auto finish = [&] {
    if (in_word) {
      if (commands.back().empty()) lines.back() = line;
      commands.back().push_back(word);
    }
    word.clear();
    in_word = false;
  };
  auto next_command = [&] {
    commands.emplace_back();
    lines.push_back(line);
  };
  for (size_t i = 0; i < script.size(); ++i) {
    const char ch = script[i];
    if (ch == '\n') ++line;
    if (quote) {
      if (ch == quote) {
        quote = 0;
      } else {
        word += ch;
      }
      continue;
    }
    if (ch == '\\' && i + 1 < script.size()) {
      if (script[i + 1] == '\n') {
        ++i;
        ++line;
        finish();
        continue;
      }
      word += script[++i];
      in_word = true;
      continue;
    }
    if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
      continue;
    }
    if (ch == '#' && !in_word) {
      while (i + 1 < script.size() && script[i + 1] != '\n') ++i;
      finish();
      next_command();
      continue;
    }
    if (ch == '\n' || ch == ';' || ch == '&' || ch == '|') {
      finish();
      next_command();
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\r' || ch == '(' || ch == ')') {
      finish();
      continue;
    }
    word += ch;
    in_word = true;
  }
  if (quote) throw ConfigError("", std::string("unterminated ") + (quote == '"' ? "double" : "single") + " quote", SourceLocation{source, 0, 0});
  finish();
  // Assignments (NAME=value, export NAME=value) feed later expansions. The words of an array
  // (NAME=( … )) are taken where they are written, and ${NAME[@]} expands to nothing, so each
  // argument is read once.
  std::map<std::string, std::string> vars = env;
  std::vector<std::string> words;
  size_t total = 0;
  // if/elif/else/fi: only the branch bash takes counts. Each open `if` records whether a branch
  // was taken and whether the current one is; commands in a branch not taken are skipped.
  struct Branch {
    bool outer_active, taken, active;
  };
  std::vector<Branch> branches;
  auto active = [&] { return branches.empty() || branches.back().active; };
  for (size_t c = 0; c < commands.size(); ++c) {
    std::vector<std::string> cmd = commands[c];
    const SourceLocation where{source, lines[c], 1};
    // `then` / `else` / `do` may begin a command that goes on (`then A=1`): drop the keyword.
    if (!cmd.empty() && (cmd[0] == "then" || cmd[0] == "do")) cmd.erase(cmd.begin());
    if (!cmd.empty() && cmd[0] == "if") {
      const bool outer = active();
      const bool holds = outer && test_condition(cmd, vars, where);
      branches.push_back(Branch{outer, holds, holds});
      cmd.clear();
    } else if (!cmd.empty() && cmd[0] == "elif") {
      if (branches.empty()) throw ConfigError("script", "elif without if", where);
      Branch& b = branches.back();
      const bool holds = b.outer_active && !b.taken && test_condition(cmd, vars, where);
      b.active = holds;
      b.taken = b.taken || holds;
      cmd.clear();
    } else if (!cmd.empty() && cmd[0] == "else") {
      if (branches.empty()) throw ConfigError("script", "else without if", where);
      Branch& b = branches.back();
      b.active = b.outer_active && !b.taken;
      b.taken = true;
      cmd.erase(cmd.begin());
    } else if (!cmd.empty() && cmd[0] == "fi") {
      if (branches.empty()) throw ConfigError("script", "fi without if", where);
      branches.pop_back();
      cmd.erase(cmd.begin());
    }
    if (!active()) continue;
    // A script that echoes its command prints it, it does not run it: the words are not arguments.
    if (!cmd.empty() && (cmd[0] == "echo" || cmd[0] == "printf")) continue;
    for (size_t k = 0; k < cmd.size(); ++k) {
      std::string name, value;
      // A variable that doubles itself (A=$A$A) grows without bound: no launch script's value is
      // anywhere near 1 MiB.
      constexpr size_t kMaxExpansion = size_t{1} << 20;
      auto checked = [&](std::string text) {
        if (text.size() > kMaxExpansion)
          throw ConfigError("script", "a variable expands to more than 1 MiB (" + printable(cmd[k].substr(0, 60)) +
                                          "): a variable that doubles itself?", where);
        return text;
      };
      const std::string w = checked(expand(cmd[k], vars));
      if ((k == 0 || (k == 1 && cmd[0] == "export")) && is_assignment(cmd[k], &name, &value)) {
        vars[name] = checked(expand(value, vars));
        continue;
      }
      if (w == "export" && k == 0) continue;
      // A variable holding several words ("--a 1 --b 2") splits like the shell; a quoted
      // literal stays one word.
      total += w.size();
      if (total > 16 * kMaxExpansion)
        throw ConfigError("script", "the expanded arguments exceed 16 MiB (a variable repeated without bound?)", SourceLocation{source, 0, 0});
      if (cmd[k].find('$') == std::string::npos) {
        words.push_back(w);
        continue;
      }
      std::istringstream split(w);
      for (std::string part; split >> part;) words.push_back(part);
    }
  }
  if (!branches.empty()) throw ConfigError("script", "an if without its fi", SourceLocation{source, line, 1});
  return words;
}

}  // namespace ptdp
