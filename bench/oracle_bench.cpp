// Benchmark: time and memory of one epoch's order for every rank, for N samples.
//   oracle_bench N [WORLD] [REPS] [ORDER]  -> one JSON line (median of REPS)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "clairfs/oracle.hpp"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const uint64_t n = std::strtoull(argv[1], nullptr, 10);
  const uint64_t world = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const std::string order = argc > 4 ? argv[4] : "torch";
  clairfs::Schedule s;
  s.order = order == "torch-random" ? clairfs::Order::kTorchRandom
            : order == "clairfs"    ? clairfs::Order::kClairfs
                                    : clairfs::Order::kTorch;
  s.world_size = world;
  s.seed = 42;
  s.batch_size = 256;
  s.workers = 8;
  clairfs::Oracle oracle(n, s);
  std::vector<double> times;
  uint64_t checksum = 0, bytes = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    clairfs::EpochOrder e = oracle.epoch(10 + static_cast<uint64_t>(r));
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (uint64_t rank = 0; rank < world; ++rank) checksum += e.at(rank, e.per_rank(rank) / 2);
    bytes = e.memory_bytes();
  }
  std::sort(times.begin(), times.end());
  std::printf("{\"n\": %llu, \"world\": %llu, \"order\": \"%s\", \"median_s\": %.4f, \"min_s\": %.4f, "
              "\"bytes_per_entry\": %.2f, \"checksum\": %llu}\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(world), order.c_str(),
              times[times.size() / 2], times.front(), static_cast<double>(bytes) / static_cast<double>(n),
              static_cast<unsigned long long>(checksum));
  return 0;
}
