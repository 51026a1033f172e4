// Benchmark: cache policies on the predicted trace. The trace is what one node's training ranks read
// over several epochs (the oracle's DistributedSampler order, the node's ranks interleaved step by
// step), with each sample's real size. For caches of given fractions of the data set's bytes it reports
// the hit ratio (by files and by bytes) of
//   LRU     what the kernel page cache approximates;
//   MIN     Belady's policy: evict what is used again farthest in the future (never admitting what would
//           be evicted first) — optimal for a known future with unit sizes, the bound to compare with;
//   clairfs the daemon's own staging core, its verbs called as the stager calls them (core_driver.hpp):
//           staging in key order ahead of the readers (here instantly), evicting the resident needed
//           farthest only for a file needed sooner and only within the eviction window. Its "hit ratio"
//           is 1 - fetches / accesses, counting every fetch from SOURCE: staged, wasted or demand.
//
//   cache_sim --root DIR [--seed 0] [--world-size 8] [--ranks-per-node 4] [--epochs 3]
//             [--fractions 0.1,0.25,0.5,1.0] [--loader-window 16]  -> one JSON line per (policy, fraction)
#include <algorithm>
#include <cstdio>
#include <limits>
#include <list>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"
#include "core_driver.hpp"

namespace {

struct Result {
  uint64_t hits = 0, accesses = 0, hit_bytes = 0, bytes = 0;
};

Result lru(const std::vector<uint32_t>& trace, const std::vector<uint64_t>& size, uint64_t capacity) {
  Result r;
  std::list<uint32_t> order;  // most recent first
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> where;
  uint64_t used = 0;
  for (uint32_t s : trace) {
    r.accesses++;
    r.bytes += size[s];
    auto it = where.find(s);
    if (it != where.end()) {
      r.hits++;
      r.hit_bytes += size[s];
      order.splice(order.begin(), order, it->second);
      continue;
    }
    if (size[s] > capacity) continue;
    order.push_front(s);
    where[s] = order.begin();
    used += size[s];
    while (used > capacity) {
      used -= size[order.back()];
      where.erase(order.back());
      order.pop_back();
    }
  }
  return r;
}

Result belady(const std::vector<uint32_t>& trace, const std::vector<uint64_t>& size, uint64_t capacity) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> next(trace.size());
  std::unordered_map<uint32_t, uint64_t> last;
  for (uint64_t i = trace.size(); i-- > 0;) {
    auto it = last.find(trace[i]);
    next[i] = it == last.end() ? kNever : it->second;
    last[trace[i]] = i;
  }
  Result r;
  std::set<std::pair<uint64_t, uint32_t>> by_next;  // (next use, sample), farthest last
  std::unordered_map<uint32_t, uint64_t> cached;    // sample -> its next use
  uint64_t used = 0;
  for (uint64_t i = 0; i < trace.size(); ++i) {
    const uint32_t s = trace[i];
    r.accesses++;
    r.bytes += size[s];
    auto it = cached.find(s);
    if (it != cached.end()) {
      r.hits++;
      r.hit_bytes += size[s];
      by_next.erase({it->second, s});
      used -= size[s];
      cached.erase(it);
    }
    if (next[i] == kNever || size[s] > capacity) continue;
    by_next.insert({next[i], s});
    cached[s] = next[i];
    used += size[s];
    while (used > capacity) {  // evict the farthest next use (possibly s itself: bypass)
      auto far = std::prev(by_next.end());
      used -= size[far->second];
      cached.erase(far->second);
      by_next.erase(far);
    }
  }
  return r;
}

// The daemon's own staging core, driven as the stager drives it (core_driver.hpp). Its "hit ratio"
// is 1 - fetches / accesses.
Result clairfs_policy(const clairfs::Manifest& m, const clairfs::Oracle& oracle, uint64_t ranks, uint64_t epochs,
                      uint64_t capacity, uint64_t loader_window) {
  using namespace clairfs;
  const StreamSource src = [&](uint64_t e) {
    const EpochOrder order = oracle.epoch(e);
    std::vector<std::vector<EntryId>> seq(ranks);
    for (uint64_t r = 0; r < ranks; ++r)
      for (uint64_t k = 0; k < order.loaded(r); ++k) seq[r].push_back(m.samples()[order.at(r, k)]);
    return seq;
  };
  core_driver::Config c;
  c.ranks = ranks;
  c.epochs = epochs;
  c.capacity = capacity;
  c.loader_window = loader_window;
  const core_driver::Totals t = core_driver::drive(m, src, c, [](const core_driver::Fetch&) {});
  Result r;
  r.accesses = t.accesses;
  r.bytes = t.bytes;
  r.hits = t.accesses - t.fetches;
  r.hit_bytes = t.bytes - t.fetch_bytes;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, fractions_text = "0.1,0.25,0.5,1.0";
  clairfs::Schedule s;
  s.world_size = 8;
  uint64_t ranks_per_node = 4, epochs = 3, loader_window = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--root") root = v;
    else if (a == "--seed") s.seed = std::stoll(v);
    else if (a == "--world-size") s.world_size = std::stoull(v);
    else if (a == "--ranks-per-node") ranks_per_node = std::stoull(v);
    else if (a == "--epochs") epochs = std::stoull(v);
    else if (a == "--fractions") fractions_text = v;
    else if (a == "--loader-window") loader_window = std::stoull(v);  // files a rank's loader keeps ahead
    else {
      std::fprintf(stderr, "cache_sim: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (root.empty()) {
    std::fprintf(stderr, "usage: cache_sim --root DIR [...]\n");
    return 2;
  }
  const clairfs::Manifest m = clairfs::Manifest::scan(root, clairfs::default_extensions());
  std::vector<uint64_t> size;
  for (clairfs::EntryId id : m.samples()) size.push_back(m.entry(id).size);
  const clairfs::Oracle oracle(size.size(), s);

  // Node 0 serves ranks 0 .. ranks_per_node-1; their streams advance together, step by step.
  std::vector<uint32_t> trace;
  uint64_t node_bytes = 0;
  std::vector<char> seen(size.size(), 0);
  for (uint64_t e = 0; e < epochs; ++e) {
    const clairfs::EpochOrder order = oracle.epoch(e);
    for (uint64_t k = 0; k < order.loaded(0); ++k)
      for (uint64_t r = 0; r < ranks_per_node && r < s.world_size; ++r) {
        const uint32_t smp = order.at(r, k);
        trace.push_back(smp);
        if (!seen[smp]) node_bytes += size[smp];
        seen[smp] = 1;
      }
  }
  std::stringstream fs(fractions_text);
  for (std::string f; std::getline(fs, f, ',');) {
    const double fraction = std::stod(f);
    const uint64_t capacity = static_cast<uint64_t>(fraction * static_cast<double>(node_bytes));
    for (const char* policy : {"lru", "min", "clairfs"}) {
      const std::string name = policy;
      const Result r = name == "lru"   ? lru(trace, size, capacity)
                       : name == "min" ? belady(trace, size, capacity)
                                       : clairfs_policy(m, oracle, std::min(ranks_per_node, s.world_size), epochs, capacity, loader_window);
      std::printf("{\"policy\": \"%s\", \"fraction\": %.2f, \"hit_ratio\": %.4f, \"byte_hit_ratio\": %.4f, "
                  "\"accesses\": %llu, \"epochs\": %llu, \"ranks_per_node\": %llu}\n",
                  policy, fraction, static_cast<double>(r.hits) / static_cast<double>(r.accesses),
                  static_cast<double>(r.hit_bytes) / static_cast<double>(r.bytes),
                  static_cast<unsigned long long>(r.accesses), static_cast<unsigned long long>(epochs),
                  static_cast<unsigned long long>(ranks_per_node));
    }
  }
  return 0;
}
