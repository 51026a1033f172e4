// Unit tests for the RAM tier's budget: reservations and held files never pass it, erasing frees it,
// and a file still held by a reader outlives its eviction.
#include "tiers/ram.hpp"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "tiers/next_use.hpp"

namespace clairfs {
namespace {

FileBytes bytes(size_t n) { return std::make_shared<const Bytes>(n, 'x'); }

uint64_t C(uint64_t n) { return RamTier::charge(n); }  // what a file of n bytes counts
constexpr uint64_t L = RamTier::kSmallFile;            // files above this are shared, not copied

TEST(RamTierTest, BudgetIsAHardLimit) {
  for (uint64_t base : {uint64_t{0}, L}) {  // small files and large ones
    SCOPED_TRACE(base);
    const uint64_t a = base + 60, b = base + 40;
    RamTier ram(C(a) + C(b));
    EXPECT_TRUE(ram.reserve(a));
    EXPECT_FALSE(ram.reserve(b + 48));
    EXPECT_TRUE(ram.reserve(b));
    EXPECT_EQ(ram.used(), C(a) + C(b));
    ram.insert(1, bytes(a));
    ram.unreserve(b);
    EXPECT_EQ(ram.used(), C(a));
    EXPECT_EQ(ram.files(), 1u);
    EXPECT_EQ(ram.bookkeeping(), C(a) - a);
    EXPECT_EQ(*ram.get(1), Bytes(a, 'x'));
    EXPECT_FALSE(ram.reserve(C(b) + 16));
    EXPECT_EQ(ram.erase(1), a);
    EXPECT_EQ(ram.erase(1), 0u);
    EXPECT_EQ(ram.used(), 0u);
    EXPECT_EQ(ram.get(1), nullptr);
    EXPECT_TRUE(ram.reserve(a + b));
  }
}

TEST(RamTierTest, ABudgetLoweredBelowWhatIsHeldGoesBackUpToWhatItWasMadeWith) {
  RamTier ram(1000 * L);
  ASSERT_TRUE(ram.reserve(600 * L));
  const uint64_t used = ram.used();
  EXPECT_EQ(ram.lower_budget_below_used(100 * L), used - 100 * L);
  EXPECT_FALSE(ram.reserve(1));
  EXPECT_EQ(ram.lower_budget_below_used(used), 0u);  // never below nothing
  EXPECT_EQ(ram.raise_budget(300 * L), 300 * L);
  EXPECT_EQ(ram.raise_budget(600 * L), 900 * L);
  EXPECT_EQ(ram.raise_budget(600 * L), 1000 * L);  // never above ram=
  EXPECT_EQ(ram.budget(), ram.configured_budget());
}

TEST(RamTierTest, SmallFilesComeBackByteForByte) {
  RamTier ram(1 << 20);
  for (EntryId id = 0; id <= 300; ++id) {
    Bytes v(id * 13 + (id == 300 ? L - 300 * 13 : 0));  // up to kSmallFile exactly
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>(i * 7 + id);
    ASSERT_TRUE(ram.reserve(v.size()));
    ram.insert(id, std::make_shared<const Bytes>(v));
  }
  for (EntryId id = 0; id <= 300; ++id) {
    FileBytes got = ram.get(id);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->size(), id * 13 + (id == 300 ? L - 300 * 13 : 0));
    for (size_t i = 0; i < got->size(); ++i) ASSERT_EQ((*got)[i], static_cast<char>(i * 7 + id)) << id << " " << i;
  }
  EXPECT_EQ(ram.files(), 301u);
}

TEST(RamTierTest, EvictedFileStaysAliveForItsReader) {
  const uint64_t n = L + 10;  // shared with its readers (a small one is handed out as a copy)
  RamTier ram(C(n));
  ASSERT_TRUE(ram.reserve(n));
  ram.insert(7, bytes(n));
  FileBytes held = ram.get(7);
  EXPECT_EQ(held, ram.get(7));  // the same buffer, not a copy
  ram.erase(7);
  EXPECT_FALSE(ram.contains(7));
  EXPECT_EQ(ram.get(7), nullptr);
  EXPECT_EQ(held->size(), n);  // the reader's copy is intact
  // Its bytes are still in memory: still counted, until the reader lets go.
  EXPECT_EQ(ram.used(), C(n));
  EXPECT_FALSE(ram.reserve(1));
  held.reset();
  EXPECT_TRUE(ram.reserve(n));
  EXPECT_EQ(ram.used(), C(n));
}

TEST(RamTierTest, EvictedFileNobodyHoldsIsFreedAtOnce) {
  for (uint64_t n : {uint64_t{10}, L + 10}) {
    RamTier ram(C(n));
    ASSERT_TRUE(ram.reserve(n));
    ram.insert(7, bytes(n));
    FileBytes copy = n <= L ? ram.get(7) : nullptr;  // a small file's reader holds a copy only
    EXPECT_EQ(ram.erase(7), n);
    EXPECT_EQ(ram.used(), 0u);
    EXPECT_TRUE(ram.reserve(n));
  }
}

TEST(RamTierTest, EmptyFilesCountTheirBookkeeping) {
  // A million staged empty files took 240 MB outside the budget; each now counts what holding it costs.
  RamTier ram(3 * C(0));
  for (EntryId id = 0; id < 3; ++id) {
    ASSERT_TRUE(ram.reserve(0));
    ram.insert(id, bytes(0));
  }
  EXPECT_EQ(ram.used(), 3 * C(0));
  EXPECT_GE(C(0), 64u);
  EXPECT_FALSE(ram.reserve(0));
}

// The heap in use: small chunks and the large ones malloc maps on their own (a hash table's array).
size_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

// What charge() says a file costs besides its bytes covers what holding it costs: the heap in use
// (mallinfo2) grows by no more than the charges, for 64-200 B files as in a tokenized data set and for
// files of a few KiB, the staging policy's index entries included; and it comes back when they go.
TEST(RamTierTest, BookkeepingIsWhatItCosts) {
  for (uint64_t base : {uint64_t{64}, L + 1000}) {
    SCOPED_TRACE(base);
    const EntryId kFiles = base < L ? 200000 : 20000;
    const size_t before = heap_in_use();
    auto ram = std::make_unique<RamTier>(uint64_t{1} << 40);
    auto index = std::make_unique<TierIndex>();
    uint64_t charged = 0, bytes_held = 0;
    for (EntryId id = 0; id < kFiles; ++id) {
      const uint64_t n = base + id % 137;
      ASSERT_TRUE(ram->reserve(n));
      ram->insert(id * 7, bytes(n));
      index->set(id * 7, uint64_t{id} * 3, false);
      charged += C(n);
      bytes_held += n;
    }
    const size_t used = heap_in_use() - before;
    EXPECT_LE(used, charged);
    EXPECT_EQ(ram->bookkeeping(), charged - bytes_held);
    if (base < L) {
      EXPECT_LE(static_cast<double>(charged - bytes_held) / kFiles, 200.0) << "small files' bookkeeping";
    }
    std::printf("files of %llu-%llu B: %.1f B a file besides its bytes (charged %.1f)\n",
                static_cast<unsigned long long>(base), static_cast<unsigned long long>(base + 136),
                static_cast<double>(used - bytes_held) / kFiles, static_cast<double>(charged - bytes_held) / kFiles);
    // Evicted, their memory goes back, the tables' slots included (not just their bytes).
    for (EntryId id = 1000; id < kFiles; ++id) {
      ASSERT_GT(ram->erase(id * 7), 0u);
      ASSERT_TRUE(index->erase(id * 7));
    }
    EXPECT_EQ(ram->files(), 1000u);
    EXPECT_LE(heap_in_use() - before, size_t{1000} * (base + 136 + RamTier::kBookkeeping) + (size_t{64} << 10));
  }
}

TEST(TierIndexTest, EvictsTheFarthestAndKeepsOwnedFilesForOwnedOnly) {
  TierIndex t;
  t.set(1, 100, false);
  t.set(2, 500, false);
  t.set(3, 900, true);  // kept for the other nodes
  // A file needed at 50: the farthest of the rest goes first, never an owned one for an unowned file.
  EXPECT_EQ(t.victim(50, false), std::optional<EntryId>(2));
  t.erase(2);
  EXPECT_EQ(t.victim(50, false), std::optional<EntryId>(1));
  t.erase(1);
  EXPECT_EQ(t.victim(50, false), std::nullopt);
  EXPECT_EQ(t.victim(50, true), std::optional<EntryId>(3));  // an owned file may displace another
  EXPECT_EQ(t.victim(950, true), std::nullopt);               // not one needed sooner than itself
  // The use at 900 passed: re-keyed to its next one.
  t.passed(3, 900, 2000);
  EXPECT_EQ(t.key(3), std::optional<uint64_t>(2000));
  t.passed(3, 900, 3000);  // not waiting for 900 any more: unchanged
  EXPECT_EQ(t.key(3), std::optional<uint64_t>(2000));
}

TEST(DemandAllowanceTest, AllocateByWaitsForAShareGivenBackAndNoLongerThanItsDeadline) {
  using namespace std::chrono_literals;
  DemandAllowance demand(100);
  auto a = demand.allocate(80);
  bool waited = false;
  // Room now: no wait. Over the limit: no wait either, whatever the deadline.
  EXPECT_TRUE(demand.allocate_by(20, DemandAllowance::Clock::now() + 10s, &waited));
  EXPECT_FALSE(waited);
  EXPECT_FALSE(demand.allocate_by(101, DemandAllowance::Clock::now() + 10s, &waited));
  EXPECT_FALSE(waited);
  // No room until another thread frees its buffer (or hands it over).
  std::thread freer([&] {
    std::this_thread::sleep_for(50ms);
    DemandAllowance::hand_over(a);
  });
  const auto t0 = DemandAllowance::Clock::now();
  auto b = demand.allocate_by(50, t0 + 10s, &waited);
  freer.join();
  EXPECT_TRUE(b);
  EXPECT_TRUE(waited);
  EXPECT_LT(DemandAllowance::Clock::now() - t0, 5s);  // woken by the share given back, not the deadline
  // Nothing given back: nullptr at the deadline.
  auto c = demand.allocate(50);
  ASSERT_TRUE(c);
  EXPECT_FALSE(demand.allocate_by(10, DemandAllowance::Clock::now() + 30ms, &waited));
  EXPECT_TRUE(waited);
}

TEST(DemandAllowanceTest, BuffersCountUntilFreedOrHandedOver) {
  DemandAllowance demand(100);
  auto a = demand.allocate(60);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size(), 60u);
  EXPECT_EQ(demand.used(), 60u);
  EXPECT_FALSE(demand.allocate(41));  // would pass the limit
  EXPECT_FALSE(demand.allocate(101));
  auto b = demand.allocate(40);
  ASSERT_TRUE(b);
  EXPECT_EQ(demand.used(), 100u);
  b.reset();  // freed: its share is back
  EXPECT_EQ(demand.used(), 60u);
  // Handed to the RAM tier: counted there from now on, once, even if handed over twice; freeing it later
  // gives nothing back a second time.
  FileBytes held = a;
  a.reset();
  DemandAllowance::hand_over(held);
  DemandAllowance::hand_over(held);
  EXPECT_EQ(demand.used(), 0u);
  held.reset();
  EXPECT_EQ(demand.used(), 0u);
  // Other buffers are not its business.
  DemandAllowance::hand_over(std::make_shared<Bytes>(10));
  EXPECT_EQ(demand.used(), 0u);
  // A buffer may outlive the allowance.
  FileBytes late;
  {
    DemandAllowance gone(10);
    late = gone.allocate(10);
  }
  EXPECT_EQ(late->size(), 10u);
}

}  // namespace
}  // namespace clairfs
