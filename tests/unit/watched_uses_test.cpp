// WatchedUses on a clock of its own: each use a watch tells is counted once, by its first read or its
// close, whichever order the watch's news and the reads come in.
#include "engine/watched_uses.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace clairfs {
namespace {

using namespace std::chrono_literals;
using Clock = WatchedUses::Clock;

FileBytes bytes(char c) { return std::make_shared<const Bytes>(3, c); }

struct WatchedUsesTest : ::testing::Test {
  WatchedUses uses;
  Clock::time_point t0 = Clock::now();
  FileBytes data;
  Origin from = Origin::kSource;
};

TEST_F(WatchedUsesTest, AToldOpenWaitsForItsFirstReadWithTheCopyHeldAtTheOpen) {
  EXPECT_TRUE(uses.opened(7, t0));
  uses.hold(7, bytes('a'), Origin::kPeer);
  uses.hold(7, bytes('b'), Origin::kRam);  // it has one already
  EXPECT_TRUE(uses.unread(7));
  ASSERT_TRUE(uses.take_unread(7, &data, &from));
  EXPECT_EQ((*data)[0], 'a');
  EXPECT_EQ(from, Origin::kPeer);
  EXPECT_FALSE(uses.unread(7));
  EXPECT_FALSE(uses.take_unread(7, &data, &from));  // its close: read already, not counted again
}

TEST_F(WatchedUsesTest, TwoOpensOfOneFileAreTwoUses) {
  EXPECT_TRUE(uses.opened(7, t0));
  EXPECT_TRUE(uses.opened(7, t0 + 1ms));
  EXPECT_TRUE(uses.take_unread(7, &data, &from));
  EXPECT_TRUE(uses.take_unread(7, &data, &from));
  EXPECT_FALSE(uses.take_unread(7, &data, &from));
}

TEST_F(WatchedUsesTest, HoldingIsForUnreadUsesOnly) {
  uses.hold(7, bytes('a'), Origin::kRam);  // no use told: nothing to hold for
  EXPECT_FALSE(uses.unread(7));
  EXPECT_TRUE(uses.opened(7, t0));
  ASSERT_TRUE(uses.take_unread(7, &data, &from));
  EXPECT_EQ(data, nullptr);  // nothing was held for it: read from wherever the file is then
}

TEST_F(WatchedUsesTest, AReadBeforeTheWatchToldItsOpenCountsTheUseOnce) {
  EXPECT_TRUE(uses.read_before_told(7, t0));         // counted here
  EXPECT_FALSE(uses.read_before_told(7, t0 + 1ms));  // read again before told: not again
  EXPECT_FALSE(uses.opened(7, t0 + 10ms));           // the open told late: counted already
  EXPECT_FALSE(uses.unread(7));                      // so its close counts nothing
  EXPECT_TRUE(uses.opened(7, t0 + 20ms));            // the next open is a use of its own
}

TEST_F(WatchedUsesTest, AnOpenToldLongAfterAnEarlyReadIsAnotherUse) {
  EXPECT_TRUE(uses.read_before_told(7, t0));
  EXPECT_TRUE(uses.opened(7, t0 + WatchedUses::kAge + 1ms));
  EXPECT_TRUE(uses.unread(7));
}

TEST_F(WatchedUsesTest, AReadFromTheStartJustAfterATellingIsLateNotAnotherUse) {
  EXPECT_FALSE(uses.told_lately(7, t0));
  uses.opened(7, t0);
  EXPECT_TRUE(uses.told_lately(7, t0 + 1s));
  EXPECT_FALSE(uses.told_lately(7, t0 + WatchedUses::kAge));
  EXPECT_FALSE(uses.told_lately(8, t0 + 1s));
}

TEST_F(WatchedUsesTest, WhatIsRememberedIsBounded) {
  for (EntryId id = 0; id < 3 * WatchedUses::kMaxRemembered; ++id) {
    uses.read_before_told(id, t0);
    uses.opened(id + 1000000, t0);
  }
  // The oldest early reads were forgotten (their opens, told now, count as uses of their own); the
  // newest are still matched.
  EXPECT_TRUE(uses.opened(0, t0 + 1ms));
  EXPECT_FALSE(uses.opened(3 * WatchedUses::kMaxRemembered - 1, t0 + 1ms));
}

TEST_F(WatchedUsesTest, LostOpensForgetEverything) {
  uses.opened(7, t0);
  uses.read_before_told(8, t0);
  uses.forget();
  EXPECT_FALSE(uses.unread(7));
  EXPECT_FALSE(uses.told_lately(7, t0));
  EXPECT_TRUE(uses.opened(8, t0 + 1ms));  // the early read forgotten: a use of its own
}

}  // namespace
}  // namespace clairfs
