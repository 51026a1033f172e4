// The permutations: torch.randperm (both generations) and clairfs's own shuffle.
//
// torch.randperm's Fisher-Yates swaps element i with a random element at or after it. For 14 M samples
// the 57 MB array does not fit any cache, so each swap would wait on memory; the random draws, though,
// do not depend on the array, so we draw them a few steps ahead and prefetch the element each will touch.
#include <algorithm>
#include <numeric>

#include "clairfs/oracle.hpp"
#include "oracle/mt19937.hpp"
#include "util/memory.hpp"

namespace clairfs::shuffle {

namespace {

// How far ahead draws are made and their targets prefetched: enough to cover a DRAM miss.
constexpr uint64_t kLookahead = 16;

// REQUIRES: r.size() < 2^32 (so a 32-bit modulo, several times cheaper than a 64-bit one, is exact).
void classic(std::vector<uint32_t>& r, Mt19937& g) {
  const uint64_t n = r.size();
  auto draw = [&](uint64_t i) { return i + g() % static_cast<uint32_t>(n - i); };
  if (n < 2) return;
  uint64_t ahead[kLookahead];
  const uint64_t steps = n - 1;
  const uint64_t fill = std::min<uint64_t>(kLookahead, steps);
  for (uint64_t i = 0; i < fill; ++i) {
    ahead[i] = draw(i);
    __builtin_prefetch(&r[ahead[i]], 1);
  }
  for (uint64_t i = 0; i < steps; ++i) {
    const uint64_t z = ahead[i % kLookahead];
    const uint64_t next = i + kLookahead;
    if (next < steps) {
      ahead[next % kLookahead] = draw(next);
      __builtin_prefetch(&r[ahead[next % kLookahead]], 1);
    }
    std::swap(r[i], r[z]);
  }
}

uint64_t random64(Mt19937& g) {
  const uint64_t hi = g();
  const uint64_t lo = g();
  return (hi << 32) | lo;
}

// torch 2's inside-out variant for large n: r[i] = r[z]; r[z] = i, z uniform in [0, i].
void inside_out(std::vector<uint32_t>& r, Mt19937& g) {
  for (uint64_t i = 0; i < r.size(); ++i) {
    const uint64_t z = random64(g) % (i + 1);
    r[i] = r[z];
    r[z] = static_cast<uint32_t>(i);
  }
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

uint32_t torch_seed32(SeedInt seed, uint64_t epoch) {
  // Python adds arbitrary-precision ints; manual_seed keeps the two's complement bits; MT uses the low 32.
  const SeedInt sum = seed + static_cast<SeedInt>(epoch);
  return static_cast<uint32_t>(static_cast<SeedUint>(sum) & 0xffffffffu);
}

uint32_t torch_global_seed32(SeedInt seed, uint64_t draws, uint64_t epoch, bool persistent_workers) {
  // Each epoch's DataLoader iterator draws its base seed (64 bits: two outputs) as it is made, then the
  // sampler, at its first item, its own generator's seed: two more, of which manual_seed keeps the low
  // 32 bits — the second output.
  const uint64_t base_seeds = persistent_workers ? 1 : epoch + 1;
  Mt19937 g(torch_seed32(seed, 0));
  g.jump(draws + 2 * base_seeds + 2 * epoch + 1);
  return g();
}

uint64_t torch_randperm_draws(uint64_t n, TorchShuffle kind) {
  if (kind == TorchShuffle::kLargeSplit && n >= kLargeSplitThreshold) return 2 * n;
  return n < 2 ? 0 : n - 1;
}

std::vector<uint32_t> torch_randperm_after(uint64_t n, uint32_t seed32, uint64_t skip, TorchShuffle kind) {
  Mt19937 g(seed32);
  if (skip) g.jump(skip);
  std::vector<uint32_t> r;
  assign_huge(r, n, 0u);
  if (kind == TorchShuffle::kLargeSplit && n >= kLargeSplitThreshold) {
    inside_out(r, g);
  } else {
    std::iota(r.begin(), r.end(), 0u);
    classic(r, g);
  }
  return r;
}

std::vector<uint32_t> torch_randperm(uint64_t n, uint32_t seed32, TorchShuffle kind) {
  return torch_randperm_after(n, seed32, 0, kind);
}

std::vector<uint32_t> clairfs_permutation(uint64_t n, SeedInt seed, uint64_t epoch) {
  // docs/order.md specifies this exactly; examples/clairfs_order.py is a reference implementation.
  uint64_t state = static_cast<uint64_t>(static_cast<SeedUint>(seed)) ^ (epoch * 0xd1342543de82ef95ull);
  splitmix64(state);  // one step so that seed 0, epoch 0 does not start at state 0
  std::vector<uint32_t> r;
  assign_huge(r, n, 0u);
  std::iota(r.begin(), r.end(), 0u);
  for (uint64_t i = n; i > 1; --i) {
    // Lemire's unbiased bounded draw: j uniform in [0, i).
    SeedUint m = static_cast<SeedUint>(splitmix64(state)) * i;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < i) {
      const uint64_t threshold = (0 - i) % i;
      while (low < threshold) {
        m = static_cast<SeedUint>(splitmix64(state)) * i;
        low = static_cast<uint64_t>(m);
      }
    }
    const uint64_t j = static_cast<uint64_t>(m >> 64);
    std::swap(r[i - 1], r[j]);
  }
  return r;
}

}  // namespace clairfs::shuffle
