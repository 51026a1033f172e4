// Unit tests for the oracle: the generator, its jump-ahead, the permutations, DistributedSampler's split,
// batches and workers, and the order file. Bit-exactness against real torch is tested separately, with
// torch itself (tests/mount/test_oracle_vs_torch.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include "clairfs/oracle.hpp"
#include "oracle/mt19937.hpp"

namespace clairfs {
namespace {

TEST(Mt19937Test, MatchesTheStandardEngine) {
  for (uint32_t seed : {0u, 1u, 5489u, 42u, 0xffffffffu}) {
    Mt19937 ours(seed);
    std::mt19937 ref(seed);
    for (int i = 0; i < 5000; ++i) ASSERT_EQ(ours(), ref()) << "seed " << seed << " output " << i;
  }
}

TEST(Mt19937Test, TheFirstOutputAloneIsTheFirstOutput) {
  for (uint32_t seed : {0u, 1u, 5u, 42u, 0x9908b0dfu, 0xffffffffu})
    EXPECT_EQ(Mt19937::first_output(seed), Mt19937(seed)());
}

TEST(Mt19937Test, JumpEqualsDrawing) {
  for (uint32_t seed : {7u, 123456789u}) {
    for (uint64_t k : {0ull, 1ull, 623ull, 624ull, 199999ull, 200000ull, 200001ull, 1234567ull, 3000017ull}) {
      Mt19937 jumped(seed), drawn(seed);
      jumped.jump(k);
      drawn.discard(k);
      for (int i = 0; i < 1300; ++i) ASSERT_EQ(jumped(), drawn()) << "seed " << seed << " k " << k << " i " << i;
    }
  }
}

// Straightforward torch.randperm (classic), to check the prefetching version against.
std::vector<uint32_t> reference_randperm(uint64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> r(n);
  std::iota(r.begin(), r.end(), 0u);
  for (uint64_t i = 0; i + 1 < n; ++i) std::swap(r[i], r[i + g() % (n - i)]);
  return r;
}

TEST(ShuffleTest, TorchRandpermIsTheClassicFisherYates) {
  for (uint64_t n : {0ull, 1ull, 2ull, 3ull, 17ull, 1000ull, 100003ull})
    for (uint32_t seed : {0u, 3u, 99u})
      EXPECT_EQ(shuffle::torch_randperm(n, seed, TorchShuffle::kClassic), reference_randperm(n, seed)) << n;
  EXPECT_EQ(shuffle::torch_randperm(1000, 5, TorchShuffle::kLargeSplit), reference_randperm(1000, 5));
}

TEST(ShuffleTest, SeedsAreTakenAsPythonAddsThem) {
  EXPECT_EQ(shuffle::torch_seed32(0, 0), 0u);
  EXPECT_EQ(shuffle::torch_seed32(5, 3), 8u);
  EXPECT_EQ(shuffle::torch_seed32(-1, 0), 0xffffffffu);
  EXPECT_EQ(shuffle::torch_seed32(-3, 5), 2u);
  EXPECT_EQ(shuffle::torch_seed32((SeedInt{1} << 32) + 7, 1), 8u);
  EXPECT_EQ(shuffle::torch_seed32((SeedInt{1} << 64) - 1, 0), 0xffffffffu);
}

TEST(ShuffleTest, ClairfsPermutationIsAPermutationPerEpoch) {
  auto a = shuffle::clairfs_permutation(10000, 42, 0);
  auto b = shuffle::clairfs_permutation(10000, 42, 1);
  auto c = shuffle::clairfs_permutation(10000, 42, 0);
  EXPECT_EQ(a, c);
  EXPECT_NE(a, b);
  std::sort(b.begin(), b.end());
  for (uint32_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], i);
  // Pinned values: docs/order.md's reference implementation must keep producing these.
  EXPECT_EQ(shuffle::clairfs_permutation(8, 0, 0), (std::vector<uint32_t>{2, 7, 4, 1, 6, 5, 0, 3}));
}

Schedule torch_schedule(uint64_t world, uint64_t batch, bool drop_last, bool loader_drop_last, uint64_t workers) {
  Schedule s;
  s.order = Order::kSequential;
  s.world_size = world;
  s.batch_size = batch;
  s.drop_last = drop_last;
  s.loader_drop_last = loader_drop_last;
  s.workers = workers;
  return s;
}

TEST(OracleTest, DistributedSamplerPadsCyclicallyAndSplits) {
  Oracle o(10, torch_schedule(4, 1, false, false, 0));
  EpochOrder e = o.epoch(0);
  EXPECT_EQ(e.per_rank(0), 3u);
  EXPECT_EQ(e.rank_sequence(0), (std::vector<uint32_t>{0, 4, 8}));
  EXPECT_EQ(e.rank_sequence(1), (std::vector<uint32_t>{1, 5, 9}));
  EXPECT_EQ(e.rank_sequence(2), (std::vector<uint32_t>{2, 6, 0}));
  EXPECT_EQ(e.rank_sequence(3), (std::vector<uint32_t>{3, 7, 1}));
  Oracle cut(10, torch_schedule(4, 1, true, false, 0));
  EXPECT_EQ(cut.epoch(0).rank_sequence(3), (std::vector<uint32_t>{3, 7}));
  // Fewer samples than ranks: padding repeats the whole list.
  Oracle tiny(2, torch_schedule(5, 1, false, false, 0));
  EXPECT_EQ(tiny.epoch(0).rank_sequence(4), (std::vector<uint32_t>{0}));
  EXPECT_EQ(tiny.epoch(0).rank_sequence(3), (std::vector<uint32_t>{1}));
  Oracle none(2, torch_schedule(5, 1, true, false, 0));
  EXPECT_TRUE(none.epoch(0).rank_sequence(0).empty());
}

TEST(OracleTest, BatchesGoToWorkersRoundRobin) {
  Oracle o(23, torch_schedule(1, 4, false, true, 3));
  EpochOrder e = o.epoch(0);
  EXPECT_EQ(e.loaded(0), 20u);  // the last short batch (3 samples) is dropped
  auto w = o.by_worker(e, 0);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], (std::vector<uint32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(w[1], (std::vector<uint32_t>{4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_EQ(w[2], (std::vector<uint32_t>{8, 9, 10, 11}));
  Oracle main_process(5, torch_schedule(1, 2, false, false, 0));
  EXPECT_EQ(main_process.by_worker(main_process.epoch(0), 0).size(), 1u);
}

TEST(OracleTest, EpochsAreIndependentAndDirect) {
  Schedule s = torch_schedule(3, 8, false, false, 2);
  s.order = Order::kTorch;
  s.seed = 11;
  Oracle o(1000, s);
  EpochOrder late = o.epoch(57);
  auto perm = shuffle::torch_randperm(1000, 68, s.torch_shuffle);
  for (uint64_t k = 0; k < late.per_rank(1); ++k) ASSERT_EQ(late.at(1, k), perm[(k * 3 + 1) % 1000]);
}

TEST(OracleTest, TorchRandomSkipsWhatEarlierEpochsDrew) {
  Schedule s = torch_schedule(1, 1, false, false, 0);
  s.order = Order::kTorchRandom;
  s.seed = 3;
  Oracle o(500, s);
  // Epoch 2 by hand: base seed (2) + perm (499) + thrown-away perm (499), twice, then base seed (2).
  Mt19937 g(3);
  g.discard(2 * (2 + 2 * 499) + 2);
  std::vector<uint32_t> r(500);
  std::iota(r.begin(), r.end(), 0u);
  for (uint64_t i = 0; i + 1 < 500; ++i) std::swap(r[i], r[i + g() % (500 - i)]);
  EXPECT_EQ(o.epoch(2).rank_sequence(0), r);
}

class OrderFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/clairfs-order-XXXXXX";
    int fd = ::mkstemp(tmpl);
    ::close(fd);
    file_ = tmpl;
  }
  void TearDown() override { ::unlink(file_.c_str()); }
  OrderList parse(const std::string& text, uint64_t world = 2) {
    std::ofstream(file_) << text;
    return parse_order_file(file_, 10, world, [](const std::string& p) -> int64_t {
      return p.size() == 6 && p.rfind("s", 0) == 0 ? std::stoll(p.substr(1, 1)) : -1;
    });
  }
  std::string error(const std::string& text, uint64_t world = 2) {
    try {
      parse(text, world);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }
  std::string file_;
};

TEST_F(OrderFileTest, ParsesSectionsAndRanks) {
  OrderList l = parse("# my order\ns3.png\n./s1.png\n\n@epoch 2\n@rank 1\ns0.png\n@rank 0\ns2.png\ns4.png\n");
  ASSERT_EQ(l.sections.size(), 2u);
  EXPECT_EQ(l.sections[0].global, (std::vector<uint32_t>{3, 1}));
  EXPECT_EQ(l.sections[1].first_epoch, 2u);
  EXPECT_EQ(l.sections[1].by_rank[0], (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(l.sections[1].by_rank[1], (std::vector<uint32_t>{0}));
  Schedule s;
  s.order = Order::kList;
  s.world_size = 2;
  s.list = std::make_shared<OrderList>(l);
  Oracle o(10, s);
  EXPECT_EQ(o.epoch(0).rank_sequence(0), (std::vector<uint32_t>{3}));
  EXPECT_EQ(o.epoch(1).rank_sequence(1), (std::vector<uint32_t>{1}));
  EXPECT_EQ(o.epoch(5).rank_sequence(0), (std::vector<uint32_t>{2, 4}));
}

TEST_F(OrderFileTest, BadFilesNameTheLine) {
  EXPECT_NE(error("s1.png\nnope.png\n").find("line 2"), std::string::npos);
  EXPECT_NE(error("@epoch x\n").find("line 1"), std::string::npos);
  EXPECT_NE(error("@rank 2\ns1.png\n").find("world_size"), std::string::npos);
  EXPECT_NE(error("@epoch 3\ns1.png\n@epoch 3\ns2.png\n").find("increase"), std::string::npos);
  EXPECT_NE(error("# nothing\n").find("no samples"), std::string::npos);
  EXPECT_NE(error("@bogus 1\n").find("unknown"), std::string::npos);
  // A sign after a second space was taken for a number (2^64 - 5); so was a plus sign.
  EXPECT_NE(error("@epoch  -5\ns1.png\n").find("non-negative number"), std::string::npos);
  EXPECT_NE(error("@epoch +5\ns1.png\n").find("non-negative number"), std::string::npos);
  EXPECT_NE(error("@rank  0\ns1.png\n").find("non-negative number"), std::string::npos);
}

}  // namespace
}  // namespace clairfs
