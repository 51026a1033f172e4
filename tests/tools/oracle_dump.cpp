// Test tool: answers oracle queries read from stdin, one per line, so scripts can compare with torch.
//   rank ORDER N WORLD RANK SEED EPOCH DROP_LAST BATCH LOADER_DROP_LAST WORKERS SHARED PERSISTENT START KIND [DRAWS]
//       -> rank's loaded sequence, space separated
//   workers ...same fields...   -> one line per worker: its sequence
//   head N SEED32 KIND         -> the first 8 and the last 4 entries of torch.randperm(N)
// ORDER is torch, torch-random, torch-global, sequential or clairfs; KIND is classic or split; SEED any integer.
#include <iostream>
#include <sstream>
#include <string>

#include "clairfs/oracle.hpp"

namespace {

clairfs::SeedInt parse_seed(const std::string& s) {
  clairfs::SeedInt v = 0;
  bool neg = s[0] == '-';
  for (size_t i = neg ? 1 : 0; i < s.size(); ++i) v = v * 10 + (s[i] - '0');
  return neg ? -v : v;
}

}  // namespace

int main() {
  using namespace clairfs;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "head") {
      uint64_t n;
      uint32_t seed;
      std::string kind;
      in >> n >> seed >> kind;
      auto p = shuffle::torch_randperm(n, seed, kind == "split" ? TorchShuffle::kLargeSplit : TorchShuffle::kClassic);
      for (size_t i = 0; i < 8 && i < p.size(); ++i) std::cout << p[i] << ' ';
      for (size_t i = p.size() >= 4 ? p.size() - 4 : 0; i < p.size(); ++i) std::cout << p[i] << ' ';
      std::cout << std::endl;
      continue;
    }
    std::string order, seed, kind;
    uint64_t n, world, rank, epoch, batch, workers, start;
    int drop_last, loader_drop_last, shared, persistent;
    in >> order >> n >> world >> rank >> seed >> epoch >> drop_last >> batch >> loader_drop_last >> workers >>
        shared >> persistent >> start >> kind;
    uint64_t draws = 0;
    in >> draws;
    Schedule s;
    s.order = order == "torch"          ? Order::kTorch
              : order == "torch-random" ? Order::kTorchRandom
              : order == "torch-global" ? Order::kTorchGlobal
              : order == "sequential"   ? Order::kSequential
                                        : Order::kClairfs;
    s.seed = parse_seed(seed);
    s.world_size = world;
    s.batch_size = batch;
    s.drop_last = drop_last;
    s.loader_drop_last = loader_drop_last;
    s.workers = workers;
    s.shared_generator = shared;
    s.persistent_workers = persistent;
    s.start_epoch = start;
    s.draws = draws;
    s.torch_shuffle = kind == "split" ? TorchShuffle::kLargeSplit : TorchShuffle::kClassic;
    Oracle o(n, s);
    EpochOrder e = o.epoch(epoch);
    if (cmd == "workers") {
      for (const auto& w : o.by_worker(e, rank)) {
        for (auto v : w) std::cout << v << ' ';
        std::cout << '\n';
      }
      std::cout << "." << std::endl;
    } else {
      for (auto v : e.rank_sequence(rank)) std::cout << v << ' ';
      std::cout << std::endl;
    }
  }
  return 0;
}
