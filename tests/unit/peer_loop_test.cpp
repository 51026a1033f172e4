// The peers' loop phase by phase, over loopback wires and a clock of the test's own: what a node asks,
// serves, refuses and gives up, and what it leaves behind at the end.
#include "peer/peer_loop.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <future>
#include <optional>

#include "fakes/loopback_wire.hpp"
#include "fakes/memory_source.hpp"
#include "peer/message.hpp"

namespace clairfs {
namespace {

using namespace std::chrono_literals;
using Clock = PeerLoop::Clock;

// What a fetch ended with: its result and its buffer.
struct Asked {
  std::shared_ptr<Bytes> buf;
  std::optional<int64_t> result;
  std::string bytes() const { return std::string(buf->begin(), buf->end()); }
};

// Links whose closing the test decides (peer/links.hpp).
struct TestLinks final : LinkWatch {
  explicit TestLinks(int nodes) : gone(static_cast<size_t>(nodes)) {}
  bool closed(int node) const override { return gone[static_cast<size_t>(node)]; }
  uint64_t closures() const override { return count; }
  int made() const override { return 2; }
  void close(int node) { gone[static_cast<size_t>(node)] = true, ++count; }
  std::vector<bool> gone;
  uint64_t count = 0;
};

struct PeerLoopTest : ::testing::Test {
  // Four files; file 2 has the size of file 0 (a late answer of one would fit the other's buffer).
  fakes::MemoryTree tree{{100, 200, 300, 100}};
  fakes::LoopbackWires wires{3, kPeerFirstReplyTag + 2};  // two reply tags: 16 and 17
  std::vector<std::unique_ptr<PeerLoop>> loops;
  std::vector<bool> holds{true, true, true};  // whether each node's lookup has the file
  TestLinks links{3};                         // node 0's
  Clock::time_point t0 = Clock::now();

  PeerLoopTest() {
    for (int n = 0; n < 3; ++n) {
      loops.push_back(
          std::make_unique<PeerLoop>(wires.end(n), tree.manifest, PeersConfig{}, n == 0 ? &links : nullptr));
      loops.back()->begin([this, n](EntryId id) -> PeerBytes {
        if (!holds[static_cast<size_t>(n)]) return nullptr;
        const std::string& b = tree.bytes(id);
        return std::make_shared<const Bytes>(b.begin(), b.end());
      });
    }
  }
  PeerLoop& node(int n) { return *loops[static_cast<size_t>(n)]; }
  // Node 0 asks node 1 for file 0 at t0, and node 1 answers.
  bool answered_once() {
    auto first = fetch(0, 1, 0);
    node(0).turn(t0);
    node(1).turn(t0);
    node(0).turn(t0 + 1ms);
    return first->result == 100;
  }
  std::shared_ptr<Asked> fetch(int from, int owner, size_t file) {
    auto a = std::make_shared<Asked>();
    a->buf = std::make_shared<Bytes>(tree.bytes(tree.file(file)).size());
    node(from).fetch(owner, tree.file(file), a->buf, [a](int64_t r) { a->result = r; });
    return a;
  }
};

TEST_F(PeerLoopTest, AFetchIsAnsweredWithTheOwnersBytes) {
  auto a = fetch(0, 1, 1);
  EXPECT_TRUE(node(0).start_queued(t0));
  EXPECT_EQ(node(0).active(), 1u);
  EXPECT_TRUE(node(1).serve_requests(t0));
  EXPECT_TRUE(node(0).poll_fetches(t0 + 1ms));
  ASSERT_EQ(a->result, 200);
  EXPECT_EQ(a->bytes(), tree.bytes(tree.file(1)));
  EXPECT_EQ(node(0).counters().hits, 1u);
  EXPECT_EQ(node(1).counters().served, 1u);
  EXPECT_EQ(node(1).counters().served_bytes, 200u);
  node(1).reap_sends();
  EXPECT_EQ(node(1).sending(), 0u);
}

TEST_F(PeerLoopTest, AFileTheOwnerDoesNotHoldIsRefused) {
  holds[1] = false;
  auto a = fetch(0, 1, 0);
  node(0).turn(t0);
  node(1).turn(t0);
  node(0).turn(t0);
  EXPECT_EQ(a->result, -ENOENT);
  EXPECT_EQ(node(0).counters().refused, 1u);
  EXPECT_EQ(node(1).counters().refused_to_peers, 1u);
  EXPECT_TRUE(node(0).usable(1));  // a refusal is an answer
}

TEST_F(PeerLoopTest, ARequestThatDoesNotMatchTheManifestIsRefusedNeverServed) {
  // From node 2's wire by hand: file 1 asked with file 0's size, the answer to come on tag 16.
  uint64_t words[3];
  encode_peer_request(PeerRequest{tree.file(1), kPeerFirstReplyTag, 100}, words);
  std::vector<char> answer(300, 'x');
  Wire::Op recv = wires.end(2).receive(answer.data(), answer.size(), 0, kPeerFirstReplyTag);
  Wire::Op send = wires.end(2).send(words, sizeof words, 0, PeerLoop::kRequest);
  EXPECT_TRUE(node(0).serve_requests(t0));
  const Wire::Test got = wires.end(2).test(recv);
  EXPECT_TRUE(got.ended);
  EXPECT_EQ(got.bytes, 0u);  // the empty answer: refused
  EXPECT_EQ(node(0).counters().served, 0u);
  EXPECT_EQ(node(0).counters().refused_to_peers, 1u);
  wires.end(2).test(send);
}

TEST_F(PeerLoopTest, FetchesInFlightAreBoundedPerPeerAndInAll) {
  loops[0] = std::make_unique<PeerLoop>(wires.end(0), tree.manifest,
                                        PeersConfig{.timeout = 5000ms, .max_in_flight = 3, .max_per_peer = 2});
  node(0).begin([](EntryId) { return nullptr; });
  std::vector<std::shared_ptr<Asked>> asked;
  for (int i = 0; i < 3; ++i) asked.push_back(fetch(0, 1, 0));
  node(0).start_queued(t0);
  EXPECT_EQ(node(0).active(), 2u);  // two to node 1
  asked.push_back(fetch(0, 2, 0));
  asked.push_back(fetch(0, 2, 0));
  node(0).start_queued(t0);
  EXPECT_EQ(node(0).active(), 3u);  // and one to node 2: three in all
  node(1).serve_requests(t0);
  node(1).serve_requests(t0);
  node(0).poll_fetches(t0);
  EXPECT_EQ(node(0).active(), 1u);
  node(0).start_queued(t0);
  EXPECT_EQ(node(0).active(), 3u);  // node 1's third, node 2's second
}

TEST_F(PeerLoopTest, ALateAnswerNeverLandsInALaterFetchsBuffer) {
  // A: node 1 silent past the timeout. Its reply tag (16) waits for the late answer.
  auto a = fetch(0, 1, 0);
  node(0).turn(t0);
  node(0).turn(t0 + 5001ms);
  EXPECT_EQ(a->result, -ETIMEDOUT);
  EXPECT_FALSE(node(0).usable(1));
  EXPECT_EQ(node(0).given_up(), 1u);
  // Node 1 wakes: it answers A (late, unmatched at node 0), and asks node 0 for a file, which node 0
  // hears: node 1 is asked again.
  node(1).serve_requests(t0 + 5002ms);
  auto theirs = fetch(1, 0, 3);
  node(1).start_queued(t0 + 5002ms);
  node(0).serve_requests(t0 + 5003ms);
  EXPECT_TRUE(node(0).usable(1));
  EXPECT_EQ(node(0).counters().returned, 1u);
  // B takes tag 17; C, of a file as large as A's, would take 16 again if it were not awaited.
  auto b = fetch(0, 1, 1);
  node(0).start_queued(t0 + 5003ms);
  node(1).serve_requests(t0 + 5004ms);
  node(0).poll_fetches(t0 + 5004ms);
  EXPECT_EQ(b->result, 200);
  auto c = fetch(0, 1, 3);
  node(0).start_queued(t0 + 5005ms);
  node(1).serve_requests(t0 + 5005ms);
  node(0).poll_fetches(t0 + 5005ms);
  ASSERT_EQ(c->result, 100);
  EXPECT_EQ(c->bytes(), tree.bytes(tree.file(3)));  // not A's (file 0's)
  // The late answer is taken at the next looks, and A let go of.
  node(0).watch_liveness(t0 + 5100ms);
  node(0).watch_liveness(t0 + 5200ms);
  EXPECT_EQ(node(0).given_up(), 0u);
  EXPECT_EQ(wires.unmatched(0), 0u);
}

TEST_F(PeerLoopTest, AnOwnerThatStopsAnsweringIsGivenUpWithinASecondNotTheTimeout) {
  ASSERT_TRUE(answered_once());  // node 1 has shown how fast it answers
  auto a = fetch(0, 1, 1);
  node(0).turn(t0 + 10ms);
  node(0).turn(t0 + 300ms);  // silent while it owes an answer: pinged
  EXPECT_FALSE(a->result);
  node(0).turn(t0 + 1000ms);  // the ping not answered
  EXPECT_EQ(a->result, -EHOSTDOWN);
  EXPECT_FALSE(node(0).usable(1));
  EXPECT_TRUE(node(0).failed());  // the end must not wait on it
}

TEST_F(PeerLoopTest, AnOwnerWhoseLinkClosesIsGivenUpAtTheNextTurn) {
  auto a = fetch(0, 1, 1);
  node(0).turn(t0);
  node(0).turn(t0 + 1ms);
  EXPECT_FALSE(a->result);  // waited on: no word from it yet, as it should be
  links.close(1);           // its daemon's process ended: its kernel closed the link
  node(0).turn(t0 + 2ms);   // no 250 ms of silence, no ping's wait
  EXPECT_EQ(a->result, -EHOSTDOWN);
  EXPECT_FALSE(node(0).usable(1));
  EXPECT_TRUE(node(0).failed());  // the end must not wait on it
  EXPECT_TRUE(node(0).usable(2));
}

TEST_F(PeerLoopTest, APeerWhoseLinkClosedIsNotTakenBackByAMessageItSentBefore) {
  ASSERT_TRUE(answered_once());  // node 1 is proven
  auto a = fetch(0, 1, 1);
  node(0).turn(t0 + 10ms);
  node(0).turn(t0 + 300ms);   // silent while it owes an answer: pinged
  node(0).turn(t0 + 1000ms);  // and given up for silence (it may come back)
  ASSERT_EQ(a->result, -EHOSTDOWN);
  links.close(1);  // then its link closed: it will not
  node(0).turn(t0 + 1001ms);
  node(1).turn(t0 + 1001ms);  // what it sent before (the answer, the pong) comes now
  node(0).turn(t0 + 1002ms);
  node(0).turn(t0 + 1100ms);
  EXPECT_FALSE(node(0).usable(1));
  EXPECT_EQ(node(0).counters().returned, 0u);
}

TEST_F(PeerLoopTest, AnOwnerThatOnlyAskedThisNodeIsGivenUpWithinASecondToo) {
  // Node 1 asked node 0, which answered: messages went both ways, so node 1 silent later (killed) is
  // given up at the ping's usual time, not the 2.5 s a peer never heard from is given.
  auto theirs = fetch(1, 0, 2);
  node(1).turn(t0);
  node(0).turn(t0);
  node(1).turn(t0 + 1ms);
  ASSERT_EQ(theirs->result, 300);
  auto a = fetch(0, 1, 1);
  node(0).turn(t0 + 10ms);
  node(0).turn(t0 + 300ms);  // pinged
  node(0).turn(t0 + 1000ms);
  EXPECT_EQ(a->result, -EHOSTDOWN);
  EXPECT_FALSE(node(0).usable(1));
}

TEST_F(PeerLoopTest, AnOwnerNeverHeardFromIsGivenTheFirstContactsTime) {
  auto a = fetch(0, 1, 1);
  node(0).turn(t0);
  node(0).turn(t0 + 300ms);  // pinged
  node(0).turn(t0 + 1000ms);
  EXPECT_FALSE(a->result);  // its connections may still be being made
  node(0).turn(t0 + 2900ms);
  EXPECT_EQ(a->result, -EHOSTDOWN);
}

TEST_F(PeerLoopTest, AnOwnerThatAnswersPingsIsWaitedForUntilTheTimeout) {
  auto first = fetch(0, 1, 0);
  node(0).turn(t0);
  node(1).turn(t0);
  node(0).turn(t0 + 1ms);
  auto a = fetch(0, 1, 1);
  node(0).turn(t0 + 10ms);
  for (auto t = 300ms; t < 5000ms; t += 250ms) {
    node(0).turn(t0 + t);
    node(1).answer_pings(t0 + t);  // busy: answers pings, serves nothing
  }
  EXPECT_FALSE(a->result);
  EXPECT_TRUE(node(0).usable(1));
  node(0).turn(t0 + 5011ms);
  EXPECT_EQ(a->result, -ETIMEDOUT);
}

TEST_F(PeerLoopTest, APeerThatSaidGoodbyeIsNotAskedAgain) {
  EXPECT_FALSE(node(1).leave(Clock::now() + 1s, [] {}));
  EXPECT_TRUE(node(0).take_goodbyes());
  EXPECT_TRUE(node(0).left(1));
  EXPECT_FALSE(node(0).usable(1));
  auto a = fetch(0, 1, 0);
  EXPECT_EQ(a->result, -EHOSTDOWN);  // at once, without a message
  EXPECT_EQ(node(0).active(), 0u);
  EXPECT_TRUE(node(2).take_goodbyes());
}

TEST_F(PeerLoopTest, AFailedPeerEndsItsFetchesAndTheOthersAreStillServed) {
  auto a = fetch(0, 1, 0);
  node(0).turn(t0);
  wires.kill(1);
  node(0).turn(t0 + 1ms);
  EXPECT_EQ(a->result, -EHOSTDOWN);
  EXPECT_FALSE(node(0).usable(1));
  EXPECT_TRUE(node(0).failed());
  // Node 0's receive of requests from any node broke with node 1; it stands again for node 2.
  auto b = fetch(2, 0, 2);
  node(2).turn(t0);
  node(0).turn(t0 + 2ms);
  node(2).turn(t0 + 2ms);
  EXPECT_EQ(b->result, 300);
}

TEST_F(PeerLoopTest, LeavingEndsEveryFetchAndLeavesNothingRunning) {
  loops[0] = std::make_unique<PeerLoop>(wires.end(0), tree.manifest,
                                        PeersConfig{.timeout = 5000ms, .max_in_flight = 1, .max_per_peer = 1});
  node(0).begin([](EntryId) { return nullptr; });
  auto active = fetch(0, 1, 0);
  auto queued = fetch(0, 1, 1);
  node(0).turn(t0);
  EXPECT_EQ(node(0).active(), 1u);
  node(0).leave(Clock::now() + 1s, [] {});
  EXPECT_EQ(active->result, -ECANCELED);
  EXPECT_EQ(queued->result, -ECANCELED);
  EXPECT_EQ(node(0).active(), 0u);
  EXPECT_EQ(node(0).given_up(), 0u);
  EXPECT_EQ(node(0).sending(), 0u);
  EXPECT_EQ(wires.stranded(0), 0u);  // every receive taken back, every send gone
  EXPECT_TRUE(node(1).take_goodbyes());
  auto late = fetch(0, 2, 0);
  EXPECT_EQ(late->result, -ECANCELED);  // stopped or not, a fetch after the end never waits
}

TEST(WirePeers, TwoNodesOnTheirOwnThreadsServeEachOther) {
  fakes::MemoryTree tree{{1000, 5000}};
  fakes::LoopbackWires wires(2);
  std::vector<std::unique_ptr<WirePeers>> peers;
  std::vector<bool> ended(2, false);
  for (int n = 0; n < 2; ++n) {
    peers.push_back(std::make_unique<WirePeers>(wires.end(n), tree.manifest, PeersConfig{},
                                                [&ended, n](bool failed) { ended[static_cast<size_t>(n)] = !failed; }));
    peers.back()->start([&tree](EntryId id) {
      const std::string& b = tree.bytes(id);
      return std::make_shared<const Bytes>(b.begin(), b.end());
    });
  }
  auto buf = std::make_shared<Bytes>(5000);
  std::promise<int64_t> done;
  peers[0]->fetch(1, tree.file(1), buf, [&done](int64_t r) { done.set_value(r); });
  auto result = done.get_future();
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(result.get(), 5000);
  EXPECT_EQ(std::string(buf->begin(), buf->end()), tree.bytes(tree.file(1)));
  peers[0]->stop();
  peers[1]->stop();
  EXPECT_TRUE(ended[0]);  // a clean end on both
  EXPECT_TRUE(ended[1]);
}

}  // namespace
}  // namespace clairfs
