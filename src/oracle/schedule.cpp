// Builds the oracle's Schedule from the mount options, reading the order file (order=list) against
// the manifest's samples.
#include "oracle/schedule.hpp"

#include <sys/stat.h>

#include <unordered_map>

namespace clairfs {

Schedule schedule_from_options(const Options& o, const Manifest& manifest) {
  Schedule s;
  s.order = o.order;
  s.seed = o.seed;
  s.world_size = o.world_size;
  s.batch_size = o.batch_size;
  s.drop_last = o.drop_last;
  s.loader_drop_last = o.loader_drop_last;
  s.workers = o.workers;
  s.prefetch_factor = o.prefetch_factor;
  s.torch_shuffle = o.torch_version == 1 ? TorchShuffle::kClassic : TorchShuffle::kLargeSplit;
  s.shared_generator = o.shared_generator;
  s.persistent_workers = o.persistent_workers;
  s.start_epoch = o.start_epoch;
  s.draws = o.draws;
  if (o.order == Order::kList) {
    // A path names the sample of the file it resolves to (the first, if several samples reach it).
    std::unordered_map<EntryId, int64_t> sample_of;
    const auto& samples = manifest.samples();
    for (size_t i = samples.size(); i-- > 0;) sample_of[samples[i]] = static_cast<int64_t>(i);
    auto resolve = [&](const std::string& path) -> int64_t {
      const EntryId id = manifest.resolve_relative(path);
      auto it = sample_of.find(id);
      return it == sample_of.end() ? -1 : it->second;
    };
    s.list = std::make_shared<OrderList>(parse_order_file(o.order_file, samples.size(), o.world_size, resolve));
  }
  return s;
}

}  // namespace clairfs
