// PeerLiveness on a clock of its own: whom the progress thread pings, and when it gives a peer up.
#include "peer/liveness.hpp"

#include <gtest/gtest.h>

namespace clairfs {
namespace {

using namespace std::chrono_literals;
using Clock = PeerLiveness::Clock;

struct LivenessTest : ::testing::Test {
  PeerLiveness live{
      3, {.probe_after = 250ms, .answer_within = 600ms, .unproven_within = 2s, .link_bytes_per_second = 1e6}};
  Clock::time_point t0 = Clock::now();
  LivenessTest() {
    for (int peer = 0; peer < 3; ++peer) live.answered(peer);  // each answered once
  }
};

TEST_F(LivenessTest, APeerOwingNothingIsNeverPinged) {
  EXPECT_TRUE(live.turn(t0 + 10s).ping.empty());
  EXPECT_TRUE(live.turn(t0 + 20s).dead.empty());
}

TEST_F(LivenessTest, ASilentPeerIsPingedOnceAndGivenUpWhenItsPingIsNotAnswered) {
  live.asked(1, 0, t0);
  EXPECT_TRUE(live.turn(t0 + 200ms).ping.empty());
  EXPECT_EQ(live.turn(t0 + 250ms).ping, std::vector<int>{1});
  EXPECT_TRUE(live.turn(t0 + 500ms).ping.empty());  // once
  EXPECT_TRUE(live.turn(t0 + 800ms).dead.empty());
  EXPECT_EQ(live.turn(t0 + 850ms).dead, std::vector<int>{1});  // 250 ms of silence + 600 ms unanswered
  EXPECT_TRUE(live.turn(t0 + 2s).dead.empty());                // told once
}

TEST_F(LivenessTest, AnythingHeardFromAPeerKeepsItAlive) {
  live.asked(2, 0, t0);
  EXPECT_EQ(live.turn(t0 + 300ms).ping, std::vector<int>{2});
  live.heard(2, t0 + 800ms);  // a pong, an answer or a request of its own
  EXPECT_TRUE(live.turn(t0 + 1000ms).dead.empty());
  EXPECT_TRUE(live.turn(t0 + 1000ms).ping.empty());  // silent for 200 ms only
  EXPECT_EQ(live.turn(t0 + 1050ms).ping, std::vector<int>{2});
}

TEST_F(LivenessTest, SilenceCountsFromTheFirstFetchAfterAnIdleTime) {
  live.heard(1, t0);
  live.asked(1, 0, t0 + 10s);  // asked nothing for 10 s: not silent yet
  EXPECT_TRUE(live.turn(t0 + 10s + 100ms).ping.empty());
  live.ended(1, 0);
  EXPECT_TRUE(live.turn(t0 + 20s).ping.empty());  // owes nothing again
}

TEST_F(LivenessTest, TheBytesItOwesExtendTheWaitForItsPong) {
  live.asked(1, 2'000'000, t0);  // 2 s of bytes at 1 MB/s queued before a pong
  EXPECT_EQ(live.turn(t0 + 250ms).ping, std::vector<int>{1});
  EXPECT_TRUE(live.turn(t0 + 2500ms).dead.empty());
  EXPECT_EQ(live.turn(t0 + 2900ms).dead, std::vector<int>{1});
}

TEST_F(LivenessTest, APeerThatHasNotAnsweredYetIsGivenLonger) {
  PeerLiveness fresh{2, {.probe_after = 250ms, .answer_within = 600ms, .unproven_within = 2s}};
  fresh.asked(1, 0, t0);
  EXPECT_EQ(fresh.turn(t0 + 250ms).ping, std::vector<int>{1});
  EXPECT_TRUE(fresh.turn(t0 + 250ms + 1900ms).dead.empty());
  EXPECT_EQ(fresh.turn(t0 + 250ms + 2s).dead, std::vector<int>{1});
}

TEST_F(LivenessTest, APeerSlowToAnswerItsPingIsGivenAsLongToAnswerTheNext) {
  live.asked(1, 0, t0);
  EXPECT_EQ(live.turn(t0 + 250ms).ping, std::vector<int>{1});
  live.heard(1, t0 + 650ms);  // its pong took 400 ms (a busy node, or a sanitized build)
  EXPECT_EQ(live.turn(t0 + 900ms).ping, std::vector<int>{1});
  EXPECT_TRUE(live.turn(t0 + 900ms + 1500ms).dead.empty());  // 4 × 400 ms, not 600 ms
  EXPECT_EQ(live.turn(t0 + 900ms + 1600ms).dead, std::vector<int>{1});
}

TEST_F(LivenessTest, ASlowPongIsForgottenAnEighthAtEachAnswer) {
  live.asked(1, 0, t0);
  auto at = t0 + 250ms;
  EXPECT_EQ(live.turn(at).ping, std::vector<int>{1});
  live.heard(1, at + 400ms);      // 400 ms once
  for (int i = 0; i < 12; ++i) {  // then quick pongs: 400 ms × (7/8)^12 ≈ 80 ms
    at += 1s;
    ASSERT_EQ(live.turn(at).ping, std::vector<int>{1});
    live.heard(1, at + 1ms);
  }
  at += 1s;
  EXPECT_EQ(live.turn(at).ping, std::vector<int>{1});
  EXPECT_EQ(live.turn(at + 600ms).dead, std::vector<int>{1});  // answer_within again
}

TEST_F(LivenessTest, AKeepersSlowAnswerToARequestDoesNotLengthenThePingsWait) {
  // A keeper answers a file once it has it (read from SOURCE, or behind other answers): seconds, which
  // say nothing of how soon a live node answers a ping.
  live.asked(1, 0, t0);
  live.heard(1, t0 + 3s);
  live.answered(1);
  live.ended(1, 0);
  live.asked(1, 0, t0 + 4s);
  EXPECT_EQ(live.turn(t0 + 4s + 250ms).ping, std::vector<int>{1});
  EXPECT_EQ(live.turn(t0 + 4s + 850ms).dead, std::vector<int>{1});
}

TEST_F(LivenessTest, APeerGivenUpThatIsHeardFromAgainIsAliveAndGivenLongerEachTime) {
  live.asked(1, 0, t0);
  EXPECT_EQ(live.turn(t0 + 250ms).ping, std::vector<int>{1});
  EXPECT_EQ(live.turn(t0 + 850ms).dead, std::vector<int>{1});
  EXPECT_FALSE(live.heard(2, t0 + 900ms));  // another peer, never given up
  EXPECT_TRUE(live.heard(1, t0 + 3s));      // its pong, late: a stall, not a death
  EXPECT_FALSE(live.heard(1, t0 + 3s));     // told once
  // Silent again while it owes: pinged again, and given twice as long (1.2 s, not 600 ms) to answer.
  live.ended(1, 0);
  live.asked(1, 0, t0 + 4s);
  EXPECT_EQ(live.turn(t0 + 4s + 250ms).ping, std::vector<int>{1});
  EXPECT_TRUE(live.turn(t0 + 4s + 250ms + 1100ms).dead.empty());
  EXPECT_EQ(live.turn(t0 + 4s + 250ms + 1200ms).dead, std::vector<int>{1});
  // Back again, and again: the wait doubles (2.4 s, 4.8 s) up to longest_within (5 s), no further.
  const std::chrono::milliseconds waits[] = {2400ms, 4800ms, 5000ms, 5000ms};
  for (int i = 0; i < 4; ++i) {
    const auto at = t0 + 10s + i * 20s;
    ASSERT_TRUE(live.heard(1, at));
    EXPECT_EQ(live.turn(at + 250ms).ping, std::vector<int>{1});
    EXPECT_TRUE(live.turn(at + 250ms + waits[i] - 50ms).dead.empty()) << "return " << i + 2;
    EXPECT_EQ(live.turn(at + 250ms + waits[i]).dead, std::vector<int>{1}) << "return " << i + 2;
  }
}

}  // namespace
}  // namespace clairfs
