// The shell interpreter of launch scripts (shell_words): runs a script's statements and commands
// (the lexer and parser are in shell_syntax.cpp, word expansion and arithmetic in
// shell_expand.cpp) and collects the words of the commands the script runs.
#include "interop/shell.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "core/error.hpp"
#include "interop/shell_interpreter.hpp"
#include "interop/shell_syntax.hpp"

namespace ptdp {
namespace shell_interpreter {

Shell::Shell(const std::map<std::string, std::string>& env, ShellFileReader read, ShellContext context)
    : read_(std::move(read)), context_(std::move(context)) {
  if (!context_.cwd.empty()) vars_["PWD"] = Var{{context_.cwd}, false, {}};
  if (!context_.script_path.empty()) vars_["BASH_SOURCE"] = Var{{context_.script_path}, true, {}};
  for (const auto& [name, value] : env) {
    vars_[name] = Var{{value}, false, {}};
    given_.insert(name);
  }
  frames_.push_back(Frame{});
}

void Shell::run_script(const std::string& text, const std::string& source) {
  try {
    run_text(text, source, 1);
  } catch (const ExitScript&) {
  } catch (const ReturnFrom&) {
  } catch (const LoopControl&) {
  }
}

void Shell::run_text(const std::string& text, const std::string& source, int line_offset) {
  DepthGuard guard{++depth_};
  if (depth_ > kMaxDepth) fail("functions, source and eval nest more than " + std::to_string(kMaxDepth) + " deep");
  struct Restore {
    std::string& source;
    std::string outer;
    ~Restore() { source = outer; }
  } restore{source_, source_};
  source_ = source;
  std::vector<Token> tokens = lex(text, source);
  for (auto& t : tokens) t.line += line_offset - 1;
  auto program = std::make_shared<List>(parse(std::move(tokens), source));
  programs_.push_back(program);  // functions defined in it outlive this call
  run_list(*program);
}

int Shell::run_list(const List& list) {
  int status = 0;
  for (const auto& node : list) status = run(*node);
  return status;
}

int Shell::run(const Node& n) {
  if (++steps_ > kMaxSteps) {
    where_ = SourceLocation{source_, n.line, n.col};
    fail("the script runs more than " + std::to_string(kMaxSteps) + " commands (a loop that does not end?)");
  }
  where_ = SourceLocation{source_, n.line, n.col};
  switch (n.kind) {
    case Node::Simple: return simple(n);
    case Node::Arith: return arith_or_fail(n.text) != 0 ? 0 : 1;
    case Node::If:
      for (const auto& [cond, body] : n.arms)
        if (run_list(cond) == 0) return run_list(body);
      return n.has_else ? run_list(n.else_body) : 0;
    case Node::Case: {
      const std::string subject = known_string(n.subject, "the case");
      for (const auto& arm : n.cases)
        for (const auto& pattern : arm.patterns)
          if (matches(pattern_of(pattern), subject)) return run_list(arm.body);
      return 0;
    }
    case Node::For: {
      std::vector<std::string> items;
      if (n.in_given) {
        for (const auto& w : n.items)
          for (auto& f : expand(w, true).fields) items.push_back(std::move(f));
      } else {
        items = frames_.back().args;
      }
      int status = 0;
      for (const auto& item : items) {
        assign(n.text, Var{{item}, false, {}});
        if (loop_body(n.body, status)) break;
      }
      return status;
    }
    case Node::ArithFor: {
      std::vector<std::string> parts(3);
      size_t k = 0;
      for (char c : n.text) {
        if (c == ';' && k < 2) ++k;
        else parts[k] += c;
      }
      if (k != 2) fail("a for (( )) loop needs init; condition; step");
      int status = 0;
      if (parts[0].find_first_not_of(" \t") != std::string::npos) arith_or_fail(parts[0]);
      while (parts[1].find_first_not_of(" \t") == std::string::npos || arith_or_fail(parts[1]) != 0) {
        if (loop_body(n.body, status)) break;
        if (parts[2].find_first_not_of(" \t") != std::string::npos) arith_or_fail(parts[2]);
        if (++steps_ > kMaxSteps) fail("the script runs more than " + std::to_string(kMaxSteps) + " commands (a loop that does not end?)");
      }
      return status;
    }
    case Node::While: {
      int status = 0;
      const auto& [cond, body] = n.arms.front();
      for (;;) {
        const bool holds = run_list(cond) == 0;
        if (holds == n.until) break;
        if (loop_body(body, status)) break;
      }
      return status;
    }
    case Node::Group: return run_list(n.body);
    case Node::Subshell: return in_subshell([&] { return run_list(n.body); });
    case Node::Function:
      functions_[n.text] = n.function_body;
      return 0;
    case Node::Chain: {
      // Pipelines (commands joined by |) bind tighter than && and ||; each command of a
      // pipeline runs in a subshell, as bash runs it: its assignments do not reach the script.
      int status = 0;
      for (size_t k = 0; k < n.parts.size();) {
        size_t end = k;
        while (end + 1 < n.parts.size() && n.ops[end] == Tok::Pipe) ++end;
        const bool skipped = k > 0 && ((n.ops[k - 1] == Tok::And && status != 0) || (n.ops[k - 1] == Tok::Or && status == 0));
        if (!skipped && end == k) status = run(*n.parts[k]);
        if (!skipped && end > k)
          for (size_t j = k; j <= end; ++j) status = in_subshell([&] { return run(*n.parts[j]); });
        k = end + 1;
      }
      return status;
    }
  }
  return 0;
}

// Runs `body` as a subshell: its assignments (and functions) do not reach the script, an exit
// ends only it; the words of its commands do reach the import.
template <typename F>
int Shell::in_subshell(F body) {
  const auto vars = vars_;
  const auto functions = functions_;
  int status = 0;
  try {
    status = body();
  } catch (const ExitScript&) {
  }
  vars_ = vars;
  functions_ = functions;
  return status;
}

// Runs a loop body; true when the loop ends (break).
bool Shell::loop_body(const List& body, int& status) {
  DepthGuard guard{++loops_};
  try {
    status = run_list(body);
  } catch (LoopControl& c) {
    if (c.levels > 1) {
      --c.levels;
      throw;
    }
    return c.is_break;
  }
  return false;
}

int Shell::simple(const Node& n) {
  std::vector<std::string> argv;
  std::vector<const Element*> assignments;
  size_t k = 0;
  for (; k < n.elements.size() && argv.empty(); ++k) {
    const Element& e = n.elements[k];
    if (e.array || assignment_name(e.word)) {
      assignments.push_back(&e);
      continue;
    }
    // Tests read their operands as written, so that an unknown one is named.
    if (e.word.is("[[")) return test_command(n.elements, k + 1, "]]") ? 0 : 1;
    if (e.word.is("[")) return test_command(n.elements, k + 1, "]") ? 0 : 1;
    if (e.word.is("test")) return test_command(n.elements, k + 1, "") ? 0 : 1;
    for (auto& f : expand(e.word, true).fields) argv.push_back(std::move(f));
  }
  if (argv.empty()) {
    // Only assignments (or words that expanded to nothing): they set variables.
    for (const Element* e : assignments) assign_element(*e);
    return 0;
  }
  // NAME=v command …: the assignment is for that command's environment only.
  const std::string name = argv[0];  // a copy: argv grows below
  static const std::set<std::string> declaring{"export", "local", "declare", "typeset", "readonly"};
  if (declaring.count(name)) {
    // Options (-i: integer, +i: no longer) before and between the names, as bash reads them.
    std::optional<bool> integer;
    auto mark = [&](const std::string& var) {
      if (!integer) return;
      Var& v = vars_[var];
      v.integer = *integer;
      if (v.items.empty() && !v.array) v.items.emplace_back();
    };
    for (; k < n.elements.size(); ++k) {
      const Element& e = n.elements[k];
      if (e.array || assignment_name(e.word)) {
        const std::string var = *assignment_name(e.word);
        if (name == "local") make_local(var);
        if (integer && vars_.count(var) == 0) vars_[var] = Var{};
        if (integer) vars_[var].integer = *integer;
        assign_element(e);
        continue;
      }
      for (const auto& f : expand(e.word, true).fields) {
        if (f.size() > 1 && (f[0] == '-' || f[0] == '+') && f.find('i') != std::string::npos && f.find_first_not_of("aAfFgilnrtux", 1) == std::string::npos)
          integer = f[0] == '-';
        if (!is_name(f)) continue;
        if (name == "local") make_local(f);
        mark(f);
      }
    }
    return 0;
  }
  argv_unknown_ = Unknown{};
  for (; k < n.elements.size(); ++k) {
    const Element& e = n.elements[k];
    if (e.array) fail("an array assignment as an argument of " + printable(name, 40));
    Expansion x = expand(e.word, true);
    if (argv_unknown_.empty()) argv_unknown_ = x.unknown;
    for (auto& f : x.fields) argv.push_back(std::move(f));
  }
  return command(argv, n);
}

int Shell::command(std::vector<std::string>& argv, const Node& n) {
  const std::string name = argv[0];
  if (const auto f = functions_.find(name); f != functions_.end()) {
    DepthGuard guard{++depth_};
    if (depth_ > kMaxDepth) fail("functions, source and eval nest more than " + std::to_string(kMaxDepth) + " deep");
    const NodePtr body = f->second;  // the function may redefine itself
    frames_.push_back(Frame{std::vector<std::string>(argv.begin() + 1, argv.end()), {}});
    // Its local variables end with it; break/continue do not reach the caller's loops.
    struct Leave {
      Shell& sh;
      int loops;
      ~Leave() {
        sh.leave_frame();
        sh.loops_ = loops;
      }
    } leave{*this, loops_};
    loops_ = 0;
    try {
      return run(*body);
    } catch (const ReturnFrom&) {
      return 0;
    }
  }
  if (name == "true" || name == ":") return 0;
  if (name == "false") return 1;
  if (name == "[" || name == "test") {
    std::vector<Element> args;
    for (size_t k = 0; k < argv.size(); ++k) args.push_back(Element{Word{{{Quote::Single, argv[k]}}, n.line, n.col}, false, {}});
    return test_command(args, 1, name == "[" ? "]" : "") ? 0 : 1;
  }
  if (name == "let") {
    // let EXPR…: each argument is arithmetic; the status is that of the last value.
    if (argv.size() < 2) fail("let without an expression");
    long v = 0;
    for (size_t k = 1; k < argv.size(); ++k) v = arith_or_fail(argv[k]);
    return v != 0 ? 0 : 1;
  }
  if (name == "printf" && argv.size() >= 3 && argv[1] == "-v") {
    // printf -v NAME FORMAT ARGS…: the formatted text is assigned, not printed.
    if (!is_name(argv[2])) fail("printf -v " + printable(argv[2], 40) + ": not a variable name");
    if (argv.size() < 4) fail("printf -v " + argv[2] + " without a format");
    if (!argv_unknown_.empty()) {
      assign(argv[2], Var{{""}, false, inherited(argv_unknown_)});
      return 0;
    }
    assign(argv[2], Var{{printf_format(argv[3], std::vector<std::string>(argv.begin() + 4, argv.end()))}, false, {}});
    return 0;
  }
  if (name == "echo" || name == "printf" || name == "read" || name == "wait" || name == "trap" || name == "set" ||
      name == "cd" || name == "pushd" || name == "popd" || name == "mkdir" || name == "rm" || name == "cp" || name == "mv" ||
      name == "ls" || name == "touch" || name == "sleep" || name == "ulimit" || name == "umask" || name == "module" ||
      name == "cat" || name == "tee" || name == "pwd" || name == "date" || name == "hostname" || name == "nvidia-smi" ||
      name == "chmod" || name == "ln" || name == "shopt" || name == "alias" || name == "hash")
    return 0;
  if (name == "unset") {
    for (size_t k = 1; k < argv.size(); ++k) {
      if (argv[k].empty() || argv[k][0] == '-') continue;
      vars_.erase(argv[k]);
      functions_.erase(argv[k]);
    }
    return 0;
  }
  if (name == "exit") stop_script(argv);
  if (name == "return") {
    if (frames_.size() > 1) throw ReturnFrom{};
    stop_script(argv);  // return in a sourced script or at the top: the script stops here
  }
  if (name == "break" || name == "continue") {
    long levels = 1;
    if (argv.size() > 1) {
      levels = integer_of(argv[1]);
      if (levels < 1) fail(name + " " + argv[1] + ": the count must be at least 1");
    }
    if (loops_ == 0) return 0;  // outside a loop bash only warns
    throw LoopControl{name == "break", levels};
  }
  if (name == "shift") {
    long count = argv.size() > 1 ? integer_of(argv[1]) : 1;
    auto& args = frames_.back().args;
    if (count < 0) fail("shift " + argv[1] + ": the count must not be negative");
    if (static_cast<size_t>(count) <= args.size()) args.erase(args.begin(), args.begin() + count);
    return 0;
  }
  if (name == "source" || name == ".") {
    if (argv.size() < 2) fail(name + " without a file");
    if (!read_) fail(name + " " + printable(argv[1], 60) + ": sourcing a file is not available here");
    // A file the import cannot read (a cluster's environment setup, a name from an unknown
    // variable) is skipped: what the launch needs from it shows as a missing argument, and the
    // import's error lists the skipped files.
    if (argv[1].find('$') != std::string::npos || argv[1].find('`') != std::string::npos) {
      notes.push_back(where_str() + ": skipped `" + name + " " + printable(argv[1], 60) +
                      "`: the file's name depends on a variable the script does not set (give it with --env NAME=VALUE)");
      return 0;
    }
    std::string file_name;
    const SourceLocation at = where_;
    std::string text;
    try {
      text = read_(argv[1], &file_name);
    } catch (const std::exception& e) {  // named at the line that sources it
      notes.push_back(where_str() + ": skipped `" + name + " " + printable(argv[1], 60) + "`: " + e.what());
      return 0;
    }
    run_text(text, file_name, 1);
    where_ = at;
    return 0;
  }
  if (name == "eval") {
    std::string text;
    for (size_t k = 1; k < argv.size(); ++k) text += (k > 1 ? " " : "") + argv[k];
    const SourceLocation at = where_;
    run_text(text, source_, n.line);
    where_ = at;
    return 0;
  }
  if (name == "exec" || name == "command" || name == "builtin" || name == "time" || name == "nohup") {
    if (argv.size() == 1) return 0;
    argv.erase(argv.begin());
    return command(argv, n);
  }
  // `bash -c STRING` (after a launcher: srun …, mpirun …, env …): the string is the command.
  for (size_t k = 0; k + 2 < argv.size(); ++k) {
    const std::string shell = std::filesystem::path(argv[k]).filename().string();
    const std::string& flag = argv[k + 1];
    if ((shell != "bash" && shell != "sh") || flag.size() < 2 || flag[0] != '-' || flag.find('c') == std::string::npos ||
        flag.find_first_not_of("-cexlu") != std::string::npos)
      continue;
    const std::string text = argv[k + 2];
    argv.resize(k);
    for (auto& w : argv) push_word(std::move(w));
    notes.push_back(where_str() + ": ran the string of `" + shell + " " + flag + "` as the command");
    const SourceLocation at = where_;
    const std::string outer_exit = exit_where, outer_command = exit_command;
    const int outer_status = exit_status;
    try {
      run_text(text, source_, n.line);
    } catch (const ExitScript&) {  // exits that shell, not the script
    } catch (const ReturnFrom&) {
    }
    exit_where = outer_exit, exit_command = outer_command, exit_status = outer_status;
    where_ = at;
    return 0;
  }
  for (auto& w : argv) push_word(std::move(w));
  return 0;
}

void Shell::push_word(std::string w) {
  words_bytes_ += w.size();
  if (words_bytes_ > kMaxWords) fail("the script's commands exceed 16 MiB of words (a variable repeated without bound?)");
  words.push_back(std::move(w));
}

// `exit` (or `return` outside a function): the script stops; the import names the line.
[[noreturn]] void Shell::stop_script(const std::vector<std::string>& argv) {
  exit_where = where_.file + ":" + std::to_string(where_.line) + ":" + std::to_string(where_.column);
  exit_command.clear();
  for (const auto& a : argv) exit_command += (exit_command.empty() ? "" : " ") + a;
  exit_status = argv.size() > 1 ? static_cast<int>(integer_of(argv[1])) : 0;
  throw ExitScript{};
}

// The output of a command substitution the import can know: where the script is and runs
// (`pwd`, `dirname "$0"`, `cd DIR && pwd`, …); nullopt for anything else.
std::optional<std::string> Shell::substitution(const std::string& inner) {
  std::vector<Token> tokens;
  try {
    tokens = lex(inner, source_);
  } catch (const ConfigError&) {
    return std::nullopt;
  }
  namespace fs = std::filesystem;
  fs::path dir = context_.cwd;
  std::optional<std::string> output;
  std::vector<std::string> argv;
  auto absolute = [&](const std::string& p) -> std::optional<fs::path> {
    fs::path path(p);
    if (path.is_relative()) {
      if (dir.empty()) return std::nullopt;
      path = dir / path;
    }
    path = path.lexically_normal();
    if (path.has_filename() == false && path != path.root_path()) path = path.parent_path();
    return path;
  };
  auto run_one = [&]() -> bool {
    if (argv.empty()) return true;
    const std::string& cmd = argv[0];
    if (cmd == "pwd" && (argv.size() == 1 || argv[1] == "-P" || argv[1] == "-L")) {
      if (dir.empty()) return false;
      output = dir.string();
    } else if (cmd == "cd" && argv.size() == 2) {
      const auto to = absolute(argv[1]);
      if (!to) return false;
      dir = *to;
    } else if (cmd == "dirname" && argv.size() == 2) {
      const std::string parent = fs::path(argv[1]).parent_path().string();
      output = parent.empty() ? "." : parent;
    } else if (cmd == "basename" && argv.size() == 2) {
      output = fs::path(argv[1]).filename().string();
    } else if ((cmd == "realpath" && argv.size() == 2) || (cmd == "readlink" && argv.size() == 3 && argv[1] == "-f")) {
      const auto to = absolute(argv.back());
      if (!to) return false;
      output = to->string();
    } else {
      return false;
    }
    argv.clear();
    return true;
  };
  for (const Token& t : tokens) {
    if (t.kind == Tok::Word) {
      Expansion x = expand(t.word, true);
      if (!x.unknown.empty()) return std::nullopt;
      argv.insert(argv.end(), x.fields.begin(), x.fields.end());
    } else if (t.kind == Tok::Semi || t.kind == Tok::And || t.kind == Tok::Newline || t.kind == Tok::End) {
      if (!run_one()) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!run_one()) return std::nullopt;
  return output;
}

// A file test (-e, -f, -d, …) on `path`: what the files in the script's folder (--cwd) say, or
// true with --assume-files; false when the folder is unknown.
bool Shell::file_test(const std::string& op, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string shown = "[ " + op + " " + printable(path, 60) + " ]";
  if (context_.assume_files) {
    note_once(where_str() + ": " + shown + " taken as true (--assume-files)");
    return true;
  }
  if (context_.cwd.empty()) return false;
  fs::path file(path);
  if (file.is_relative()) file = fs::path(context_.cwd) / file;
  std::error_code ec;
  const auto st = fs::status(file, ec);
  bool holds = false;
  if (!ec && fs::exists(st)) {
    if (op == "-f") holds = fs::is_regular_file(st);
    else if (op == "-d") holds = fs::is_directory(st);
    else if (op == "-s") holds = fs::is_regular_file(st) ? fs::file_size(file, ec) > 0 : true;
    else if (op == "-L" || op == "-h") holds = fs::is_symlink(fs::symlink_status(file, ec));
    else if (op == "-p") holds = fs::is_fifo(st);
    else if (op == "-S") holds = fs::is_socket(st);
    else if (op == "-b") holds = fs::is_block_file(st);
    else if (op == "-c") holds = fs::is_character_file(st);
    else holds = true;  // -e, -r, -w, -x: it exists
  }
  note_once(where_str() + ": " + shown + " is " + (holds ? "true" : "false") + ", looking in " + context_.cwd +
            " (--cwd DIR: where the script runs; --assume-files: take file tests as true)");
  return holds;
}

void Shell::note_once(const std::string& note) {
  if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
}

void Shell::leave_frame() {
  for (auto& [name, value] : frames_.back().saved) {
    if (value) vars_[name] = *value;
    else vars_.erase(name);
  }
  frames_.pop_back();
}

void Shell::make_local(const std::string& name) {
  if (frames_.size() < 2) return;
  auto& saved = frames_.back().saved;
  if (saved.count(name)) return;
  const auto it = vars_.find(name);
  saved[name] = it == vars_.end() ? std::nullopt : std::optional<Var>(it->second);
}

// The NAME of a NAME=… / NAME+=… word (the first segment unquoted), else nullptr.
const std::string* Shell::assignment_name(const Word& w) {
  if (w.segs.empty() || w.segs[0].quote != Quote::None) return nullptr;
  const std::string& t = w.segs[0].text;
  const size_t eq = t.find('=');
  if (eq == std::string::npos || eq == 0) return nullptr;
  const size_t end = t[eq - 1] == '+' ? eq - 1 : eq;
  std::string name = t.substr(0, end);
  if (const auto br = name.find('['); br != std::string::npos && name.back() == ']') name = name.substr(0, br);
  if (!is_name(name)) return nullptr;
  last_name_ = name;
  return &last_name_;
}

void Shell::assign_element(const Element& e) {
  const std::string& first = e.word.segs[0].text;
  const size_t eq = first.find('=');
  const bool append = first[eq - 1] == '+';
  std::string target = first.substr(0, append ? eq - 1 : eq);
  std::string index;
  if (const auto br = target.find('['); br != std::string::npos) {
    index = target.substr(br + 1, target.size() - br - 2);
    target = target.substr(0, br);
  }
  if (e.array) {
    Var v{{}, true, {}};
    if (append) {
      if (const auto it = vars_.find(target); it != vars_.end()) v = it->second, v.array = true;
    }
    for (const auto& item : e.items) {
      Expansion x = expand(item, true);
      if (!x.unknown.empty() && v.unknown.empty()) v.unknown = inherited(x.unknown);
      for (auto& f : x.fields) v.items.push_back(std::move(f));
    }
    assign(target, std::move(v));
    return;
  }
  Word value = e.word;
  value.segs[0].text = first.substr(eq + 1);
  Expansion x = expand(value, false);
  std::string text = x.fields.empty() ? std::string() : x.fields[0];
  if (!index.empty()) {
    const long at = arith_or_fail(index);
    if (at < 0 || at > 100'000) fail("array index " + std::to_string(at) + " out of range [0, 100000]");
    Var v = vars_.count(target) ? vars_[target] : Var{};
    v.array = true;
    if (v.items.size() <= static_cast<size_t>(at)) v.items.resize(static_cast<size_t>(at) + 1);
    v.items[static_cast<size_t>(at)] = append ? v.items[static_cast<size_t>(at)] + text : text;
    assign(target, std::move(v));
    return;
  }
  // declare -i NAME: the value is arithmetic (NAME=2+3 is 5, NAME+=1 adds).
  if (const auto it = vars_.find(target); it != vars_.end() && it->second.integer && x.unknown.empty() && it->second.unknown.empty()) {
    long value = arith_or_fail(text);
    if (append && !it->second.items.empty() && !it->second.items[0].empty()) {
      const long old = arith_or_fail(it->second.items[0]);
      if (__builtin_add_overflow(old, value, &value)) fail("arithmetic " + printable(target + "+=" + text, 60) + ": overflow");
    }
    Var v{{std::to_string(value)}, false, {}, true};
    assign(target, std::move(v));
    return;
  }
  Var v{{text}, false, inherited(x.unknown)};
  if (append) {
    if (const auto it = vars_.find(target); it != vars_.end()) {
      v = it->second;
      if (v.items.empty()) v.items.emplace_back();
      v.items[0] += text;
      if (v.unknown.empty() && !x.unknown.empty()) v.unknown = inherited(x.unknown);
    }
  }
  if (const auto it = vars_.find(target); it != vars_.end()) v.integer = it->second.integer;
  assign(target, std::move(v));
}

// Array items copied (assigned, appended to, expanded): a loop that grows an array by one item
// copies it whole each time (quadratic), so the work is bounded by what was copied.
void Shell::charge_items(size_t n) {
  items_copied_ += n;
  if (items_copied_ > kMaxItems)
    fail("the script copies more than " + std::to_string(kMaxItems) + " array items (a loop that grows an array without end?)");
}

void Shell::assign(const std::string& name, Var v) {
  // A value the import cannot know does not replace one the user gave with --env.
  if (!v.unknown.empty() && given_.count(name)) return;
  charge_items(v.items.size());
  size_t size = 0;
  for (const auto& item : v.items) size += item.size();
  if (size > kMaxValue) fail("variable " + name + " grows beyond 1 MiB: a variable that doubles itself?");
  if (const auto it = vars_.find(name); it != vars_.end() && it->second.integer) v.integer = true;
  vars_[name] = std::move(v);
}

// printf's FORMAT applied to ARGS as bash does: escapes (\n \t \\ …), %% and the conversions
// d i o u x X c s b f e E g G with flags, width and precision; the format is reused while
// arguments remain; a missing argument is "" (or 0).
std::string Shell::printf_format(const std::string& fmt, const std::vector<std::string>& args) {
  std::string out;
  size_t next = 0;
  auto escape = [](const std::string& t, size_t& k, std::string& to) {
    const char c = k + 1 < t.size() ? t[k + 1] : '\\';
    static const std::string from = "ntr\\abfv\"'", into = "\n\t\r\\\a\b\f\v\"'";
    if (const size_t at = from.find(c); at != std::string::npos && k + 1 < t.size()) {
      to += into[at];
      k += 2;
      return;
    }
    to += '\\';
    k += 1;
  };
  for (;;) {
    const size_t used_before = next;
    for (size_t k = 0; k < fmt.size();) {
      if (fmt[k] == '\\') {
        escape(fmt, k, out);
        continue;
      }
      if (fmt[k] != '%') {
        out += fmt[k++];
        continue;
      }
      if (k + 1 < fmt.size() && fmt[k + 1] == '%') {
        out += '%';
        k += 2;
        continue;
      }
      size_t e = k + 1;
      while (e < fmt.size() && std::string("-+ 0#").find(fmt[e]) != std::string::npos) ++e;
      while (e < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[e])) || fmt[e] == '.')) ++e;
      if (e >= fmt.size() || std::string("diouxXcsbfeEgG").find(fmt[e]) == std::string::npos)
        fail("printf: the format " + printable(fmt, 60) + " has a conversion this import does not know");
      if (e - k > 20) fail("printf: the conversion " + printable(fmt.substr(k, e - k + 1), 40) + " is too long");
      const char conv = fmt[e];
      std::string spec = fmt.substr(k, e - k);
      for (size_t j = 0; j < spec.size();) {  // width and precision within the buffer below
        if (!std::isdigit(static_cast<unsigned char>(spec[j]))) {
          ++j;
          continue;
        }
        const size_t from = j;
        while (j < spec.size() && std::isdigit(static_cast<unsigned char>(spec[j]))) ++j;
        if (j - from > 3 || std::stoi(spec.substr(from, j - from)) > 400)
          fail("printf: the width or precision of " + printable(fmt.substr(k, e - k + 1), 40) + " exceeds 400");
      }
      const std::string arg = next < args.size() ? args[next] : std::string();
      if (next < args.size()) ++next;
      char buf[512];
      if (conv == 's' || conv == 'b' || conv == 'c') {
        std::string text = arg;
        if (conv == 'b') {
          text.clear();
          for (size_t j = 0; j < arg.size();) {
            if (arg[j] == '\\') escape(arg, j, text);
            else text += arg[j++];
          }
        }
        if (conv == 'c') text = text.substr(0, 1);
        if (text.size() > 400) {
          out += text;  // no padding needed beyond the buffer: wide text
        } else {
          std::snprintf(buf, sizeof buf, (spec + "s").c_str(), text.c_str());
          out += buf;
        }
      } else if (std::string("diouxX").find(conv) != std::string::npos) {
        long v = 0;
        if (!arg.empty() && (arg[0] == '\'' || arg[0] == '"')) v = arg.size() > 1 ? static_cast<unsigned char>(arg[1]) : 0;
        else if (!arg.empty()) {  // as C reads it: 0x1f, 010 (octal), -3
          char* end = nullptr;
          errno = 0;
          v = std::strtol(arg.c_str(), &end, 0);
          if (end == arg.c_str() || *end != '\0' || errno == ERANGE) fail("printf: '" + printable(arg, 40) + "' is not an integer");
        }
        std::snprintf(buf, sizeof buf, (spec + "l" + conv).c_str(), v);
        out += buf;
      } else {
        double v = 0;
        if (!arg.empty()) {
          char* end = nullptr;
          v = std::strtod(arg.c_str(), &end);
          if (end == arg.c_str() || *end != '\0') fail("printf: '" + printable(arg, 40) + "' is not a number");
        }
        if (!std::isfinite(v) || std::fabs(v) > 1e300) fail("printf: '" + printable(arg, 40) + "' is out of range");
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v);
        out += buf;
      }
      k = e + 1;
      if (out.size() > kMaxValue) fail("printf: the text grows beyond 1 MiB");
    }
    if (next >= args.size() || next == used_before) break;
  }
  return out;
}

struct Shell::Test {
  Shell& sh;
  const std::vector<Element>& e;
  size_t i, end;
  bool double_bracket;

  bool at(const char* text) const { return i < end && e[i].word.segs.size() == 1 && e[i].word.raw() == text; }
  bool or_expr() {
    bool v = and_expr();
    while (at("||") || at("-o")) {
      ++i;
      if (v) skip_and();  // short-circuit: the right side is not evaluated
      else v = and_expr();
    }
    return v;
  }
  bool and_expr() {
    bool v = not_expr();
    while (at("&&") || at("-a")) {
      ++i;
      if (!v) skip_not();
      else v = not_expr();
    }
    return v;
  }
  // Skipping without evaluating (so an unknown operand there is not an error).
  void skip_and() {
    skip_not();
    while (at("&&") || at("-a")) {
      ++i;
      skip_not();
    }
  }
  void skip_not() {
    while (at("!")) ++i;
    if (at("(")) {
      int depth = 0;
      for (; i < end; ++i) {
        if (at("(")) ++depth;
        else if (at(")") && --depth == 0) {
          ++i;
          return;
        }
      }
      sh.fail("a test with '(' and no ')'");
    }
    if (i < end && is_unary(e[i].word.raw()) && i + 1 < end) {
      i += 2;
      return;
    }
    if (i + 1 < end && is_binary(e[i + 1].word.raw())) {
      i = std::min(i + 3, end);
      return;
    }
    if (i < end) ++i;
  }
  static bool is_unary(const std::string& op) {
    return op == "-n" || op == "-z" || op == "-e" || op == "-f" || op == "-d" || op == "-s" || op == "-r" || op == "-w" ||
           op == "-x" || op == "-L" || op == "-h" || op == "-v" || op == "-p" || op == "-S" || op == "-b" || op == "-c";
  }
  static bool is_binary(const std::string& op) {
    return op == "=" || op == "==" || op == "!=" || op == "-eq" || op == "-ne" || op == "-gt" || op == "-lt" || op == "-ge" ||
           op == "-le" || op == "=~" || op == "<" || op == ">";
  }
  bool not_expr() {
    if (at("!")) {
      ++i;
      return !not_expr();
    }
    return primary();
  }
  std::string value(size_t k) { return sh.known_string(e[k].word, "the condition"); }
  bool primary() {
    if (at("(")) {
      ++i;
      const bool v = or_expr();
      if (!at(")")) sh.fail("a test with '(' and no ')'");
      ++i;
      return v;
    }
    if (i >= end) sh.fail("a test is missing an operand");
    const std::string first = e[i].word.raw();
    if (i + 1 < end && is_binary(e[i + 1].word.raw()) && e[i + 1].word.segs[0].quote != Quote::Single) {
      const std::string op = e[i + 1].word.raw();
      if (i + 2 >= end) sh.fail("the test operator '" + op + "' is missing its right operand");
      const std::string a = value(i);
      bool holds = false;
      if (op == "=" || op == "==" || op == "!=") {
        const bool equal = double_bracket ? sh.matches(sh.pattern_of(e[i + 2].word), a) : a == value(i + 2);
        holds = (op == "!=") != equal;
      } else if (op == "=~") {
        sh.fail("cannot evaluate '=~' (regular expressions): give the value it decides with --env NAME=VALUE");
      } else if (op == "<" || op == ">") {
        const std::string b = value(i + 2);
        holds = op == "<" ? a < b : a > b;
      } else {
        const std::string b = value(i + 2);
        long x = 0, y = 0;
        if (double_bracket) {
          x = sh.arith_or_fail(a);
          y = sh.arith_or_fail(b);
        } else if (!parse_integer(a, x) || !parse_integer(b, y)) {
          sh.fail("'" + printable(a, 30) + " " + op + " " + printable(b, 30) + "' compares a value that is not an integer");
        }
        holds = op == "-eq" ? x == y : op == "-ne" ? x != y : op == "-gt" ? x > y : op == "-lt" ? x < y : op == "-ge" ? x >= y : x <= y;
      }
      i += 3;
      return holds;
    }
    if (is_unary(first) && i + 1 < end) {
      ++i;
      if (first == "-n" || first == "-z") {
        const bool empty = value(i++).empty();
        return first == "-z" ? empty : !empty;
      }
      if (first == "-v") {
        const std::string name = value(i++);
        return sh.vars_.count(name) > 0;
      }
      // File tests: the files in the folder the script runs in (ShellContext).
      return sh.file_test(first, value(i++));
    }
    return !value(i++).empty();
  }
};

bool Shell::test_command(const std::vector<Element>& elements, size_t from, const std::string& close) {
  size_t end = elements.size();
  if (!close.empty()) {
    if (end <= from || !(elements[end - 1].word.raw() == close && elements[end - 1].word.segs.size() == 1))
      fail("a test without its closing " + close);
    --end;
  }
  Test t{*this, elements, from, end, close == "]]"};
  if (t.i == t.end) return false;
  const bool v = t.or_expr();
  if (t.i != t.end) fail("cannot evaluate the test: unexpected '" + printable(elements[t.i].word.raw(), 40) + "'");
  return v;
}

long Shell::arith_or_fail(const std::string& text) {
  try {
    return arith_value(text);
  } catch (UnknownArith& u) {
    unknown_condition(u.unknown, "the condition");
  }
}

}  // namespace shell_interpreter

using shell_interpreter::Shell;

std::vector<std::string> shell_words(const std::string& script, const std::string& source,
                                     const std::map<std::string, std::string>& env, const ShellFileReader& read) {
  Shell shell(env, read);
  shell.run_script(script, source);
  return std::move(shell.words);
}

ShellRun run_shell(const std::string& script, const std::string& source, const std::map<std::string, std::string>& env,
                   const ShellFileReader& read, const ShellContext& context) {
  Shell shell(env, read, context);
  shell.run_script(script, source);
  return ShellRun{std::move(shell.words), std::move(shell.notes), shell.exit_where, shell.exit_command, shell.exit_status};
}

}  // namespace ptdp
