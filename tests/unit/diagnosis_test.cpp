// Diagnosis: what order a rank off the plan reads in, named from 64 of its opens. The jobs' opens come
// from the real oracle (the order torch yields), shuffled within windows of 128 the way a DataLoader's
// workers open out of order (4 workers, batch 16, prefetch 2).
#include "engine/diagnosis.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <unordered_map>

#include "fakes/memory_source.hpp"

namespace clairfs {
namespace {

constexpr uint64_t kFiles = 3000;
constexpr uint64_t kTolerance = 1088;  // batch 32, prefetch 2, 8 workers assumed: the default's width

struct Job {
  SeedInt seed = 42;
  uint64_t world_size = 1;
  uint64_t rank = 0;
  uint64_t epoch = 0;
  Order order = Order::kTorch;
  uint64_t draws = 0;  // order=torch-global
};

class Diagnosis : public ::testing::Test {
 protected:
  fakes::MemoryTree tree{std::vector<uint64_t>(kFiles, 1)};

  // `count` opens of the job's rank from its `from`th item on, out of order within windows.
  std::vector<EntryId> opens(const Job& job, size_t from = 200, size_t count = 64) {
    Schedule s;
    s.order = job.order;
    s.seed = job.seed;
    s.world_size = job.world_size;
    s.draws = job.draws;
    const Oracle oracle(kFiles, s);
    std::vector<uint32_t> seq = oracle.epoch(job.epoch).rank_sequence(job.rank);
    std::mt19937 g(5);
    for (size_t i = 0; i + 128 <= seq.size(); i += 128) std::shuffle(seq.begin() + i, seq.begin() + i + 128, g);
    std::vector<EntryId> out;
    for (size_t k = from; k < from + count; ++k) out.push_back(tree.manifest.samples()[seq[k]]);
    return out;
  }
  // `count` opens of the job's rank from the epoch's start as a DataLoader with 2 workers and batches
  // of 16 makes them: worker 0's first item, worker 1's, worker 0's second, ...
  std::vector<EntryId> loader_opens(const Job& job, size_t count) {
    Schedule s;
    s.order = job.order;
    s.seed = job.seed;
    s.draws = job.draws;
    s.batch_size = 16;
    s.workers = 2;
    const Oracle oracle(kFiles, s);
    const auto by_worker = oracle.by_worker(oracle.epoch(job.epoch), 0);
    std::vector<EntryId> out;
    for (size_t k = 0; out.size() < count; ++k)
      for (const auto& w : by_worker) out.push_back(tree.manifest.samples()[w[k]]);
    out.resize(count);
    return out;
  }
  std::optional<std::string> explain_job(const Job& job, MountedOrder mounted, uint64_t plan_epoch, uint64_t rank,
                                         std::optional<uint64_t>* epoch = nullptr) {
    mounted.gap = kTolerance;
    return explain(tree.manifest, mounted, Evidence{rank, plan_epoch, opens(job)}, epoch);
  }
};

TEST_F(Diagnosis, AnotherSeed) {
  Job job;
  job.seed = 43;
  const auto words = explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 0, 0);
  ASSERT_TRUE(words);
  // Torch seeds epoch e with seed + e: seed 43 at epoch 0 is seed 42 at epoch 1, and both are said.
  EXPECT_EQ(*words, "reads as seed=43 (mounted seed=42), or as epoch 1 of seed=42 where the plan is at epoch 0");
  job.seed = 1234;  // a seed people type
  EXPECT_EQ(explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 0, 0).value_or(""), "reads as seed=1234 (mounted seed=42)");
}

TEST_F(Diagnosis, AnotherWorldSizeOrRank) {
  Job job;  // the job runs alone; the mount was told 2 ranks
  EXPECT_EQ(explain_job(job, MountedOrder{Order::kTorch, 42, 2, 0}, 0, 0).value_or(""),
            "reads as world_size=1 (mounted world_size=2, rank 0)");
  job.world_size = 4;
  job.rank = 3;
  EXPECT_EQ(explain_job(job, MountedOrder{Order::kTorch, 42, 2, 0}, 0, 1).value_or(""),
            "reads as world_size=4, rank 3 (mounted world_size=2, rank 1)");
}

TEST_F(Diagnosis, AnEpochThatRepeatsTheFirstOrStartsElsewhere) {
  Job job;  // epoch 0's order again while the plan is at epoch 2: no set_epoch
  std::optional<uint64_t> epoch;
  const auto words = explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 2, 0, &epoch);
  ASSERT_TRUE(words);
  EXPECT_NE(words->find("repeats epoch 0's order in epoch 2"), std::string::npos) << *words;
  EXPECT_NE(words->find("set_epoch"), std::string::npos) << *words;
  EXPECT_FALSE(epoch) << "a job repeating its first epoch is not one to plan from that epoch again";
  // Mounted start_epoch=2, the job starts at 0: the epoch to plan from.
  const auto start = explain_job(job, MountedOrder{Order::kTorch, 42, 1, 2}, 2, 0, &epoch);
  ASSERT_TRUE(start);
  EXPECT_NE(start->find("reads epoch 0's order where the plan is at epoch 2 (mounted start_epoch=2"), std::string::npos) << *start;
  EXPECT_EQ(epoch, 0u);
  // A job restarted at epoch 5 on a mount at epoch 2 (start_epoch=0).
  job.epoch = 5;
  epoch.reset();
  const auto later = explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 2, 0, &epoch);
  ASSERT_TRUE(later);
  EXPECT_EQ(epoch, 5u) << *later;
  // A higher seed is the mounted one at a later epoch (seed 1234 at epoch 0 is seed 42 at 1192), in every
  // epoch after too; a lower seed, or another world size, is no epoch of the mounted order.
  job.epoch = 0;
  job.seed = 1234;
  epoch.reset();
  EXPECT_TRUE(explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 0, 0, &epoch));
  EXPECT_EQ(epoch, 1192u);
  job.seed = 7;
  epoch.reset();
  EXPECT_TRUE(explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 0, 0, &epoch));
  EXPECT_FALSE(epoch);
  job.seed = 42;
  EXPECT_TRUE(explain_job(job, MountedOrder{Order::kTorch, 42, 2, 0}, 1, 0, &epoch));
  EXPECT_FALSE(epoch);
}

TEST_F(Diagnosis, SampleOrder) {
  Job job;
  job.order = Order::kSequential;
  const auto words = explain_job(job, MountedOrder{Order::kTorch, 42, 1, 0}, 0, 0);
  ASSERT_TRUE(words);
  EXPECT_NE(words->find("reads in sample order"), std::string::npos) << *words;
}

// A few opens of a shuffle lie close in sample order by chance now and then (16 of 3,000 samples: 3 times
// in 1,000): the shuffle that fits them better is named, not sample order.
TEST_F(Diagnosis, AShuffleThatLooksLikeSampleOrderByChanceIsNamedAsTheShuffle) {
  std::unordered_map<EntryId, int64_t> sample_of;
  for (size_t s = 0; s < tree.manifest.samples().size(); ++s)
    sample_of[tree.manifest.samples()[s]] = static_cast<int64_t>(s);
  Job job;
  job.seed = 43;
  const int64_t close = static_cast<int64_t>(kFiles / 8);  // how near sample order counts opens for one rank
  size_t chanced = 0;
  for (size_t from = 0; from + kMinDiagnosisOpens <= 2900 && chanced < 3; ++from) {
    const std::vector<EntryId> ids = opens(job, from, kMinDiagnosisOpens);
    size_t near = 0;
    for (size_t i = 1; i < ids.size(); ++i) near += std::llabs(sample_of[ids[i]] - sample_of[ids[i - 1]]) <= close;
    if (10 * near < 6 * (ids.size() - 1)) continue;  // not like sample order
    ++chanced;
    MountedOrder mounted{Order::kTorch, 42, 1, 0};
    mounted.gap = kTolerance;
    EXPECT_EQ(explain(tree.manifest, mounted, Evidence{0, 0, ids}).value_or(""),
              "reads as seed=43 (mounted seed=42), or as epoch 1 of seed=42 where the plan is at epoch 0")
        << "the opens from item " << from;
  }
  EXPECT_GT(chanced, 0u) << "no 16 opens of the shuffle looked like sample order: the test tests nothing";
}

TEST_F(Diagnosis, AnOrderNearNothingIsNotNamed) {
  std::vector<EntryId> ids(tree.manifest.samples().begin(), tree.manifest.samples().end());
  std::mt19937 g(99);
  std::shuffle(ids.begin(), ids.end(), g);
  ids.resize(64);
  MountedOrder mounted{Order::kTorch, 42, 1, 0};
  mounted.gap = kTolerance;
  EXPECT_FALSE(explain(tree.manifest, mounted, Evidence{0, 0, ids}).has_value());
  // Too few opens to tell.
  ids.resize(kMinDiagnosisOpens - 1);
  EXPECT_FALSE(explain(tree.manifest, mounted, Evidence{0, 0, ids}).has_value());
}

// seed=auto: the seed is learned from a job's first opens.
TEST_F(Diagnosis, ASeedIsLearnedFromTheFirstOpens) {
  LearnQuestion q;
  q.gap = kTolerance;
  Job job;
  job.seed = 7;
  auto found = learn_seed(tree.manifest, q, opens(job, 0, kMinDiagnosisOpens));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->seed, 7);
  EXPECT_GE(found->fit, kLearnFit);
  job.seed = 3407;
  EXPECT_EQ(learn_seed(tree.manifest, q, opens(job, 0, 64)).value_or(Learned{}).seed, 3407);
  // A job at epoch 1 of seed 42 reads seed 43's first epoch: the mount plans seed=43 from epoch 0,
  // which is the same order in every epoch after.
  job.seed = 42;
  job.epoch = 1;
  EXPECT_EQ(learn_seed(tree.manifest, q, opens(job, 0, 64)).value_or(Learned{}).seed, 43);
  // Mounted start_epoch=5, the job at its epoch 5 of seed 9.
  q.start_epoch = 5;
  job.seed = 9;
  job.epoch = 5;
  EXPECT_EQ(learn_seed(tree.manifest, q, opens(job, 0, 64)).value_or(Learned{}).seed, 9);
}

TEST_F(Diagnosis, DataLoaderShuffleAfterTorchManualSeedIsLearnedWithTheDrawsBeforeIt) {
  LearnQuestion q;
  q.gap = kTolerance;
  Job job;
  job.order = Order::kTorchGlobal;
  job.seed = 42;
  job.draws = 100;
  auto found = learn_seed(tree.manifest, q, loader_opens(job, 32));
  ASSERT_TRUE(found);
  EXPECT_EQ(learned_options(*found), "seed=42,order=torch-global,draws=100");
  EXPECT_GT(found->candidates, 100000u);
  // Found at its third epoch: each epoch took 4 outputs (the loader's base seed, the sampler's), so
  // the same order from here on is the one of 8 draws more.
  job.epoch = 2;
  EXPECT_EQ(learned_options(learn_seed(tree.manifest, q, loader_opens(job, 32)).value_or(Learned{})),
            "seed=42,order=torch-global,draws=108");
  // Told the job uses DistributedSampler only (not order=torch-global): not learned.
  q.global = false;
  EXPECT_FALSE(learn_seed(tree.manifest, q, loader_opens(job, 32)).has_value());
  // A DistributedSampler job is learned as one, not as some global generator's output.
  q.global = true;
  Job distributed;
  distributed.seed = 5;
  EXPECT_EQ(learned_options(learn_seed(tree.manifest, q, loader_opens(distributed, 32)).value_or(Learned{})), "seed=5");
  // Too many draws before (a model built on the CPU first), or an unlikely seed: nothing.
  job.epoch = 0;
  job.draws = 5000;
  EXPECT_FALSE(learn_seed(tree.manifest, q, loader_opens(job, 32)).has_value());
  job.draws = 0;
  job.seed = 987654321;
  EXPECT_FALSE(learn_seed(tree.manifest, q, loader_opens(job, 32)).has_value());
}

TEST_F(Diagnosis, TwoRanksOnTheNodeAreLearnedTogether) {
  LearnQuestion q;
  q.gap = kTolerance;
  q.world_size = 4;
  q.ranks = {1, 2};
  Job a, b;
  a.seed = b.seed = 11;
  a.world_size = b.world_size = 4;
  a.rank = 1;
  b.rank = 2;
  const auto one = opens(a, 0, 32), two = opens(b, 0, 32);
  std::vector<EntryId> both;  // batches of 8 from each, as two jobs' opens arrive
  for (size_t i = 0; i < 32; i += 8) {
    both.insert(both.end(), one.begin() + static_cast<ptrdiff_t>(i), one.begin() + static_cast<ptrdiff_t>(i + 8));
    both.insert(both.end(), two.begin() + static_cast<ptrdiff_t>(i), two.begin() + static_cast<ptrdiff_t>(i + 8));
  }
  EXPECT_EQ(learn_seed(tree.manifest, q, both).value_or(Learned{}).seed, 11);
  // Ranks this node does not serve: not them.
  q.ranks = {0, 3};
  EXPECT_FALSE(learn_seed(tree.manifest, q, both).has_value());
}

TEST_F(Diagnosis, NoSeedIsLearnedFromAnUnlikelySeedAWalkOrTooFewOpens) {
  LearnQuestion q;
  q.gap = kTolerance;
  Job job;
  job.seed = 987654321;
  EXPECT_FALSE(learn_seed(tree.manifest, q, opens(job, 0, 256)).has_value());
  job.order = Order::kSequential;
  EXPECT_FALSE(learn_seed(tree.manifest, q, opens(job, 0, 256)).has_value());
  job = Job{};
  EXPECT_FALSE(learn_seed(tree.manifest, q, opens(job, 0, kMinDiagnosisOpens - 1)).has_value());
}

TEST_F(Diagnosis, TheDiagnoserAnswersOnItsThreadAndForgets) {
  Diagnoser d(tree.manifest, MountedOrder{Order::kTorch, 42, 1, 0, TorchShuffle::kLargeSplit, kTolerance}, {5});
  Job job;
  job.seed = 1234;
  d.ask(0, Evidence{5, 0, opens(job)});
  for (int i = 0; i < 500 && d.answered() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(d.answer(0), "reads as seed=1234 (mounted seed=42)");
  d.forget(0);
  EXPECT_EQ(d.answer(0), "");
}

}  // namespace
}  // namespace clairfs
