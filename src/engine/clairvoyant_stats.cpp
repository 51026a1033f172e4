// The engine's stats (.clairfs/stats, clairfs status, the OpenMetrics): its counters, tiers and peers
// taken into an EngineStats (typed), the staging core's part added by StagingCore::snapshot, apart from
// the serving paths in clairvoyant.cpp; rendered by engine_stats.cpp.
#include <algorithm>

#include "engine/clairvoyant.hpp"
#include "util/memory.hpp"
#include "util/text.hpp"

namespace clairfs {

EngineStats ClairvoyantEngine::stats() const {
  EngineStats s;
  for (Origin o : {Origin::kPageCache, Origin::kRam, Origin::kNvme, Origin::kPeer, Origin::kSource})
    s.tier(o) = {counters_.files(o), counters_.bytes(o)};
  s.staged = {counters_.staged_files.load(),     counters_.staged_bytes.load(),
              counters_.staged_from_nvme.load(), counters_.staged_from_peer.load(),
              counters_.stage_failures.load(),   counters_.staged_source_bytes.load(),
              counters_.attributes_read.load(),  counters_.staged_after_their_use.load()};
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
    p.unkept = config_.unkept;
    p.source_instead = counters_.source_over_peer.load();
    p.source_instead_bytes = counters_.source_over_peer_bytes.load();
    p.timeouts = c.timeouts;
    p.failures = c.failures;
    p.returned = c.returned;
    p.links = c.links;
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
  s.demand = {demand_.allowance().limit(),      demand_.allowance().used(),    counters_.piecewise_files.load(),
              counters_.left_to_readers.load(), counters_.demand_waits.load(), counters_.demand_waits_given_up.load()};
  s.pagecache.budget = config_.page_cache ? config_.pagecache : 0;
  const bool inferred = config_.no_open && !watched_.load(std::memory_order_acquire);
  s.progress.from = !config_.no_open ? "opens" : inferred ? "reads" : "watched opens";
  s.idle.after_seconds = std::chrono::duration_cast<std::chrono::seconds>(config_.idle).count();
  // What grows with the data set's size, for the bound of 100 bytes per file.
  s.memory.entries = manifest_.size();
  s.memory.manifest = manifest_.memory_bytes();
  s.memory.ram_bookkeeping = ram_.bookkeeping();
  // The ranks, the plan, the page window, the readers, idle=, the parts' memory, and the counters that
  // move with them.
  state_.snapshot(s, inferred);
  for (size_t r = 0; r < s.ranks.size(); ++r) s.ranks[r].reads_as = news_.answer(r);
  return s;
}

}  // namespace clairfs
