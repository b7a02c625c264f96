// PyTorch-compatible CSV: round trip, lowering of compute-only files, and located errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {
namespace {

// What from_csv says when it refuses `text`: the message and where (a test failure if it accepts).
struct Refusal {
  std::string message;
  SourceLocation where;
  bool says(const std::string& part) const { return message.find(part) != std::string::npos; }
};

Refusal refusal(const std::string& text, const std::string& source) {
  try {
    from_csv(text, source);
  } catch (const ConfigError& e) {
    return {e.what(), e.where()};
  }
  ADD_FAILURE() << source << ": accepted";
  return {};
}

void expect_same(const Schedule& a, const Schedule& b, const std::string& what) {
  EXPECT_EQ(a.p, b.p) << what;
  EXPECT_EQ(a.v, b.v) << what;
  EXPECT_EQ(a.m, b.m) << what;
  EXPECT_EQ(a.stage_to_rank, b.stage_to_rank) << what;
  EXPECT_EQ(a.lowered, b.lowered) << what;
  ASSERT_EQ(a.programs.size(), b.programs.size()) << what;
  for (size_t r = 0; r < a.programs.size(); ++r) EXPECT_EQ(a.programs[r].actions, b.programs[r].actions) << what << " rank " << r;
}

TEST(Csv, RoundTripGivesTheSamePrograms) {
  for (int which = 0; which < 4; ++which) {
    Schedule s = which == 0 ? make_gpipe(4, 6) : which == 1 ? make_1f1b(4, 8) : which == 2 ? make_interleaved(4, 2, 8)
                                                                                       : make_interleaved(3, 4, 9);
    lower(s);
    const std::string csv = to_csv(s);
    expect_same(from_csv(csv, "round.csv"), s, "schedule " + std::to_string(which));
    EXPECT_EQ(to_csv(from_csv(csv, "round.csv")), csv);
  }
}

TEST(Csv, OneRowPerRankOneActionPerCell) {
  Schedule s = make_1f1b(2, 1);
  lower(s);
  // PyTorch's format: no OPTIM (the optimizer step is implied after each rank's last action).
  EXPECT_EQ(to_csv(s), "0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\n");
  const Schedule back = from_csv(to_csv(s), "one.csv");
  EXPECT_EQ(back.programs[0].actions.back(), (Action{ActionKind::OPTIM, -1, -1}));  // implied on import
  expect_same(back, s, "1f1b p2 m1");
}

TEST(Csv, ComputeOnlyFilesAreLowered) {
  const Schedule s = from_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", "compute.csv");
  EXPECT_EQ(s.p, 2);
  EXPECT_EQ(s.v, 1);
  EXPECT_EQ(s.m, 2);
  EXPECT_TRUE(s.lowered);
  Schedule want = make_1f1b(2, 2);
  lower(want);
  expect_same(s, want, "compute-only 1F1B");
}

TEST(Csv, PyTorchsLoweredFilesImplyTheGradientReduction) {
  // PyTorch's lowering writes send/recv actions but never REDUCE_GRAD: each row's reductions are
  // implied before its optimizer step, where ptdp's own lowering puts them.
  for (int which = 0; which < 3; ++which) {
    Schedule s = which == 0 ? make_1f1b(4, 8) : which == 1 ? make_interleaved(4, 2, 8) : make_zb_h1(4, 8);
    lower(s);
    std::string pytorch;
    for (const auto& prog : s.programs) {
      std::string row;
      for (const Action& a : prog.actions)
        if (a.kind != ActionKind::REDUCE_GRAD && a.kind != ActionKind::OPTIM) row += (row.empty() ? "" : ",") + a.str();
      pytorch += row + "\n";
    }
    ASSERT_EQ(pytorch.find("REDUCE_GRAD"), std::string::npos);
    expect_same(from_csv(pytorch, "pytorch-lowered.csv"), s, "schedule " + std::to_string(which));
  }
  // A row that names some of its reductions is checked as written.
  EXPECT_TRUE(refusal("0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0,0REDUCE_GRAD\n", "mixed.csv")
                  .says("stage 0 belongs to rank 0"));
}

TEST(Csv, ComputeOnlyExportIsWhatPyTorchLoadsByDefault) {
  for (int which = 0; which < 3; ++which) {
    Schedule s = which == 0 ? make_1f1b(4, 8) : which == 1 ? make_interleaved(4, 2, 8) : make_zb_h2(4, 8);
    const Schedule unlowered = s;
    lower(s);
    const std::string compute = to_csv(s, true);
    for (const char* word : {"SEND", "RECV", "REDUCE_GRAD", "OPTIM"}) EXPECT_EQ(compute.find(word), std::string::npos) << word;
    // Each row is the rank's compute actions in order, and importing them lowers to the same program.
    std::string want;
    for (const auto& prog : unlowered.programs) {
      std::string row;
      for (const Action& a : prog.actions) row += (row.empty() ? "" : ",") + a.str();
      want += row + "\n";
    }
    EXPECT_EQ(compute, want) << which;
    expect_same(from_csv(compute, "compute.csv"), s, "compute-only round trip " + std::to_string(which));
  }
}

TEST(Csv, OldBwSpellingIsRefusedWithTheWItMeans) {
  const Refusal r = refusal("0F0,0I0,0BW0\n", "old.csv");
  EXPECT_TRUE(r.says("BW is the old PyTorch spelling of the weight-gradient backward; write W (0W0)")) << r.message;
  EXPECT_EQ(r.where.line, 1);
  EXPECT_EQ(r.where.column, 9);
}

TEST(Csv, AcceptsPyTorchsCrLfQuotesAndEmptyCells) {
  // Python's csv.writer ends rows with \r\n and writes idle slots (None) as empty cells.
  const Schedule s = from_csv("0F0,0F1,,0B0,0B1\r\n\"1F0\",1B0, 1F1 ,1B1,\r\n", "torch.csv");
  EXPECT_EQ(s.p, 2);
  EXPECT_EQ(s.m, 2);
  EXPECT_EQ(s.programs[1].actions[1], (Action{ActionKind::F, 1, 0}));  // after its RECV_F
  // A row of empty cells, quoted or not, is a blank line, not a pipeline rank.
  const Schedule blank = from_csv("0F0,0B0\n,,\n\"\",\"\"\n", "blank-rows.csv");
  EXPECT_EQ(blank.p, 1);
}

TEST(Csv, InfersInterleavedChunks) {
  Schedule s = make_interleaved(4, 3, 8);
  const Schedule back = from_csv(to_csv(s), "inter.csv");  // compute-only: lowered on import
  EXPECT_EQ(back.v, 3);
  EXPECT_EQ(back.num_stages(), 12);
  lower(s);
  expect_same(back, s, "interleaved");
}

TEST(Csv, DeadlockIsAConfigErrorNamingTheFileAndTheStuckActions) {
  try {
    from_csv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", "broken.csv");
    FAIL() << "imported a deadlocking schedule";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("broken.csv:1:", 0), 0u) << msg;  // the row (and cell) of a stuck action
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0RECV_B0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1RECV_F1"), std::string::npos) << msg;
  }
}

TEST(Csv, AReceivePostedEarlyWaitsWhereItsDataIsUsed) {
  // PyTorch posts a receive and waits for it in the compute that reads it (review IR-10): a row
  // that posts 0RECV_B0 before its forward is no deadlock, and its RECV — ptdp's wait — moves to
  // just before the B that reads it, where ptdp's own lowering puts it.
  const Schedule s = from_csv("0RECV_B0,0F0,0SEND_F0,0B0,0REDUCE_GRAD,OPTIM\n1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,OPTIM\n", "early.csv");
  Schedule own = make_1f1b(2, 1);
  lower(own);
  expect_same(s, own, "early receive");
  // An OVERLAP_F_B pair receives both inputs before its F (DualPipe waits for both).
  Schedule pairs = make_dualpipev(4, 8);
  lower(pairs);
  expect_same(from_csv(to_csv(pairs), "dualpipev.csv"), pairs, "pairs keep their receives before the F");
}

TEST(Csv, BadActionGivesFileLineColumn) {
  try {
    from_csv("0F0,0F1,0B0,0B1\n1F0,0X1,1B0\n", "bad.csv");
    FAIL() << "accepted 0X1";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.where().file, "bad.csv");
    EXPECT_EQ(e.where().line, 2);
    EXPECT_EQ(e.where().column, 5);
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.csv:2:5: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("'0X1'"), std::string::npos) << msg;
  }
  // The column points at the token, after leading blanks.
  try {
    from_csv("0F0,0B0\n  1F0,   1Q0\n", "blank.csv");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.where().line, 2);
    EXPECT_EQ(e.where().column, 10);
  }
}

TEST(Csv, StructuralErrorsAreConfigErrors) {
  EXPECT_THROW(from_csv("", "empty.csv"), ConfigError);
  EXPECT_THROW(from_csv("OPTIM\nOPTIM\n", "nocompute.csv"), ConfigError);
  // Stage 0 on two rows.
  const Refusal two_rows = refusal("0F0,0B0\n0F1,0B1\n", "tworows.csv");
  EXPECT_EQ(two_rows.where.line, 2);
  EXPECT_TRUE(two_rows.says("stage 0")) << two_rows.message;
  // Three stages cannot be spread over two ranks.
  EXPECT_THROW(from_csv("0F0,0B0,2F0,2B0\n1F0,1B0\n", "uneven.csv"), ConfigError);
  // A row that runs no stage (both stages on row 1, row 2 only the optimizer step): every
  // pipeline rank holds v stages. Accepted, it lost its row on the way back out (fuzz finding).
  const Refusal idle = refusal("0F0,1F0,1B0,0B0\nOPTIM\n", "idle-row.csv");
  EXPECT_EQ(idle.where.line, 2);
  EXPECT_TRUE(idle.says("row 2 runs the compute of 0 stage(s)")) << idle.message;
  // Row 1 holds three of four stages, row 2 one: not v = 2 each.
  const Refusal lopsided = refusal("0F0,1F0,2F0,2B0,1B0,0B0\n3F0,3B0\n", "lopsided.csv");
  EXPECT_EQ(lopsided.where.line, 2);
  EXPECT_TRUE(lopsided.says("(rows run 3, 1)") && lopsided.says("must run 2")) << lopsided.message;
  // A missing backward is a validation error, located in the file (the row of the stage that
  // lacks it).
  const Refusal missing = refusal("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "missing.csv");
  EXPECT_TRUE(missing.says("0B1")) << missing.message;
  EXPECT_EQ(missing.where.file, "missing.csv");
  EXPECT_EQ(missing.where.line, 1);
  // A backward before its forward: the file's row and the action's cell.
  const Refusal order = refusal("0F0,0F1,0B0,0B1\n1F0,1B1,1B0,1F1\n", "order.csv");
  EXPECT_EQ(order.where.line, 2);
  EXPECT_EQ(order.where.column, 5);
  EXPECT_TRUE(order.says("1B1")) << order.message;
  // OPTIM in the middle of a lowered row.
  const Refusal optim =
      refusal("0F0,0SEND_F0,OPTIM,0RECV_B0,0B0,0REDUCE_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\n", "optim.csv");
  EXPECT_EQ(optim.where.line, 1);
  EXPECT_EQ(optim.where.column, 14);
}

TEST(Csv, ZeroBubbleIwSplitImportsAndExportsAsPyTorchWritesIt) {
  const std::string zb = "0F0,0F1,0I0,0F2,0I1,0W0,0F3,0I2,0W1,0I3,0W2,0W3\n1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n";
  const Schedule s = from_csv(zb, "zb.csv");
  EXPECT_TRUE(s.lowered);
  EXPECT_EQ(s.m, 4);
  // I sends the input gradient (SEND_B after 1I0), W sends nothing.
  const auto& r1 = s.programs[1].actions;
  const auto at = std::find(r1.begin(), r1.end(), Action{ActionKind::I, 1, 0});
  ASSERT_NE(at, r1.end());
  EXPECT_EQ(*(at + 1), (Action{ActionKind::SEND_B, 1, 0}));
  // Export → import gives the same programs.
  expect_same(from_csv(to_csv(s), "zb-lowered.csv"), s, "zero-bubble round trip");
}

TEST(Csv, AcceptsUnshardReshardAndOverlappedForwardBackward) {
  // PyTorch's FSDP-aware actions and OVERLAP_F_B cells ("(F;B)OVERLAP_F_B", run one after the other).
  const Schedule s = from_csv("0UNSHARD,0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2,0RESHARD\n"
                              "1UNSHARD,1F0,1B0,1F1,1B1,1F2,1B2,1RESHARD\n",
                              "fsdp.csv");
  EXPECT_EQ(s.m, 3);
  const auto& r0 = s.programs[0].actions;
  EXPECT_EQ(r0.front(), (Action{ActionKind::UNSHARD, 0, -1}));
  const auto f2 = std::find_if(r0.begin(), r0.end(), [](const Action& a) { return a.kind == ActionKind::F && a.microbatch == 2; });
  ASSERT_NE(f2, r0.end());
  // The pair: the F marked first, its backward right after it, each naming the other.
  EXPECT_EQ(f2->overlap, 1);
  EXPECT_EQ(f2->overlap_kind, ActionKind::B);
  EXPECT_EQ((f2 + 1)->kind, ActionKind::B);
  EXPECT_EQ((f2 + 1)->microbatch, 0);
  EXPECT_EQ((f2 + 1)->overlap, -1);
  EXPECT_EQ(parse_action("1UNSHARD").str(), "1UNSHARD");
  EXPECT_EQ(parse_action("0RESHARD").kind, ActionKind::RESHARD);
  // Malformed: a microbatch on UNSHARD, a non-compute action inside OVERLAP_F_B, a missing pair.
  EXPECT_THROW(parse_action("0UNSHARD1"), ConfigError);
  for (const char* bad : {"(0F0;0SEND_F0)OVERLAP_F_B", "(0F0)OVERLAP_F_B", "(0F0;0B0)OVERLAP", "(0F0;0B0", "(0B0;0F1)OVERLAP_F_B",
                          "(0F1;0B0;0F2)OVERLAP_F_B"}) {
    try {
      from_csv(std::string("0F0,") + bad + "\n", "bad.csv");
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.where().line, 1) << bad;
      EXPECT_EQ(e.where().column, 5) << bad;
    }
  }
  // UNSHARD of a stage the rank does not hold.
  EXPECT_THROW(from_csv("1UNSHARD,0F0,0B0\n1F0,1B0\n", "wrong.csv"), ConfigError);
}

// A reader of PyTorch's current lowered CSV written from its runtime's documented rules, apart
// from ptdp's parser: each row is one rank's program; SEND/RECV are issued asynchronously and
// completed by their WAIT_* action (a WAIT_RECV blocks until the peer has issued the matching
// SEND, a WAIT_SEND until the peer has issued the RECV); a compute action needs its input either
// from a waited receive or, between two stages of the same rank, handed over locally (which the
// runtime does itself: a SEND/RECV between them is an error). Runs the ranks until all finish;
// returns "" or what stopped it.
std::string run_like_pytorch(const std::string& csv) {
  using Op = std::tuple<std::string, int, int>;  // kind, stage, microbatch (-1: none)
  std::vector<std::vector<std::pair<bool, Op>>> rows;  // (is wait, op)
  const std::regex cell(R"(^(\d+)(WAIT_)?(F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD)(\d*)$)");
  const std::regex overlap(R"(^\(([^;]+);([^;]+)\)OVERLAP_F_B$)");
  std::istringstream lines(csv);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    rows.emplace_back();
    std::istringstream cells(line);
    std::string token;
    while (std::getline(cells, token, ',')) {
      std::vector<std::string> parts = {token};
      std::smatch pair;
      if (std::regex_match(token, pair, overlap)) parts = {pair[1], pair[2]};  // an F and a backward run together
      for (const auto& part : parts) {
        std::smatch m;
        if (!std::regex_match(part, m, cell) || (parts.size() == 2 && m[3].length() != 1)) return "unknown action " + token;
        rows.back().push_back({m[2].matched, Op{m[3], std::stoi(m[1]), m[4].length() ? std::stoi(m[4]) : -1}});
      }
    }
  }
  std::map<int, int> rank_of;
  int last = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (const auto& [wait, op] : rows[r])
      if (std::get<0>(op).size() == 1) rank_of[std::get<1>(op)] = static_cast<int>(r), last = std::max(last, std::get<1>(op));
  auto rank = [&](int stage) { return rank_of.count(stage) ? rank_of[stage] : -1; };
  std::vector<std::set<Op>> issued(rows.size()), done(rows.size()), waited(rows.size());
  std::vector<size_t> pc(rows.size(), 0);
  auto peer_of = [](const Op& op) {
    const auto& k = std::get<0>(op);
    return k == "SEND_F" || k == "RECV_B" ? std::get<1>(op) + 1 : std::get<1>(op) - 1;
  };
  auto matching = [](const Op& op) {  // the peer's side of a transfer
    static const std::map<std::string, std::string> other = {
        {"SEND_F", "RECV_F"}, {"RECV_F", "SEND_F"}, {"SEND_B", "RECV_B"}, {"RECV_B", "SEND_B"}};
    const auto& k = std::get<0>(op);
    const int peer = k == "SEND_F" || k == "RECV_B" ? std::get<1>(op) + 1 : std::get<1>(op) - 1;
    return Op{other.at(k), peer, std::get<2>(op)};
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < rows.size(); ++r) {
      while (pc[r] < rows[r].size()) {
        const auto& [wait, op] = rows[r][pc[r]];
        const auto& [kind, stage, mb] = op;
        const std::string where = "rank " + std::to_string(r) + " action " + std::to_string(pc[r]) + ": ";
        bool blocked = false;
        if (wait) {
          if (!issued[r].count(op) || waited[r].count(op)) return where + "waits for an operation it did not issue";
          if (kind != "REDUCE_GRAD") {
            const Op other = matching(op);
            const int pr = rank(std::get<1>(other));
            blocked = pr < 0 || !issued[pr].count(other);
          }
          if (!blocked) waited[r].insert(op);
        } else if (kind.size() > 1) {  // SEND_*, RECV_*, REDUCE_GRAD: issued, completed by a wait
          if (kind != "REDUCE_GRAD" && rank(peer_of(op)) == static_cast<int>(r))
            return where + "a transfer between two stages of the same rank (handed over locally)";
          issued[r].insert(op);
        } else {
          auto have = [&](const std::string& recv, int from, const std::set<std::string>& producers) {
            if (waited[r].count(Op{recv, stage, mb})) return true;
            if (rank(from) != static_cast<int>(r)) return false;
            for (const auto& k : producers)
              if (done[r].count(Op{k, from, mb})) return true;
            return false;
          };
          if (kind == "F" && stage > 0 && !have("RECV_F", stage - 1, {"F"})) {
            if (rank(stage - 1) == static_cast<int>(r)) return where + "forward before its local input";
            blocked = !issued[r].count(Op{"RECV_F", stage, mb});
            if (!blocked) return where + "forward reads a receive it has not waited for";
          }
          if ((kind == "B" || kind == "I") && stage < last && !have("RECV_B", stage + 1, {"B", "I"})) {
            if (rank(stage + 1) == static_cast<int>(r)) return where + "backward before its local gradient";
            return where + "backward reads a gradient it has not received and waited for";
          }
          if (!blocked) done[r].insert(op);
        }
        if (blocked) break;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    if (pc[r] < rows[r].size()) return "deadlock: rank " + std::to_string(r) + " stuck at action " + std::to_string(pc[r]);
    if (issued[r] != waited[r]) return "rank " + std::to_string(r) + " leaves an operation unwaited";
  }
  return "";
}

std::vector<std::pair<std::string, Schedule>> single_lane_schedules() {
  return {{"1f1b", make_1f1b(4, 8)},         {"interleaved", make_interleaved(4, 2, 8)},
          {"zb-h1", make_zb_h1(4, 8)},        {"zb-v", make_zb_v(4, 8)},
          {"dualpipev", make_dualpipev(4, 8)}};
}

TEST(Csv, PyTorchFormatRunsAsPyTorchsRuntimeRunsIt) {
  for (auto [name, s] : single_lane_schedules()) {
    lower(s);
    const std::string csv = to_pytorch_csv(s);
    EXPECT_EQ(run_like_pytorch(csv), "") << name << "\n" << csv;
    // ptdp reads it back as the same lowered program: waits dropped, local hand-overs restored.
    expect_same(from_csv(csv, name + ".csv"), s, name + " PyTorch round trip");
    EXPECT_EQ(to_pytorch_csv(from_csv(csv, name + ".csv")), csv) << name;
  }
}

TEST(Csv, PtdpsOwnLoweredFormIsNotWhatPyTorchRuns) {
  // The reader above is strict: ptdp's own lowered form has no waits, and zb-v's V sends between
  // the two stages of a rank.
  Schedule s = make_zb_v(4, 8);
  lower(s);
  EXPECT_NE(run_like_pytorch(to_csv(s)), "");
  Schedule plain = make_1f1b(2, 2);
  lower(plain);
  EXPECT_NE(run_like_pytorch(to_csv(plain)).find("has not received and waited for"), std::string::npos) << run_like_pytorch(to_csv(plain));
}

TEST(Csv, ZeroBubbleVHandsOverLocallyInPyTorchsForm) {
  Schedule s = make_zb_v(2, 4);
  lower(s);
  const std::string csv = to_pytorch_csv(s);
  // Stages 1 and 2 are both on rank 1 (the V's turn): no transfer between them, either way.
  for (const char* local : {"1SEND_F", "2RECV_F", "2SEND_B", "1RECV_B"}) EXPECT_EQ(csv.find(local), std::string::npos) << local << "\n" << csv;
  EXPECT_NE(csv.find("0SEND_F0,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("0WAIT_REDUCE_GRAD"), std::string::npos) << csv;
}

TEST(Csv, DualPipeHasNoPyTorchForm) {
  Schedule s = make_dualpipe(4, 8);
  lower(s);
  try {
    to_pytorch_csv(s);
    ADD_FAILURE() << "DualPipe exported as PyTorch CSV";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no PyTorch equivalent"), std::string::npos) << e.what();
  }
}

TEST(Csv, WaitsAreCheckedWhereTheyAre) {
  // A wait for an operation the row never issued.
  Refusal r = refusal("0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0WAIT_RECV_B0,0B0\n1RECV_F0,1WAIT_RECV_F1,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
                      "w.csv");
  EXPECT_TRUE(r.says("1WAIT_RECV_F1 waits for 1RECV_F1, which the row does not issue before it")) << r.message;
  EXPECT_EQ(r.where.line, 2);
  EXPECT_EQ(r.where.column, 10);
  // A receive read before its wait.
  r = refusal("0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0WAIT_RECV_B0,0B0\n1RECV_F0,1F0,1WAIT_RECV_F0,1B0,1SEND_B0,1WAIT_SEND_B0\n", "w.csv");
  EXPECT_TRUE(r.says("1F0 reads 1RECV_F0 before 1WAIT_RECV_F0")) << r.message;
  EXPECT_EQ(r.where.column, 10);
  // A send never waited for in a row that waits.
  r = refusal("0F0,0SEND_F0,0RECV_B0,0WAIT_RECV_B0,0B0\n1RECV_F0,1WAIT_RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n", "w.csv");
  EXPECT_TRUE(r.says("0SEND_F0 is never waited for")) << r.message;
  EXPECT_EQ(r.where.line, 1);
  EXPECT_EQ(r.where.column, 5);
  // A wait for something that cannot be waited for.
  r = refusal("0F0,0WAIT_F0,0B0\n1F0,1B0\n", "w.csv");
  EXPECT_TRUE(r.says("bad action '0WAIT_F0'")) << r.message;
  // A well-formed row of waits reads as the same schedule as ptdp's own form.
  Schedule s = make_1f1b(2, 2);
  lower(s);
  expect_same(from_csv("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0WAIT_RECV_B0,0B0,0RECV_B1,0WAIT_RECV_B1,0B1,0WAIT_SEND_F0,"
                       "0WAIT_SEND_F1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
                       "1RECV_F0,1WAIT_RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1WAIT_RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,"
                       "1WAIT_SEND_B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n",
                       "waits.csv"),
              s, "1F1B with waits");
}

}  // namespace
}  // namespace ptdp
