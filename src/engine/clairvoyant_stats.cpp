// The engine's stats (.clairfs/stats, clairfs status, the OpenMetrics): its parts' numbers taken into an
// EngineStats (typed) under the engine's mutex, apart from the serving paths in clairvoyant.cpp, and
// rendered by engine_stats.cpp.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/clairvoyant.hpp"
#include "util/memory.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {
// How far the stats look for a rank's lead: enough to say "more than the window a loader keeps".
constexpr uint64_t kLeadScanSteps = 100000;
}  // namespace

uint64_t ClairvoyantEngine::lead_files(uint64_t rank) const {
  const uint64_t ranks = state_.tracker.ranks();
  uint64_t lead = 0;
  for (uint64_t n = 0, key = state_.planner.progress(rank).next_key;
       n < kLeadScanSteps && key < state_.planner.planned_end(); ++n, key += ranks) {
    const auto item = state_.planner.item(key);
    if (!item) continue;
    if (!state_.policy.ram().contains(*item) && !state_.window.pushed(*item)) break;
    ++lead;
  }
  return lead;
}

void ClairvoyantEngine::rank_stats(EngineStats& s) const {
  uint64_t min_epoch = UINT64_MAX, lead_min = UINT64_MAX;
  for (uint64_t r = 0; r < state_.tracker.ranks(); ++r) {
    const Planner::RankProgress p = state_.planner.progress(r);
    const uint64_t lead = lead_files(r);
    const double rate = state_.tracker.files_per_second(r);
    s.ranks.push_back({config_.ranks.empty() ? 0 : config_.ranks[r], p.epoch, p.done, p.total, p.live,
                       state_.tracker.verdict(r), diagnoser_ ? diagnoser_->answer(r) : "", lead,
                       rate > 0 ? static_cast<double>(lead) / rate : 0.0, rate, p.mispredicted});
    if (p.live) min_epoch = std::min(min_epoch, p.epoch), lead_min = std::min(lead_min, lead);
  }
  s.epoch = min_epoch == UINT64_MAX ? state_.planner.progress(0).epoch : min_epoch;
  s.mispredicted_opens = state_.planner.mispredicted();
  s.plan = {state_.planner.cursor(), state_.policy.stage_key(), state_.planner.planned_end(),
            lead_min == UINT64_MAX ? 0 : lead_min};
  s.pagecache = {config_.page_cache ? config_.pagecache : 0,
                 state_.window.used(),
                 counters_.pushes.load(),
                 counters_.push_failures.load(),
                 counters_.drops.load(),
                 counters_.kernel_asks.load(),
                 counters_.left_to_kernel.load(),
                 counters_.kernel_took_back.load()};
  const bool inferred = config_.no_open && !watched_.load(std::memory_order_acquire);
  s.progress = {!config_.no_open ? "opens"
                : inferred       ? "reads"
                                 : "watched opens",
                inferred ? state_.window.beacon_every() : 0,
                counters_.watched_opens.load(),
                counters_.watched_closes.load(),
                counters_.watch_losses.load(),
                state_.planner.other_readers(),
                state_.tracker.reads_as_world(),
                state_.planner.other_opens()};
}

EngineStats ClairvoyantEngine::snapshot() const {
  EngineStats s;
  for (Origin o : {Origin::kPageCache, Origin::kRam, Origin::kNvme, Origin::kPeer, Origin::kSource})
    s.tier(o) = {counters_.files(o), counters_.bytes(o)};
  s.staged = {counters_.staged_files.load(),     counters_.staged_bytes.load(),   counters_.staged_from_nvme.load(),
              counters_.staged_from_peer.load(), counters_.stage_failures.load(), counters_.staged_source_bytes.load(),
              counters_.attributes_read.load()};
  s.stalls = {static_cast<double>(counters_.stall_ns.load()) / 1e9, counters_.staging_waits_given_up.load()};
  s.readahead_files = counters_.readahead_files.load();
  s.source_changed = demand_.source_changed();
  s.ram = {ram_.budget(), ram_.used(), ram_.files(), counters_.ram_evictions.load()};
  if (nvme_)
    s.nvme = EngineStats::Nvme{nvme_->path(),           nvme_->capacity(),      nvme_->used(),
                               nvme_->files(),          nvme_->admitting(),     nvme_->writes(),
                               nvme_->write_failures(), nvme_->read_failures(), counters_.nvme_evictions.load()};
  s.checksum_failures = nvme_ ? nvme_->checksum_failures() : 0;
  if (config_.peers) {
    PeerTransport& t = *config_.peers;
    const auto c = t.counters();
    EngineStats::Peers& p = s.peers.emplace();
    p.node = t.node();
    p.nodes = t.nodes();
    p.staged_files = counters_.staged_from_peer.load();
    p.staged_bytes = counters_.staged_peer_bytes.load();
    p.demand_files = counters_.demand_peer_files.load();
    p.requests = c.requests;
    p.hits = c.hits;
    p.refused = c.refused;
    p.deferred = counters_.peer_deferrals.load();
    p.handed = config_.handed.size();
    p.handed_staged = counters_.handed_staged.load();
    p.source_instead = counters_.source_over_peer.load();
    p.source_instead_bytes = counters_.source_over_peer_bytes.load();
    p.timeouts = c.timeouts;
    p.failures = c.failures;
    p.returned = c.returned;
    p.served_files = c.served;
    p.served_bytes = c.served_bytes;
    p.refused_to_peers = c.refused_to_peers;
    p.peer_seconds_per_file = stager_ ? stager_->seconds_per_file(true) : 0.0;
    p.source_seconds_per_file = stager_ ? stager_->seconds_per_file(false) : 0.0;
    for (int n = 0; n < t.nodes(); ++n) {
      if (n == t.node()) continue;
      if (t.usable(n))
        ++p.usable;
      else
        p.gone.push_back(n);
    }
  }
  s.demand = {demand_.allowance().limit(), demand_.allowance().used(), counters_.piecewise_files.load(),
              counters_.left_to_readers.load()};
  MutexLock lock(state_.mutex);
  rank_stats(s);
  s.idle = {std::chrono::duration_cast<std::chrono::seconds>(config_.idle).count(), state_.idle,
            counters_.idle_releases.load()};
  // What grows with the data set's size, for the bound of 100 bytes per file.
  s.memory = {manifest_.size(),
              manifest_.memory_bytes(),
              state_.planner.memory_bytes(),
              state_.policy.memory_bytes(),
              state_.tracker.memory_bytes() + state_.window.memory_bytes() + state_.from_peer.capacity(),
              ram_.bookkeeping()};
  return s;
}

nlohmann::json ClairvoyantEngine::stats() const { return to_json(snapshot()); }

}  // namespace clairfs
