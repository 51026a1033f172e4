// Benchmark: the peers' one cache at cluster scale, simulated with the engine's own code — the oracle
// (each rank's order), plan_owners (who keeps each file for all), and for every node its Planner and
// StagingPolicy driven as its stager drives them (policy_driver.hpp: staging takes no time, one tier of
// `cache` × the node's share of the data set stands for its RAM and NVMe).
//
// Nodes are driven one after another, each through every epoch; what a node fetches (a file not held
// when it is staged or read) is then attributed: to a peer if the file's keeper held it when that epoch
// began (it fetched it in an earlier epoch and had not evicted it), else to SOURCE. The keeper of a file
// is the node that reads it first in epoch 0 — the only node that reads it then — so epoch 0 reads
// SOURCE once and later epochs fetch from peers what their own cache lacks.
//
// Reports, for each node count and cache size: per epoch, SOURCE bytes ÷ data set and peer bytes ÷ data
// set; bytes a node fetches from peers (mean); the busiest keeper's bytes served against the mean; and,
// for node 0, the plan's time and memory per epoch (Planner::build).
//
//   cluster_sim [--samples 1281167] [--classes 1000] [--nodes 64,256,1024] [--ranks-per-node 4]
//               [--epochs 3] [--cache 0.5,1,2] [--mean-kb 110] [--seed 0] [--loader-window 16]
//     -> one JSON line per (nodes, cache)
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
#include "engine/owners.hpp"
#include "policy_driver.hpp"

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

std::vector<double> list_of(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string x; std::getline(in, x, ',');) out.push_back(std::stod(x));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t samples = 1281167, classes = 1000, ranks_per_node = 4, epochs = 3, mean_kb = 110, loader_window = 16;
  long long seed = 0;
  std::string nodes_text = "64,256,1024", cache_text = "0.5,1,2";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--samples") samples = std::stoull(v);
    else if (a == "--classes") classes = std::stoull(v);
    else if (a == "--nodes") nodes_text = v;
    else if (a == "--ranks-per-node") ranks_per_node = std::stoull(v);
    else if (a == "--epochs") epochs = std::stoull(v);
    else if (a == "--cache") cache_text = v;
    else if (a == "--mean-kb") mean_kb = std::stoull(v);
    else if (a == "--seed") seed = std::stoll(v);
    else if (a == "--loader-window") loader_window = std::stoull(v);
    else {
      std::fprintf(stderr, "cluster_sim: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  const clairfs::Manifest m = synthetic(samples, classes, mean_kb * 1000);
  uint64_t total = 0;
  for (EntryId id : m.samples()) total += m.entry(id).size;
  std::fprintf(stderr, "cluster_sim: %llu samples, %.1f GB, made in %.1f s\n", static_cast<unsigned long long>(samples),
               static_cast<double>(total) / 1e9, seconds_since(t0));

  for (double nodes_d : list_of(nodes_text)) {
    const auto nodes = static_cast<uint64_t>(nodes_d);
    clairfs::Schedule s;
    s.seed = seed;
    s.world_size = nodes * ranks_per_node;
    s.batch_size = 32;
    const clairfs::Oracle oracle(m.samples().size(), s);
    t0 = std::chrono::steady_clock::now();
    std::vector<clairfs::EpochOrder> orders;
    for (uint64_t e = 0; e < epochs; ++e) orders.push_back(oracle.epoch(e));
    std::vector<std::vector<uint64_t>> ranks_of_node(nodes);
    for (uint64_t n = 0; n < nodes; ++n)
      for (uint64_t r = 0; r < ranks_per_node; ++r) ranks_of_node[n].push_back(n * ranks_per_node + r);
    const std::vector<uint16_t> owner =
        clairfs::plan_owners(m, oracle, 0, ranks_of_node, static_cast<int>(nodes));
    const double oracle_s = seconds_since(t0);

    for (double cache : list_of(cache_text)) {
      // Per entry: the epoch its keeper first fetched it, and the epoch it first let it go after that.
      std::vector<uint8_t> held_from(m.size(), UINT8_MAX), held_until(m.size(), UINT8_MAX);
      std::vector<std::vector<std::pair<EntryId, uint8_t>>> fetched(nodes);
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
        policy_driver::Config c;
        c.ranks = ranks_per_node;
        c.epochs = epochs;
        c.capacity = static_cast<uint64_t>(cache * static_cast<double>(total) / static_cast<double>(nodes));
        c.loader_window = loader_window;
        c.owner = owner;
        c.node = static_cast<int>(n);
        const auto d0 = std::chrono::steady_clock::now();
        policy_driver::drive(
            m, src, c,
            [&](EntryId id, uint64_t e) {
              fetched[n].emplace_back(id, static_cast<uint8_t>(e));
              if (owner[id] == n && held_from[id] == UINT8_MAX) held_from[id] = static_cast<uint8_t>(e);
            },
            [&](EntryId id, uint64_t e) {
              if (owner[id] == n && held_from[id] != UINT8_MAX && held_until[id] == UINT8_MAX)
                held_until[id] = static_cast<uint8_t>(e);
            });
        drive_s += seconds_since(d0);
      }
      std::vector<uint64_t> source(epochs, 0), peer(epochs, 0), served(nodes, 0), from_peers(nodes, 0);
      for (uint64_t n = 0; n < nodes; ++n) {
        for (const auto& [id, e] : fetched[n]) {
          const uint64_t size = m.entry(id).size;
          const bool keeper_has = owner[id] != n && held_from[id] < e && held_until[id] >= e;
          if (keeper_has) {
            peer[e] += size;
            served[owner[id]] += size;
            from_peers[n] += size;
          } else {
            source[e] += size;
          }
        }
        fetched[n] = {};
      }
      uint64_t busiest = 0, served_all = 0, fetched_all = 0;
      for (uint64_t n = 0; n < nodes; ++n) {
        busiest = std::max(busiest, served[n]);
        served_all += served[n];
        fetched_all += from_peers[n];
      }
      std::printf("{\"samples\": %llu, \"nodes\": %llu, \"ranks_per_node\": %llu, \"cache\": %.2f, \"source_per_epoch\": [",
                  static_cast<unsigned long long>(samples), static_cast<unsigned long long>(nodes),
                  static_cast<unsigned long long>(ranks_per_node), cache);
      for (uint64_t e = 0; e < epochs; ++e)
        std::printf("%s%.3f", e ? ", " : "", static_cast<double>(source[e]) / static_cast<double>(total));
      std::printf("], \"peer_per_epoch\": [");
      for (uint64_t e = 0; e < epochs; ++e)
        std::printf("%s%.3f", e ? ", " : "", static_cast<double>(peer[e]) / static_cast<double>(total));
      const double mean_served = static_cast<double>(served_all) / static_cast<double>(nodes);
      std::printf("], \"peer_bytes_per_node\": %.0f, \"busiest_served_over_mean\": %.2f, \"plan_ms_per_epoch\": %.1f, "
                  "\"plan_bytes_per_epoch\": %llu, \"oracle_s\": %.1f, \"drive_s\": %.1f}\n",
                  static_cast<double>(fetched_all) / static_cast<double>(nodes),
                  mean_served > 0 ? static_cast<double>(busiest) / mean_served : 0.0, plan_s * 1e3,
                  static_cast<unsigned long long>(plan_bytes), oracle_s, drive_s);
      std::fflush(stdout);
    }
  }
  return 0;
}
