// The oracle: the exact order in which each training rank reads the samples, for any epoch.
//
// A pure function of the sample count and the loader settings (the Schedule). Every epoch is computed
// directly from the seed and the epoch number — never by replaying earlier epochs — so a job restarted
// at start_epoch=57 is predicted as exactly as one that ran from 0. Orders:
//
//   torch         DistributedSampler(shuffle=True, seed) + set_epoch(e): MT19937 seeded with the low 32
//                 bits of seed + e, torch.randperm, padded (or cut, with drop_last) to a multiple of
//                 world_size; rank r takes entries r, r + R, r + 2R, ...
//   torch-random  RandomSampler(generator=g) with g.manual_seed(seed) once: one generator across epochs,
//                 each epoch drawing [2 for the DataLoader's base seed if it shares g,] one permutation
//                 used and a second one thrown away when the sampler is exhausted.
//   torch-global  RandomSampler without a generator: each epoch it seeds a fresh generator with a 64-bit
//                 draw from torch's global one (torch.manual_seed(seed)), after the DataLoader's base seed
//                 (also from the global one) and `draws` outputs the script took before the first epoch.
//   sequential    DistributedSampler(shuffle=False): 0 .. N-1, padded and split the same way.
//   list          the user's order file (see OrderList).
//   clairfs       clairfs's own portable shuffle (docs/order.md), split like torch.
//
// Batch k of a rank (its entries kB .. kB+B-1) is loaded by DataLoader worker k mod W.
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "clairfs/options.hpp"

namespace clairfs {

// Which torch.randperm the job's torch uses (torch changed it for very large N).
enum class TorchShuffle {
  kClassic,    // Fisher-Yates with 32-bit draws for every N (torch 1.x)
  kLargeSplit  // the same below 214,748,364 samples, inside-out with 64-bit draws at or above (torch 2.x)
};

// An order given by the user (order=list). Sample indices per epoch section; either one global sequence
// (split across ranks like DistributedSampler) or one sequence per rank.
struct OrderList {
  struct Section {
    uint64_t first_epoch = 0;
    std::vector<uint32_t> global;                // split across ranks like DistributedSampler
    std::vector<std::vector<uint32_t>> by_rank;  // or given per rank (index = rank); empty if global
  };
  std::vector<Section> sections;  // sorted by first_epoch; an epoch uses the last section at or before it
};

struct Schedule {
  Order order = Order::kTorch;
  SeedInt seed = 0;
  uint64_t world_size = 1;
  uint64_t batch_size = 1;
  bool drop_last = false;
  bool loader_drop_last = false;
  uint64_t workers = 0;
  uint64_t prefetch_factor = 2;
  TorchShuffle torch_shuffle = TorchShuffle::kLargeSplit;
  bool shared_generator = true;     // torch-random: the DataLoader draws its base seed from the same generator
  bool persistent_workers = false;  // torch-random, torch-global: ... and then only once, at its first epoch
  uint64_t start_epoch = 0;         // torch-random, torch-global: the generator is seeded when the run starts, here
  uint64_t draws = 0;               // torch-global: outputs the script drew before the first epoch's loader
  std::shared_ptr<const OrderList> list;  // order=list
};

// One epoch's order for every rank, 4 bytes per entry.
class EpochOrder {
 public:
  EpochOrder(std::vector<uint32_t> interleaved, uint64_t world_size, uint64_t per_rank, uint64_t readable);
  // Every rank reads the same sequence (RandomSampler has no notion of ranks).
  static EpochOrder same_for_all(std::vector<uint32_t> sequence, uint64_t world_size, uint64_t batch_size,
                                 bool loader_drop_last);
  // Per-rank sequences given directly (order=list with @rank sections).
  EpochOrder(const std::vector<std::vector<uint32_t>>& by_rank, uint64_t world_size, uint64_t batch_size,
             bool loader_drop_last);

  uint64_t world_size() const { return world_size_; }
  // Samples the rank's sampler yields (DistributedSampler's num_samples).
  uint64_t per_rank(uint64_t rank) const;
  // Samples the rank's DataLoader actually loads (the last short batch dropped with loader_drop_last).
  uint64_t loaded(uint64_t rank) const;
  // The sample index of rank's k-th item. REQUIRES: k < per_rank(rank), rank < world_size.
  uint32_t at(uint64_t rank, uint64_t k) const;
  // Bytes held.
  size_t memory_bytes() const { return data_.capacity() * sizeof(uint32_t) + rank_begin_.capacity() * 16; }
  // Rank's loaded sequence.
  std::vector<uint32_t> rank_sequence(uint64_t rank) const;

 private:
  std::vector<uint32_t> data_;  // interleaved: entry k*R + r is rank r's k-th; or rank-major when ragged
  uint64_t world_size_;
  uint64_t stride_;    // interleaved: world_size; shared by all ranks: 0 (rank r's k-th is data_[k])
  uint64_t per_rank_;  // interleaved layout
  uint64_t loaded_;
  std::vector<uint64_t> rank_begin_;  // ragged layout (order=list per rank): offsets into data_
  std::vector<uint64_t> rank_loaded_;
};

class Oracle {
 public:
  // Throws UsageError if the schedule cannot describe num_samples (an order_file naming samples that do
  // not exist, ...).
  Oracle(uint64_t num_samples, Schedule schedule);

  uint64_t num_samples() const { return n_; }
  const Schedule& schedule() const { return s_; }

  // The epoch's order for all ranks. Thread-safe; each call computes afresh.
  EpochOrder epoch(uint64_t epoch) const;

  // The DataLoader worker that loads a rank's k-th loaded item (0 when workers == 0).
  uint64_t worker_of(uint64_t k) const;
  // A rank's loaded sequence split by worker: result[w] is what worker w opens, in order.
  std::vector<std::vector<uint32_t>> by_worker(const EpochOrder& order, uint64_t rank) const;

 private:
  std::vector<uint32_t> permutation(uint64_t epoch) const;
  // DistributedSampler's padding (or cut) and rank split of one global order.
  EpochOrder split(std::vector<uint32_t> indices) const;

  uint64_t n_;
  Schedule s_;
};

// Low-level generators, exposed for tests and benchmarks.
namespace shuffle {
// torch 2 keeps the classic loop below this many samples (uint32 max / 20) and switches above it.
constexpr uint64_t kLargeSplitThreshold = 0xffffffffull / 20;
// torch.randperm(n) from a generator freshly seeded with `seed32` (MT19937, init_genrand).
std::vector<uint32_t> torch_randperm(uint64_t n, uint32_t seed32, TorchShuffle kind);
// The low 32 bits of Python's seed + epoch, as torch.Generator.manual_seed keeps them.
uint32_t torch_seed32(SeedInt seed, uint64_t epoch);
// torch.randperm(n) draws this many 32-bit outputs from its generator.
uint64_t torch_randperm_draws(uint64_t n, TorchShuffle kind);
// The seed (low 32 bits) RandomSampler without a generator gives its own at `epoch` (counted from the
// script's torch.manual_seed(seed)): the second half of a 64-bit draw from the global generator, after
// `draws` outputs and the DataLoader's base seeds (one per epoch, or one in all with persistent workers).
uint32_t torch_global_seed32(SeedInt seed, uint64_t draws, uint64_t epoch, bool persistent_workers);
// torch.randperm(n) from a generator that has already produced `skip` outputs since manual_seed(seed32).
std::vector<uint32_t> torch_randperm_after(uint64_t n, uint32_t seed32, uint64_t skip, TorchShuffle kind);
// clairfs's own shuffle (docs/order.md).
std::vector<uint32_t> clairfs_permutation(uint64_t n, SeedInt seed, uint64_t epoch);
}  // namespace shuffle

// Parses an order file against the manifest's samples. `resolve` maps a path (relative to the mount
// root) to a sample index, or returns -1. Throws UsageError naming the file, line and problem.
OrderList parse_order_file(const std::string& file, uint64_t num_samples, uint64_t world_size,
                           const std::function<int64_t(const std::string&)>& resolve);
// The same, from a stream; `file` names it in messages.
OrderList parse_order_stream(std::istream& in, const std::string& file, uint64_t num_samples, uint64_t world_size,
                             const std::function<int64_t(const std::string&)>& resolve);

}  // namespace clairfs
