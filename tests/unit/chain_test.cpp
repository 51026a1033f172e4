// The store chain over fakes: a store in front of SOURCE that fails, stalls or corrupts on command
// (tests/fakes/faulty_store.hpp), asked whole and asynchronously on a real io_uring loop.
#include <gtest/gtest.h>

#include "fakes/faulty_store.hpp"
#include "fakes/memory_source.hpp"
#include "io/io_loop.hpp"
#include "tiers/chain.hpp"

namespace clairfs {
namespace {

using fakes::FaultyStore;
using namespace std::chrono_literals;

struct ChainTest : ::testing::Test {
  ChainTest() : tree({5000, 7000, 100}), source(tree), kept(tree), nvme(kept, Origin::kNvme), chain({&nvme, &source}) {}

  // Fetches `id` whole; returns the bytes ("" on an error, left in *rc) and where they came from.
  std::string fetch(EntryId id, Origin* from, int* rc) {
    auto buf = std::make_shared<std::vector<char>>(tree.manifest.entry(id).size);
    *rc = chain.fetch(id, buf, from);
    return *rc == 0 ? std::string(buf->begin(), buf->end()) : std::string();
  }
  // The same through the loop; also says whether the loop's thread was ever held up for `hold` or more.
  StoreChain::Result start(EntryId id, std::chrono::milliseconds hold = 100ms, bool* held = nullptr) {
    IoLoop io(8);
    StoreChain::Result out;
    bool finished = false;
    auto buf = std::make_shared<std::vector<char>>(tree.manifest.entry(id).size);
    const auto t0 = std::chrono::steady_clock::now();
    chain.start_fetch(io, id, buf, Origin::kNvme, [&](const StoreChain::Result& r) {
      out = r;
      finished = true;
    });
    if (held) *held = std::chrono::steady_clock::now() - t0 >= hold;
    const auto deadline = t0 + 10s;
    while (!finished && std::chrono::steady_clock::now() < deadline)
      if (io.run(10ms) == 0) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(finished);
    return out;
  }
  std::string bytes(const StoreChain::Result& r) { return std::string(r.buf->begin(), r.buf->end()); }
  // Asked whole for file i and through the loop for file j, the chain gives each one's bytes from `origin`.
  void expect_served(size_t i, size_t j, Origin origin) {
    Origin from{};
    int rc = 1;
    EXPECT_EQ(fetch(tree.file(i), &from, &rc), tree.bytes(tree.file(i)));
    EXPECT_EQ(from, origin);
    const auto r = start(tree.file(j));
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(r.from, origin);
    EXPECT_EQ(bytes(r), tree.bytes(tree.file(j)));
  }

  fakes::MemoryTree tree;
  fakes::MemorySource source, kept;  // SOURCE, and the bytes the store in front of it holds
  FaultyStore nvme;
  StoreChain chain;
};

TEST_F(ChainTest, TheFirstStoreThatHasTheFileAnswers) {
  expect_served(0, 1, Origin::kNvme);
  EXPECT_EQ(source.bytes_read(), 0u);
}

TEST_F(ChainTest, AFailingStoreSendsTheReadOnToSource) {
  nvme.set(FaultyStore::Fault::kFail, -EIO);
  expect_served(0, 1, Origin::kSource);
  EXPECT_EQ(nvme.asked(), 2u);
  EXPECT_EQ(source.reads_of(tree.file(0)) + source.reads_of(tree.file(1)), 2u);
}

TEST_F(ChainTest, WhenEveryStoreFailsTheLastErrorComesBack) {
  nvme.set(FaultyStore::Fault::kFail, -EIO);
  source.fail_all(true);
  Origin from{};
  int rc = 0;
  EXPECT_EQ(fetch(tree.file(2), &from, &rc), "");
  EXPECT_EQ(rc, -EIO);
  EXPECT_EQ(start(tree.file(2)).rc, -EIO);
}

TEST_F(ChainTest, AStalledStoreHoldsUpItsAskerButNotTheLoop) {
  nvme.set(FaultyStore::Fault::kStall, 0, 300ms);
  bool held = true;
  const auto r = start(tree.file(0), 100ms, &held);
  EXPECT_FALSE(held);  // start_fetch returned at once; the answer came later on the loop
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(bytes(r), tree.bytes(tree.file(0)));
  const auto t0 = std::chrono::steady_clock::now();
  Origin from{};
  int rc = 1;
  EXPECT_EQ(fetch(tree.file(1), &from, &rc), tree.bytes(tree.file(1)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
}

TEST_F(ChainTest, TheChainPassesOnWhatAStoreReturnsSoEachStoreChecksItsOwnBytes) {
  // The contract that NvmeTier's checksum and the peer layer's checks rest on: a store that returns 0
  // vouches for the bytes; the chain does not look at them.
  nvme.set(FaultyStore::Fault::kCorrupt);
  Origin from{};
  int rc = 1;
  const std::string got = fetch(tree.file(0), &from, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(from, Origin::kNvme);
  EXPECT_NE(got, tree.bytes(tree.file(0)));
  EXPECT_EQ(got.substr(1), tree.bytes(tree.file(0)).substr(1));
}

}  // namespace
}  // namespace clairfs
