// Benchmark-only: one node's staging simulated through the daemon's own staging core (engine/core.hpp),
// its verbs called as the stager and the request threads call them — pick, staged, place, keep_read,
// admit, kept — with the parts configured from an EngineConfig as the engine configures them
// (engine_parts.hpp). What is simulated is only what lies outside the core: staging and writes take no
// time (each pick is read and staged at once, each copy up written at once), the bytes are not held (RAM
// and NVMe count them: CountedRam, CountedNvme), no kernel (no page window). Before each open, files are
// staged while the core picks any; each open is placed; a file read on demand is offered to the core as
// the stager offers it, and its copy to NVMe as the store chain does. Used by cache_sim (one node, RAM
// alone) and cluster_sim (many).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "clairfs/manifest.hpp"
#include "engine/clairvoyant.hpp"
#include "engine/core.hpp"
#include "engine/engine_parts.hpp"
#include "tiers/nvme.hpp"
#include "tiers/ram.hpp"

namespace core_driver {

using clairfs::EntryId;

struct Config {
  uint64_t ranks = 1;           // ranks the node serves (the streams' count)
  uint64_t epochs = 1;          // epochs driven, from 0
  uint64_t capacity = 0;        // bytes the node holds in RAM (counted as RamTier counts them)
  uint64_t nvme = 0;            // and on NVMe, in 4 KiB blocks
  uint64_t loader_window = 16;  // files a rank's loader opens ahead
  std::vector<uint16_t> owner;  // per entry: the node keeping it for all (empty: one node alone)
  std::vector<EntryId> handed;  // the node's files handed to it (Keepers::handed): staged first
  int node = 0;
};

struct Totals {
  uint64_t accesses = 0, bytes = 0;       // reads, and their bytes
  uint64_t fetches = 0, fetch_bytes = 0;  // files brought to the node from outside (staged or on demand)
};

// Time is the readers' step (a planner key ÷ the node's ranks: the ranks move in step, and every node's
// ranks read as many files an epoch), so steps of different nodes compare.
struct Fetch {
  EntryId id;
  uint64_t epoch;  // of the use it was brought for
  uint64_t at;     // the step it was brought at
  uint64_t use;    // the step of that use
};

struct Ignore {
  void operator()(EntryId, uint64_t) const {}
};

using Gone = std::function<void(EntryId)>;

// RAM as the core fills it, counted as RamTier counts it (each file's charge()), its bytes not held.
// gone(id) is told of each file let go.
class CountedRam final : public clairfs::StagedRam {
 public:
  CountedRam(const clairfs::Manifest& m, uint64_t budget, Gone gone)
      : m_(m), budget_(budget), held_(m.size(), 0), gone_(gone) {}
  bool reserve(uint64_t bytes) override {
    if (used_ + clairfs::RamTier::charge(bytes) > budget_) return false;
    used_ += clairfs::RamTier::charge(bytes);
    return true;
  }
  void unreserve(uint64_t bytes) override { used_ -= clairfs::RamTier::charge(bytes); }
  void insert(EntryId id, clairfs::FileBytes) override {
    held_[id] = 1;
    ids_++;
  }
  clairfs::FileBytes get(EntryId) const override { return nullptr; }
  uint64_t erase(EntryId id) override {
    if (!held_[id]) return 0;
    held_[id] = 0;
    ids_--;
    const uint64_t size = m_.entry(id).size;
    used_ -= clairfs::RamTier::charge(size);
    gone_(id);
    return size;
  }
  uint64_t used() const override { return used_; }
  std::vector<EntryId> ids() const override {
    std::vector<EntryId> all;
    all.reserve(ids_);
    for (EntryId id = 0; id < held_.size(); ++id)
      if (held_[id]) all.push_back(id);
    return all;
  }
  bool holds(EntryId id) const { return held_[id] != 0; }

 private:
  const clairfs::Manifest& m_;
  const uint64_t budget_;
  uint64_t used_ = 0;
  std::vector<uint8_t> held_;
  uint64_t ids_ = 0;
  Gone gone_;
};

// NVMe as the core admits copies to it, each copy written the moment it is admitted. Copies are packed
// (tiers/nvme.hpp): one takes its bytes, though its room is asked as whole 4 KiB blocks, as the tier
// reserves it. gone(id) is told of each copy let go.
class CountedNvme final : public clairfs::StagedNvme {
 public:
  CountedNvme(const clairfs::Manifest& m, uint64_t capacity, Gone gone)
      : m_(m), capacity_(capacity), held_(capacity ? m.size() : 0, 0), gone_(gone) {}
  static uint64_t blocks(uint64_t size) { return (size + 4095) / 4096 * 4096; }
  bool admitting() const override { return capacity_ > 0; }
  uint64_t capacity() const override { return capacity_; }
  bool reserve(uint64_t bytes) override {
    if (used_ + blocks(bytes) > capacity_) return false;
    used_ += bytes;
    return true;
  }
  uint64_t erase(EntryId id) override {
    if (!may_hold(id)) return 0;
    held_[id] = 0;
    const uint64_t size = m_.entry(id).size;
    used_ -= size;
    gone_(id);
    return size;
  }
  bool may_hold(EntryId id) const override { return !held_.empty() && held_[id] != 0; }
  void written(EntryId id) { held_[id] = 1; }

 private:
  const clairfs::Manifest& m_;
  const uint64_t capacity_;
  uint64_t used_ = 0;
  std::vector<uint8_t> held_;
  Gone gone_;
};

// The core's clock: a millisecond per step (rates are files a second; idle= is off).
class StepClock final : public clairfs::TimeSource {
 public:
  time_point now() const override { return now_; }
  void step() { now_ += std::chrono::milliseconds(1); }

 private:
  time_point now_{std::chrono::hours(1)};
};

// Drives the node through cfg.epochs epochs of `src`, its ranks' opens in step. fetched(Fetch) is called
// for every file brought to the node from outside it; evicted(id, step) for every file it let go from
// both RAM and NVMe, with the readers' step then.
template <class Fetched, class Evicted = Ignore>
Totals drive(const clairfs::Manifest& m, const clairfs::StreamSource& src, const Config& cfg, Fetched fetched,
             Evicted evicted = {}) {
  using namespace clairfs;
  EngineConfig ec;
  ec.ram = cfg.capacity;
  for (uint64_t r = 0; r < cfg.ranks; ++r) ec.ranks.push_back(r);
  ec.epochs = cfg.epochs;
  ec.horizon = cfg.epochs;  // every epoch planned (the daemon's horizon is shorter: it saves memory)
  ec.loader_window = cfg.loader_window;
  ec.owner = cfg.owner;
  ec.bytes_in_flight = UINT64_MAX;  // staging takes no time
  const uint64_t mean = mean_sample_size(m);
  PolicyConfig pc = policy_config(ec, mean);
  pc.node = cfg.node;     // (the daemon's is its transport's)
  uint64_t now_step = 0;  // the readers' step
  // A file is let go when neither tier holds it any more.
  CountedNvme* nvme_ref = nullptr;  // (none without an NVMe budget)
  CountedRam ram(m, cfg.capacity, [&](EntryId id) {
    if (!nvme_ref || !nvme_ref->may_hold(id)) evicted(id, now_step);
  });
  CountedNvme nvme(m, cfg.nvme, [&](EntryId id) {
    if (!ram.holds(id)) evicted(id, now_step);
  });
  if (cfg.nvme) nvme_ref = &nvme;
  const auto held = [&](EntryId id) { return ram.holds(id) || nvme.may_hold(id); };
  EngineCounters counters;
  StepClock clock;
  StagingCore core(m, ec.ranks, planner_config(m, ec), src, pc, window_config(ec, mean),
                   StagingConfig{ec.bytes_in_flight, cfg.handed}, ram, nvme_ref, counters, false, clock);
  core.set_lookups([](pid_t) { return pid_t{0}; },
                   [](pid_t pid) { return pid; });  // each rank's opens from a process of its own
  core.plan_up_to(kNever);

  // The steps each epoch starts at (the planner's: an epoch is as long as its longest sequence).
  std::vector<std::vector<std::vector<EntryId>>> epochs;
  std::vector<uint64_t> first_step{0};
  for (uint64_t e = 0; e < cfg.epochs; ++e) {
    epochs.push_back(src(e));
    uint64_t steps = 0;
    for (const auto& s : epochs.back()) steps = std::max<uint64_t>(steps, s.size());
    first_step.push_back(first_step.back() + steps);
  }
  // (A file kept for the other nodes that this one does not read, a handed one, is keyed beyond the plan:
  // brought for now.)
  const auto step_of = [&](uint64_t key) { return key / cfg.ranks < first_step.back() ? key / cfg.ranks : now_step; };
  const auto epoch_at = [&](uint64_t step) {
    return static_cast<uint64_t>(std::upper_bound(first_step.begin(), first_step.end(), step) - first_step.begin() - 1);
  };
  Totals t;
  const auto brought = [&](EntryId id, uint64_t epoch, uint64_t use) {
    t.fetches++;
    t.fetch_bytes += m.entry(id).size;
    fetched(Fetch{id, epoch, now_step, use});
  };
  // A copy up to NVMe, as the store chain makes it (StoreChain::start_find's copy-up, write_held): written at once.
  const auto written = [&](EntryId id, uint64_t key) {
    nvme.written(id);
    core.kept(id, key);
  };
  const auto copy_up = [&](EntryId id, uint64_t key) {
    if (nvme_ref && !nvme.may_hold(id) && core.admit(id, m.entry(id).size, key)) written(id, key);
  };
  const StagingCore::Outside outside{[](EntryId) { return false; }, [](EntryId) { return false; }};
  const auto stage = [&] {
    for (;;) {
      StagingCore::Walk walk;
      {
        StagingCore::Turn turn(core);
        walk = core.pick(1024, outside, true);
      }
      if (walk.picks.empty()) return;
      for (const StagingCore::Pick& p : walk.picks) {
        if (!p.on_nvme)  // (a handed file is brought for the other nodes' first reads: now)
          brought(p.id, epoch_at(p.why == StagingCore::Pick::For::kHanded ? now_step : step_of(p.key)), step_of(p.key));
        uint64_t after = kNever;
        {
          StagingCore::Turn turn(core);
          after = core.staged(p, nullptr, p.on_nvme ? Origin::kNvme : Origin::kSource);
          core.flight_ended(p.id);
        }
        if (after != kNever) copy_up(p.id, after);
        if (!held(p.id)) evicted(p.id, now_step);  // passed meanwhile: not kept
      }
    }
  };
  for (uint64_t e = 0; e < cfg.epochs; ++e) {
    const auto& seq = epochs[e];
    for (uint64_t s = 0; first_step[e] + s < first_step[e + 1]; ++s) {
      now_step = first_step[e] + s;
      for (uint64_t r = 0; r < cfg.ranks; ++r) {
        if (s >= seq[r].size()) continue;
        stage();
        const EntryId id = seq[r][s];
        t.accesses++;
        t.bytes += m.entry(id).size;
        bool in_ram = false;
        {
          StagingCore::Turn turn(core);
          in_ram = core.in_ram(id);
          core.place(id, static_cast<pid_t>(1000 + r), true);
        }
        core.handle_closed(id);
        if (in_ram) continue;
        if (nvme.may_hold(id)) continue;  // read from NVMe, not kept again in RAM (DemandReader)
        brought(id, e, now_step);  // not staged in time (no room): read on demand
        bool keep = false;
        {
          StagingCore::Turn turn(core);
          keep = core.keep_read(id, nullptr);  // as the stager keeps a file read whole on demand
        }
        if (keep && nvme_ref) {  // and its copy up, as the store chain queues it
          std::vector<Admission::Copy> waiting{Admission::Copy{id, nullptr, 0}};
          for (const Admission::Copy& c : core.admit_waiting(waiting, 1)) written(c.id, c.key);
        }
        if (!held(id)) evicted(id, now_step);
      }
      clock.step();
    }
  }
  return t;
}

}  // namespace core_driver
