// The engine's stats (.clairfs/stats, clairfs status, the OpenMetrics): rendered from its parts' typed
// counters under the engine's mutex, apart from the serving paths in clairvoyant.cpp.
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

void ClairvoyantEngine::ranks_json(nlohmann::json& j) const {
  nlohmann::json ranks = nlohmann::json::array();
  uint64_t min_epoch = UINT64_MAX, lead_min = UINT64_MAX;
  for (uint64_t r = 0; r < state_.tracker.ranks(); ++r) {
    const Planner::RankProgress p = state_.planner.progress(r);
    const uint64_t lead = lead_files(r);
    const double rate = state_.tracker.files_per_second(r);
    ranks.push_back({{"rank", config_.ranks.empty() ? 0 : config_.ranks[r]},
                     {"epoch", p.epoch},
                     {"done", p.done},
                     {"total", p.total},
                     {"live", p.live},
                     {"verdict", ReaderTracker::verdict_name(state_.tracker.verdict(r))},
                     {"reads_as", diagnoser_ ? diagnoser_->answer(r) : ""},
                     {"lead_files", lead},
                     {"lead_seconds", rate > 0 ? static_cast<double>(lead) / rate : 0.0},
                     {"files_per_second", rate},
                     {"mispredicted_opens", p.mispredicted}});
    if (p.live) min_epoch = std::min(min_epoch, p.epoch), lead_min = std::min(lead_min, lead);
  }
  j["ranks"] = ranks;
  j["epoch"] = min_epoch == UINT64_MAX ? state_.planner.progress(0).epoch : min_epoch;
  j["mispredicted_opens"] = state_.planner.mispredicted();
  j["plan"] = {{"cursor", state_.planner.cursor()},
               {"staged_up_to", state_.policy.stage_key()},
               {"planned_up_to", state_.planner.planned_end()},
               {"lead_files", lead_min == UINT64_MAX ? 0 : lead_min}};
  j["pagecache"] = {{"budget", config_.page_cache ? config_.pagecache : 0},
                    {"used", state_.window.used()},
                    {"pushes", counters_.pushes.load()},
                    {"push_failures", counters_.push_failures.load()},
                    {"drops", counters_.drops.load()},
                    {"asked", counters_.kernel_asks.load()},
                    {"left_to_kernel", counters_.left_to_kernel.load()},
                    {"taken_back", counters_.kernel_took_back.load()}};
  const bool inferred = config_.no_open && !watched_.load(std::memory_order_acquire);
  j["progress"] = {{"from", !config_.no_open ? "opens"
                            : inferred       ? "reads"
                                             : "watched opens"},
                   {"beacon_every", inferred ? state_.window.beacon_every() : 0},
                   {"opens_seen", counters_.watched_opens.load()},
                   {"closes_seen", counters_.watched_closes.load()},
                   {"losses", counters_.watch_losses.load()},
                   {"other_readers", state_.planner.other_readers()},
                   {"reads_as_world_size", state_.tracker.reads_as_world()},
                   {"other_opens", state_.planner.other_opens()}};
}

nlohmann::json ClairvoyantEngine::stats() const {
  nlohmann::json j;
  counters_.to_json(j);
  // Files refused because SOURCE no longer matched the scan (before or after a read): never served.
  j["source_changed"] = demand_.source_changed();
  j["ram"] = {{"budget", ram_.budget()},
              {"used", ram_.used()},
              {"files", ram_.files()},
              {"evictions", counters_.ram_evictions.load()}};
  if (nvme_)
    j["nvme"] = {{"dir", nvme_->path()},
                 {"capacity", nvme_->capacity()},
                 {"used", nvme_->used()},
                 {"files", nvme_->files()},
                 {"admitting", nvme_->admitting()},
                 {"writes", nvme_->writes()},
                 {"write_failures", nvme_->write_failures()},
                 {"read_failures", nvme_->read_failures()},
                 {"evictions", counters_.nvme_evictions.load()}};
  j["checksum_failures"] = nvme_ ? nvme_->checksum_failures() : 0;
  if (config_.peers) {
    PeerTransport& t = *config_.peers;
    const auto c = t.counters();
    j["peers"] = {{"node", t.node()},
                  {"nodes", t.nodes()},
                  {"staged_files", counters_.staged_from_peer.load()},
                  {"staged_bytes", counters_.staged_peer_bytes.load()},
                  {"demand_files", counters_.demand_peer_files.load()},
                  {"requests", c.requests},
                  {"hits", c.hits},
                  {"refused", c.refused},
                  {"deferred", counters_.peer_deferrals.load()},
                  {"handed", config_.handed.size()},
                  {"handed_staged", counters_.handed_staged.load()},
                  {"source_instead", counters_.source_over_peer.load()},
                  {"source_instead_bytes", counters_.source_over_peer_bytes.load()},
                  {"timeouts", c.timeouts},
                  {"failures", c.failures},
                  {"returned", c.returned},
                  {"served_files", c.served},
                  {"served_bytes", c.served_bytes},
                  {"refused_to_peers", c.refused_to_peers},
                  {"seconds_per_file",
                   {{"peer", stager_ ? stager_->seconds_per_file(true) : 0.0},
                    {"source", stager_ ? stager_->seconds_per_file(false) : 0.0}}}};
    int usable = 0;
    nlohmann::json gone = nlohmann::json::array();  // nodes no longer asked: left, failed or silent
    for (int n = 0; n < t.nodes(); ++n) {
      if (n == t.node()) continue;
      if (t.usable(n))
        ++usable;
      else
        gone.push_back(n);
    }
    j["peers"]["usable"] = usable;
    j["peers"]["gone"] = gone;
  }
  // Whole files held outside the RAM budget (read on demand), and files read piecewise for want of room.
  j["demand"] = {{"limit", demand_.allowance().limit()},
                 {"used", demand_.allowance().used()},
                 {"piecewise_files", counters_.piecewise_files.load()},
                 {"left_to_readers", counters_.left_to_readers.load()}};
  MutexLock lock(state_.mutex);
  ranks_json(j);
  // idle=: after how long without a read RAM is given back (0: never), whether it is now, how often it was.
  j["idle"] = {{"after_seconds", std::chrono::duration_cast<std::chrono::seconds>(config_.idle).count()},
               {"now", state_.idle},
               {"releases", counters_.idle_releases.load()}};
  // Where the daemon's memory goes, by part (bytes; the RAM tier's files are in "ram"): what grows with
  // the data set's size, for the bound of 100 bytes per file.
  j["memory"] = {
      {"entries", manifest_.size()},
      {"manifest", manifest_.memory_bytes()},
      {"plan", state_.planner.memory_bytes()},
      {"policy", state_.policy.memory_bytes()},
      {"per_entry", state_.tracker.memory_bytes() + state_.window.memory_bytes() + state_.from_peer.capacity()},
      {"ram_bookkeeping", ram_.bookkeeping()}};
  return j;
}

}  // namespace clairfs
