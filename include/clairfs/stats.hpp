// EngineStats: what an engine has done, typed — the numbers of .clairfs/stats, `clairfs status` and the
// metrics, as every Engine gives them (Engine::stats: a staging engine's taken at one moment, a plain
// mount's SOURCE counts, a learning mount's search) and rendered as JSON in one place (to_json). The
// engine tests read the fields; a renamed key cannot pass them by being absent.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "clairfs/types.hpp"

namespace clairfs {

// Whether a rank's reads follow the plan, as the status and the log say it (ReaderTracker's verdict).
enum class RankVerdict { kChecking, kFollowing, kOff, kIdle };
const char* verdict_name(RankVerdict v);

// Parts of EngineStats kept apart from it: optional members (clang 14 takes a nested struct with default
// member initializers for one it cannot construct).
struct NvmeStats {
  std::string dir;
  uint64_t capacity = 0, used = 0, files = 0;
  bool admitting = false;
  uint64_t writes = 0, write_failures = 0, read_failures = 0, evictions = 0;
};
struct PeerStats {
  int node = 0, nodes = 0;
  uint64_t staged_files = 0, staged_bytes = 0, demand_files = 0;
  uint64_t requests = 0, hits = 0, refused = 0, deferred = 0, handed = 0, handed_staged = 0, unkept = 0;
  uint64_t source_instead = 0, source_instead_bytes = 0, timeouts = 0, failures = 0, returned = 0, links = 0;
  uint64_t served_files = 0, served_bytes = 0, refused_to_peers = 0;
  double peer_seconds_per_file = 0, source_seconds_per_file = 0;
  int usable = 0;
  std::vector<int> gone;  // nodes no longer asked: left, failed or silent
};

// seed=auto and re-planning (LearningEngine): the plan of the moment, the search for the job's seed.
struct LearningStats {
  struct World {  // re-planning on: the plan of the moment
    uint64_t world_size = 0, epoch = 0, replanned = 0, kept_files = 0;
    std::string ranks;    // "0-3"
    std::string order;    // the order planned for: the told seed until the job's own was found
    std::string samples;  // the list the job was found to read, where not the mount's (folder_words)
  };
  std::optional<World> world;
  struct Learned {  // seed=auto
    std::string state, seed;
    uint64_t after_opens = 0, tries = 0, opens_seen = 0, other_users_opens = 0, relearned = 0;
    uint64_t source_bytes = 0, source_files = 0;  // read before the engine was there
  };
  std::optional<Learned> learned;
  struct Waited {  // a told seed, its engine waiting for the files' attributes
    std::string state;
    uint64_t source_bytes = 0, source_files = 0;
  };
  std::optional<Waited> waited;
};

struct EngineStats {
  // False for a mount that stages nothing (DirectEngine, or a learning mount before its plan): only the
  // SOURCE figures (tier kSource, source_changed, source_errors) mean anything, and only they are shown.
  bool staging = true;
  uint64_t source_errors = 0;  // SOURCE's reads that failed (a plain mount's)

  struct Served {
    uint64_t files = 0, bytes = 0;
  };
  // Reads served, by where their bytes came from (Origin): files at their first read (for the page
  // cache, uses presumed read from pushed pages and handles no read reached), bytes as read.
  std::array<Served, 5> served{};
  Served& tier(Origin o) { return served[static_cast<size_t>(o)]; }
  const Served& tier(Origin o) const { return served[static_cast<size_t>(o)]; }

  struct Staged {
    uint64_t files = 0, bytes = 0, from_nvme = 0, from_peer = 0, failures = 0, source_bytes = 0;
    uint64_t attributes_read = 0;  // files whose attributes the stager read itself
    uint64_t after_their_use = 0;  // their use passed while they were read (their reader on the staging's heels)
  } staged;
  // Everything read from SOURCE, for any reason: what a parallel file system sees of this node.
  uint64_t source_bytes() const { return staged.source_bytes + tier(Origin::kSource).bytes; }
  struct Stalls {
    double seconds = 0;  // time readers waited on a peer or SOURCE
    uint64_t staging_waits_given_up = 0;
  } stalls;
  uint64_t readahead_files = 0;
  uint64_t source_changed = 0;  // files refused: SOURCE no longer matched the scan

  struct Ram {
    uint64_t budget = 0, used = 0, files = 0, evictions = 0;
  } ram;
  using Nvme = NvmeStats;
  std::optional<Nvme> nvme;
  uint64_t checksum_failures = 0;
  using Peers = PeerStats;
  std::optional<Peers> peers;
  // Whole files held outside the RAM budget (read on demand), and files read piecewise for want of room.
  struct Demand {
    uint64_t limit = 0, used = 0, piecewise_files = 0, left_to_readers = 0;
    uint64_t waited = 0, waits_given_up = 0;  // misses that waited for room in it; those that waited in vain
  } demand;

  struct Rank {
    uint64_t rank = 0;  // the training rank
    uint64_t epoch = 0, done = 0, total = 0;
    bool live = false;
    RankVerdict verdict = RankVerdict::kChecking;
    std::string reads_as;  // the diagnosis, if any
    uint64_t lead_files = 0;
    double lead_seconds = 0, files_per_second = 0;
    uint64_t mispredicted_opens = 0;
  };
  std::vector<Rank> ranks;
  uint64_t epoch = 0;  // the earliest live rank's
  uint64_t mispredicted_opens = 0;
  struct Plan {
    uint64_t cursor = 0, staged_up_to = 0, planned_up_to = 0, lead_files = 0;
  } plan;
  struct PageCache {
    uint64_t budget = 0, used = 0, pushes = 0, push_failures = 0, drops = 0, asked = 0, left_to_kernel = 0;
    uint64_t taken_back = 0;
  } pagecache;
  struct Progress {
    std::string from;  // "opens", "reads" or "watched opens"
    uint64_t beacon_every = 0, opens_seen = 0, closes_seen = 0, losses = 0;
    uint64_t other_readers = 0, reads_as_world_size = 0, other_opens = 0;
  } progress;
  struct Idle {
    int64_t after_seconds = 0;
    bool now = false;
    uint64_t releases = 0;
  } idle;
  // Where the daemon's memory goes, by part (bytes; the RAM tier's files are in `ram`).
  struct Memory {
    uint64_t entries = 0, manifest = 0, plan = 0, policy = 0, per_entry = 0, ram_bookkeeping = 0;
  } memory;

  std::optional<LearningStats> learning;  // a learning mount's (seed=auto, re-planning)

  // What an earlier plan's engine served and heard, added to this one's (LearningEngine: the mount's
  // numbers are every plan's).
  void add_served(const EngineStats& before);
};

nlohmann::json to_json(const EngineStats& s);

}  // namespace clairfs
