// The syntax of the launch-script interpreter: see interop/shell_syntax.hpp.
#include "interop/shell_syntax.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.hpp"

namespace ptdp::shell_syntax {
namespace {

constexpr int kMaxParseDepth = 200;  // nested compound commands

class Lexer {
 public:
  Lexer(const std::string& text, std::string source) : s_(text), source_(std::move(source)) {}

  std::vector<Token> tokens() {
    std::vector<Token> out;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      const int line = line_, col = col_;
      auto emit = [&](Tok kind, size_t length) {
        advance(length);
        out.push_back(Token{kind, {}, {}, line, col});
      };
      if (c == '\\' && peek(1) == '\n') {
        advance(2);
      } else if (c == ' ' || c == '\t' || c == '\r') {
        advance(1);
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') advance(1);
      } else if (c == '\n') {
        emit(Tok::Newline, 1);
        read_heredocs();
      } else if (c == ';') {
        if (peek(1) == ';') emit(Tok::DSemi, peek(2) == '&' ? 3 : 2);
        else if (peek(1) == '&') emit(Tok::DSemi, 2);
        else emit(Tok::Semi, 1);
      } else if (c == '&') {
        if (peek(1) == '&') emit(Tok::And, 2);
        else if (peek(1) == '>') redirection(peek(2) == '>' ? 3 : 2);
        else emit(Tok::Amp, 1);
      } else if (c == '|') {
        if (peek(1) == '|') emit(Tok::Or, 2);
        else emit(Tok::Pipe, peek(1) == '&' ? 2 : 1);
      } else if (c == '(' && peek(1) == '(' && !in_test_) {
        advance(2);
        const size_t start = pos_;
        balanced('(', ')', 2, line, col, "((");
        out.push_back(Token{Tok::Arith, {}, s_.substr(start, pos_ - start - 2), line, col});
      } else if (c == '(') {
        emit(Tok::LParen, 1);
      } else if (c == ')') {
        emit(Tok::RParen, 1);
      } else if ((c == '<' || c == '>') && in_test_) {
        Word w{{{Quote::None, std::string(1, c)}}, line, col};
        advance(1);
        out.push_back(Token{Tok::Word, w, {}, line, col});
      } else if (c == '<' || c == '>') {
        redirection(0);
      } else {
        word(out);
      }
    }
    out.push_back(Token{Tok::End, {}, {}, line_, col_});
    return out;
  }

 private:
  char peek(size_t k) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  void advance(size_t n) {
    for (size_t k = 0; k < n && pos_ < s_.size(); ++k, ++pos_) {
      if (s_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }
  [[noreturn]] void fail(const std::string& what, int line, int col) const {
    throw ConfigError("script", what, SourceLocation{source_, line, col});
  }

  // From just inside an opening bracket, to just after the bracket that closes `depth` levels,
  // skipping quoted text. `what` names the construct in the error for an unterminated one.
  void balanced(char open, char close, int depth, int line, int col, const char* what) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '\\') {
        advance(2);
      } else if (c == '\'' || c == '"') {
        advance(1);
        while (pos_ < s_.size() && s_[pos_] != c) advance(c == '"' && s_[pos_] == '\\' ? 2 : 1);
        if (pos_ >= s_.size()) break;
        advance(1);
      } else if (c == open) {
        ++depth;
        advance(1);
      } else if (c == close) {
        advance(1);
        if (--depth == 0) return;
      } else {
        advance(1);
      }
    }
    fail(std::string("unterminated ") + what, line, col);
  }

  // A `$` construct at pos_, appended to `text` as written.
  void dollar(std::string& text) {
    const size_t start = pos_;
    const int line = line_, col = col_;
    const char n = peek(1);
    if (n == '(' && peek(2) == '(') {
      advance(3);
      balanced('(', ')', 2, line, col, "$((");
    } else if (n == '(') {
      advance(2);
      balanced('(', ')', 1, line, col, "$(");
    } else if (n == '{') {
      advance(2);
      balanced('{', '}', 1, line, col, "${");
    } else if (is_name_start(n)) {
      advance(1);
      while (pos_ < s_.size() && is_name_char(s_[pos_])) advance(1);
    } else if (std::isdigit(static_cast<unsigned char>(n)) || (n != '\0' && std::string("@*#?$!-").find(n) != std::string::npos)) {
      advance(2);
    } else {
      advance(1);
    }
    text += s_.substr(start, pos_ - start);
  }

  void word(std::vector<Token>& out) {
    Word w;
    w.line = line_;
    w.col = col_;
    auto seg = [&](Quote q) -> std::string& {
      if (w.segs.empty() || w.segs.back().quote != q) w.segs.push_back(Segment{q, {}});
      return w.segs.back().text;
    };
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (is_blank(c) || c == '\r' || c == ';' || c == '&' || c == '|' || c == '(' || c == ')' || c == '<' || c == '>') break;
      if (c == '\\') {
        if (peek(1) == '\n') {
          advance(2);
        } else if (pos_ + 1 < s_.size()) {
          w.segs.push_back(Segment{Quote::Single, std::string(1, s_[pos_ + 1])});
          advance(2);
        } else {
          advance(1);
        }
      } else if (c == '\'') {
        const int line = line_, col = col_;
        advance(1);
        const size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] != '\'') advance(1);
        if (pos_ >= s_.size()) fail("unterminated single quote", line, col);
        w.segs.push_back(Segment{Quote::Single, s_.substr(start, pos_ - start)});
        advance(1);
      } else if (c == '"') {
        const int line = line_, col = col_;
        advance(1);
        w.segs.push_back(Segment{Quote::Double, {}});  // "" is a word of its own
        while (pos_ < s_.size() && s_[pos_] != '"') {
          const char d = s_[pos_];
          if (d == '\\' && pos_ + 1 < s_.size() && std::string("$`\"\\\n").find(s_[pos_ + 1]) != std::string::npos) {
            if (s_[pos_ + 1] != '\n') w.segs.push_back(Segment{Quote::Single, std::string(1, s_[pos_ + 1])});
            advance(2);
          } else if (d == '$') {
            dollar(seg(Quote::Double));
          } else if (d == '`') {
            const size_t start = pos_;
            advance(1);
            while (pos_ < s_.size() && s_[pos_] != '`') advance(s_[pos_] == '\\' ? 2 : 1);
            if (pos_ >= s_.size()) fail("unterminated `", line, col);
            advance(1);
            seg(Quote::Double) += s_.substr(start, pos_ - start);
          } else {
            seg(Quote::Double) += d;
            advance(1);
          }
        }
        if (pos_ >= s_.size()) fail("unterminated double quote", line, col);
        advance(1);
      } else if (c == '$') {
        dollar(seg(Quote::None));
      } else if (c == '`') {
        const int line = line_, col = col_;
        const size_t start = pos_;
        advance(1);
        while (pos_ < s_.size() && s_[pos_] != '`') advance(s_[pos_] == '\\' ? 2 : 1);
        if (pos_ >= s_.size()) fail("unterminated `", line, col);
        advance(1);
        seg(Quote::None) += s_.substr(start, pos_ - start);
      } else if (c == '=' && peek(1) == '(' && w.segs.size() == 1 && w.segs[0].quote == Quote::None &&
                 (is_name(w.segs[0].text) || (w.segs[0].text.size() > 1 && w.segs[0].text.back() == '+' &&
                                              is_name(w.segs[0].text.substr(0, w.segs[0].text.size() - 1))))) {
        // NAME=( … ) / NAME+=( … ): the items follow as words, up to the closing parenthesis.
        w.segs[0].text += '=';
        advance(2);
        out.push_back(Token{Tok::ArrayOpen, w, {}, w.line, w.col});
        return;
      } else {
        seg(Quote::None) += c;
        advance(1);
      }
    }
    // A file descriptor before a redirection (2>&1): not a word.
    if ((peek(0) == '<' || peek(0) == '>') && w.segs.size() == 1 && w.segs[0].quote == Quote::None && !w.segs[0].text.empty() &&
        w.segs[0].text.find_first_not_of("0123456789") == std::string::npos && !in_test_)
      return;
    if (w.segs.empty()) return;
    if (w.is("[[")) in_test_ = true;
    if (w.is("]]")) in_test_ = false;
    out.push_back(Token{Tok::Word, w, {}, w.line, w.col});
  }

  // A redirection at pos_ (`>`, `>>`, `<`, `<<`, `<<<`, `>&2`, `&>`, …; `skip` characters already
  // known to belong to it): dropped with its target. A here-document's body is skipped at the next
  // newline.
  void redirection(size_t skip) {
    const int line = line_, col = col_;
    if (skip == 0) {
      if (peek(0) == '<' && peek(1) == '<' && peek(2) != '<') {
        const bool strip = peek(2) == '-';
        advance(strip ? 3 : 2);
        while (peek(0) == ' ' || peek(0) == '\t') advance(1);
        std::string delimiter;
        while (pos_ < s_.size() && !is_blank(s_[pos_]) && std::string(";&|()<>").find(s_[pos_]) == std::string::npos) {
          if (s_[pos_] != '\'' && s_[pos_] != '"' && s_[pos_] != '\\') delimiter += s_[pos_];
          advance(1);
        }
        if (delimiter.empty()) fail("a here-document without its delimiter", line, col);
        heredocs_.emplace_back(delimiter, strip);
        return;
      }
      skip = 1;
      while (skip < 3 && (peek(skip) == '<' || peek(skip) == '>' || peek(skip) == '&' || peek(skip) == '|')) ++skip;
    }
    advance(skip);
    if (s_[pos_ - 1] == '&' && (std::isdigit(static_cast<unsigned char>(peek(0))) || peek(0) == '-')) {
      advance(1);
      return;
    }
    while (peek(0) == ' ' || peek(0) == '\t') advance(1);
    if (peek(0) == '(') {  // process substitution
      advance(1);
      balanced('(', ')', 1, line, col, "<(");
      return;
    }
    std::vector<Token> target;
    if (pos_ < s_.size() && !is_blank(s_[pos_]) && std::string(";&|()<>").find(s_[pos_]) == std::string::npos) word(target);
  }

  void read_heredocs() {
    for (const auto& [delimiter, strip] : heredocs_) {
      while (pos_ < s_.size()) {
        size_t end = s_.find('\n', pos_);
        if (end == std::string::npos) end = s_.size();
        std::string line = s_.substr(pos_, end - pos_);
        advance(end - pos_ + 1);
        if (strip) line.erase(0, line.find_first_not_of('\t') == std::string::npos ? line.size() : line.find_first_not_of('\t'));
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line == delimiter) break;
      }
    }
    heredocs_.clear();
  }

  const std::string& s_;
  std::string source_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  bool in_test_ = false;
  std::vector<std::pair<std::string, bool>> heredocs_;
};

// ---------------------------------------------------------------------------------------------
// Parser: bash's grammar of lists, and-or chains, pipelines and compound commands.


class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string source) : t_(std::move(tokens)), source_(std::move(source)) {}

  List program() {
    List list = parse_list({});
    if (peek().kind != Tok::End) fail("unexpected " + describe(peek()), peek());
    return list;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& take() {
    const Token& t = peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool is_word(const char* text, size_t k = 0) const { return peek(k).kind == Tok::Word && peek(k).word.is(text); }
  [[noreturn]] void fail(const std::string& what, const Token& at) const {
    throw ConfigError("script", what, SourceLocation{source_, at.line, at.col});
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::Word: return "'" + printable(t.word.raw(), 40) + "'";
      case Tok::Newline: return "end of line";
      case Tok::Semi: return "';'";
      case Tok::DSemi: return "';;'";
      case Tok::And: return "'&&'";
      case Tok::Or: return "'||'";
      case Tok::Pipe: return "'|'";
      case Tok::Amp: return "'&'";
      case Tok::LParen: return "'('";
      case Tok::RParen: return "')'";
      case Tok::Arith: return "'(('";
      case Tok::ArrayOpen: return "an array";
      case Tok::End: return "end of script";
    }
    return "token";
  }
  void skip_newlines() {
    while (peek().kind == Tok::Newline) take();
  }
  void expect_word(const char* keyword, const Token& opener, const char* construct) {
    skip_newlines();
    if (!is_word(keyword))
      fail(std::string("expected '") + keyword + "' for the " + construct + " at line " + std::to_string(opener.line) + ", found " +
               describe(peek()),
           peek());
    take();
  }

  // Commands separated by ; & or newlines, up to a keyword of `stops` at the start of a command,
  // ')', ';;' or the end.
  List parse_list(const std::set<std::string>& stops) {
    List list;
    for (;;) {
      while (peek().kind == Tok::Newline || peek().kind == Tok::Semi || peek().kind == Tok::Amp) take();
      const Token& t = peek();
      if (t.kind == Tok::End || t.kind == Tok::RParen || t.kind == Tok::DSemi) break;
      if (t.kind == Tok::Word && t.word.segs.size() == 1 && t.word.segs[0].quote == Quote::None && stops.count(t.word.segs[0].text)) break;
      list.push_back(parse_chain());
      const Tok k = peek().kind;
      if (k != Tok::Newline && k != Tok::Semi && k != Tok::Amp && k != Tok::End && k != Tok::RParen && k != Tok::DSemi &&
          !(k == Tok::Word && peek().word.segs.size() == 1 && stops.count(peek().word.segs[0].text)))
        fail("unexpected " + describe(peek()), peek());
    }
    return list;
  }

  NodePtr parse_chain() {
    NodePtr first = parse_command();
    if (peek().kind != Tok::And && peek().kind != Tok::Or && peek().kind != Tok::Pipe) return first;
    auto chain = std::make_shared<Node>();
    chain->kind = Node::Chain;
    chain->line = first->line;
    chain->col = first->col;
    chain->parts.push_back(first);
    while (peek().kind == Tok::And || peek().kind == Tok::Or || peek().kind == Tok::Pipe) {
      chain->ops.push_back(take().kind);
      skip_newlines();
      chain->parts.push_back(parse_command());
    }
    return chain;
  }

  NodePtr parse_command() {
    if (++depth_ > kMaxParseDepth) fail("commands nested more than " + std::to_string(kMaxParseDepth) + " deep", peek());
    NodePtr n = command();
    --depth_;
    return n;
  }

  NodePtr command() {
    const Token& t = peek();
    auto node = std::make_shared<Node>();
    node->line = t.line;
    node->col = t.col;
    if (t.kind == Tok::Arith) {
      node->kind = Node::Arith;
      node->text = take().text;
      return node;
    }
    if (t.kind == Tok::LParen) {
      const Token open = take();
      node->kind = Node::Subshell;
      node->body = parse_list({});
      if (peek().kind != Tok::RParen) fail("a '(' at line " + std::to_string(open.line) + " without its ')'", peek());
      take();
      return node;
    }
    if (t.kind != Tok::Word && t.kind != Tok::ArrayOpen) fail("expected a command, found " + describe(t), t);
    for (const char* reserved : {"then", "elif", "else", "fi", "do", "done", "esac", "}"})
      if (is_word(reserved)) fail(std::string("'") + reserved + "' without the command it belongs to", t);
    if (is_word("if")) return parse_if(node);
    if (is_word("case")) return parse_case(node);
    if (is_word("for")) return parse_for(node);
    if (is_word("while") || is_word("until")) {
      const Token open = take();
      node->kind = Node::While;
      node->until = open.word.is("until");
      List cond = parse_list({"do"});
      expect_word("do", open, "loop");
      List body = parse_list({"done"});
      expect_word("done", open, "loop");
      node->arms.emplace_back(std::move(cond), std::move(body));
      return node;
    }
    if (is_word("{")) {
      const Token open = take();
      node->kind = Node::Group;
      node->body = parse_list({"}"});
      expect_word("}", open, "group");
      return node;
    }
    if (is_word("function")) {
      const Token open = take();
      if (peek().kind != Tok::Word || !is_name(peek().word.raw())) fail("expected a function name after 'function'", peek());
      node->text = take().word.raw();
      if (peek().kind == Tok::LParen && peek(1).kind == Tok::RParen) {
        take();
        take();
      }
      return function_body(node, open);
    }
    if (t.kind == Tok::Word && peek(1).kind == Tok::LParen && peek(2).kind == Tok::RParen) {
      const Token open = take();
      if (!is_name(open.word.raw()) && open.word.raw().find_first_of("$\"'=") != std::string::npos)
        fail("'" + printable(open.word.raw(), 40) + "' is not a function name", open);
      node->text = open.word.raw();
      take();
      take();
      return function_body(node, open);
    }
    // A simple command; [[ … ]] takes its && || ( ) as words.
    node->kind = Node::Simple;
    const bool test = is_word("[[");
    for (;;) {
      const Token& w = peek();
      if (w.kind == Tok::Word) {
        node->elements.push_back(Element{take().word, false, {}});
        if (test && node->elements.back().word.is("]]")) break;
      } else if (w.kind == Tok::ArrayOpen) {
        const Token open = take();
        Element e{open.word, true, {}};
        for (;;) {
          const Token& item = peek();
          if (item.kind == Tok::Newline) {
            take();
          } else if (item.kind == Tok::Word) {
            e.items.push_back(take().word);
          } else if (item.kind == Tok::RParen) {
            take();
            break;
          } else {
            fail("the array at line " + std::to_string(open.line) + " is not closed by ')' (found " + describe(item) + ")", item);
          }
        }
        node->elements.push_back(std::move(e));
      } else if (test && (w.kind == Tok::And || w.kind == Tok::Or || w.kind == Tok::LParen || w.kind == Tok::RParen)) {
        const char* text = w.kind == Tok::And ? "&&" : w.kind == Tok::Or ? "||" : w.kind == Tok::LParen ? "(" : ")";
        node->elements.push_back(Element{Word{{{Quote::None, text}}, w.line, w.col}, false, {}});
        take();
      } else {
        if (test) fail("a '[[' at line " + std::to_string(t.line) + " without its ']]'", w);
        break;
      }
    }
    return node;
  }

  NodePtr function_body(std::shared_ptr<Node> node, const Token& open) {
    skip_newlines();
    node->kind = Node::Function;
    if (!is_word("{") && peek().kind != Tok::LParen)
      fail("the body of function " + node->text + " (line " + std::to_string(open.line) + ") is not a { } or ( ) group", peek());
    node->function_body = parse_command();
    return node;
  }

  NodePtr parse_if(std::shared_ptr<Node> node) {
    const Token open = take();
    node->kind = Node::If;
    for (;;) {
      List cond = parse_list({"then"});
      expect_word("then", open, "if");
      List body = parse_list({"elif", "else", "fi"});
      node->arms.emplace_back(std::move(cond), std::move(body));
      if (is_word("elif")) {
        take();
        continue;
      }
      if (is_word("else")) {
        take();
        node->has_else = true;
        node->else_body = parse_list({"fi"});
      }
      expect_word("fi", open, "if");
      return node;
    }
  }

  NodePtr parse_case(std::shared_ptr<Node> node) {
    const Token open = take();
    node->kind = Node::Case;
    if (peek().kind != Tok::Word) fail("expected the word after 'case'", peek());
    node->subject = take().word;
    expect_word("in", open, "case");
    for (;;) {
      skip_newlines();
      if (is_word("esac")) {
        take();
        return node;
      }
      if (peek().kind == Tok::End) fail("the case at line " + std::to_string(open.line) + " has no 'esac'", peek());
      if (peek().kind == Tok::LParen) take();
      CaseArm arm;
      for (;;) {
        if (peek().kind != Tok::Word) fail("expected a pattern in the case at line " + std::to_string(open.line) + ", found " + describe(peek()), peek());
        arm.patterns.push_back(take().word);
        if (peek().kind == Tok::Pipe) {
          take();
          continue;
        }
        if (peek().kind != Tok::RParen) fail("expected ')' after the pattern, found " + describe(peek()), peek());
        take();
        break;
      }
      arm.body = parse_list({"esac"});
      node->cases.push_back(std::move(arm));
      if (peek().kind == Tok::DSemi) take();
      else if (!is_word("esac")) fail("expected ';;' or 'esac', found " + describe(peek()), peek());
    }
  }

  NodePtr parse_for(std::shared_ptr<Node> node) {
    const Token open = take();
    if (peek().kind == Tok::Arith) {
      node->kind = Node::ArithFor;
      node->text = take().text;
    } else {
      node->kind = Node::For;
      if (peek().kind != Tok::Word || !is_name(peek().word.raw())) fail("expected a variable name after 'for'", peek());
      node->text = take().word.raw();
      skip_newlines();
      if (is_word("in")) {
        take();
        node->in_given = true;
        while (peek().kind == Tok::Word) node->items.push_back(take().word);
      }
    }
    while (peek().kind == Tok::Semi || peek().kind == Tok::Newline) take();
    expect_word("do", open, "for loop");
    node->body = parse_list({"done"});
    expect_word("done", open, "for loop");
    return node;
  }

  std::vector<Token> t_;
  std::string source_;
  size_t i_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Glob patterns (case, [[ == ]], ${A#p}): `*`, `?`, `[…]`, `\x` literal.


bool glob_class(const std::string& p, size_t& pi, char c);

}  // namespace

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name(const std::string& s) {
  if (s.empty() || !is_name_start(s[0])) return false;
  for (char c : s)
    if (!is_name_char(c)) return false;
  return true;
}
bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n'; }

// ---------------------------------------------------------------------------------------------

std::vector<Token> lex(const std::string& text, const std::string& source) { return Lexer(text, source).tokens(); }

List parse(std::vector<Token> tokens, const std::string& source) { return Parser(std::move(tokens), source).program(); }

namespace {

bool glob_class(const std::string& p, size_t& pi, char c) {
  // p[pi] == '['; on success pi is past the ']'.
  size_t k = pi + 1;
  bool negate = false;
  if (k < p.size() && (p[k] == '!' || p[k] == '^')) {
    negate = true;
    ++k;
  }
  bool match = false;
  bool first = true;
  while (k < p.size() && (first || p[k] != ']')) {
    first = false;
    char lo = p[k];
    if (lo == '\\' && k + 1 < p.size()) lo = p[++k];
    if (k + 2 < p.size() && p[k + 1] == '-' && p[k + 2] != ']') {
      char hi = p[k + 2];
      if (hi == '\\' && k + 3 < p.size()) hi = p[++k + 2];
      if (lo <= c && c <= hi) match = true;
      k += 3;
    } else {
      if (lo == c) match = true;
      ++k;
    }
  }
  if (k >= p.size()) return false;  // no closing ']': '[' is literal, handled by the caller
  pi = k + 1;
  return match != negate;
}


}  // namespace

bool glob_match(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star_p = std::string::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = ++pi;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ++pi;
        ++si;
        continue;
      }
      if (p[pi] == '[' && p.find(']', pi + 2) != std::string::npos) {
        size_t next = pi;
        if (glob_class(p, next, s[si])) {
          pi = next;
          ++si;
          continue;
        }
      } else {
        const char want = p[pi] == '\\' && pi + 1 < p.size() ? p[pi + 1] : p[pi];
        if (want == s[si]) {
          pi += p[pi] == '\\' && pi + 1 < p.size() ? 2 : 1;
          ++si;
          continue;
        }
      }
    }
    if (star_p == std::string::npos) return false;
    pi = star_p;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::string glob_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Interpreter.

// What an expansion could not know: the variable to give with --env, and why it is unknown
// (empty: an environment variable the script does not set; else e.g. "the output of $(nproc)").

}  // namespace ptdp::shell_syntax
