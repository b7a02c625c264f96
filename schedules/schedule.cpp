#include "schedules/schedule.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <sstream>

#include "core/error.hpp"

namespace ptdp {
namespace {

constexpr std::array<std::pair<ActionKind, std::string_view>, 12> kKindNames = {{
    {ActionKind::F, "F"},
    {ActionKind::B, "B"},
    {ActionKind::I, "I"},
    {ActionKind::W, "W"},
    {ActionKind::SEND_F, "SEND_F"},
    {ActionKind::RECV_F, "RECV_F"},
    {ActionKind::SEND_B, "SEND_B"},
    {ActionKind::RECV_B, "RECV_B"},
    {ActionKind::REDUCE_GRAD, "REDUCE_GRAD"},
    {ActionKind::OPTIM, "OPTIM"},
    {ActionKind::UNSHARD, "UNSHARD"},
    {ActionKind::RESHARD, "RESHARD"},
}};

}  // namespace

std::string_view to_string(ActionKind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "?";
}

std::string Action::str() const {
  std::string out;
  if (kind != ActionKind::OPTIM) out += std::to_string(stage);
  out += to_string(kind);
  if (microbatch >= 0) out += std::to_string(microbatch);
  return out;
}

Action parse_action(std::string_view text) {
  auto fail = [&](const std::string& why) -> Action {
    throw ConfigError("", "bad action '" + printable(text) + "': " + why +
                              " (expected e.g. 2F0, 1I3, 1SEND_B3, 0REDUCE_GRAD, 0UNSHARD or OPTIM)");
  };
  size_t i = 0;
  int64_t stage = -1;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    stage = (stage < 0 ? 0 : stage) * 10 + (text[i] - '0');
    if (stage > 10'000'000) return fail("stage number too large");
    ++i;
  }
  std::string_view rest = text.substr(i);
  // PyTorch's schedules before 2.6 wrote the weight-gradient backward as BW.
  if (rest.substr(0, 2) == "BW" && (rest.size() == 2 || std::isdigit(static_cast<unsigned char>(rest[2]))))
    return fail("BW is the old PyTorch spelling of the weight-gradient backward; write W (" +
                (stage >= 0 ? std::to_string(stage) : std::string()) + "W" + std::string(rest.substr(2)) + ")");
  const std::pair<ActionKind, std::string_view>* match = nullptr;
  for (const auto& entry : kKindNames)
    if (rest.substr(0, entry.second.size()) == entry.second && (!match || entry.second.size() > match->second.size()))
      match = &entry;
  if (!match) return fail("unknown action kind");
  Action a;
  a.kind = match->first;
  rest = rest.substr(match->second.size());
  int64_t mb = -1;
  for (char c : rest) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return fail("unexpected '" + std::string(1, c) + "'");
    mb = (mb < 0 ? 0 : mb) * 10 + (c - '0');
    if (mb > 100'000'000) return fail("microbatch number too large");
  }
  const bool per_microbatch = !is_stage_action(a.kind) && a.kind != ActionKind::OPTIM;
  if (a.kind == ActionKind::OPTIM) {
    if (stage >= 0 || mb >= 0) return fail("OPTIM takes no stage or microbatch");
  } else if (stage < 0) {
    return fail("missing stage number");
  }
  if (per_microbatch && mb < 0) return fail("missing microbatch number");
  if (!per_microbatch && mb >= 0) return fail(std::string(to_string(a.kind)) + " takes no microbatch");
  a.stage = static_cast<int32_t>(stage);
  a.microbatch = static_cast<int32_t>(mb);
  if (a.kind == ActionKind::OPTIM) a.stage = -1;
  return a;
}

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& p : programs) n += p.actions.size();
  return n;
}

ActionKind last_backward_kind(const Schedule& s, int stage) {
  const auto& actions = s.programs.at(static_cast<size_t>(s.stage_to_rank.at(static_cast<size_t>(stage)))).actions;
  for (auto it = actions.rbegin(); it != actions.rend(); ++it)
    if (it->stage == stage && (it->kind == ActionKind::B || it->kind == ActionKind::W)) return it->kind;
  return ActionKind::B;
}

int warmup_forwards(const Schedule& s, int rank) {
  // Megatron's warm-up excludes the forward that opens the steady 1F1B phase; when every
  // forward precedes every backward the two readings coincide.
  int before = 0, total = 0;
  bool backward_seen = false;
  for (const auto& a : s.programs.at(rank).actions) {
    if (a.kind == ActionKind::B || a.kind == ActionKind::I) backward_seen = true;
    if (a.kind == ActionKind::F) {
      ++total;
      if (!backward_seen) ++before;
    }
  }
  return before < total ? before - 1 : before;
}

std::vector<int> peak_inflight_activations(const Schedule& s) {
  std::vector<int> peak(s.p, 0);
  for (int r = 0; r < s.p; ++r) {
    // With split backward (any W on the rank) the weight gradient still needs the stored
    // activations: they are freed at W, else at B or I. Both counts are kept in one pass.
    int live_split = 0, live_whole = 0, peak_split = 0, peak_whole = 0;
    bool split = false;
    for (const auto& a : s.programs[r].actions) {
      switch (a.kind) {
        case ActionKind::F:
          peak_split = std::max(peak_split, ++live_split);
          peak_whole = std::max(peak_whole, ++live_whole);
          break;
        case ActionKind::B: --live_split, --live_whole; break;
        case ActionKind::I: --live_whole; break;
        case ActionKind::W: --live_split, split = true; break;
        default: break;
      }
    }
    peak[r] = split ? peak_split : peak_whole;
  }
  return peak;
}

std::string format_grid(const Schedule& s) {
  size_t width = 3;
  for (const auto& prog : s.programs)
    for (const auto& a : prog.actions) width = std::max(width, a.str().size());
  // An OVERLAP_F_B pair is one cell, "(0F2;7B0)".
  auto cells = [](const std::vector<Action>& acts) {
    std::vector<std::string> out;
    for (size_t i = 0; i < acts.size(); ++i) {
      if (acts[i].overlap == 1 && i + 1 < acts.size()) {
        out.push_back("(" + acts[i].str() + ";" + acts[i + 1].str() + ")");
        ++i;
      } else {
        out.push_back(acts[i].str());
      }
    }
    return out;
  };
  for (const auto& prog : s.programs)
    for (const auto& c : cells(prog.actions)) width = std::max(width, c.size());
  std::ostringstream out;
  for (int r = 0; r < s.p; ++r) {
    out << "rank " << r << (r < 10 && s.p > 10 ? " " : "") << " |";
    for (const auto& txt : cells(s.programs[r].actions)) out << ' ' << txt << std::string(width - txt.size(), ' ');
    out << '\n';
  }
  return out.str();
}

Schedule empty_schedule(int p, int v, int m, std::vector<int> stage_to_rank) {
  PTDP_ASSERT(p >= 1 && v >= 1 && m >= 1, "schedule sizes must be positive");
  Schedule s;
  s.p = p;
  s.v = v;
  s.m = m;
  if (stage_to_rank.empty())
    for (int st = 0; st < p * v; ++st) stage_to_rank.push_back(st % p);
  PTDP_ASSERT(static_cast<int>(stage_to_rank.size()) == p * v, "one rank per stage");
  s.stage_to_rank = std::move(stage_to_rank);
  s.programs.resize(p);
  return s;
}

}  // namespace ptdp
