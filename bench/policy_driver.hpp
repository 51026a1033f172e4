// Benchmark-only: one node's staging driven the way the staging core drives it, through the engine's own
// Planner and StagingPolicy (engine/planner.hpp, engine/policy.hpp), with staging that takes no time:
// before each access, files are staged in the policy's order while it finds room; each access is placed
// in the planner; a file read on demand is kept as the stager keeps it. The node holds one copy of a file,
// in RAM while `capacity` has room, else on NVMe (`nvme` bytes, in 4 KiB blocks), both ordered by next
// use as one tier. Used by cache_sim (one node, RAM alone) and cluster_sim (many).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "clairfs/manifest.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"

namespace policy_driver {

struct Config {
  uint64_t ranks = 1;           // ranks the node serves (the streams' count)
  uint64_t epochs = 1;          // epochs driven, from 0
  uint64_t capacity = 0;        // bytes the node holds in RAM
  uint64_t nvme = 0;            // and on NVMe, in 4 KiB blocks
  uint64_t loader_window = 16;  // files a rank's loader opens ahead
  std::vector<uint16_t> owner;  // per entry: the node keeping it for all (empty: one node alone)
  std::vector<clairfs::EntryId> handed;  // the node's files handed to it (Keepers::handed): staged first
  int node = 0;
};

struct Totals {
  uint64_t accesses = 0, bytes = 0;  // reads, and their bytes
  uint64_t fetches = 0, fetch_bytes = 0;  // files brought to the node (staged or on demand)
};

// Time is the readers' step (a planner key ÷ the node's ranks: the ranks move in step, and every node's
// ranks read as many files an epoch), so steps of different nodes compare.
struct Fetch {
  clairfs::EntryId id;
  uint64_t epoch;  // of the use it was brought for
  uint64_t at;     // the step it was brought at
  uint64_t use;    // the step of that use
};

struct Ignore {
  void operator()(clairfs::EntryId, uint64_t, uint64_t) const {}
};

// Drives the node through cfg.epochs epochs of `src`. fetched(Fetch) is called for every file brought to
// the node; evicted(id, epoch, step) for every file let go, with the readers' epoch and step then.
template <class Fetched, class Evicted = Ignore>
Totals drive(const clairfs::Manifest& m, const clairfs::StreamSource& src, const Config& cfg, Fetched fetched,
             Evicted evicted = {}) {
  using namespace clairfs;
  PlannerConfig pc;
  pc.ranks = cfg.ranks;
  pc.entries = m.size();
  pc.end_epoch = cfg.epochs;
  pc.horizon = cfg.epochs;
  Planner p(pc, src);
  StagingPolicy policy(m, p, PolicyConfig{cfg.capacity, cfg.ranks, cfg.loader_window, 32, cfg.owner, cfg.node, mean_sample_size(m)});
  uint64_t ram_used = 0, nvme_used = 0;
  std::vector<uint8_t> on_nvme(cfg.nvme ? m.size() : 0, 0);
  auto blocks = [](uint64_t size) { return (size + 4095) / 4096 * 4096; };
  auto reserve = [&](EntryId id, uint64_t size) {
    return [&, id, size] {
      if (ram_used + size <= cfg.capacity) return ram_used += size, true;
      if (on_nvme.empty() || nvme_used + blocks(size) > cfg.nvme) return false;
      nvme_used += blocks(size);
      on_nvme[id] = 1;
      return true;
    };
  };
  const auto step = [&](uint64_t key) { return key / cfg.ranks; };
  std::vector<uint64_t> epoch_ends;  // first key of each epoch after the first
  auto epoch_of = [&](uint64_t key) {
    while ((epoch_ends.empty() || epoch_ends.back() <= key) && (epoch_ends.empty() || epoch_ends.back() != kNever))
      epoch_ends.push_back(p.epoch_end_key(epoch_ends.empty() ? 0 : epoch_ends.back()));
    return static_cast<uint64_t>(std::upper_bound(epoch_ends.begin(), epoch_ends.end(), key) - epoch_ends.begin());
  };
  auto evict = [&](EntryId id) {
    const uint64_t size = m.entry(id).size;
    if (!on_nvme.empty() && on_nvme[id])
      nvme_used -= blocks(size), on_nvme[id] = 0;
    else
      ram_used -= size;
    evicted(id, epoch_of(p.cursor()), step(p.cursor()));
  };
  // Room as the stager makes it (one copy a file here: none is held elsewhere on the node).
  auto room = [&](EntryId id, uint64_t key, uint64_t size, bool owned) {
    return policy.make_ram_room(key, owned, reserve(id, size), evict);
  };
  Totals t;
  bool started = false;
  for (;;) {
    while (auto e = p.wanted_epoch()) p.add_epoch(Planner::build(src, *e, cfg.ranks, m.size()));
    if (!started) {  // the files handed to this node, staged before anything else (as the staging core does)
      started = true;
      for (EntryId id : cfg.handed) {
        const uint64_t key = policy.keep_key(id), size = m.entry(id).size;
        if (key == kNever || !room(id, key, size, true)) continue;
        policy.ram().set(id, key, true);
        t.fetches++;
        t.fetch_bytes += size;
        fetched(Fetch{id, 0, 0, 0});
      }
    }
    while (const auto pick = policy.next_candidate([](EntryId) { return false; })) {
      const bool owned = policy.owned(pick->id);
      if (!room(pick->id, pick->key, pick->size, owned)) break;
      policy.ram().set(pick->id, policy.staged_key(pick->id, false, owned), owned);
      policy.take();
      t.fetches++;
      t.fetch_bytes += pick->size;
      fetched(Fetch{pick->id, epoch_of(pick->key), step(p.cursor()), step(pick->key)});
    }
    const uint64_t key = p.cursor();
    if (key >= p.planned_end()) break;
    const auto id = p.item(key);
    if (!id) break;
    const uint64_t size = m.entry(*id).size;
    t.accesses++;
    t.bytes += size;
    const bool demand = !policy.ram().contains(*id);  // not staged in time (no room): read on demand
    if (demand) {
      t.fetches++;
      t.fetch_bytes += size;
      fetched(Fetch{*id, epoch_of(key), step(key), step(key)});
    }
    p.on_open(*id, 1);
    policy.readers_moved(p);
    if (demand)  // kept for its next use, as the stager keeps a file read whole on demand
      if (const uint64_t next = policy.keep_key(*id); next != kNever && room(*id, next, size, policy.owned(*id)))
        policy.ram().set(*id, next, policy.owned(*id));
  }
  return t;
}

}  // namespace policy_driver
