// The store chain over fakes: a store in front of SOURCE that fails, stalls or corrupts on command
// (tests/fakes/faulty_store.hpp), asked whole and asynchronously on a real io_uring loop; and its copies
// up to a store that keeps them, as an admission rule allows.
#include <gtest/gtest.h>

#include <map>

#include "fakes/faulty_store.hpp"
#include "fakes/memory_source.hpp"
#include "io/io_loop.hpp"
#include "tiers/chain.hpp"

namespace clairfs {
namespace {

using fakes::FaultyStore;
using namespace std::chrono_literals;

struct ChainTest : ::testing::Test {
  ChainTest() : tree({5000, 7000, 100}), source(tree), kept(tree), nvme(kept, Origin::kNvme), chain({&nvme}, source) {}

  // Fetches `id` whole; returns the bytes ("" on an error, left in *rc) and where they came from.
  std::string fetch(EntryId id, Origin* from, int* rc) {
    auto buf = std::make_shared<Bytes>(tree.manifest.entry(id).size);
    *rc = chain.find(id, buf, from);
    return *rc == 0 ? std::string(buf->begin(), buf->end()) : std::string();
  }
  // The same through the loop; also says whether the loop's thread was ever held up for `hold` or more.
  Store::Found start(EntryId id, std::chrono::milliseconds hold = 100ms, bool* held = nullptr) {
    IoLoop io(8);
    Store::Found out;
    bool finished = false;
    auto buf = std::make_shared<Bytes>(tree.manifest.entry(id).size);
    const auto t0 = std::chrono::steady_clock::now();
    chain.start_find(io, id, buf, Store::Route{Origin::kNvme}, [&](const Store::Found& r) {
      out = r;
      finished = true;
      return Store::Keep{};
    });
    if (held) *held = std::chrono::steady_clock::now() - t0 >= hold;
    const auto deadline = t0 + 10s;
    while (!finished && std::chrono::steady_clock::now() < deadline)
      if (io.run(10ms) == 0) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(finished);
    return out;
  }
  std::string bytes(const Store::Found& r) { return std::string(r.buf->begin(), r.buf->end()); }
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

TEST_F(ChainTest, AsOneStoreTheChainAnswersFromTheFirstThatHasTheFile) {
  Store& store = chain;
  EXPECT_TRUE(store.may_hold(tree.file(0)));
  auto buf = std::make_shared<Bytes>(tree.manifest.entry(tree.file(0)).size);
  EXPECT_EQ(store.fetch(tree.file(0), buf), 0);
  EXPECT_EQ(std::string(buf->begin(), buf->end()), tree.bytes(tree.file(0)));
  nvme.set(FaultyStore::Fault::kFail, -EIO);
  IoLoop io(8);
  int rc = 1;
  auto buf1 = std::make_shared<Bytes>(tree.manifest.entry(tree.file(1)).size);
  store.start_fetch(io, tree.file(1), buf1, [&](int r) { rc = r; });
  for (int i = 0; i < 1000 && rc == 1; ++i) io.run(10ms);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(std::string(buf1->begin(), buf1->end()), tree.bytes(tree.file(1)));
  EXPECT_EQ(source.reads_of(tree.file(1)), 1u);
}

// A store that keeps the copies offered to it (NVMe's part), in memory.
class Keeper final : public Store {
 public:
  Origin origin() const override { return Origin::kNvme; }
  bool may_hold(EntryId id) const override { return held.count(id) != 0; }
  int fetch(EntryId, const Buffer&) override { return -ENOENT; }
  void start_fetch(IoLoop&, EntryId, Buffer, Done done) override { done(-ENOENT); }
  void start_offer(IoLoop&, EntryId id, FileBytes bytes, Done done) override {
    if (fail) return done(-ENOSPC);
    held[id] = std::move(bytes);
    done(0);
  }
  bool keeps_copies() const override { return admitting; }

  std::map<EntryId, FileBytes> held;
  bool fail = false, admitting = true;
};

// An admission rule that says yes while it has room for `room` more copies, and writes down what it did.
struct Rule final : Admission {
  bool admit(EntryId id, uint64_t, uint64_t key) override {
    asked.emplace_back(id, key);
    return room > 0 && room-- > 0;
  }
  std::vector<Copy> admit_waiting(std::vector<Copy>& waiting, size_t most) override {
    std::vector<Copy> admitted;
    size_t n = 0;
    for (; n < waiting.size() && admitted.size() < most; ++n)
      if (room > 0 && room-- > 0) admitted.push_back(Copy{waiting[n].id, waiting[n].bytes, 100 + n});
    waiting.erase(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(n));
    return admitted;
  }
  void kept(EntryId id, uint64_t key) override { kept_as.emplace_back(id, key); }

  uint64_t room = 0;
  std::vector<std::pair<EntryId, uint64_t>> asked, kept_as;
};

struct CopyUpTest : ::testing::Test {
  CopyUpTest() : tree({100, 200, 300, 400}), source(tree), chain({&keeper}, source, &rule), io(8) {}
  FileBytes bytes(size_t i) {
    const std::string b = tree.bytes(tree.file(i));
    return std::make_shared<const Bytes>(b.begin(), b.end());
  }
  // Stages file i through the chain as the stager does, answering that a copy is for the use at `keep`
  // (none: no copy); whether it was found.
  bool stage(StoreChain& through, size_t i, Store::Keep keep) {
    auto buf = std::make_shared<Bytes>(tree.manifest.entry(tree.file(i)).size);
    int rc = 1;
    through.start_find(io, tree.file(i), buf, Store::Route{Origin::kNvme}, [&](const Store::Found& f) {
      rc = f.rc;
      return keep;
    });
    for (int k = 0; k < 1000 && rc == 1; ++k) io.run(10ms);
    return rc == 0;
  }
  fakes::MemoryTree tree;
  fakes::MemorySource source;
  Keeper keeper;
  Rule rule;
  StoreChain chain;
  IoLoop io;
};

TEST_F(CopyUpTest, AStagedFileGoesUpWhenTheRuleMakesRoomAndTheRuleIsToldOnceItIsKept) {
  rule.room = 1;
  ASSERT_TRUE(stage(chain, 0, 7));
  EXPECT_TRUE(keeper.may_hold(tree.file(0)));
  EXPECT_EQ(rule.kept_as, (std::vector<std::pair<EntryId, uint64_t>>{{tree.file(0), 7}}));
  ASSERT_TRUE(stage(chain, 0, 9));  // held: the rule is not asked again
  ASSERT_TRUE(stage(chain, 1, 8));  // no room
  EXPECT_FALSE(keeper.may_hold(tree.file(1)));
  EXPECT_EQ(rule.asked.size(), 2u);
  ASSERT_TRUE(stage(chain, 3, std::nullopt));  // its reader said no copy is wanted: the rule is not asked
  EXPECT_EQ(rule.asked.size(), 2u);
  keeper.fail = true;  // a write that fails is not kept (the store counts it)
  rule.room = 1;
  ASSERT_TRUE(stage(chain, 2, 3));
  EXPECT_EQ(rule.asked.size(), 3u);
  EXPECT_EQ(rule.kept_as.size(), 1u);
}

TEST_F(CopyUpTest, FilesReadOnDemandWaitForRoomInTheRingThenGoUpAsTheRuleSays) {
  rule.room = 10;
  for (size_t i = 0; i < 3; ++i) chain.hold_copy(tree.file(i), bytes(i));
  EXPECT_TRUE(chain.copies_held());
  EXPECT_EQ(chain.write_held(io, 0), 0u);  // the ring is full
  EXPECT_EQ(chain.write_held(io, 2), 2u);
  EXPECT_TRUE(chain.copies_held());
  EXPECT_EQ(chain.write_held(io, 5), 1u);
  EXPECT_FALSE(chain.copies_held());
  EXPECT_EQ(rule.kept_as.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(keeper.may_hold(tree.file(i))) << i;
  chain.hold_copy(tree.file(0), bytes(0));  // held already: not queued
  EXPECT_FALSE(chain.copies_held());
  chain.hold_copy(tree.file(3), bytes(3));
  keeper.admitting = false;  // the store takes no more copies (its directory went read-only): let go
  EXPECT_FALSE(chain.copies_held());
  EXPECT_EQ(chain.write_held(io, 5), 0u);
}

TEST_F(CopyUpTest, WithoutAStoreThatKeepsCopiesNothingGoesUp) {
  StoreChain alone({}, source, &rule);
  rule.room = 10;
  ASSERT_TRUE(stage(alone, 0, 1));
  alone.hold_copy(tree.file(1), bytes(1));
  EXPECT_FALSE(alone.copies_held());
  EXPECT_TRUE(rule.asked.empty());
}

}  // namespace
}  // namespace clairfs
