// The staging policy alone: the walk over the plan, room made by next use (Belady's MIN), room for
// read-ahead, the peer-or-SOURCE model, and who keeps each file for the other nodes.
#include "engine/policy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/owners.hpp"
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

// Not told where in its epoch the job starts, the walk stages its start window (files per rank) and
// waits there until the job's opens show where it is (a job resumed mid-epoch: nothing it skipped is
// staged but the window).
TEST(Policy, StagesOnlyTheStartWindowBeforeARankIsConfirmed) {
  fakes::MemoryTree tree(std::vector<uint64_t>(300, 100));
  PlannerConfig pc = planner_config(tree.manifest);
  pc.tolerance = 16;
  Planner planner(pc, in_order(300));
  PolicyConfig config{30000, 1, 2, 2, {}, 0, mean_sample_size(tree.manifest)};
  config.start_window = 3;
  StagingPolicy policy(tree.manifest, planner, config);
  const auto none = [](EntryId) { return false; };
  for (EntryId id = 2; id < 5; ++id, policy.take()) EXPECT_EQ(policy.next_candidate(none)->id, id);
  EXPECT_FALSE(policy.next_candidate(none));
  // The job's opens from its item 12 on (it skipped 0..11): the walk waits until they confirm the rank.
  EntryId id = 14;
  for (; !planner.confirmed(0) && id < 30; ++id) {
    planner.on_open(id, 100, 1);
    policy.catch_up();
    if (!planner.confirmed(0)) {
      EXPECT_FALSE(policy.next_candidate(none)) << "after the open of " << id;
    }
  }
  const auto next = policy.next_candidate(none);  // past its opens, none of the skipped 3..11
  ASSERT_TRUE(next);
  EXPECT_EQ(next->id, id);
}

// "Needed soon" (latency matters, a keeper's refusal goes to SOURCE) reaches half the eviction window,
// at most as far as the loaders hold files ahead, and never past the next epoch: a loader reads ahead within its epoch only, and with
// windows larger than an epoch every planned epoch was "soon" — a node then read from SOURCE, for
// epochs its job might never reach, files its peers held.
TEST(Policy, NeededSoonEndsWithTheNextEpoch) {
  fakes::MemoryTree tree(std::vector<uint64_t>(10, 100));
  const StreamSource source = in_order(10);
  PlannerConfig pc = planner_config(tree.manifest);
  pc.horizon = 3;
  Planner planner(pc, source);
  while (const auto e = planner.wanted_epoch()) planner.add_epoch(Planner::build(source, *e, 1, tree.manifest.size()));
  ASSERT_EQ(planner.planned_end(), 40u);  // epochs 0-3, 10 keys each
  const uint64_t mean = mean_sample_size(tree.manifest);
  StagingPolicy wide(tree.manifest, planner, PolicyConfig{1000, 1, 1000, 2, {}, 0, mean});  // loaders: 1,000 ahead
  EXPECT_TRUE(wide.needed_soon(0));
  EXPECT_TRUE(wide.needed_soon(19));   // the next epoch
  EXPECT_FALSE(wide.needed_soon(20));  // the one after
  EXPECT_FALSE(wide.needed_soon(39));
  // Loaders 2 ahead, 2 reads in flight, RAM for no file: the eviction window is what they hold (4 keys),
  // half of it soon.
  StagingPolicy narrow(tree.manifest, planner, PolicyConfig{1000, 1, 2, 2, {}, 0, mean});
  EXPECT_TRUE(narrow.needed_soon(1));
  EXPECT_FALSE(narrow.needed_soon(2));
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

// Room in RAM as the staging core (and the simulators driving it, bench/core_driver.hpp) makes it: near
// the readers by next use, beyond the eviction window free room only; for a kept file, the RAM copies of
// files NVMe holds go first, however soon they are needed, and then kept files needed later.
TEST(Policy, RamRoomForAKeptFileTakesCopiesHeldElsewhereFirst) {
  fakes::MemoryTree tree(std::vector<uint64_t>(10, 100));
  Planner planner(planner_config(tree.manifest), in_order(10));
  StagingPolicy policy(tree.manifest, planner, PolicyConfig{1000, 1, 2, 2, {}, 0, mean_sample_size(tree.manifest)});
  ASSERT_GT(policy.evict_window(), 2u);
  ASSERT_LT(policy.evict_window(), 100u);
  policy.ram().set(2, 1, false);    // needed at 1, sooner than what room is made for; NVMe holds it
  policy.ram().set(3, 9, true);     // kept for the others, needed at 9
  policy.ram().set(4, 500, false);  // needed far beyond the window
  bool room = false;
  std::vector<EntryId> evicted;
  const auto reserve = [&] { return std::exchange(room, false); };
  const auto evict = [&](EntryId id) {
    evicted.push_back(id);
    room = true;
  };
  const auto on_nvme = [](EntryId id) { return id == 2; };
  // Beyond the window: free room only, though 4 is needed later still.
  EXPECT_FALSE(policy.make_ram_room(100, false, reserve, evict, on_nvme));
  EXPECT_TRUE(evicted.empty());
  // Near: 4 goes (needed later); then, not kept, nothing more may.
  EXPECT_TRUE(policy.make_ram_room(2, false, reserve, evict, on_nvme));
  EXPECT_FALSE(policy.make_ram_room(2, false, reserve, evict, on_nvme));
  // Kept: the copy NVMe holds goes, though needed at 1, and wherever the kept file is needed.
  EXPECT_TRUE(policy.make_ram_room(100, true, reserve, evict, on_nvme));
  EXPECT_FALSE(policy.make_ram_room(100, true, reserve, evict, on_nvme));  // beyond: no kept file goes
  EXPECT_TRUE(policy.make_ram_room(2, true, reserve, evict, on_nvme));     // near: the kept one needed later
  EXPECT_EQ(evicted, (std::vector<EntryId>{4, 2, 3}));
  EXPECT_FALSE(policy.make_ram_room(2, true, reserve, evict, on_nvme));  // nothing left
}

// The epochs after the readers' are built on another thread; a reader quicker than that passes files
// whose next use is not planned yet. Counted as never needed, they went first and were read again; they
// are kept by an estimate (the plan's end) and keyed by their real next use once the epoch is added.
TEST(Policy, AFilePassedBeforeItsNextEpochIsPlannedIsKeptAndKeyedWhenItIs) {
  fakes::MemoryTree tree(std::vector<uint64_t>(10, 100));
  const StreamSource source = [](uint64_t epoch) {  // epoch 0 in order, later epochs reversed
    std::vector<EntryId> seq(10);
    std::iota(seq.begin(), seq.end(), 2);
    if (epoch > 0) std::reverse(seq.begin(), seq.end());
    return std::vector<std::vector<EntryId>>{seq};
  };
  Planner planner(planner_config(tree.manifest), source);
  StagingPolicy policy(tree.manifest, planner, PolicyConfig{1000, 1, 2, 2, {}, 0, mean_sample_size(tree.manifest)});
  ASSERT_EQ(planner.wanted_epoch(), 1u);  // epoch 1 not built yet
  policy.ram().set(2, 0, false);
  policy.ram().set(3, 1, false);
  planner.on_open(2, 1);
  policy.readers_moved(planner);
  EXPECT_EQ(policy.ram().key(2), 10u);           // at least the plan's end; not kNever
  EXPECT_EQ(policy.ram().victim(5, false), 2u);  // but the first to go for a planned use
  policy.ram().set(9, planner.next_use(9, 15), false);  // looked for from 15: an estimate, 15
  EXPECT_EQ(policy.ram().key(9), 15u);
  const uint64_t end = planner.planned_end();
  planner.add_epoch(Planner::build(source, 1, 1, tree.manifest.size()));
  policy.plan_grew(end);
  EXPECT_EQ(policy.ram().key(2), 19u);  // last in epoch 1
  EXPECT_EQ(policy.ram().key(3), 1u);   // not an estimate: untouched
  EXPECT_EQ(policy.ram().key(9), 20u);  // its use at 12 lies before 15: still an estimate, past epoch 1
  // The plan closed (an epoch could not be built) with a file keyed by an estimate: never needed.
  planner.on_open(3, 1);
  policy.readers_moved(planner);
  EXPECT_EQ(policy.ram().key(3), 18u);
  policy.ram().set(4, planner.next_use(4, 20), true);  // kept for peers, beyond the plan
  EXPECT_EQ(policy.ram().key(4), 20u);
  planner.close_plan();
  policy.plan_grew(20);
  EXPECT_EQ(policy.ram().key(4), kKeptForPeers);
  EXPECT_EQ(planner.next_use(2, 20), kNever);
}

TEST(PeerModel, AsksPeersUntilWarmThenPrefersThemUnlessFourTimesSlower) {
  PeerModel m;
  // Cold: always the peer.
  EXPECT_TRUE(m.prefer_peer(true, 0, 0, 32));
  for (int i = 0; i < 16; ++i) {
    m.note(true, 0.010);
    m.note(false, 0.001);
  }
  // Warm: a peer 10× slower than SOURCE loses a file needed soon (but every 32nd choice probes it)...
  int peer = 0;
  for (int i = 0; i < 64; ++i) peer += m.prefer_peer(true, 0, 0, 32);
  EXPECT_EQ(peer, 2);
  // ...and wins one not needed soon.
  EXPECT_TRUE(m.prefer_peer(false, 0, 0, 32));
}

}  // namespace
}  // namespace clairfs

namespace clairfs {
namespace {

// Each file is kept for the others by the node that reads it first, unless that one has no room left
// for it: then by the node with the most room left, the same on every node; with room nowhere, by none.
TEST(Keepers, FilesPastTheirFirstReadersRoomGoToANodeWithRoomLeft) {
  std::vector<uint64_t> sizes(200);
  for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = 1000 + 37 * (i % 13);
  fakes::MemoryTree tree(sizes);
  const Manifest& m = tree.manifest;
  Schedule s;
  s.seed = 3;
  s.world_size = 4;
  s.batch_size = 4;
  const Oracle oracle(m.samples().size(), s);
  const std::vector<std::vector<uint64_t>> ranks{{0}, {1}, {2}, {3}};
  const Keepers first = plan_owners(m, oracle, 0, ranks, 4);
  EXPECT_TRUE(first.handed.empty());
  std::vector<uint64_t> share(4, 0);
  for (EntryId id : m.samples()) share[first.owner[id]] += m.entry(id).size;

  std::vector<uint64_t> room(4);  // node 0 short of its share by a tenth, the others with room to spare
  for (size_t n = 0; n < 4; ++n) room[n] = n == 0 ? share[0] * 9 / 10 : share[n] + share[0] / 10;
  const Keepers k = plan_owners(m, oracle, 0, ranks, 4, room);
  ASSERT_FALSE(k.handed.empty());
  std::vector<uint64_t> kept(4, 0);
  for (EntryId id : m.samples()) kept[k.owner[id]] += m.entry(id).size;
  for (size_t n = 0; n < 4; ++n) EXPECT_LE(kept[n], room[n]) << "node " << n;
  for (EntryId id : m.samples()) {
    const bool handed = std::find(k.handed.begin(), k.handed.end(), id) != k.handed.end();
    if (handed) {
      EXPECT_EQ(first.owner[id], 0u);
      EXPECT_NE(k.owner[id], 0u);
    } else {
      EXPECT_EQ(k.owner[id], first.owner[id]);
    }
  }
  EXPECT_EQ(plan_owners(m, oracle, 0, ranks, 4, room).owner, k.owner);  // every node alike

  const Keepers none = plan_owners(m, oracle, 0, ranks, 4, std::vector<uint64_t>(4, 1));
  EXPECT_TRUE(none.handed.empty());
  EXPECT_EQ(none.unkept, m.samples().size());
  for (EntryId id : m.samples()) EXPECT_EQ(none.owner[id], kNoKeeper);

  // Room for half of each node's share: each keeps the first half it reads, and the rest is no one's.
  std::vector<uint64_t> half(4);
  for (size_t n = 0; n < 4; ++n) half[n] = share[n] / 2;
  const Keepers h = plan_owners(m, oracle, 0, ranks, 4, half);
  std::vector<uint64_t> held(4, 0);
  uint64_t unkept = 0;
  for (EntryId id : m.samples()) {
    if (h.owner[id] == kNoKeeper) {
      unkept += m.entry(id).size;
      continue;
    }
    EXPECT_EQ(h.owner[id], first.owner[id]);
    held[h.owner[id]] += m.entry(id).size;
  }
  for (size_t n = 0; n < 4; ++n) EXPECT_LE(held[n], half[n]) << "node " << n;
  EXPECT_EQ(unkept, h.unkept_bytes);
  EXPECT_GT(h.unkept_bytes, tree.total() * 45 / 100);
}

// NVMe's room in files' bytes: what its blocks hold of these files.
TEST(Keepers, NvmeRoomCountsTheBlocksFilesFill) {
  fakes::MemoryTree tree(std::vector<uint64_t>(10, 6144));  // a block and a half each
  EXPECT_EQ(keeper_room(tree.manifest, 1000, 0), 1000u);
  EXPECT_EQ(keeper_room(tree.manifest, 1000, 8192), 1000u + 6144u);
  EXPECT_EQ(keeper_room(tree.manifest, 1000, 16384, 16384), 1000u + 6144u);  // a file system of 16 KiB blocks
}

}  // namespace
}  // namespace clairfs
