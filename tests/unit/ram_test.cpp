// Unit tests for the RAM tier's budget: reservations and held files never pass it, erasing frees it,
// and a file still held by a reader outlives its eviction.
#include <gtest/gtest.h>

#include "tiers/ram.hpp"

namespace clairfs {
namespace {

FileBytes bytes(size_t n) { return std::make_shared<const std::vector<char>>(n, 'x'); }

TEST(RamTierTest, BudgetIsAHardLimit) {
  RamTier ram(100);
  EXPECT_TRUE(ram.reserve(60));
  EXPECT_FALSE(ram.reserve(41));
  EXPECT_TRUE(ram.reserve(40));
  EXPECT_EQ(ram.used(), 100u);
  ram.insert(1, bytes(60));
  ram.unreserve(40);
  EXPECT_EQ(ram.used(), 60u);
  EXPECT_EQ(ram.files(), 1u);
  EXPECT_FALSE(ram.reserve(41));
  EXPECT_EQ(ram.erase(1), 60u);
  EXPECT_EQ(ram.erase(1), 0u);
  EXPECT_EQ(ram.used(), 0u);
  EXPECT_TRUE(ram.reserve(100));
}

TEST(RamTierTest, EvictedFileStaysAliveForItsReader) {
  RamTier ram(10);
  ASSERT_TRUE(ram.reserve(10));
  ram.insert(7, bytes(10));
  FileBytes held = ram.get(7);
  ASSERT_TRUE(held);
  ram.erase(7);
  EXPECT_FALSE(ram.contains(7));
  EXPECT_EQ(ram.get(7), nullptr);
  EXPECT_EQ(held->size(), 10u);  // the reader's copy is intact
  EXPECT_TRUE(ram.reserve(10));  // and the budget is free again
}

TEST(RamTierTest, EmptyFilesCostNothing) {
  RamTier ram(0);
  EXPECT_TRUE(ram.reserve(0));
  ram.insert(3, bytes(0));
  EXPECT_TRUE(ram.contains(3));
  EXPECT_EQ(ram.used(), 0u);
}

}  // namespace
}  // namespace clairfs
