// The staging core alone, on one thread: no stager, no facade, no kernel — its verbs called as the
// request threads and the stager call them.
#include "engine/core.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "fakes/manual_clock.hpp"
#include "fakes/memory_source.hpp"

namespace clairfs {
namespace {

constexpr uint64_t kFiles = 600;

// The k-th file of an epoch: MemoryTree's files (entries 2..) in order, in reverse order every other epoch.
EntryId item(uint64_t epoch, uint64_t k) { return static_cast<EntryId>(2 + (epoch % 2 ? kFiles - 1 - k : k)); }

// One rank reading two epochs of item(); tolerance 16; time on a clock the test moves.
struct Core {
  explicit Core(bool handed_over = false, uint64_t ram_bytes = kFiles * RamTier::charge(100),
                StagingConfig staging = {})
      : tree(std::vector<uint64_t>(kFiles, 100)),
        streams([](uint64_t epoch) {
          std::vector<EntryId> seq;
          for (uint64_t k = 0; k < kFiles; ++k) seq.push_back(item(epoch, k));
          return std::vector<std::vector<EntryId>>{seq};
        }),
        ram(ram_bytes),
        core(tree.manifest, {0}, planner(tree.manifest), streams,
             PolicyConfig{ram_bytes, 1, 2, 2, {}, 0, mean_sample_size(tree.manifest)},
             WindowConfig{0, false, nullptr, 1, 16, mean_sample_size(tree.manifest)}, std::move(staging), ram, nullptr,
             counters, handed_over, clock) {
    core.plan_up_to(kNever);
  }
  static PlannerConfig planner(const Manifest& m) {
    PlannerConfig c;
    c.entries = m.size();
    c.tolerance = 16;
    c.end_epoch = 2;
    return c;
  }
  // Opens of an epoch's items [from, to) by one reader, as a request thread places them.
  // (Each epoch's by a process of its own, as a DataLoader's workers are.)
  void open(uint64_t epoch, uint64_t from, uint64_t to) {
    for (uint64_t k = from; k < to; ++k) {
      StagingCore::Turn turn(core);
      core.place(item(epoch, k), static_cast<pid_t>(100 + epoch), true);
    }
  }
  static std::vector<std::pair<EntryId, pid_t>> opens(uint64_t epoch, uint64_t from, uint64_t to) {
    std::vector<std::pair<EntryId, pid_t>> o;
    for (uint64_t k = from; k < to; ++k) o.emplace_back(item(epoch, k), static_cast<pid_t>(100 + epoch));
    return o;
  }
  // The rank's epoch and its items of it done.
  std::pair<uint64_t, uint64_t> at() {
    EngineStats s;
    core.snapshot(s, false);
    return {s.ranks.at(0).epoch, s.ranks.at(0).done};
  }

  fakes::MemoryTree tree;
  const StreamSource streams;
  RamTier ram;
  EngineCounters counters;
  fakes::ManualClock clock;
  StagingCore core;
};

// A re-plan's core is told opens before the old plan's last are handed over: they wait, unplaced, and
// are placed after those, in the order made. (Placed as they came, the later ones moved the rank past the
// older, which then counted for nothing: test_seed_auto under TSan ended an epoch at 1,823 of 3,000;
// engine_test's TheOpensMadeWhileANewPlanIsSwitchedToAreCountedByItInTheOrderMade shows it whole. This
// one reader's plan does not lose them either way.)
TEST(Core, OpensToldDuringAHandOverArePlacedAfterTheOnesHandedOver) {
  using At = std::pair<uint64_t, uint64_t>;
  Core c(/*handed_over=*/true);
  c.core.catch_up(Core::opens(0, 0, 500));       // (the opens the new plan was built from)
  c.open(1, 0, 100);                             // the next epoch's first, told to it once published
  EXPECT_EQ(c.at(), (At{0, 500}));               // waiting
  c.core.catch_up(Core::opens(0, 500, kFiles));  // the old plan's last
  while (c.core.place_waiting()) {
  }
  EXPECT_EQ(c.at(), (At{1, 100}));
  c.open(1, 100, kFiles);  // as they come, the hand-over over
  EXPECT_EQ(c.at(), (At{1, kFiles}));
}

// RAM's bytes and the policy's index of them change together: kept, shed by next use, given back.
TEST(Core, RamAndItsIndexChangeTogether) {
  Core c(false, 10 * RamTier::charge(100));
  StagingCore::Turn turn(c.core);
  for (EntryId id = 2; id < 12; ++id) {
    ASSERT_TRUE(c.core.make_ram_room(100, id - 2, false)) << id;  // (keys: the first epoch's uses)
    c.core.keep_in_ram(id, std::make_shared<const Bytes>(100, 'x'), id - 2, false, Origin::kSource);
  }
  EXPECT_EQ(c.ram.files(), 10u);
  EXPECT_FALSE(c.core.make_ram_room(100, 50, false));        // full, of files needed sooner
  EXPECT_EQ(c.core.shed_ram(5 * RamTier::charge(100)), 5u);  // needed last first
  EXPECT_EQ(c.ram.files(), 5u);
  for (EntryId id = 2; id < 12; ++id) {
    EXPECT_EQ(c.core.in_ram(id), id < 7) << id;
    EXPECT_EQ(c.ram.get(id) != nullptr, id < 7) << id;
  }
  EXPECT_EQ(c.core.release_ram(), (std::pair<uint64_t, uint64_t>{5, 500}));  // idle=
  EXPECT_EQ(c.ram.files(), 0u);
  for (EntryId id = 2; id < 12; ++id) EXPECT_FALSE(c.core.in_ram(id)) << id;
  EXPECT_EQ(c.counters.ram_evictions.load(), 5u);  // shed; what idle= gives back is not evicted
}

// What the walk asks of the outside: nothing is loaded or read by a reader.
const StagingCore::Outside kNobodyElse{[](EntryId) { return false; }, [](EntryId) { return false; }};

// The walk picks the plan's next files by next use, each counted in flight, while the bytes in flight
// stay within the bound: the next waits until one has ended.
TEST(Core, TheWalkPicksThePlansNextFilesWithinTheBytesInFlight) {
  Core c(false, kFiles * RamTier::charge(100), StagingConfig{250, {}});
  StagingCore::Turn turn(c.core);
  StagingCore::Walk w = c.core.pick(64, kNobodyElse, true);
  ASSERT_EQ(w.picks.size(), 2u);  // 100 + 100 bytes: a third would pass 250
  for (uint64_t k = 0; k < 2; ++k) {
    EXPECT_EQ(w.picks[k].id, item(0, k));
    EXPECT_EQ(w.picks[k].key, k);
    EXPECT_EQ(w.picks[k].why, StagingCore::Pick::For::kPlan);
    EXPECT_TRUE(c.core.in_flight(item(0, k)));
  }
  EXPECT_TRUE(c.core.pick(64, kNobodyElse, true).picks.empty());
  c.core.flight_ended(item(0, 0));
  EXPECT_FALSE(c.core.in_flight(item(0, 0)));
  w = c.core.pick(64, kNobodyElse, true);
  ASSERT_EQ(w.picks.size(), 1u);
  EXPECT_EQ(w.picks[0].id, item(0, 2));
  EXPECT_EQ(c.core.pick(1, kNobodyElse, true).picks.size(), 0u);  // (and within the ring's room)
}

// A file whose use its reader passed while the stager read it (the reader on the staging's heels) is
// kept in RAM for its next use, an epoch away, and NVMe is asked to hold it for that use too — not for
// the use after it (none here: two epochs), which left the next epoch to read SOURCE again once RAM had
// let it go. A file staged before its use goes to NVMe for the use after RAM's, as ever.
TEST(Core, AFileWhoseUseWasPassedWhileItWasReadGoesToNvmeForItsNextUse) {
  Core c;
  std::vector<StagingCore::Pick> picks;
  {
    StagingCore::Turn turn(c.core);
    picks = c.core.pick(2, kNobodyElse, true).picks;
  }
  ASSERT_EQ(picks.size(), 2u);
  c.open(0, 0, 1);  // item(0, 0) opened while its staging read is in flight
  const auto bytes = std::make_shared<const Bytes>(100);
  StagingCore::Turn turn(c.core);
  // Epoch 1 reads the items in reverse: item(0, 0) is its last (key 1,199), item(0, 1) the one before.
  EXPECT_EQ(c.core.staged(picks[0], bytes, Origin::kSource), 2 * kFiles - 1);
  EXPECT_EQ(c.counters.staged_after_their_use.load(), 1u);
  EXPECT_EQ(c.core.staged(picks[1], bytes, Origin::kSource), 2 * kFiles - 2);
  EXPECT_EQ(c.counters.staged_after_their_use.load(), 1u);
}

// A watched mount: a read that comes before the watch told its open (its thread behind the reader) is
// that use's; the walk does not stage the file for it, after the read as during it.
TEST(Core, TheWalkLeavesAFileReadBeforeTheWatchToldItsOpen) {
  Core c;
  c.core.watching_opens();
  StagingCore::Turn turn(c.core);
  FileBytes data;
  Origin from = Origin::kRam;
  const StagingCore::WatchedRead r = c.core.watched_read(item(0, 3), true, c.core.now(), &data, &from);
  EXPECT_TRUE(r.first);
  EXPECT_TRUE(r.wait);
  const StagingCore::Walk w = c.core.pick(16, kNobodyElse, true);
  ASSERT_EQ(w.picks.size(), 16u);
  for (const StagingCore::Pick& p : w.picks) EXPECT_NE(p.id, item(0, 3)) << p.key;
  EXPECT_EQ(w.picks[3].id, item(0, 4));
  EXPECT_EQ(c.counters.left_to_readers.load(), 1u);
}

// idle= on the core's clock: RAM given back once nothing was asked for that long, once; the next open
// ends it. No sleeping: the test moves the clock.
TEST(Core, IdleGivesRamBackOnceOnTheCoresClockAndTheNextOpenEndsIt) {
  using std::chrono::seconds;
  Core c;
  StagingCore::Turn turn(c.core);
  for (EntryId id = 2; id < 5; ++id) {
    ASSERT_TRUE(c.core.make_ram_room(100, id - 2, false));
    c.core.keep_in_ram(id, std::make_shared<const Bytes>(100, 'x'), id - 2, false, Origin::kSource);
  }
  c.core.touch();
  c.clock.advance(seconds(1));
  EXPECT_FALSE(c.core.release_if_idle(c.core.now(), seconds(2)));
  c.clock.advance(seconds(1));
  EXPECT_EQ(c.core.release_if_idle(c.core.now(), seconds(2)), (std::pair<uint64_t, uint64_t>{3, 300}));
  EXPECT_TRUE(c.core.is_idle());
  EXPECT_EQ(c.ram.files(), 0u);
  EXPECT_EQ(c.counters.idle_releases.load(), 1u);
  c.clock.advance(seconds(10));
  EXPECT_FALSE(c.core.release_if_idle(c.core.now(), seconds(2)));  // once
  EXPECT_TRUE(c.core.place(item(0, 0), 100, true).woke);
  EXPECT_FALSE(c.core.is_idle());
  c.clock.advance(seconds(1));
  EXPECT_FALSE(c.core.release_if_idle(c.core.now(), seconds(2)));  // the open asked for something
  c.clock.advance(seconds(10));
  EXPECT_FALSE(c.core.release_if_idle(c.core.now(), seconds(0)));  // idle= off
}

// A rank's rate (the stats' files a second, by which its lead is judged) is timed on the core's clock.
TEST(Core, ARanksRateIsTimedOnTheCoresClock) {
  Core c;
  for (uint64_t k = 0; k < 300; ++k) {
    c.clock.advance(std::chrono::milliseconds(10));
    c.open(0, k, k + 1);
  }
  EngineStats s;
  c.core.snapshot(s, false);
  EXPECT_NEAR(s.ranks.at(0).files_per_second, 100.0, 1.0);
}

}  // namespace
}  // namespace clairfs
