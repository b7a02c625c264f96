// The shell interpreter of launch scripts (shell_words): a lexer that keeps each word's quoting,
// a recursive-descent parser of bash's command grammar, and an interpreter that expands words as
// bash does and collects the words of the commands the script runs.
#include "interop/shell.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "core/error.hpp"
#include "interop/shell_syntax.hpp"

namespace ptdp {
namespace {

using namespace shell_syntax;

constexpr size_t kMaxValue = size_t{1} << 20;        // one variable's value
constexpr size_t kMaxWords = size_t{16} << 20;       // all words collected
constexpr size_t kMaxExpanded = size_t{256} << 20;   // all bytes ever expanded (a loop that copies)
constexpr long kMaxSteps = 200'000;                  // commands run
constexpr size_t kMaxItems = 2'000'000;              // array items ever assigned or expanded (a loop that grows an array)
constexpr int kMaxDepth = 64;                        // functions, source, eval, nested expansions
constexpr size_t kMaxMatch = 4096;                   // subject of a pattern operation

struct Unknown {
  std::string name, reason;
  bool empty() const { return name.empty() && reason.empty(); }
};

struct Var {
  std::vector<std::string> items;  // a scalar is items[0]
  bool array = false;
  Unknown unknown;                 // empty: the value is known
  bool integer = false;            // declare -i: assignments are evaluated as arithmetic
};

// What a variable assigned from an unknown expansion records.
Unknown inherited(const Unknown& u) { return u.reason.empty() ? u : Unknown{"", u.reason}; }

struct DepthGuard {
  int& depth;
  ~DepthGuard() { --depth; }
  DepthGuard(int& d) : depth(d) {}
};

// A piece of an expanded word: text that splits (unquoted expansion) or not, or a boundary
// between the items of "${A[@]}".
struct Piece {
  std::string text;
  bool split = false, boundary = false, quoted = false;
};

struct Expansion {
  std::vector<std::string> fields;
  Unknown unknown;
};

struct ExitScript {};
struct ReturnFrom {};
struct LoopControl {
  bool is_break;
  long levels;
};
struct UnknownArith {
  Unknown unknown;
};

class Shell {
 public:
  Shell(const std::map<std::string, std::string>& env, ShellFileReader read, ShellContext context = {})
      : read_(std::move(read)), context_(std::move(context)) {
    if (!context_.cwd.empty()) vars_["PWD"] = Var{{context_.cwd}, false, {}};
    if (!context_.script_path.empty()) vars_["BASH_SOURCE"] = Var{{context_.script_path}, true, {}};
    for (const auto& [name, value] : env) {
      vars_[name] = Var{{value}, false, {}};
      given_.insert(name);
    }
    frames_.push_back(Frame{});
  }

  void run_script(const std::string& text, const std::string& source) {
    try {
      run_text(text, source, 1);
    } catch (const ExitScript&) {
    } catch (const ReturnFrom&) {
    } catch (const LoopControl&) {
    }
  }

  std::vector<std::string> words;
  std::vector<std::string> notes;
  std::string exit_where, exit_command;
  int exit_status = 0;

 private:
  struct Frame {
    std::vector<std::string> args;
    std::map<std::string, std::optional<Var>> saved;  // local variables' outer values
  };

  [[noreturn]] void fail(const std::string& what) const { throw ConfigError("script", what, where_); }

  void run_text(const std::string& text, const std::string& source, int line_offset) {
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

  int run_list(const List& list) {
    int status = 0;
    for (const auto& node : list) status = run(*node);
    return status;
  }

  int run(const Node& n) {
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
  int in_subshell(F body) {
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
  bool loop_body(const List& body, int& status) {
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

  // ---- simple commands

  int simple(const Node& n) {
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

  int command(std::vector<std::string>& argv, const Node& n) {
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

  void push_word(std::string w) {
    words_bytes_ += w.size();
    if (words_bytes_ > kMaxWords) fail("the script's commands exceed 16 MiB of words (a variable repeated without bound?)");
    words.push_back(std::move(w));
  }

  std::string where_str() const { return where_.file + ":" + std::to_string(where_.line); }

  // `exit` (or `return` outside a function): the script stops; the import names the line.
  [[noreturn]] void stop_script(const std::vector<std::string>& argv) {
    exit_where = where_.file + ":" + std::to_string(where_.line) + ":" + std::to_string(where_.column);
    exit_command.clear();
    for (const auto& a : argv) exit_command += (exit_command.empty() ? "" : " ") + a;
    exit_status = argv.size() > 1 ? static_cast<int>(integer_of(argv[1])) : 0;
    throw ExitScript{};
  }

  // The output of a command substitution the import can know: where the script is and runs
  // (`pwd`, `dirname "$0"`, `cd DIR && pwd`, …); nullopt for anything else.
  std::optional<std::string> substitution(const std::string& inner) {
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
  bool file_test(const std::string& op, const std::string& path) {
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

  void note_once(const std::string& note) {
    if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
  }

  void leave_frame() {
    for (auto& [name, value] : frames_.back().saved) {
      if (value) vars_[name] = *value;
      else vars_.erase(name);
    }
    frames_.pop_back();
  }

  void make_local(const std::string& name) {
    if (frames_.size() < 2) return;
    auto& saved = frames_.back().saved;
    if (saved.count(name)) return;
    const auto it = vars_.find(name);
    saved[name] = it == vars_.end() ? std::nullopt : std::optional<Var>(it->second);
  }

  // The NAME of a NAME=… / NAME+=… word (the first segment unquoted), else nullptr.
  const std::string* assignment_name(const Word& w) {
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

  void assign_element(const Element& e) {
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
  void charge_items(size_t n) {
    items_copied_ += n;
    if (items_copied_ > kMaxItems)
      fail("the script copies more than " + std::to_string(kMaxItems) + " array items (a loop that grows an array without end?)");
  }

  void assign(const std::string& name, Var v) {
    // A value the import cannot know does not replace one the user gave with --env.
    if (!v.unknown.empty() && given_.count(name)) return;
    charge_items(v.items.size());
    size_t size = 0;
    for (const auto& item : v.items) size += item.size();
    if (size > kMaxValue) fail("variable " + name + " grows beyond 1 MiB: a variable that doubles itself?");
    if (const auto it = vars_.find(name); it != vars_.end() && it->second.integer) v.integer = true;
    vars_[name] = std::move(v);
  }

  // ---- expansion

  Expansion expand(const Word& w, bool split) {
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
  std::string string_of(const Word& w, Unknown* unknown) {
    Expansion x = expand(w, false);
    if (unknown && unknown->empty()) *unknown = x.unknown;
    return x.fields.empty() ? std::string() : x.fields[0];
  }

  // Unknown values in a condition are an error: bash would decide with a value the import lacks.
  [[noreturn]] void unknown_condition(const Unknown& u, const std::string& what) const {
    if (u.name.empty())
      fail(what + " depends on " + u.reason + ", which an import does not run: give the value it decides with --env NAME=VALUE");
    fail(what + " depends on " + u.name + (u.reason.empty() ? ", which the script does not set (an environment variable)" : " (" + u.reason + ")") +
         ": give its value with --env " + u.name + "=VALUE");
  }

  std::string known_string(const Word& w, const std::string& what) {
    Unknown u;
    std::string value = string_of(w, &u);
    if (!u.empty()) unknown_condition(u, what);
    return value;
  }

  // A glob pattern from a word: quoted parts match literally.
  std::string pattern_of(const Word& w) {
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

  bool matches(const std::string& pattern, const std::string& text) {
    if (text.size() > kMaxMatch * 16 || pattern.size() > kMaxMatch) fail("a pattern match on more than 64 KiB of text");
    return glob_match(pattern, text);
  }

  // Appends the pieces of segment text `t`: literal text splits only where `literal_splits` (the
  // operand of ${A:-a b} outside quotes), expansions outside double quotes split.
  void expand_text(const std::string& t, bool in_double, bool literal_splits, std::vector<Piece>& out, Unknown& unknown) {
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
  static size_t closing(const std::string& t, size_t open_at, char open, char close) {
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
  bool lookup(const std::string& name, std::vector<std::string>& values, bool& multi, Unknown& unknown) {
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

  void simple_parameter(const std::string& name, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
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

  void emit_values(const std::vector<std::string>& values, bool multi, bool star, bool in_double, std::vector<Piece>& out) const {
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
  void braced(const std::string& inner, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
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
  void value_operator(const std::string& op_text, const std::string& written, std::vector<std::string>& values, bool multi, bool star,
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
  Word operand_word(const std::string& text) {
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

  void expand_into(const Word& w, bool in_double, std::vector<Piece>& out, Unknown& unknown) {
    for (const auto& s : w.segs) {
      if (s.quote == Quote::Single) out.push_back(Piece{s.text, false, false, true});
      else expand_text(s.text, in_double || s.quote == Quote::Double, !in_double && s.quote == Quote::None, out, unknown);
    }
  }

  // printf's FORMAT applied to ARGS as bash does: escapes (\n \t \\ …), %% and the conversions
  // d i o u x X c s b f e E g G with flags, width and precision; the format is reused while
  // arguments remain; a missing argument is "" (or 0).
  std::string printf_format(const std::string& fmt, const std::vector<std::string>& args) {
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

  // The characters that split words: $IFS, or blank, tab and newline when it is unset.
  std::string ifs() const {
    const auto it = vars_.find("IFS");
    if (it == vars_.end() || !it->second.unknown.empty()) return " \t\n";
    return it->second.items.empty() ? std::string() : it->second.items[0];
  }

  // ---- arithmetic

  long arith_value(const std::string& expr) {
    Unknown u;
    Word w{{{Quote::Double, expr}}, where_.line, where_.column};
    const std::string text = string_of(w, &u);
    if (!u.empty()) throw UnknownArith{u};
    Arith a{*this, text};
    const long v = a.parse();
    return v;
  }

  long integer_of(const std::string& text) {
    long value = 0;
    if (!parse_integer(text, value)) fail("'" + printable(text, 40) + "' is not an integer");
    return value;
  }

  static bool parse_integer(const std::string& raw, long& value) {
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
  long arith_variable(const std::string& name, int depth) {
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

  struct Arith {
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

  // ---- tests: [ ], [[ ]], test

  bool test_command(const std::vector<Element>& elements, size_t from, const std::string& close) {
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

  struct Test {
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

  long arith_or_fail(const std::string& text) {
    try {
      return arith_value(text);
    } catch (UnknownArith& u) {
      unknown_condition(u.unknown, "the condition");
    }
  }

  friend struct Arith;
  friend struct Test;

  ShellFileReader read_;
  ShellContext context_;
  std::map<std::string, Var> vars_;
  std::set<std::string> given_;
  std::map<std::string, NodePtr> functions_;
  std::vector<Frame> frames_;
  Unknown argv_unknown_;  // of the arguments of the command being run (printf -v)
  std::vector<std::shared_ptr<List>> programs_;
  std::string source_, last_name_;
  SourceLocation where_;
  long steps_ = 0;
  size_t items_copied_ = 0;
  int depth_ = 0, expand_depth_ = 0, loops_ = 0;
  size_t words_bytes_ = 0, expanded_bytes_ = 0;
};

}  // namespace

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
