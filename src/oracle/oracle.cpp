// Epoch orders: the permutation of the chosen sampler, DistributedSampler's padding and split, and the
// DataLoader's batches and workers. See clairfs/oracle.hpp.
#include "clairfs/oracle.hpp"

#include <algorithm>
#include <numeric>

#include "util/memory.hpp"

namespace clairfs {

namespace {

// DistributedSampler.num_samples: N / R rounded down with drop_last, else up.
uint64_t per_rank_count(uint64_t n, uint64_t world, bool drop_last) {
  return drop_last ? n / world : (n + world - 1) / world;
}

uint64_t loaded_count(uint64_t per_rank, uint64_t batch, bool loader_drop_last) {
  return loader_drop_last ? per_rank / batch * batch : per_rank;
}

}  // namespace

EpochOrder::EpochOrder(std::vector<uint32_t> interleaved, uint64_t world_size, uint64_t per_rank, uint64_t loaded)
    : data_(std::move(interleaved)), world_size_(world_size), stride_(world_size), per_rank_(per_rank),
      loaded_(loaded) {}

EpochOrder EpochOrder::same_for_all(std::vector<uint32_t> sequence, uint64_t world_size, uint64_t batch_size,
                                    bool loader_drop_last) {
  const uint64_t n = sequence.size();
  EpochOrder e(std::move(sequence), world_size, n, loaded_count(n, batch_size, loader_drop_last));
  e.stride_ = 0;
  return e;
}

EpochOrder::EpochOrder(const std::vector<std::vector<uint32_t>>& by_rank, uint64_t world_size, uint64_t batch_size,
                       bool loader_drop_last)
    : world_size_(world_size), stride_(world_size), per_rank_(0), loaded_(0) {
  for (uint64_t r = 0; r < world_size; ++r) {
    rank_begin_.push_back(data_.size());
    if (r < by_rank.size()) data_.insert(data_.end(), by_rank[r].begin(), by_rank[r].end());
    rank_loaded_.push_back(loaded_count(data_.size() - rank_begin_.back(), batch_size, loader_drop_last));
  }
  rank_begin_.push_back(data_.size());
}

uint64_t EpochOrder::per_rank(uint64_t rank) const {
  return rank_begin_.empty() ? per_rank_ : rank_begin_[rank + 1] - rank_begin_[rank];
}

uint64_t EpochOrder::loaded(uint64_t rank) const { return rank_begin_.empty() ? loaded_ : rank_loaded_[rank]; }

uint32_t EpochOrder::at(uint64_t rank, uint64_t k) const {
  if (!rank_begin_.empty()) return data_[rank_begin_[rank] + k];
  return stride_ == 0 ? data_[k] : data_[k * stride_ + rank];
}

std::vector<uint32_t> EpochOrder::rank_sequence(uint64_t rank) const {
  std::vector<uint32_t> out(loaded(rank));
  for (uint64_t k = 0; k < out.size(); ++k) out[k] = at(rank, k);
  return out;
}

Oracle::Oracle(uint64_t num_samples, Schedule schedule) : n_(num_samples), s_(std::move(schedule)) {
  if (n_ > 0xffffffffull) throw UsageError("more than 2^32 samples");
  if (s_.order == Order::kList && !s_.list) throw UsageError("order=list needs order_file=FILE");
}

std::vector<uint32_t> Oracle::permutation(uint64_t epoch) const {
  switch (s_.order) {
    case Order::kTorch:
      return shuffle::torch_randperm(n_, shuffle::torch_seed32(s_.seed, epoch), s_.torch_shuffle);
    case Order::kTorchRandom: {
      // One generator, seeded when the script starts (at start_epoch). Each epoch's DataLoader iterator
      // draws a 64-bit base seed from it if it is shared (once only, with persistent workers), then the
      // sampler draws the permutation and, when it runs dry, a second one that is thrown away.
      const uint64_t j = epoch > s_.start_epoch ? epoch - s_.start_epoch : 0;
      const uint64_t perm_draws = shuffle::torch_randperm_draws(n_, s_.torch_shuffle);
      const uint64_t base_seeds = !s_.shared_generator ? 0 : s_.persistent_workers ? 1 : j + 1;
      const uint64_t skip = 2 * base_seeds + 2 * perm_draws * j;
      return shuffle::torch_randperm_after(n_, shuffle::torch_seed32(s_.seed, 0), skip, s_.torch_shuffle);
    }
    case Order::kTorchGlobal: {
      const uint64_t j = epoch > s_.start_epoch ? epoch - s_.start_epoch : 0;
      return shuffle::torch_randperm(n_, shuffle::torch_global_seed32(s_.seed, s_.draws, j, s_.persistent_workers),
                                     s_.torch_shuffle);
    }
    case Order::kSequential: {
      std::vector<uint32_t> r;
      assign_huge(r, n_, 0u);
      std::iota(r.begin(), r.end(), 0u);
      return r;
    }
    case Order::kClairfs:
      return shuffle::clairfs_permutation(n_, s_.seed, epoch);
    case Order::kList:
      break;
  }
  return {};
}

EpochOrder Oracle::epoch(uint64_t epoch) const {
  const uint64_t world = s_.world_size;
  if (s_.order == Order::kList) {
    const OrderList::Section* section = &s_.list->sections.front();
    for (const auto& sec : s_.list->sections)
      if (sec.first_epoch <= epoch) section = &sec;
    if (!section->by_rank.empty()) return EpochOrder(section->by_rank, world, s_.batch_size, s_.loader_drop_last);
    return split(section->global);
  }
  if (s_.order == Order::kTorchRandom || s_.order == Order::kTorchGlobal) {
    // RandomSampler has no notion of ranks: every rank's loader reads the whole permutation.
    return EpochOrder::same_for_all(permutation(epoch), world, s_.batch_size, s_.loader_drop_last);
  }
  return split(permutation(epoch));
}

EpochOrder Oracle::split(std::vector<uint32_t> indices) const {
  // DistributedSampler: extend cyclically (no drop_last) or cut (drop_last) to per_rank * world entries;
  // rank r takes r, r + R, ... — which is exactly the interleaved layout.
  const uint64_t world = s_.world_size;
  const uint64_t n = indices.size();
  const uint64_t per_rank = n == 0 ? 0 : per_rank_count(n, world, s_.drop_last);
  const uint64_t total = per_rank * world;
  if (total <= n) {
    indices.resize(total);
  } else {
    reserve_huge(indices, total);
    for (uint64_t i = n; i < total; ++i) indices.push_back(indices[i - n]);
  }
  return EpochOrder(std::move(indices), world, per_rank, loaded_count(per_rank, s_.batch_size, s_.loader_drop_last));
}

uint64_t Oracle::worker_of(uint64_t k) const {
  return s_.workers == 0 ? 0 : (k / s_.batch_size) % s_.workers;
}

std::vector<std::vector<uint32_t>> Oracle::by_worker(const EpochOrder& order, uint64_t rank) const {
  std::vector<std::vector<uint32_t>> out(std::max<uint64_t>(1, s_.workers));
  for (uint64_t k = 0; k < order.loaded(rank); ++k) out[worker_of(k)].push_back(order.at(rank, k));
  return out;
}

}  // namespace clairfs
