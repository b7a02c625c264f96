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

}  // namespace

std::vector<std::string> shell_words(const std::string& script, const std::string& source) {
  // Raw words with their quoting removed; '\n' ends a command (for assignments).
  std::vector<std::vector<std::string>> commands(1);
  std::string word;
  bool in_word = false;
  char quote = 0;
  auto finish = [&] {
    if (in_word) commands.back().push_back(word);
    word.clear();
    in_word = false;
  };
  for (size_t i = 0; i < script.size(); ++i) {
    const char ch = script[i];
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
      while (i < script.size() && script[i] != '\n') ++i;
      finish();
      commands.emplace_back();
      continue;
    }
    if (ch == '\n' || ch == ';' || ch == '&' || ch == '|') {
      finish();
      commands.emplace_back();
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
  std::map<std::string, std::string> vars;
  std::vector<std::string> words;
  size_t total = 0;
  for (const auto& cmd : commands) {
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
                                          "): a variable that doubles itself?", SourceLocation{source, 0, 0});
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
  return words;
}

}  // namespace ptdp
