#include <nlohmann/json.hpp>

#include "clairfs/stats.hpp"

namespace clairfs {

const char* verdict_name(RankVerdict v) {
  switch (v) {
    case RankVerdict::kChecking: return "checking";
    case RankVerdict::kFollowing: return "following";
    case RankVerdict::kOff: return "off";
    case RankVerdict::kIdle: return "idle";
  }
  return "?";
}

void EngineStats::add_served(const EngineStats& before) {
  for (size_t i = 0; i < served.size(); ++i) {
    served[i].files += before.served[i].files;
    served[i].bytes += before.served[i].bytes;
  }
  staged.files += before.staged.files;
  staged.bytes += before.staged.bytes;
  staged.from_nvme += before.staged.from_nvme;
  staged.from_peer += before.staged.from_peer;
  staged.failures += before.staged.failures;
  staged.source_bytes += before.staged.source_bytes;
  staged.attributes_read += before.staged.attributes_read;
  staged.after_their_use += before.staged.after_their_use;
  stalls.seconds += before.stalls.seconds;
  stalls.staging_waits_given_up += before.stalls.staging_waits_given_up;
  // The watch's news went to the plan of the moment: heard opens and closes are the sum.
  progress.opens_seen += before.progress.opens_seen;
  progress.closes_seen += before.progress.closes_seen;
  progress.losses += before.progress.losses;
}

namespace {

// A mount that stages nothing: what it read from SOURCE.
nlohmann::json source_json(const EngineStats& s) {
  nlohmann::json j;
  j["tiers"]["source"] = {{"files", s.tier(Origin::kSource).files}, {"bytes", s.tier(Origin::kSource).bytes}};
  j["source_changed"] = s.source_changed;
  j["source_errors"] = s.source_errors;
  j["staging"] = "off (give ram=SIZE to stage ahead)";
  return j;
}

void add_learning(const LearningStats& l, nlohmann::json& j) {
  if (const auto& w = l.world)
    j["plan"]["world"] = {{"world_size", w->world_size}, {"ranks", w->ranks},         {"epoch", w->epoch},
                          {"order", w->order},           {"replanned", w->replanned}, {"samples", w->samples},
                          {"kept_files", w->kept_files}};
  if (const auto& w = l.waited)  // what was read from SOURCE while the engine waited for the files' attributes
    j["waited"] = {{"state", w->state}, {"source_bytes", w->source_bytes}, {"source_files", w->source_files}};
  if (const auto& x = l.learned)
    j["learned"] = {{"state", x->state},
                    {"seed", x->seed},
                    {"after_opens", x->after_opens},
                    {"tries", x->tries},
                    {"opens_seen", x->opens_seen},
                    {"other_users_opens", x->other_users_opens},  // not learned from (learn_from=)
                    {"relearned", x->relearned},  // times a seed was learned again (the job read in another order)
                    {"source_bytes", x->source_bytes},   // read before the engine was there (counted in
                    {"source_files", x->source_files}};  // source_traffic, tiers.source and stalls too)
}

nlohmann::json staging_json(const EngineStats& s) {
  nlohmann::json j;
  for (Origin o : {Origin::kRam, Origin::kNvme, Origin::kPeer, Origin::kSource})
    j["tiers"][origin_name(o)] = {{"files", s.tier(o).files}, {"bytes", s.tier(o).bytes}};
  // Without opens, files read from pushed pages are presumed read once their reader reads past them.
  j["tiers"]["pagecache"] = {{"files", s.tier(Origin::kPageCache).files}};
  j["staged"] = {{"files", s.staged.files},
                 {"bytes", s.staged.bytes},
                 {"from_nvme", s.staged.from_nvme},
                 {"from_peer", s.staged.from_peer},
                 {"failures", s.staged.failures},
                 {"source_bytes", s.staged.source_bytes},
                 {"attributes_read", s.staged.attributes_read},
                 {"after_their_use", s.staged.after_their_use}};
  j["source_traffic"] = {{"bytes", s.source_bytes()}};
  j["stalls"] = {{"opens", s.tier(Origin::kSource).files},
                 {"seconds", s.stalls.seconds},
                 {"staging_waits_given_up", s.stalls.staging_waits_given_up}};
  j["readahead_files"] = s.readahead_files;
  j["source_changed"] = s.source_changed;
  j["ram"] = {{"budget", s.ram.budget}, {"used", s.ram.used}, {"files", s.ram.files}, {"evictions", s.ram.evictions}};
  if (s.nvme)
    j["nvme"] = {{"dir", s.nvme->dir},
                 {"capacity", s.nvme->capacity},
                 {"used", s.nvme->used},
                 {"files", s.nvme->files},
                 {"admitting", s.nvme->admitting},
                 {"writes", s.nvme->writes},
                 {"write_failures", s.nvme->write_failures},
                 {"read_failures", s.nvme->read_failures},
                 {"evictions", s.nvme->evictions}};
  j["checksum_failures"] = s.checksum_failures;
  if (const auto& p = s.peers)
    j["peers"] = {{"node", p->node},
                  {"nodes", p->nodes},
                  {"staged_files", p->staged_files},
                  {"staged_bytes", p->staged_bytes},
                  {"demand_files", p->demand_files},
                  {"requests", p->requests},
                  {"hits", p->hits},
                  {"refused", p->refused},
                  {"deferred", p->deferred},
                  {"handed", p->handed},
                  {"handed_staged", p->handed_staged},
                  {"unkept", p->unkept},
                  {"source_instead", p->source_instead},
                  {"source_instead_bytes", p->source_instead_bytes},
                  {"timeouts", p->timeouts},
                  {"failures", p->failures},
                  {"returned", p->returned},
                  {"links", p->links},
                  {"served_files", p->served_files},
                  {"served_bytes", p->served_bytes},
                  {"refused_to_peers", p->refused_to_peers},
                  {"seconds_per_file", {{"peer", p->peer_seconds_per_file}, {"source", p->source_seconds_per_file}}},
                  {"usable", p->usable},
                  {"gone", p->gone}};
  j["demand"] = {{"limit", s.demand.limit},
                 {"used", s.demand.used},
                 {"piecewise_files", s.demand.piecewise_files},
                 {"left_to_readers", s.demand.left_to_readers},
                 {"waited", s.demand.waited},
                 {"waits_given_up", s.demand.waits_given_up}};
  nlohmann::json ranks = nlohmann::json::array();
  for (const EngineStats::Rank& r : s.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"epoch", r.epoch},
                     {"done", r.done},
                     {"total", r.total},
                     {"live", r.live},
                     {"verdict", verdict_name(r.verdict)},
                     {"reads_as", r.reads_as},
                     {"lead_files", r.lead_files},
                     {"lead_seconds", r.lead_seconds},
                     {"files_per_second", r.files_per_second},
                     {"mispredicted_opens", r.mispredicted_opens}});
  j["ranks"] = ranks;
  j["epoch"] = s.epoch;
  j["mispredicted_opens"] = s.mispredicted_opens;
  j["plan"] = {{"cursor", s.plan.cursor},
               {"staged_up_to", s.plan.staged_up_to},
               {"planned_up_to", s.plan.planned_up_to},
               {"lead_files", s.plan.lead_files}};
  j["pagecache"] = {{"budget", s.pagecache.budget},
                    {"used", s.pagecache.used},
                    {"pushes", s.pagecache.pushes},
                    {"push_failures", s.pagecache.push_failures},
                    {"drops", s.pagecache.drops},
                    {"asked", s.pagecache.asked},
                    {"left_to_kernel", s.pagecache.left_to_kernel},
                    {"taken_back", s.pagecache.taken_back}};
  j["progress"] = {{"from", s.progress.from},
                   {"beacon_every", s.progress.beacon_every},
                   {"opens_seen", s.progress.opens_seen},
                   {"closes_seen", s.progress.closes_seen},
                   {"losses", s.progress.losses},
                   {"other_readers", s.progress.other_readers},
                   {"reads_as_world_size", s.progress.reads_as_world_size},
                   {"other_opens", s.progress.other_opens}};
  // idle=: after how long without a read RAM is given back (0: never), whether it is now, how often it was.
  j["idle"] = {{"after_seconds", s.idle.after_seconds}, {"now", s.idle.now}, {"releases", s.idle.releases}};
  j["memory"] = {{"entries", s.memory.entries},     {"manifest", s.memory.manifest},
                 {"plan", s.memory.plan},           {"policy", s.memory.policy},
                 {"per_entry", s.memory.per_entry}, {"ram_bookkeeping", s.memory.ram_bookkeeping}};
  return j;
}

}  // namespace

nlohmann::json to_json(const EngineStats& s) {
  nlohmann::json j = s.staging ? staging_json(s) : source_json(s);
  if (s.learning) add_learning(*s.learning, j);
  return j;
}

}  // namespace clairfs
