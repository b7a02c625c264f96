// The one breakdown every engine uses (rank_breakdown) and the one JSON mapping of timelines.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "report/timeline.hpp"

namespace ptdp {
namespace {

TimelineEvent ev(int device, const char* action, Stream stream, double start, double end, int peer = -1,
                 std::string label = {}) {
  TimelineEvent e;
  e.device = device;
  e.pipeline_rank = device;
  e.action = parse_action(action);
  e.stream = stream;
  e.start_s = start;
  e.end_s = end;
  e.peer = peer;
  e.label = std::move(label);
  return e;
}

// Two pipeline ranks, one microbatch, iteration of 10 s:
//   rank 0: F [0,2] (TP 0.5 of it), SEND_F posted at 2, RECV_B wait [2,7] — the gradient was
//           posted at 6.5 by rank 1 — then its all-gather [7,7.5], B [7.5,9.5], REDUCE_GRAD [9.5,10].
//   rank 1: RECV_F wait [0,3] (posted at 2: 1 s on the wire), F [3,5], B [5,6.5], SEND_B at 6.5,
//           OPTIM [9,10].
std::vector<TimelineEvent> two_ranks() {
  return {ev(0, "0F0", Stream::Compute, 0, 2),          ev(0, "0F0", Stream::TP, 1.5, 2),
          ev(0, "0SEND_F0", Stream::PP, 2, 3, 1),       ev(0, "0RECV_B0", Stream::PP, 2, 7, 1),
          ev(0, "0RECV_B0", Stream::PP, 7, 7.5, 1, kPipelineAllGather),
          ev(0, "0B0", Stream::Compute, 7.5, 9.5),      ev(0, "0REDUCE_GRAD", Stream::DP, 9.5, 10),
          ev(1, "1RECV_F0", Stream::PP, 0, 3, 0),       ev(1, "1F0", Stream::Compute, 3, 5),
          ev(1, "1B0", Stream::Compute, 5, 6.5),        ev(1, "1SEND_B0", Stream::PP, 6.5, 7, 0),
          ev(1, "OPTIM", Stream::Compute, 9, 10)};
}

TEST(RankBreakdown, SplitsWaitsIntoWireTimeAndBubbleAndAddsUpToTheIteration) {
  const auto rb = rank_breakdown(two_ranks(), {0, 1}, 10.0);
  ASSERT_EQ(rb.size(), 2u);
  // Rank 0: busy = F 2 − TP 0.5 + B 2; pp = wire 0.5 (7 − 6.5) + all-gather 0.5; dp 0.5.
  EXPECT_DOUBLE_EQ(rb[0].busy_s, 3.5);
  EXPECT_DOUBLE_EQ(rb[0].exposed_tp_s, 0.5);
  EXPECT_DOUBLE_EQ(rb[0].exposed_pp_s, 1.0);
  EXPECT_DOUBLE_EQ(rb[0].exposed_dp_s, 0.5);
  EXPECT_DOUBLE_EQ(rb[0].bubble_s, 10 - 3.5 - 0.5 - 1.0 - 0.5);
  // Rank 1: the RECV_F waited 3 s, of which 1 s after the send was posted.
  EXPECT_DOUBLE_EQ(rb[1].busy_s, 4.5);
  EXPECT_DOUBLE_EQ(rb[1].exposed_pp_s, 1.0);
  EXPECT_DOUBLE_EQ(rb[1].bubble_s, 10 - 4.5 - 1.0);
  // Per class: counts of every action; RECV time includes its all-gather; sends only count.
  const auto p2p = static_cast<size_t>(ActionClass::P2P);
  EXPECT_EQ(rb[0].class_count[p2p], 2);
  EXPECT_DOUBLE_EQ(rb[0].class_time_s[p2p], 5.5);
  EXPECT_EQ(rb[1].class_count[static_cast<size_t>(ActionClass::Optim)], 1);
  EXPECT_EQ(rb[0].class_count[static_cast<size_t>(ActionClass::ReduceGrad)], 1);
  EXPECT_DOUBLE_EQ(rb[0].class_time_s[static_cast<size_t>(ActionClass::ReduceGrad)], 0.5);
}

TEST(RankBreakdown, OnlyTheRepresentativesCountAndTheirPeersSendsArePaired) {
  // Device 5 is another TP rank of pipeline rank 0: its events are ignored, not added.
  auto events = two_ranks();
  events.push_back(ev(5, "0F0", Stream::Compute, 0, 9));
  const auto rb = rank_breakdown(events, {0, 1}, 10.0);
  EXPECT_DOUBLE_EQ(rb[0].busy_s, 3.5);
  // Without the sender's events every wait is bubble (nothing says when the data left).
  std::vector<TimelineEvent> only_rank1;
  for (const auto& e : two_ranks())
    if (e.device == 1) only_rank1.push_back(e);
  const auto alone = rank_breakdown(only_rank1, {0, 1}, 10.0);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].pipeline_rank, 1);
  EXPECT_DOUBLE_EQ(alone[0].exposed_pp_s, 0.0);
}

TEST(TimelineJson, RoundTripsEveryField) {
  Timeline t;
  t.events = two_ranks();
  t.device_names = {{0, "gpu 0"}, {1, "gpu 1 (pp 1)"}};
  const Timeline back = timeline_from_json(timeline_to_json(t), "t.json");
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].action, t.events[i].action);
    EXPECT_EQ(back.events[i].stream, t.events[i].stream);
    EXPECT_EQ(back.events[i].device, t.events[i].device);
    EXPECT_EQ(back.events[i].peer, t.events[i].peer);
    EXPECT_EQ(back.events[i].label, t.events[i].label);
    EXPECT_DOUBLE_EQ(back.events[i].start_s, t.events[i].start_s);
    EXPECT_DOUBLE_EQ(back.events[i].end_s, t.events[i].end_s);
  }
  EXPECT_EQ(back.device_names, t.device_names);
  EXPECT_THROW(timeline_from_json("{\"events\": [[0]]}", "bad.json"), ConfigError);
  EXPECT_THROW(timeline_from_json("[", "bad.json"), ConfigError);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(ReportJson, MemoryBreakdownAndShardTimeSurviveARoundTrip) {
  Report r;
  r.iteration_time_s = 2;
  RankBreakdown rb;
  rb.exposed_shard_s = 0.25;
  r.ranks.push_back(rb);
  for (int p = 0; p < 2; ++p) {
    MemoryBreakdown m;
    m.pipeline_rank = p;
    m.weights_bytes = 1 + p, m.gradients_bytes = 2, m.optimizer_bytes = 3, m.activations_bytes = 4 + 10 * p;
    m.buffers_bytes = 5, m.host_bytes = 6;
    m.total_bytes = m.weights_bytes + 2 + 3 + m.activations_bytes + 5;
    r.memory.push_back(m);
  }
  const std::string text = report_to_json(r);
  const Report back = report_from_json(text, "r.json");
  ASSERT_EQ(back.memory.size(), 2u);
  EXPECT_EQ(back.memory[1].pipeline_rank, 1);
  EXPECT_EQ(back.memory[1].weights_bytes, 2);
  EXPECT_EQ(back.memory[1].activations_bytes, 14);
  EXPECT_EQ(back.memory[1].buffers_bytes, 5);
  EXPECT_EQ(back.memory[1].host_bytes, 6);
  EXPECT_EQ(back.memory[1].total_bytes, 26);
  EXPECT_EQ(back.ranks.at(0).exposed_shard_s, 0.25);
  // The peak rank's breakdown is written on its own as well.
  EXPECT_NE(text.find("\"memory_breakdown\""), std::string::npos);
  EXPECT_NE(text.find("\"memory_breakdown\": {\n    \"activations\": 14.0"), std::string::npos) << text;
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// A report's MFU against a calibrated peak (a CPU profile measured while the machine was busy)
// can exceed 1: valid (the CLI warns), never an internal error; 25 is no load effect.
TEST(ReportInvariants, MfuAboveOneAgainstACalibratedPeakIsAccepted) {
  Report r;
  r.iteration_time_s = 1;
  r.tflops_per_gpu = 0.1;
  r.tokens_per_s = 1000;
  r.parameters = 1e6;
  r.gpus = 2;
  r.mfu = 1.06;
  EXPECT_NO_THROW(check_report(r));
  r.mfu = 25;
  EXPECT_ANY_THROW(check_report(r));
}

}  // namespace
}  // namespace ptdp
