// Unit tests for the RAM tier's budget: reservations and held files never pass it, erasing frees it,
// and a file still held by a reader outlives its eviction.
#include <gtest/gtest.h>

#include "tiers/next_use.hpp"
#include "tiers/ram.hpp"

namespace clairfs {
namespace {

FileBytes bytes(size_t n) { return std::make_shared<const std::vector<char>>(n, 'x'); }

constexpr uint64_t B = RamTier::kBookkeeping;  // what each file counts besides its bytes

TEST(RamTierTest, BudgetIsAHardLimit) {
  RamTier ram(100 + 2 * B);
  EXPECT_TRUE(ram.reserve(60));
  EXPECT_FALSE(ram.reserve(41));
  EXPECT_TRUE(ram.reserve(40));
  EXPECT_EQ(ram.used(), 100u + 2 * B);
  ram.insert(1, bytes(60));
  ram.unreserve(40);
  EXPECT_EQ(ram.used(), 60u + B);
  EXPECT_EQ(ram.files(), 1u);
  EXPECT_FALSE(ram.reserve(41 + B));
  EXPECT_EQ(ram.erase(1), 60u);
  EXPECT_EQ(ram.erase(1), 0u);
  EXPECT_EQ(ram.used(), 0u);
  EXPECT_TRUE(ram.reserve(100 + B));
}

TEST(RamTierTest, EvictedFileStaysAliveForItsReader) {
  RamTier ram(10 + B);
  ASSERT_TRUE(ram.reserve(10));
  ram.insert(7, bytes(10));
  FileBytes held = ram.get(7);
  ASSERT_TRUE(held);
  ram.erase(7);
  EXPECT_FALSE(ram.contains(7));
  EXPECT_EQ(ram.get(7), nullptr);
  EXPECT_EQ(held->size(), 10u);  // the reader's copy is intact
  // Its bytes are still in memory: still counted, until the reader lets go.
  EXPECT_EQ(ram.used(), 10u + B);
  EXPECT_FALSE(ram.reserve(1));
  held.reset();
  EXPECT_TRUE(ram.reserve(10));
  EXPECT_EQ(ram.used(), 10u + B);
}

TEST(RamTierTest, EvictedFileNobodyHoldsIsFreedAtOnce) {
  RamTier ram(10 + B);
  ASSERT_TRUE(ram.reserve(10));
  ram.insert(7, bytes(10));
  EXPECT_EQ(ram.erase(7), 10u);
  EXPECT_EQ(ram.used(), 0u);
  EXPECT_TRUE(ram.reserve(10));
}

TEST(RamTierTest, EmptyFilesCountTheirBookkeeping) {
  // A million staged empty files took 240 MB outside the budget; each now counts what holding it costs.
  RamTier ram(3 * B);
  for (EntryId id = 0; id < 3; ++id) {
    ASSERT_TRUE(ram.reserve(0));
    ram.insert(id, bytes(0));
  }
  EXPECT_EQ(ram.used(), 3 * B);
  EXPECT_FALSE(ram.reserve(0));
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
  DemandAllowance::hand_over(std::make_shared<std::vector<char>>(10));
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
