// The staging policy alone: the walk over the plan, room made by next use (Belady's MIN), room for
// read-ahead, and the peer-or-SOURCE model.
#include "engine/policy.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "fakes/memory_source.hpp"

namespace clairfs {
namespace {

StreamSource in_order(size_t n) {
  return [n](uint64_t) {
    std::vector<EntryId> seq(n);
    std::iota(seq.begin(), seq.end(), 2);  // MemoryTree's files are entries 2..n+1
    return std::vector<std::vector<EntryId>>{seq};
  };
}

PlannerConfig planner_config(const Manifest& m) {
  PlannerConfig c;
  c.entries = m.size();
  c.tolerance = 4;
  return c;
}

TEST(Policy, WalksThePlanSkippingWhatIsHeldOrBusy) {
  fakes::MemoryTree tree(std::vector<uint64_t>(10, 100));
  Planner planner(planner_config(tree.manifest), in_order(10));
  StagingPolicy policy(tree.manifest, planner, PolicyConfig{1000, 1, 2, 2, {}, 0, mean_sample_size(tree.manifest)});
  policy.ram().set(2, 0, false);  // held
  auto c = policy.next_candidate([](EntryId id) { return id == 3; });  // busy
  ASSERT_TRUE(c);
  EXPECT_EQ(c->id, 4u);
  EXPECT_EQ(c->key, 2u);
  policy.take();
  EXPECT_EQ(policy.next_candidate([](EntryId) { return false; })->id, 5u);
}

TEST(Policy, MakesRoomByEvictingTheFarthestNeededOnlyIfLater) {
  TierIndex index;
  index.set(1, 10, false);
  index.set(2, 50, false);
  index.set(3, 30, false);
  uint64_t free_slots = 0;
  std::vector<EntryId> evicted;
  auto reserve = [&] { return free_slots > 0 ? (--free_slots, true) : false; };
  auto evict = [&](EntryId id) {
    evicted.push_back(id);
    ++free_slots;
  };
  EXPECT_TRUE(StagingPolicy::make_room(index, 20, false, reserve, evict));
  EXPECT_EQ(evicted, std::vector<EntryId>{2});  // needed at 50: farthest
  EXPECT_TRUE(StagingPolicy::make_room(index, 20, false, reserve, evict));
  EXPECT_EQ(evicted.back(), 3u);
  // What is left (needed at 10) is needed sooner than 20: nothing may go.
  EXPECT_FALSE(StagingPolicy::make_room(index, 20, false, reserve, evict));
  EXPECT_EQ(evicted.size(), 2u);
}

TEST(Policy, OwnedFilesGoOnlyForOwnedFiles) {
  TierIndex index;
  index.set(1, 100, true);  // kept for the other nodes
  bool room = false;
  auto reserve = [&] { return room; };
  auto evict = [&](EntryId) { room = true; };
  EXPECT_FALSE(StagingPolicy::make_room(index, 5, false, reserve, evict));
  EXPECT_TRUE(StagingPolicy::make_room(index, 5, true, reserve, evict));
}

TEST(PeerModel, AsksPeersUntilWarmThenPrefersThemUnlessFourTimesSlower) {
  PeerModel m;
  // Cold: always the peer.
  EXPECT_TRUE(m.prefer_peer(0, 0, 100, 0, 0, 32));
  for (int i = 0; i < 16; ++i) {
    m.note(true, 0.010);
    m.note(false, 0.001);
  }
  // Warm: a peer 10× slower than SOURCE loses a file needed soon (but every 32nd choice probes it)...
  int peer = 0;
  for (int i = 0; i < 64; ++i) peer += m.prefer_peer(0, 0, 100, 0, 0, 32);
  EXPECT_EQ(peer, 2);
  // ...and wins one needed beyond half the eviction window.
  EXPECT_TRUE(m.prefer_peer(60, 0, 100, 0, 0, 32));
}

}  // namespace
}  // namespace clairfs
