#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/error.hpp"
#include "schedules/graph.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {

std::string to_csv(const Schedule& s, bool compute_only) {
  std::string out;
  for (const auto& prog : s.programs) {
    bool first = true;
    const auto& acts = prog.actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.kind == ActionKind::OPTIM) continue;  // PyTorch: the optimizer step is implied
      if (compute_only && !is_compute(a.kind)) continue;
      if (!first) out += ',';
      first = false;
      if (a.overlap == 1 && i + 1 < acts.size()) {  // one cell, as PyTorch writes the pair
        out += "(" + a.str() + ";" + acts[i + 1].str() + ")OVERLAP_F_B";
        ++i;
        continue;
      }
      out += a.str();
    }
    out += '\n';
  }
  return out;
}

namespace {

// The stage at the other end of a transfer: activations go from a stage to the next of its lane,
// gradients back (Schedule's lanes); -1 when the stage has no neighbour that way.
int peer_stage(const Schedule& s, const Action& a) {
  switch (a.kind) {
    case ActionKind::SEND_F:
    case ActionKind::RECV_B: return s.last_stage(a.stage) ? -1 : a.stage + 1;
    case ActionKind::RECV_F:
    case ActionKind::SEND_B: return s.first_stage(a.stage) ? -1 : a.stage - 1;
    default: return -1;
  }
}

// A transfer between two stages of the same rank: PyTorch hands the tensor over in memory.
bool local_handover(const Schedule& s, const Action& a) {
  if (!is_p2p(a.kind)) return false;
  const int peer = peer_stage(s, a);
  return peer >= 0 && peer < static_cast<int>(s.stage_to_rank.size()) && a.stage < static_cast<int>(s.stage_to_rank.size()) &&
         s.stage_to_rank[peer] == s.stage_to_rank[a.stage];
}

// "1SEND_F3" -> "1WAIT_SEND_F3": PyTorch's name for waiting on an issued operation.
std::string wait_str(const Action& a) {
  std::string out = std::to_string(a.stage) + "WAIT_" + std::string(to_string(a.kind));
  if (a.microbatch >= 0) out += std::to_string(a.microbatch);
  return out;
}

// Whether compute action c uses receive r (the F its activation, the B or I its gradient).
bool consumes(const Action& c, const Action& r) {
  if (c.stage != r.stage || c.microbatch != r.microbatch) return false;
  if (r.kind == ActionKind::RECV_F) return c.kind == ActionKind::F;
  if (r.kind == ActionKind::RECV_B) return c.kind == ActionKind::B || c.kind == ActionKind::I;
  return false;
}

}  // namespace

std::string to_pytorch_csv(const Schedule& schedule) {
  if (schedule.lanes != 1)
    throw ConfigError("", "DualPipe's two lanes (microbatches entering the pipeline from both ends) have no PyTorch "
                          "equivalent: torch.distributed.pipelining runs every microbatch in one direction; export "
                          "ptdp's own form with --format lowered (ptdp imports it), or use dualpipev, its V-shaped "
                          "single-lane variant, which PyTorch runs");
  Schedule lowered_copy;
  const Schedule* sp = &schedule;
  if (!schedule.lowered) {
    lowered_copy = schedule;
    lower(lowered_copy);
    sp = &lowered_copy;
  }
  const Schedule& s = *sp;
  std::string out;
  for (const auto& prog : s.programs) {
    std::vector<std::string> cells;
    std::vector<Action> receives, sends, reductions;  // issued, not yet waited
    auto wait_receives_of = [&](const Action& c) {
      for (size_t k = 0; k < receives.size();)
        if (consumes(c, receives[k])) {
          cells.push_back(wait_str(receives[k]));
          receives.erase(receives.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          ++k;
        }
    };
    auto wait_sends = [&] {
      for (const Action& a : sends) cells.push_back(wait_str(a));
      sends.clear();
    };
    const auto& acts = prog.actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.kind == ActionKind::OPTIM || local_handover(s, a)) continue;
      if (is_compute(a.kind)) {
        wait_receives_of(a);
        if (a.overlap == 1 && i + 1 < acts.size()) {
          wait_receives_of(acts[i + 1]);
          cells.push_back("(" + a.str() + ";" + acts[i + 1].str() + ")OVERLAP_F_B");
          ++i;
          continue;
        }
      }
      if (a.kind == ActionKind::REDUCE_GRAD) {
        wait_sends();
        reductions.push_back(a);
      }
      if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) sends.push_back(a);
      if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) receives.push_back(a);
      cells.push_back(a.str());
    }
    wait_sends();
    for (const Action& a : receives) cells.push_back(wait_str(a));  // a receive no compute uses
    for (const Action& a : reductions) cells.push_back(wait_str(a));
    for (size_t k = 0; k < cells.size(); ++k) out += (k ? "," : "") + cells[k];
    out += '\n';
  }
  return out;
}

namespace {

// PyTorch writes an overlapped forward/backward pair as "(0F1;0B0)OVERLAP_F_B": an F and then a
// B or I, marked as a pair (Action::overlap; schedules/schedule.hpp gives its meaning).
std::vector<Action> parse_cell(std::string_view token) {
  constexpr std::string_view kOverlap = "OVERLAP_F_B";
  if (token.empty() || token.front() != '(') return {parse_action(token)};
  const size_t close = token.rfind(')');
  if (close == std::string_view::npos || token.substr(close + 1) != kOverlap)
    throw ConfigError("", "bad action '" + std::string(token) + "': expected (A;B)OVERLAP_F_B");
  std::vector<Action> out;
  std::string_view inner = token.substr(1, close - 1);
  while (true) {
    const size_t semi = inner.find(';');
    std::string_view part = inner.substr(0, semi);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    const Action a = parse_action(part);
    if (!is_compute(a.kind))
      throw ConfigError("", "bad action '" + std::string(token) + "': OVERLAP_F_B holds compute actions only (got " +
                                a.str() + ")");
    out.push_back(a);
    if (semi == std::string_view::npos) break;
    inner = inner.substr(semi + 1);
  }
  if (out.size() != 2 || out[0].kind != ActionKind::F || (out[1].kind != ActionKind::B && out[1].kind != ActionKind::I))
    throw ConfigError("", "bad action '" + std::string(token) + "': OVERLAP_F_B pairs an F and then a B or I, e.g. (0F2;1B0)OVERLAP_F_B");
  out[0].overlap = 1, out[0].overlap_kind = out[1].kind, out[0].overlap_stage = out[1].stage;
  out[1].overlap = -1, out[1].overlap_kind = ActionKind::F, out[1].overlap_stage = out[0].stage;
  return out;
}

// "1WAIT_SEND_F3": the operation a PyTorch wait cell waits for; nullopt when `token` is no wait.
std::optional<Action> parse_wait(std::string_view token) {
  size_t i = 0;
  while (i < token.size() && std::isdigit(static_cast<unsigned char>(token[i]))) ++i;
  if (token.substr(i, 5) != "WAIT_") return std::nullopt;
  const std::string inner = std::string(token.substr(0, i)) + std::string(token.substr(i + 5));
  Action a;
  try {
    a = parse_action(inner);
  } catch (const ConfigError& err) {
    throw ConfigError("", "bad action '" + printable(token) + "': it waits for '" + printable(inner) + "', " + err.message());
  }
  if (!is_p2p(a.kind) && a.kind != ActionKind::REDUCE_GRAD)
    throw ConfigError("", "bad action '" + printable(token) + "': PyTorch waits for SEND_F/B, RECV_F/B and REDUCE_GRAD only");
  return a;
}

bool same_operation(const Action& a, const Action& b) {
  return a.kind == b.kind && a.stage == b.stage && a.microbatch == b.microbatch;
}

struct Wait {
  Action op;       // what is waited for
  size_t at = 0;   // the number of the row's actions before the wait
  int column = 0;  // where the wait cell is
};

// A row of PyTorch's current format waits for each operation it issued: once, after issuing it,
// and for a receive before the compute that reads it. Rows without waits (older PyTorch, ptdp's
// own lowered form) are not checked.
void check_waits(const std::vector<Action>& acts, const std::vector<int>& columns, const std::vector<Wait>& waits,
                 const std::string& source, int line) {
  if (waits.empty()) return;
  std::vector<int64_t> waited_at(acts.size(), -1);
  for (const Wait& w : waits) {
    int64_t issued = -1;
    bool twice = false;
    for (size_t k = 0; k < w.at && k < acts.size(); ++k)
      if (same_operation(acts[k], w.op)) {
        if (waited_at[k] < 0) {
          issued = static_cast<int64_t>(k);
          break;
        }
        twice = true;
      }
    if (issued < 0)
      throw ConfigError("", wait_str(w.op) + (twice ? " waits a second time for " : " waits for ") + w.op.str() +
                                (twice ? "" : ", which the row does not issue before it"),
                        SourceLocation{source, line, w.column});
    waited_at[static_cast<size_t>(issued)] = static_cast<int64_t>(w.at);
  }
  for (size_t k = 0; k < acts.size(); ++k) {
    const Action& a = acts[k];
    if (!is_p2p(a.kind) && a.kind != ActionKind::REDUCE_GRAD) continue;
    if (waited_at[k] < 0)
      throw ConfigError("", a.str() + " is never waited for: a row of PyTorch's format that waits waits for every send, "
                                "receive and gradient reduction it issues (add " + wait_str(a) + ")",
                        SourceLocation{source, line, columns[k]});
    for (size_t j = k + 1; j < acts.size(); ++j)
      if (is_compute(acts[j].kind) && consumes(acts[j], a)) {
        if (waited_at[k] > static_cast<int64_t>(j))
          throw ConfigError("", acts[j].str() + " reads " + a.str() + " before " + wait_str(a) +
                                    ": a receive is waited for before the compute that uses it",
                            SourceLocation{source, line, columns[j]});
        break;
      }
  }
}

// PyTorch hands activations and gradients between two stages of one rank over in memory; ptdp's
// IR names those transfers: put back each one a lowered row leaves out, a RECV just before the
// compute that uses it and a SEND just after the one that produced it, as lower() places them.
// `columns` follows the actions (an added transfer points at its compute's cell).
void restore_local_handovers(Schedule& s, std::vector<std::vector<int>>& columns) {
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    const auto& cols = columns[r];
    auto present = [&](const Action& t) {
      return std::any_of(acts.begin(), acts.end(), [&](const Action& a) { return same_operation(a, t); });
    };
    auto missing_local = [&](ActionKind kind, const Action& c) -> std::optional<Action> {
      const Action t{kind, c.stage, c.microbatch};
      if (!local_handover(s, t) || present(t)) return std::nullopt;
      return t;
    };
    auto receive_of = [&](const Action& c) {
      return missing_local(c.kind == ActionKind::F ? ActionKind::RECV_F : ActionKind::RECV_B, c);
    };
    auto send_of = [&](const Action& c) {
      return missing_local(c.kind == ActionKind::F ? ActionKind::SEND_F : ActionKind::SEND_B, c);
    };
    std::vector<Action> out;
    std::vector<int> out_cols;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      const bool backward_in = a.kind == ActionKind::B || a.kind == ActionKind::I;
      if (a.kind != ActionKind::F && !backward_in) {
        out.push_back(a), out_cols.push_back(cols[i]);
        continue;
      }
      const size_t n = a.overlap == 1 && i + 1 < acts.size() ? 2 : 1;
      for (size_t k = i; k < i + n; ++k)
        if (auto t = receive_of(acts[k])) out.push_back(*t), out_cols.push_back(cols[k]);
      for (size_t k = i; k < i + n; ++k) out.push_back(acts[k]), out_cols.push_back(cols[k]);
      for (size_t k = i; k < i + n; ++k)
        if (auto t = send_of(acts[k])) out.push_back(*t), out_cols.push_back(cols[k]);
      i += n - 1;
    }
    s.programs[r].actions = std::move(out);
    columns[r] = std::move(out_cols);
  }
}

// A receive waits for its data where the data is used: PyTorch's runtime and ptdp's executor
// post a receive and wait in (or just before) the compute that reads it, and ptdp's RECV means
// that wait. Each RECV of a lowered row moves to just before its consumer — the first later F
// (RECV_F) or B / I (RECV_B) of its stage and microbatch on the row, or the F opening that
// consumer's OVERLAP_F_B pair, whose inputs both arrive before it — as lower() places them. A
// RECV with no later consumer stays where it is (validate_lowered names it). `columns` follows.
void receives_where_consumed(Schedule& s, std::vector<std::vector<int>>& columns) {
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    const auto& cols = columns[r];
    const size_t n = acts.size();
    // The place (index of the compute action, or of its pair's F) each RECV moves to, else n:
    // one backward pass keeps the nearest later reader of each (direction, stage, microbatch).
    std::vector<size_t> place(n, n);
    std::map<std::tuple<bool, int, int>, size_t> reader;
    for (size_t i = n; i-- > 0;) {
      const Action& a = acts[i];
      if (a.kind == ActionKind::F || a.kind == ActionKind::B || a.kind == ActionKind::I) {
        reader[{a.kind == ActionKind::F, a.stage, a.microbatch}] = a.overlap < 0 && i > 0 && acts[i - 1].overlap > 0 ? i - 1 : i;
      } else if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
        const auto it = reader.find({a.kind == ActionKind::RECV_F, a.stage, a.microbatch});
        if (it != reader.end()) place[i] = it->second;
      }
    }
    std::vector<std::vector<size_t>> arriving(n);
    for (size_t i = 0; i < n; ++i)
      if (place[i] < n) arriving[place[i]].push_back(i);
    std::vector<Action> out;
    std::vector<int> out_cols;
    out.reserve(n);
    out_cols.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j : arriving[i]) out.push_back(acts[j]), out_cols.push_back(cols[j]);
      if (place[i] < n) continue;
      out.push_back(acts[i]), out_cols.push_back(cols[i]);
    }
    s.programs[r].actions = std::move(out);
    columns[r] = std::move(out_cols);
  }
}

// A schedule file's rows as read: the programs, where each action came from, and what the
// shape checks need.
struct CsvRows {
  Schedule s;
  int max_stage = -1, max_mb = -1;
  int stage0_max_mb = -1;  // the last microbatch the first stage runs (lanes)
  bool has_comm = false;
  int64_t compute_actions = 0;
  std::vector<int> stage_rank;  // rank holding each stage's compute, -1 unknown
  // Where each action came from: per rank, the file line and per action the column.
  std::vector<int> row_line;
  std::vector<std::vector<int>> action_column;
};

// Each non-blank line a rank's program, each cell an action (or a wait, checked and dropped).
CsvRows read_rows(std::string_view text, const std::string& source) {
  CsvRows rows;
  Schedule& s = rows.s;
  int& max_stage = rows.max_stage;
  int& max_mb = rows.max_mb;
  int& stage0_max_mb = rows.stage0_max_mb;
  bool& has_comm = rows.has_comm;
  int64_t& compute_actions = rows.compute_actions;
  std::vector<int>& stage_rank = rows.stage_rank;
  std::vector<int>& row_line = rows.row_line;
  std::vector<std::vector<int>>& action_column = rows.action_column;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t,\"") == std::string_view::npos) continue;  // blank, as cells are
    const int rank = static_cast<int>(s.programs.size());
    RankProgram prog;
    std::vector<int> columns;
    std::vector<Wait> waits;
    size_t cell_start = 0;
    while (cell_start <= line.size()) {
      size_t comma = line.find(',', cell_start);
      if (comma == std::string_view::npos) comma = line.size();
      std::string_view cell = line.substr(cell_start, comma - cell_start);
      size_t b = cell.find_first_not_of(" \t\"");
      size_t e = cell.find_last_not_of(" \t\"");
      const int column = static_cast<int>(cell_start + (b == std::string_view::npos ? 0 : b)) + 1;
      if (b != std::string_view::npos) {
        std::string_view token = cell.substr(b, e - b + 1);
        std::vector<Action> parsed;
        try {
          if (const auto waited = parse_wait(token)) {
            waits.push_back(Wait{*waited, prog.actions.size(), column});
            cell_start = comma + 1;
            continue;
          }
          parsed = parse_cell(token);
        } catch (const ConfigError& err) {
          throw ConfigError("", err.message(), SourceLocation{source, line_no, column});
        }
        for (const Action& a : parsed) {
          if (a.kind != ActionKind::OPTIM) max_stage = std::max(max_stage, a.stage);
          max_mb = std::max(max_mb, a.microbatch);
          if (is_p2p(a.kind)) has_comm = true;
          if (is_compute(a.kind)) {
            ++compute_actions;
            if (a.stage == 0) stage0_max_mb = std::max(stage0_max_mb, a.microbatch);
            if (static_cast<int>(stage_rank.size()) <= a.stage) stage_rank.resize(a.stage + 1, -1);
            if (stage_rank[a.stage] >= 0 && stage_rank[a.stage] != rank)
              throw ConfigError("", "stage " + std::to_string(a.stage) + " runs on rows " +
                                        std::to_string(stage_rank[a.stage] + 1) + " and " + std::to_string(rank + 1) +
                                        "; a stage belongs to one pipeline rank",
                                SourceLocation{source, line_no, column});
            stage_rank[a.stage] = rank;
          }
          if (a.kind == ActionKind::OPTIM && !prog.actions.empty() && prog.actions.back().kind == ActionKind::OPTIM)
            throw ConfigError("", "OPTIM appears twice in a row", SourceLocation{source, line_no, column});
          prog.actions.push_back(a);
          columns.push_back(column);
        }
      }
      cell_start = comma + 1;
    }
    check_waits(prog.actions, columns, waits, source, line_no);
    s.programs.push_back(std::move(prog));
    row_line.push_back(line_no);
    action_column.push_back(std::move(columns));
  }
  return rows;
}

// The schedule's p, v, m, lanes and placement from what the rows run, each row checked to hold
// its share of the stages.
void shape_schedule(CsvRows& rows, const std::string& source) {
  Schedule& s = rows.s;
  const int max_stage = rows.max_stage, max_mb = rows.max_mb, stage0_max_mb = rows.stage0_max_mb;
  const int64_t compute_actions = rows.compute_actions;
  const std::vector<int>& stage_rank = rows.stage_rank;
  const std::vector<int>& row_line = rows.row_line;
  if (s.programs.empty()) throw ConfigError("", "no schedule rows", SourceLocation{source, 0, 0});
  s.p = static_cast<int>(s.programs.size());
  const int stages = max_stage + 1;
  if (stages < 1 || max_mb < 0) throw ConfigError("", "the schedule has no compute actions", SourceLocation{source, 0, 0});
  if (stages % s.p != 0)
    throw ConfigError("", std::to_string(stages) + " stages cannot be spread over " + std::to_string(s.p) + " pipeline ranks",
                      SourceLocation{source, 0, 0});
  s.v = stages / s.p;
  s.m = max_mb + 1;
  // DualPipe's two lanes (Schedule::lanes): the first stage runs only the first half of the
  // microbatches; the second half enters at the second lane's first stage, stages / 2.
  if (stages % 2 == 0 && s.m % 2 == 0 && stage0_max_mb >= 0 && stage0_max_mb < s.m / 2) s.lanes = 2;
  // Every stage runs F and a backward of every microbatch of its lane: stage and microbatch
  // numbers far beyond the file's actions (fewer than one per (stage, microbatch)) cannot make a
  // schedule, and would size the checks' tables. Smaller gaps get validate()'s precise message.
  if (compute_actions < static_cast<int64_t>(stages) * s.m / s.lanes)
    throw ConfigError("", "the numbers go up to stage " + std::to_string(max_stage) + " and microbatch " + std::to_string(max_mb) +
                              ": each of the " + std::to_string(stages) + " stages must run F and a backward of " +
                              std::to_string(s.m) + " microbatches (" + std::to_string(2 * static_cast<int64_t>(stages) * s.m) +
                              " compute actions), but the file has " + std::to_string(compute_actions),
                      SourceLocation{source, 0, 0});
  s.stage_to_rank.assign(stages, -1);
  for (int st = 0; st < stages; ++st) {
    if (st >= static_cast<int>(stage_rank.size()) || stage_rank[st] < 0)
      throw ConfigError("", "stage " + std::to_string(st) + " has no compute actions", SourceLocation{source, 0, 0});
    s.stage_to_rank[st] = stage_rank[st];
  }
  // Each pipeline rank holds v stages (the plan's p and v describe nothing else): a row that
  // runs no stage, or fewer than its share, is refused where the row is, with every row's count.
  std::vector<int> stages_on(s.p, 0);
  for (int st = 0; st < stages; ++st) ++stages_on[s.stage_to_rank[st]];
  const auto short_row = std::find_if(stages_on.begin(), stages_on.end(), [&](int n) { return n < s.v; });
  if (short_row != stages_on.end()) {
    const int r = static_cast<int>(short_row - stages_on.begin());
    std::string counts;
    for (int n : stages_on) counts += (counts.empty() ? "" : ", ") + std::to_string(n);
    throw ConfigError("", "row " + std::to_string(r + 1) + " runs the compute of " + std::to_string(stages_on[r]) +
                              " stage(s) (rows run " + counts + "); with " + std::to_string(stages) + " stages on " +
                              std::to_string(s.p) + " rows each pipeline rank must run " + std::to_string(s.v),
                      SourceLocation{source, row_line[r], 1});
  }
}

// Lowers a compute-only schedule, or completes and checks a lowered one; a ScheduleError becomes
// a ConfigError at the file's row and cell.
void lower_rows(CsvRows& rows, const std::string& source) {
  Schedule& s = rows.s;
  const bool has_comm = rows.has_comm;
  const std::vector<int>& row_line = rows.row_line;
  std::vector<std::vector<int>>& action_column = rows.action_column;
  std::vector<RankProgram> file_programs;
  if (!has_comm) file_programs = s.programs;  // lower() rewrites the programs in place
  try {
    if (has_comm) {
      // A lowered schedule: the optimizer step is implied after each rank's last action, and so,
      // in a row that names no REDUCE_GRAD (PyTorch's lowering never writes one), are the
      // gradient reductions of the row's stages just before it, as ptdp's lowering places them.
      // A row that names OPTIM or REDUCE_GRAD elsewhere is checked as written (validate_lowered says where).
      restore_local_handovers(s, action_column);
      receives_where_consumed(s, action_column);
      for (int r = 0; r < s.p; ++r) {
        auto& acts = s.programs[r].actions;
        auto is = [](ActionKind k) { return [k](const Action& a) { return a.kind == k; }; };
        const bool optim = std::any_of(acts.begin(), acts.end(), is(ActionKind::OPTIM));
        if (std::none_of(acts.begin(), acts.end(), is(ActionKind::REDUCE_GRAD))) {
          auto at = optim ? std::find_if(acts.begin(), acts.end(), is(ActionKind::OPTIM)) : acts.end();
          std::vector<Action> reduce;
          for (int st : reduction_order(s, r)) reduce.push_back(Action{ActionKind::REDUCE_GRAD, st, -1});
          acts.insert(at, reduce.begin(), reduce.end());
        }
        if (!optim) acts.push_back(Action{ActionKind::OPTIM, -1, -1});
      }
      validate_lowered(s);  // each rank's complete program, OPTIM last
      check_deadlock_free(s);
      s.lowered = true;
    } else {
      lower(s);
    }
  } catch (const ScheduleError& err) {
    SourceLocation loc{source, 0, 0};
    if (err.rank >= 0 && err.rank < s.p) {
      loc.line = row_line[err.rank];
      const auto& cols = action_column[err.rank];
      int64_t at = err.position;
      if (at >= 0 && !file_programs.empty() && s.lowered) {
        // Found after lowering (a deadlock): the position is in the lowered program; point at
        // the file's cell of the same compute action (a RECV: the compute it feeds).
        const auto& lowered = s.programs[err.rank].actions;
        const auto& original = file_programs[err.rank].actions;
        size_t k = static_cast<size_t>(at);
        while (k < lowered.size() && !is_compute(lowered[k].kind)) ++k;
        const auto it = k < lowered.size() ? std::find(original.begin(), original.end(), lowered[k]) : original.end();
        at = it == original.end() ? -1 : static_cast<int64_t>(it - original.begin());
      }
      if (at >= 0 && static_cast<size_t>(at) < cols.size()) loc.column = cols[at];
    }
    throw ConfigError("", err.what(), loc);
  }
}

}  // namespace

Schedule from_csv(std::string_view text, const std::string& source) {
  // A UTF-8 byte-order mark (spreadsheets on Windows) is not part of the first cell.
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  CsvRows rows = read_rows(text, source);
  shape_schedule(rows, source);
  lower_rows(rows, source);
  return std::move(rows.s);
}

}  // namespace ptdp
