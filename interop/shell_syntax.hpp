// The syntax of the launch-script interpreter (interop/shell.cpp): a lexer that keeps each word's
// quoting, a recursive-descent parser of bash's command grammar, and bash's glob patterns. Internal
// to interop/ (the interpreter, shell_interpreter.hpp, is its only user).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ptdp::shell_syntax {

bool is_name_start(char c);
bool is_name_char(char c);
/// A variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_name(const std::string& s);
/// A space, tab or newline (what separates words).
bool is_blank(char c);

// Lexer. A word is a list of segments, each unquoted, single-quoted (also an escaped character)
// or double-quoted; `$…` constructs stay as text in their segment and are expanded later.

enum class Quote { None, Single, Double };
struct Segment {
  Quote quote;
  std::string text;
};
struct Word {
  std::vector<Segment> segs;
  int line = 0, col = 0;
  bool is(const char* text) const { return segs.size() == 1 && segs[0].quote == Quote::None && segs[0].text == text; }
  std::string raw() const {
    std::string r;
    for (const auto& s : segs) r += s.text;
    return r;
  }
};
enum class Tok { Word, Newline, Semi, DSemi, And, Or, Pipe, Amp, LParen, RParen, Arith, ArrayOpen, End };
struct Token {
  Tok kind;
  Word word;         // Word; ArrayOpen: the `NAME=` / `NAME+=` part
  std::string text;  // Arith: the expression inside (( ))
  int line, col;
};


struct Node;
using NodePtr = std::shared_ptr<const Node>;
using List = std::vector<NodePtr>;

struct Element {          // of a simple command
  Word word;              // a word, or the NAME= / NAME+= of an array assignment
  bool array = false;
  std::vector<Word> items;
};
struct CaseArm {
  std::vector<Word> patterns;
  List body;
};

struct Node {
  enum Kind { Simple, Arith, If, Case, For, ArithFor, While, Group, Subshell, Function, Chain } kind;
  int line = 0, col = 0;
  std::vector<Element> elements;                // Simple
  std::string text;                             // Arith, ArithFor (init;cond;step), Function name, For variable
  std::vector<std::pair<List, List>> arms;      // If: (condition, body); While: one (condition, body)
  List else_body;                               // If
  bool has_else = false, until = false, in_given = false;
  Word subject;                                 // Case
  std::vector<CaseArm> cases;                   // Case
  std::vector<Word> items;                      // For
  List body;                                    // For, ArithFor, Group, Subshell
  NodePtr function_body;                        // Function
  std::vector<NodePtr> parts;                   // Chain: commands joined by && || |
  std::vector<Tok> ops;
};


/// The tokens of `text` (ConfigError with `source`:line:col when malformed).
std::vector<Token> lex(const std::string& text, const std::string& source);
/// The command list of a script's tokens (ConfigError with `source`:line:col).
List parse(std::vector<Token> tokens, const std::string& source);
/// bash's pattern matching (`*`, `?`, `[…]`) of `s` against pattern `p`.
bool glob_match(const std::string& p, const std::string& s);
/// `text` with the pattern characters escaped (a quoted part of a pattern).
std::string glob_escape(const std::string& text);

}  // namespace ptdp::shell_syntax
