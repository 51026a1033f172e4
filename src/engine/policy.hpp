// The staging policy: which file to stage next, what to evict for it, and whether to ask a peer or
// SOURCE — decisions only. No I/O and no threads: the stager asks, acts, and tells it what happened, so
// the policy can be driven by a test or a simulation (bench/cache_sim) exactly as the daemon drives it.
//
// Keys are the planner's (planner.hpp): when a file is used. RAM and NVMe residents are indexed by next
// use (TierIndex); room is made by evicting the resident needed farthest in the future, and only if it is
// needed later than the file in question (Belady's MIN), within the eviction window ahead of the cursor;
// beyond the window files are staged into free room only — staging far ahead would push out files kept
// for later epochs and fetch them again (prefetching only pays within the lead the readers need).
//
// Thread-compatible: the engine guards it with its mutex (StagingCore::mutex), but PeerModel, which is
// the stager's alone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "clairfs/manifest.hpp"
#include "engine/planner.hpp"
#include "tiers/next_use.hpp"

namespace clairfs {

// Key of a read-ahead file in RAM: after every planned use, so it is the first to go.
constexpr uint64_t kReadAheadKey = kNever - 1;
// Key of a file this node keeps for the others but will not read itself within the plan: kept, and the
// first of those to go.
constexpr uint64_t kKeptForPeers = kNever - 2;

struct PolicyConfig {
  uint64_t ram = 0;            // the RAM budget, bytes
  uint64_t ranks = 1;          // ranks this node serves
  uint64_t loader_window = 16; // files a rank's DataLoader opens ahead
  unsigned depth = 32;         // staging reads in flight
  std::vector<uint16_t> owner; // per entry: the node keeping it for all (empty: alone)
  int node = 0;
  uint64_t mean_size = 1;      // bytes of a sample, on average (mean_sample_size)
  // Files per rank the walk stages before the opens confirmed a rank's place (0: no bound): where in its
  // epoch the job starts is not known until then (a job resumed mid-epoch skips the batches it did).
  uint64_t start_window = 0;
};

// The data set's mean sample size in bytes (at least 1): what budgets in bytes become in files.
uint64_t mean_sample_size(const Manifest& manifest);

class StagingPolicy {
 public:
  // REQUIRES: manifest and planner outlive the policy.
  StagingPolicy(const Manifest& manifest, const Planner& planner, PolicyConfig config);

  // Keys ahead of the cursor within which staging may evict: the larger of 1/16 of the RAM budget in
  // files of mean size, and the loaders' windows plus a ring's worth.
  uint64_t evict_window() const { return evict_window_; }
  bool within_window(uint64_t key) const { return key < planner_.cursor() + evict_window_; }
  // Within half the eviction window but no further than the readers' loaders and the staging reads hold
  // ahead, and not beyond the next epoch (a loader reads ahead within its epoch, however large its
  // window): a file the readers will want soon, which should be on its way now. (Half the eviction
  // window alone spans all of the data set when the RAM budget holds it.)
  bool needed_soon(uint64_t key) const;
  // The use at `key` is still to come: planned (no hole), its rank on the plan, not opened yet.
  bool upcoming(uint64_t key) const;
  // This node keeps the file for the others (it owns it in the global plan).
  bool owned(EntryId id) const { return !config_.owner.empty() && config_.owner[id] == config_.node; }

  TierIndex& ram() { return ram_; }
  const TierIndex& ram() const { return ram_; }
  TierIndex& nvme() { return nvme_; }
  // Bytes of its indexes and per-entry owners.
  size_t memory_bytes() const {
    return ram_.memory_bytes() + nvme_.memory_bytes() + config_.owner.capacity() * sizeof(uint16_t);
  }

  // The use a file read on demand is kept for: its next use not yet opened, else kKeptForPeers if this
  // node keeps it for the others, else kNever (not kept).
  uint64_t keep_key(EntryId id) const;
  // The key a staged file is held by in RAM once its read finished (kNever: passed meanwhile).
  uint64_t staged_key(EntryId id, bool readahead, bool keep_for_peers) const;
  // Its use after `key` (for NVMe admission).
  uint64_t after_key(EntryId id, uint64_t key, bool keep_for_peers) const;
  // The key of an NVMe copy just written for the use at `key`.
  uint64_t written_key(EntryId id, uint64_t key) const;

  // The readers passed the use at `key` of `id`: residents waiting for it now wait for `next`.
  void passed(EntryId id, uint64_t key, uint64_t next);
  // The plan grew (an epoch added) or was closed where it ended at `old_end`: residents keyed by an
  // estimate of their next use (at or beyond old_end, see Planner::next_use) are keyed by it anew.
  void plan_grew(uint64_t old_end);

  // The walk over the plan. next_candidate() skips holes, ranks off the plan, uses already opened,
  // files held, `busy` ones (in flight), files gone from SOURCE and files larger than the budget, and
  // returns the next file to stage; take() moves past it once it is staged (or room for it was found).
  // Until the opens confirmed a rank's place, it goes no further than the start window past the cursor.
  // A file whose attributes are still to be read (a mount up before they all were) is returned as
  // `pending`, size unknown: the walk waits there until they are.
  struct Candidate {
    uint64_t key;
    EntryId id;
    uint64_t size;
    bool pending = false;
  };
  std::optional<Candidate> next_candidate(const std::function<bool(EntryId)>& busy);
  void take() { ++stage_key_; }
  uint64_t stage_key() const { return stage_key_; }
  // The walk restarts from the cursor (a rank came back), or catches up with it.
  void restart() { stage_key_ = planner_.cursor(); }
  void catch_up() { stage_key_ = std::max(stage_key_, planner_.cursor()); }

  // The readers moved: each use the cursor passed (planner.take_passed(); the planner this policy
  // reads) is re-keyed in both tiers by its next use and told to `also` (the page window), and the walk
  // catches up with the cursor.
  void readers_moved(Planner& planner, const std::function<void(EntryId, uint64_t key, uint64_t next)>& also = {});

  // Room in RAM (ram()) for a file needed at `key`, as staging makes it: within the eviction window by
  // evicting residents needed later (kept ones only for a `kept` file, and last), beyond it free room
  // only. For a kept file (this node keeps it for the others), the RAM copies of files held elsewhere on
  // the node (`elsewhere`: NVMe has them; among the kRamCopyScan needed last) go before kept files,
  // however soon they are needed: they are read back from there, where a kept copy pushed out would be
  // read from SOURCE again. What goes is dropped from the index and handed to `evict`. The daemon's
  // staging core makes room so (and the simulators, which drive it: bench/core_driver.hpp).
  static constexpr size_t kRamCopyScan = 256;
  bool make_ram_room(uint64_t key, bool kept, const std::function<bool()>& reserve,
                     const std::function<void(EntryId)>& evict, const std::function<bool(EntryId)>& elsewhere = {});

  // Makes room in a tier for `size` bytes needed at `key`: while `reserve(size)` fails, evicts the
  // resident needed latest (if later than `key`; owned files only for an owned file): drops it from the
  // index and hands it to `evict`. False when nothing may go: wait for the readers.
  static bool make_room(TierIndex& index, uint64_t key, bool owned, const std::function<bool()>& reserve,
                        const std::function<void(EntryId)>& evict);
  // Room for read-ahead: only files no plan needs may go, or anything when no rank follows the plan.
  bool make_readahead_room(const std::function<bool()>& reserve, const std::function<void(EntryId)>& evict);

 private:
  const Manifest& manifest_;
  const Planner& planner_;
  const PolicyConfig config_;
  uint64_t evict_window_ = 0;
  bool started_ = false;    // the opens confirmed a rank's place (the start window is lifted)
  uint64_t lead_ = 1;       // keys ahead of the cursor that may be needed soon
  uint64_t stage_key_ = 0;  // next key the walk considers
  TierIndex ram_, nvme_;    // residents by next use
};

// The choice between a file's keeper and SOURCE for a file needed soon: seconds per file each way as
// measured (submission to completion, queueing included), scaled by how busy each way is now. SOURCE is
// chosen only when a peer is clearly slower (4×): peers spare the shared file system. Every 32nd choice
// goes to the peer anyway, so its estimate follows the present.
//
// The stager's alone; seconds() may be read from any thread (stats).
class PeerModel {
 public:
  // Whether to ask the keeper for a file; `soon`: the readers will want it soon
  // (StagingPolicy::needed_soon). Others go to the keeper however slow: latency matters only for files
  // needed soon. (It was half the eviction window, which with a RAM budget larger than the data set
  // spans all of it: a node then read from SOURCE whatever a slow keeper held, twice over the job.)
  bool prefer_peer(bool soon, unsigned peer_in_flight, unsigned source_in_flight, unsigned depth);
  // A fetch each way took `seconds`.
  void note(bool peer, double seconds);
  double seconds(bool peer) const { return (peer ? secs_peer_ : secs_source_).load(); }

 private:
  std::atomic<double> secs_peer_{0}, secs_source_{0};  // EWMA
  uint64_t peer_samples_ = 0, source_samples_ = 0;
  uint64_t choices_ = 0;
};

}  // namespace clairfs
