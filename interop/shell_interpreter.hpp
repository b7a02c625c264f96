// The launch-script interpreter's state and its members (interop/shell.cpp): the interpreter runs
// the statements and commands of a script (shell.cpp: the entry points, statements, simple
// commands and builtins, assignments, tests) and expands its words as bash does
// (shell_expand.cpp: words, parameters, arithmetic). Internal to interop/.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "interop/shell.hpp"
#include "interop/shell_syntax.hpp"

namespace ptdp::shell_interpreter {

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
inline Unknown inherited(const Unknown& u) { return u.reason.empty() ? u : Unknown{"", u.reason}; }

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
  Shell(const std::map<std::string, std::string>& env, ShellFileReader read, ShellContext context = {});

  void run_script(const std::string& text, const std::string& source);

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

  // ---- statements (shell.cpp)

  void run_text(const std::string& text, const std::string& source, int line_offset);
  int run_list(const List& list);
  int run(const Node& n);
  template <typename F>
  int in_subshell(F body);
  bool loop_body(const List& body, int& status);

  // ---- simple commands, builtins and assignments (shell.cpp)

  int simple(const Node& n);
  int command(std::vector<std::string>& argv, const Node& n);
  std::string printf_format(const std::string& fmt, const std::vector<std::string>& args);
  void push_word(std::string w);
  std::string where_str() const { return where_.file + ":" + std::to_string(where_.line); }
  [[noreturn]] void stop_script(const std::vector<std::string>& argv);
  std::optional<std::string> substitution(const std::string& inner);
  bool file_test(const std::string& op, const std::string& path);
  void note_once(const std::string& note);
  void leave_frame();
  void make_local(const std::string& name);
  const std::string* assignment_name(const Word& w);
  void assign_element(const Element& e);
  void charge_items(size_t n);
  void assign(const std::string& name, Var v);

  // ---- expansion (shell_expand.cpp)

  Expansion expand(const Word& w, bool split);
  std::string string_of(const Word& w, Unknown* unknown);
  [[noreturn]] void unknown_condition(const Unknown& u, const std::string& what) const;
  std::string known_string(const Word& w, const std::string& what);
  std::string pattern_of(const Word& w);
  bool matches(const std::string& pattern, const std::string& text);
  void expand_text(const std::string& t, bool in_double, bool literal_splits, std::vector<Piece>& out, Unknown& unknown);
  static size_t closing(const std::string& t, size_t open_at, char open, char close);
  bool lookup(const std::string& name, std::vector<std::string>& values, bool& multi, Unknown& unknown);
  void simple_parameter(const std::string& name, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown);
  void emit_values(const std::vector<std::string>& values, bool multi, bool star, bool in_double, std::vector<Piece>& out) const;
  void braced(const std::string& inner, const std::string& written, bool in_double, std::vector<Piece>& out, Unknown& unknown);
  void value_operator(const std::string& op_text, const std::string& written, std::vector<std::string>& values, bool multi, bool star,
                      bool in_double, std::vector<Piece>& out, Unknown& unknown);
  Word operand_word(const std::string& text);
  void expand_into(const Word& w, bool in_double, std::vector<Piece>& out, Unknown& unknown);
  std::string ifs() const;

  // ---- arithmetic (shell_expand.cpp)

  long arith_value(const std::string& expr);
  long integer_of(const std::string& text);
  static bool parse_integer(const std::string& raw, long& value);
  long arith_variable(const std::string& name, int depth);
  struct Arith;

  // ---- tests: [ ], [[ ]], test (shell.cpp)

  bool test_command(const std::vector<Element>& elements, size_t from, const std::string& close);
  struct Test;
  long arith_or_fail(const std::string& text);

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

}  // namespace ptdp::shell_interpreter
