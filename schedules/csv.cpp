#include <algorithm>
#include <sstream>

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

}  // namespace

Schedule from_csv(std::string_view text, const std::string& source) {
  // A UTF-8 byte-order mark (spreadsheets on Windows) is not part of the first cell.
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  Schedule s;
  int max_stage = -1, max_mb = -1;
  int stage0_max_mb = -1;  // the last microbatch the first stage runs (lanes)
  bool has_comm = false;
  int64_t compute_actions = 0;
  std::vector<int> stage_rank;  // rank holding each stage's compute, -1 unknown
  // Where each action came from: per rank, the file line and per action the column.
  std::vector<int> row_line;
  std::vector<std::vector<int>> action_column;
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
    s.programs.push_back(std::move(prog));
    row_line.push_back(line_no);
    action_column.push_back(std::move(columns));
  }
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
  std::vector<RankProgram> file_programs;
  if (!has_comm) file_programs = s.programs;  // lower() rewrites the programs in place
  try {
    if (has_comm) {
      // A lowered schedule: the optimizer step is implied after each rank's last action, and so,
      // in a row that names no REDUCE_GRAD (PyTorch's lowering never writes one), are the
      // gradient reductions of the row's stages just before it, as ptdp's lowering places them.
      // A row that names OPTIM or REDUCE_GRAD elsewhere is checked as written (validate_lowered says where).
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
  return s;
}

}  // namespace ptdp
