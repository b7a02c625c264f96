#include <algorithm>
#include <sstream>

#include "core/error.hpp"
#include "schedules/graph.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {

std::string to_csv(const Schedule& s) {
  std::string out;
  for (const auto& prog : s.programs) {
    for (size_t i = 0; i < prog.actions.size(); ++i) {
      if (i) out += ',';
      out += prog.actions[i].str();
    }
    out += '\n';
  }
  return out;
}

Schedule from_csv(std::string_view text, const std::string& source) {
  Schedule s;
  int max_stage = -1, max_mb = -1;
  bool has_comm = false;
  std::vector<int> stage_rank;  // rank holding each stage's compute, -1 unknown
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t,") == std::string_view::npos) continue;
    const int rank = static_cast<int>(s.programs.size());
    RankProgram prog;
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
        Action a;
        try {
          a = parse_action(token);
        } catch (const ConfigError& err) {
          throw ConfigError("", err.message(), SourceLocation{source, line_no, column});
        }
        if (a.kind != ActionKind::OPTIM) max_stage = std::max(max_stage, a.stage);
        max_mb = std::max(max_mb, a.microbatch);
        if (!is_compute(a.kind)) has_comm = true;
        if (is_compute(a.kind)) {
          if (static_cast<int>(stage_rank.size()) <= a.stage) stage_rank.resize(a.stage + 1, -1);
          if (stage_rank[a.stage] >= 0 && stage_rank[a.stage] != rank)
            throw ConfigError("", "stage " + std::to_string(a.stage) + " runs on rows " + std::to_string(stage_rank[a.stage] + 1) +
                                      " and " + std::to_string(rank + 1) + "; a stage belongs to one pipeline rank",
                              SourceLocation{source, line_no, column});
          stage_rank[a.stage] = rank;
        }
        prog.actions.push_back(a);
      }
      cell_start = comma + 1;
    }
    s.programs.push_back(std::move(prog));
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
  s.stage_to_rank.assign(stages, -1);
  for (int st = 0; st < stages; ++st) {
    if (st >= static_cast<int>(stage_rank.size()) || stage_rank[st] < 0)
      throw ConfigError("", "stage " + std::to_string(st) + " has no compute actions", SourceLocation{source, 0, 0});
    s.stage_to_rank[st] = stage_rank[st];
  }
  try {
    if (has_comm) {
      validate_lowered(s);
      check_deadlock_free(s);
      s.lowered = true;
    } else {
      lower(s);
    }
  } catch (const ScheduleError& err) {
    throw ConfigError("", err.what(), SourceLocation{source, 0, 0});
  }
  return s;
}

}  // namespace ptdp
