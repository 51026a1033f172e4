// Benchmark: the peers' one cache at cluster scale, simulated with the engine's own code — the oracle
// (each rank's order), plan_owners (who keeps each file for all), and for every node the daemon's staging
// core, its verbs called as its stager calls them (core_driver.hpp: staging and NVMe writes take no time;
// RAM and NVMe budgets `cache` R or R+N, each × the node's share of the data set, NVMe's copies packed:
// their bytes, room asked in 4 KiB blocks; RAM first, copies up to NVMe by next use, as the daemon makes
// them).
//
// Nodes are driven one after another, each through every epoch, with time as the readers' step (all
// ranks move in step); what a node fetches (a file not held when it is staged or read) is then
// attributed: to a peer if the file's keeper held it at some moment between the fetch and the use it was
// for (the daemon asks again, when the readers need it soon, for a file its keeper has not read yet), else
// to SOURCE. The keeper of a file is the node that reads it first in epoch 0 — the only node that reads it
// then — so epoch 0 reads SOURCE once and later epochs fetch from peers what their own cache lacks.
//
// Reports, for each node count and cache: per epoch, SOURCE bytes ÷ data set and peer bytes ÷ data set;
// the kept files' bytes over their keepers' room (÷ data set); bytes a node fetches from peers (mean); the
// busiest keeper's bytes served against the mean; and, for node 0, the plan's time and memory per epoch
// (Planner::build).
//
//   cluster_sim [--samples 1281167] [--classes 1000] [--mean-kb 110] | [--tree DIR]
//               [--nodes 64,256,1024] [--ranks-per-node 4] [--batch 32] [--epochs 3]
//               [--cache 0.5,1,2,0.5+0.5] [--seed 0] [--loader-window 16]
//     -> one JSON line per (nodes, cache)
// --tree DIR simulates the data set of a real tree (its files' sizes and order), as a mount of it sees it.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"
#include "core_driver.hpp"
#include "engine/owners.hpp"

namespace {

using clairfs::EntryId;

// A data set of `samples` files in `classes` folders, sizes spread evenly over 0.2-1.8 × the mean.
clairfs::Manifest synthetic(uint64_t samples, uint64_t classes, uint64_t mean) {
  std::vector<clairfs::Entry> entries(1 + classes + samples);
  std::string names;
  entries[0].mode = S_IFDIR | 0755;
  entries[0].first_child = 1;
  entries[0].child_count = static_cast<uint32_t>(classes);
  entries[0].subdir_count = static_cast<uint32_t>(classes);
  EntryId next = static_cast<EntryId>(1 + classes);
  for (uint64_t c = 0; c < classes; ++c) {
    clairfs::Entry& d = entries[1 + c];
    char name[24];
    std::snprintf(name, sizeof name, "c%06llu", static_cast<unsigned long long>(c));  // sorted as numbers
    d.mode = S_IFDIR | 0755;
    d.name_off = names.size();
    d.name_len = static_cast<uint16_t>(std::strlen(name));
    names += name;
    const uint64_t first = c * samples / classes, end = (c + 1) * samples / classes;
    d.first_child = next;
    d.child_count = static_cast<uint32_t>(end - first);
    for (uint64_t i = first; i < end; ++i, ++next) {
      clairfs::Entry& f = entries[next];
      char file[32];
      std::snprintf(file, sizeof file, "%09llu.jpg", static_cast<unsigned long long>(i));
      f.mode = S_IFREG | 0644;
      f.parent = static_cast<EntryId>(1 + c);
      f.name_off = names.size();
      f.name_len = static_cast<uint16_t>(std::strlen(file));
      names += file;
      f.size = mean / 5 + XXH64(&i, sizeof i, 7) % (mean * 8 / 5 + 1);
    }
  }
  return clairfs::Manifest::from_parts(std::move(entries), std::move(names), clairfs::default_extensions(), "/");
}

std::vector<std::string> items_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string x; std::getline(in, x, ',');) out.push_back(x);
  return out;
}

struct Cache {
  double ram = 0, nvme = 0;  // × the node's share
};

Cache cache_of(const std::string& item) {
  const size_t plus = item.find('+');
  if (plus == std::string::npos) return {std::stod(item), 0};
  return {std::stod(item.substr(0, plus)), std::stod(item.substr(plus + 1))};
}

// The moments a keeper held its files: [from, until) in steps.
struct Hold {
  EntryId id;
  uint64_t from, until;
  bool operator<(const Hold& o) const { return id != o.id ? id < o.id : from < o.from; }
};

class Holds {
 public:
  explicit Holds(size_t entries) : open_(entries, kNone) {}
  void fetched(EntryId id, uint64_t at) {
    if (open_[id] != kNone) return;
    open_[id] = holds_.size();
    holds_.push_back(Hold{id, at, UINT64_MAX});
  }
  void evicted(EntryId id, uint64_t at) {
    if (open_[id] == kNone) return;
    holds_[open_[id]].until = at;
    open_[id] = kNone;
  }
  void done() { std::sort(holds_.begin(), holds_.end()); }
  // Whether the keeper held `id` at some moment in [from, to].
  bool held(EntryId id, uint64_t from, uint64_t to) const {
    auto it = std::lower_bound(holds_.begin(), holds_.end(), Hold{id, 0, 0});
    for (; it != holds_.end() && it->id == id; ++it)
      if (it->from <= to && it->until > from) return true;
    return false;
  }

 private:
  static constexpr size_t kNone = SIZE_MAX;
  std::vector<size_t> open_;
  std::vector<Hold> holds_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t samples = 1281167, classes = 1000, ranks_per_node = 4, epochs = 3, mean_kb = 110, loader_window = 16,
           batch = 32;
  long long seed = 0;
  bool hand_over = true;
  std::string nodes_text = "64,256,1024", cache_text = "0.5,1,2", tree;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--samples") samples = std::stoull(v);
    else if (a == "--classes") classes = std::stoull(v);
    else if (a == "--tree")
      tree = v;
    else if (a == "--nodes") nodes_text = v;
    else if (a == "--ranks-per-node") ranks_per_node = std::stoull(v);
    else if (a == "--batch")
      batch = std::stoull(v);
    else if (a == "--epochs") epochs = std::stoull(v);
    else if (a == "--cache") cache_text = v;
    else if (a == "--mean-kb") mean_kb = std::stoull(v);
    else if (a == "--seed") seed = std::stoll(v);
    else if (a == "--loader-window") loader_window = std::stoull(v);
    else if (a == "--hand-over")
      hand_over = v != "0";
    else {
      std::fprintf(stderr, "cluster_sim: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  const clairfs::Manifest m = tree.empty() ? synthetic(samples, classes, mean_kb * 1000)
                                           : clairfs::Manifest::scan(tree, clairfs::default_extensions());
  samples = m.samples().size();
  uint64_t total = 0;
  for (EntryId id : m.samples()) total += m.entry(id).size;
  std::fprintf(stderr, "cluster_sim: %llu samples, %.3f GB, made in %.1f s\n", static_cast<unsigned long long>(samples),
               static_cast<double>(total) / 1e9, seconds_since(t0));

  for (const std::string& nodes_item : items_of(nodes_text)) {
    const auto nodes = std::stoull(nodes_item);
    clairfs::Schedule s;
    s.seed = seed;
    s.world_size = nodes * ranks_per_node;
    s.batch_size = batch;
    const clairfs::Oracle oracle(m.samples().size(), s);
    t0 = std::chrono::steady_clock::now();
    std::vector<clairfs::EpochOrder> orders;
    for (uint64_t e = 0; e < epochs; ++e) orders.push_back(oracle.epoch(e));
    std::vector<std::vector<uint64_t>> ranks_of_node(nodes);
    for (uint64_t n = 0; n < nodes; ++n)
      for (uint64_t r = 0; r < ranks_per_node; ++r) ranks_of_node[n].push_back(n * ranks_per_node + r);
    const std::vector<uint16_t> first_readers =
        clairfs::plan_owners(m, oracle, 0, ranks_of_node, static_cast<int>(nodes)).owner;
    const double oracle_s = seconds_since(t0);
    std::vector<uint64_t> first_kept(nodes, 0);  // each first reader's files, in bytes
    for (EntryId id : m.samples()) first_kept[first_readers[id]] += m.entry(id).size;

    for (const std::string& cache_item : items_of(cache_text)) {
      const Cache cache = cache_of(cache_item);
      const double share = static_cast<double>(total) / static_cast<double>(nodes);
      const auto ram = static_cast<uint64_t>(cache.ram * share), nvme = static_cast<uint64_t>(cache.nvme * share);
      uint64_t over = 0;  // what the first readers cannot hold
      for (uint64_t n = 0; n < nodes; ++n) over += first_kept[n] > ram + nvme ? first_kept[n] - ram - nvme : 0;
      // The keepers as the daemons choose them, knowing each other's room.
      clairfs::Keepers keepers = clairfs::plan_owners(
          m, oracle, 0, ranks_of_node, static_cast<int>(nodes),
          std::vector<uint64_t>(nodes, hand_over ? clairfs::keeper_room(m, ram, nvme, 1) : UINT64_MAX));
      const std::vector<uint16_t>& owner = keepers.owner;
      std::vector<std::vector<EntryId>> handed(nodes);
      uint64_t handed_bytes = 0;
      for (EntryId id : keepers.handed) handed[owner[id]].push_back(id), handed_bytes += m.entry(id).size;
      Holds holds(m.size());
      std::vector<std::vector<core_driver::Fetch>> fetched(nodes);
      double plan_s = 0, drive_s = 0;
      uint64_t plan_bytes = 0;
      for (uint64_t n = 0; n < nodes; ++n) {
        const clairfs::StreamSource src = [&, n](uint64_t e) {
          std::vector<std::vector<EntryId>> seq(ranks_per_node);
          for (uint64_t r = 0; r < ranks_per_node; ++r) {
            const uint64_t rank = n * ranks_per_node + r;
            seq[r].reserve(orders[e].loaded(rank));
            for (uint64_t k = 0; k < orders[e].loaded(rank); ++k) seq[r].push_back(m.samples()[orders[e].at(rank, k)]);
          }
          return seq;
        };
        if (n == 0) {  // the plan of one epoch, as a node makes it
          const auto p0 = std::chrono::steady_clock::now();
          const clairfs::EpochStreams es = clairfs::Planner::build(src, 0, ranks_per_node, m.size());
          plan_s = seconds_since(p0);
          for (const auto& q : es.seq) plan_bytes += q.capacity() * sizeof(EntryId);
          plan_bytes += es.first.capacity() * sizeof(uint32_t) + es.sparse.capacity() * sizeof(es.sparse[0]) +
                        es.read.capacity() * sizeof(uint64_t);
        }
        core_driver::Config c;
        c.ranks = ranks_per_node;
        c.epochs = epochs;
        c.capacity = ram;
        c.nvme = nvme;
        c.loader_window = loader_window;
        c.owner = owner;
        c.handed = handed[n];
        c.node = static_cast<int>(n);
        const auto d0 = std::chrono::steady_clock::now();
        core_driver::drive(
            m, src, c,
            [&](const core_driver::Fetch& f) {
              fetched[n].push_back(f);
              if (owner[f.id] == n) holds.fetched(f.id, f.at);
            },
            [&](EntryId id, uint64_t at) {
              if (owner[id] == n) holds.evicted(id, at);
            });
        drive_s += seconds_since(d0);
      }
      holds.done();
      std::vector<uint64_t> source(epochs, 0), peer(epochs, 0), served(nodes, 0), from_peers(nodes, 0);
      for (uint64_t n = 0; n < nodes; ++n) {
        for (const core_driver::Fetch& f : fetched[n]) {
          const uint64_t size = m.entry(f.id).size;
          if (owner[f.id] != n && holds.held(f.id, f.at, f.use)) {
            peer[f.epoch] += size;
            served[owner[f.id]] += size;
            from_peers[n] += size;
          } else {
            source[f.epoch] += size;
          }
        }
        fetched[n] = {};
      }
      uint64_t busiest = 0, served_all = 0, fetched_all = 0, source_all = 0;
      for (uint64_t n = 0; n < nodes; ++n) {
        busiest = std::max(busiest, served[n]);
        served_all += served[n];
        fetched_all += from_peers[n];
      }
      for (uint64_t e = 0; e < epochs; ++e) source_all += source[e];
      const auto of_total = [&](uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(total); };
      std::printf(
          "{\"samples\": %llu, \"nodes\": %llu, \"ranks_per_node\": %llu, \"ram\": %.3f, \"nvme\": %.3f, "
          "\"source\": %.3f, \"source_per_epoch\": [",
          static_cast<unsigned long long>(samples), static_cast<unsigned long long>(nodes),
          static_cast<unsigned long long>(ranks_per_node), cache.ram, cache.nvme, of_total(source_all));
      for (uint64_t e = 0; e < epochs; ++e) std::printf("%s%.3f", e ? ", " : "", of_total(source[e]));
      std::printf("], \"peer_per_epoch\": [");
      for (uint64_t e = 0; e < epochs; ++e) std::printf("%s%.3f", e ? ", " : "", of_total(peer[e]));
      const double mean_served = static_cast<double>(served_all) / static_cast<double>(nodes);
      std::printf(
          "], \"over_room\": %.4f, \"handed\": %.4f, \"peer_bytes_per_node\": %.0f, \"busiest_served_over_mean\": "
          "%.2f, "
          "\"plan_ms_per_epoch\": %.1f, \"plan_bytes_per_epoch\": %llu, \"oracle_s\": %.1f, \"drive_s\": %.1f}\n",
          of_total(over), of_total(handed_bytes), static_cast<double>(fetched_all) / static_cast<double>(nodes),
          mean_served > 0 ? static_cast<double>(busiest) / mean_served : 0.0, plan_s * 1e3,
          static_cast<unsigned long long>(plan_bytes), oracle_s, drive_s);
      std::fflush(stdout);
    }
  }
  return 0;
}
