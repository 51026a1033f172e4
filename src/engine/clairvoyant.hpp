// ClairvoyantEngine: stages the files this node's ranks will open next before they ask, and keeps what
// is needed again by next use. This is the facade: it implements Engine for the FUSE front-end and wires
// the parts, each in its own file —
//
//   planner.hpp         the plan: when each file is used, epoch after epoch, and where the readers are
//   reader_tracker.hpp  what each open says: progress, ranks lost or back, rates, sequential readers
//   policy.hpp          what to stage next, what to evict for it (Belady's MIN), peer or SOURCE
//   page_window.hpp     pushes into the kernel's page cache just ahead of the readers, beacons, drops
//   stager.hpp          the background thread: its io_uring loop, picks, reads, NVMe writes
//   demand.hpp          misses: files read on the request threads, whole or piece by piece
//   tiers/chain.hpp     where bytes not in RAM come from: NVMe, the keeper node, SOURCE (one chain)
//   counters.hpp        every number the engine counts
//   engine_stats.hpp    the stats, typed, and their JSON
//
// and StagingCore (core.hpp), what the request threads and the stager share under one mutex.
//
// An open (or, in FUSE no-open mode, a file's first read) is placed in the plan, and served from the RAM
// copy staged for it (or the kernel's pages pushed for it); anything else is read on demand. Opens no
// rank expects are counted as mispredictions; a rank that keeps missing is dropped from the plan until it
// returns. Bytes are right whatever happens. docs/engine.md tells the whole story.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/oracle.hpp"
#include "clairfs/peer.hpp"
#include "clairfs/stats.hpp"
#include "clairfs/store.hpp"
#include "engine/core.hpp"
#include "engine/counters.hpp"
#include "engine/demand.hpp"
#include "engine/diagnosis.hpp"
#include "engine/reader_news.hpp"
#include "engine/stager.hpp"
#include "peer/peer_store.hpp"
#include "tiers/chain.hpp"
#include "tiers/nvme.hpp"
#include "tiers/page_cache.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

class ClairvoyantEngine;

// Epochs planned after the readers' one, for a node serving `ranks` of `world`: a file comes back to it
// about every world / ranks epochs, so eviction by next use must see that far (and one more); 16 at
// most, since each epoch planned costs memory.
inline uint64_t plan_horizon(uint64_t world, uint64_t ranks) {
  return std::min<uint64_t>(16, (world + ranks - 1) / std::max<uint64_t>(ranks, 1) + 1);
}

struct EngineConfig {
  uint64_t ram = 0;                // bytes
  std::vector<uint64_t> ranks;     // the training ranks this node serves
  uint64_t start_epoch = 0;
  uint64_t start_item = 0;  // each served rank's first item of start_epoch (start_batch × batch_size)
  // Files per rank staged before the opens confirmed a rank's place (PolicyConfig::start_window); 0: no
  // bound.
  uint64_t start_window = 0;
  // Per served rank (empty: all 0): in the plan's epoch e it reads its epoch e + shift — ranks that
  // started at different epochs (one started epochs after the others on its node). The least is 0.
  std::vector<uint64_t> epoch_shift;
  std::vector<uint64_t> start_items;  // per served rank, its first item (empty: start_item for each)
  std::vector<bool> idle_ranks;       // per served rank (empty: none): idle from the start (a re-plan's)
  std::optional<uint64_t> epochs;
  // The start epoch's first head_steps items per rank alone (PlannerConfig::head): set by the engine built
  // from an oracle for a large epoch; engine tests give one of their own.
  StreamSource head;
  uint64_t head_steps = 0;
  unsigned depth = 32;             // opens, reads and writes in flight
  // Bytes of staging reads in flight at most (one file at least): 32 small files keep a source busy, but
  // 32 large ones would share its bandwidth and each come 32 times later than alone — the first a reader
  // waits for too (a 140 MB file at 100 MB/s: 11 s, not 1.4; and read again on demand when the wait gave
  // up). Below it files come in the order they are needed.
  uint64_t bytes_in_flight = 64 << 20;
  uint64_t tolerance = 256;        // steps an open may stray from its rank's place (Planner)
  uint64_t horizon = 2;            // epochs planned after the readers' one (Planner)
  uint64_t loader_window = 16;     // files a rank's DataLoader opens ahead: prefetch_factor × workers × batch
  std::string nvme;                // a directory; empty: no NVMe tier
  uint64_t nvme_size = 0;          // 0: 90% of what is free there
  uint64_t pagecache = 0;          // bytes pushed ahead into the kernel at most; 0: no pushes
  PageCache* page_cache = nullptr; // where pushes go; nullptr: no pushes
  bool no_open = false;            // the kernel opens files without asking: progress comes from reads
  PeerTransport* peers = nullptr;  // the other nodes' daemons; nullptr: alone
  std::vector<uint16_t> owner;     // per entry: the node that keeps it for all (empty: alone)
  std::vector<EntryId> handed;     // files it keeps that another node reads first (Keepers::handed)
  uint64_t unkept = 0;             // files no node has room to keep (Keepers::unkept), for the stats
  std::chrono::milliseconds peer_wait{7000};  // a read waiting on a peer gives up after this
  // After this long without a read (an open, a read, a peer's request) RAM and pushed pages are given back
  // and staging waits for the next read (idle=); zero: never.
  std::chrono::milliseconds idle{0};
  // After memory ran short (an allocation failed), the RAM budget is raised again by steps, each after
  // this long without another failure.
  std::chrono::milliseconds memory_retry{30000};
  // Opens made before the engine was there (seed=auto), placed in the plan before the stager starts (so
  // that it does not stage what was read already).
  std::vector<std::pair<EntryId, pid_t>> opened_before;
  // The engine of a re-plan, published while the old plan's engine may still take opens: those told to it
  // wait, unplaced, until the old engine's last are handed over (take_over), then are placed after them.
  bool handed_over = false;
  // A watch on the mount tells every open with its opener (LearningEngine sets it for every plan of a
  // watched mount): readers are judged one by one from the first of the opens above.
  bool watched = false;
  // Where a process's parent is found (a DataLoader's workers read for their parent's rank); nullptr: in
  // /proc, when first asked (0 for a process gone by then). Tests make up the parents.
  std::function<pid_t(pid_t)> parent_of;
  // Where a thread's process is found (threads of one process that share its reading are one reader to
  // the world size found from opens); nullptr: in /proc, when first asked (the thread itself if gone).
  std::function<pid_t(pid_t)> process_of;
  // The files the engine of the mount's last plan held in RAM (a re-plan, LearningEngine): taken once
  // the opens above are placed, before staging starts, and kept as RAM allows (adopt); given the new
  // engine, to which the old one's reads on demand go from then on (ClairvoyantEngine::retire).
  std::function<std::vector<std::pair<EntryId, FileBytes>>(ClairvoyantEngine& next)> adopt;
  // A reader found to read as another world size makes whoever built the engine plan again (on_world),
  // rather than a remount: what the log says.
  bool replans = false;
  // Re-planning (LearningEngine), called off the engine's lock from its first open on (catch_up's too):
  // each time a reader is found to read as another world size than the plan's;
  std::function<void()> on_world;
  // and once until a rank follows the plan again, when a reader is judged to read in another order or a
  // rank goes off the plan (a learned seed may be learned again from what they read).
  std::function<void()> on_other_order;
};

class ClairvoyantEngine final : public Engine {
 public:
  // REQUIRES: manifest, oracle, source and page_cache outlive the engine. Starts the stager thread;
  // throws std::runtime_error if io_uring cannot be set up, NvmeError if the NVMe directory cannot be used.
  ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceStore& source, EngineConfig config);
  // The same with the plan's streams given directly (engine tests, simulations).
  ClairvoyantEngine(const Manifest& manifest, StreamSource streams, SourceStore& source, EngineConfig config);
  ~ClairvoyantEngine() override;

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) override;
  void release(uint64_t handle) override;
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) override;
  void watching_opens() override EXCLUDES(state_.lock());
  void opened(EntryId id, pid_t pid) override EXCLUDES(state_.lock());
  void closed(EntryId id, pid_t pid) override EXCLUDES(state_.lock());
  // closed(), and whether it counted a use (an open told here that no read reached).
  bool close_told(EntryId id, pid_t pid) EXCLUDES(state_.lock());
  // Whether an open of `id` told here has had no read yet (its close counts it).
  bool unread_open(EntryId id) const EXCLUDES(state_.lock());
  // A plan changed while a told open of `id` had no read yet: the engine of the old plan gives that use up
  // (true if it had one; it counts it no more), and the new plan's engine takes it as told to it, so that
  // its first read or its close counts it, once (it was counted by the new engine's read and again by the
  // old engine's close: 6,001 uses served of 6,000 in an ASan run of test_readers' late rank).
  bool give_up_unread_open(EntryId id) EXCLUDES(state_.lock());
  void take_unread_open(EntryId id) EXCLUDES(state_.lock());
  void opens_lost() override EXCLUDES(state_.lock());
  void low_on_memory() override EXCLUDES(state_.lock());

  // Opens made before the engine was there (seed=auto learns the seed from them): placed in the plan in
  // order, as if made now, so that it starts where the readers are.
  void catch_up(const std::vector<std::pair<EntryId, pid_t>>& opens) EXCLUDES(state_.lock());
  // A re-plan's engine (EngineConfig::handed_over), published: the opens the old plan's engine took last,
  // then those told here meanwhile, placed in the order they were made — each counted once, none lost
  // (placed after later ones, those fell behind the rank: test_seed_auto under TSan ended its job's
  // last epoch at 1,823 of 3,000, the plan published 1,177 opens into it by a thread at nice 10).
  void take_over(const std::vector<std::pair<EntryId, pid_t>>& opens) EXCLUDES(state_.lock());
  // Plans the epochs `opens` opens could reach, as catch_up does first: called before it where opens wait
  // while it runs (an epoch of a large data set takes seconds to build).
  void plan_for(size_t opens) EXCLUDES(state_.lock());

  // What it has done, at one moment.
  EngineStats stats() const override EXCLUDES(state_.lock());

  // What this node answers when a peer asks for a file (for PeerTransport::start): its RAM or NVMe copy.
  PeerTransport::Lookup peer_lookup();

  // The readers as the staging core judges them, for re-planning (LearningEngine): whether a rank is
  // followed, the processes in another order or of another world size and their latest opens, the ranks
  // off the plan, a late start suspected (core.hpp, "where the readers are").
  const StagingCore& readers() const { return state_; }
  // Where each served rank reads (an off rank's epoch the diagnosis's), for a plan that follows them all
  // (LearningEngine::follow_epoch).
  using RankAt = StagingCore::RankAt;
  std::vector<RankAt> ranks_at() const EXCLUDES(state_.lock());
  // For each served rank that never read, the epoch of the planned order it reads in, from `others`, the
  // opens of processes that follow no rank (StagingCore::opens_unplaced): ReaderNews::late_epochs.
  std::vector<std::optional<uint64_t>> late_epochs(const std::vector<std::pair<EntryId, pid_t>>& others,
                                                   uint64_t at_epoch) const EXCLUDES(state_.lock());
  // The epoch the plan's cursor is in (its earliest live rank's).
  uint64_t reading_epoch() const EXCLUDES(state_.lock());
  // The plan is over: staging stops (its reads in flight kept) and the files held in RAM are handed
  // over to the next plan's engine (EngineConfig::adopt), and still served here until free_ram(), once
  // that engine serves. Opens and reads keep working, from RAM, then SOURCE or NVMe; what they read whole
  // goes to `next` to keep (DemandReader::hand_to), as do their files read on demand not yet kept here.
  std::vector<std::pair<EntryId, FileBytes>> retire(ClairvoyantEngine& next) EXCLUDES(state_.lock());
  void free_ram() EXCLUDES(state_.lock());
  // The engine retire() was given failed to start: reads on demand are this one's own again.
  void successor_gone();
  // retire() was called (asked by the thread that called it).
  bool retired() const { return !stager_; }
  // Files kept from the last plan's engine (EngineConfig::adopt).
  uint64_t adopted() const { return adopted_; }

 private:
  // The members made, the parent lookup set; the public constructors end with begin().
  struct Parts {};
  ClairvoyantEngine(Parts, const Manifest& manifest, StreamSource streams, SourceStore& source, EngineConfig config);
  // Once the tracker and the diagnosis know the order (the Oracle's constructor): the opens made before
  // placed, the files of the plan before adopted, the stager started.
  void begin() EXCLUDES(state_.lock());
  // An open of `id` (or, without a handle, a first read): places it, wakes the stager if the readers
  // moved far enough. Returns the RAM copy, if any (after waiting for a staging read of it in flight),
  // and where it came from (kRam or kPeer). *again: a reader without a handle read its last file again.
  FileBytes note_open(EntryId id, pid_t pid, bool handle, Origin* from, bool* again) EXCLUDES(state_.lock());
  // Waits for `id`'s staging read if one is in flight (kWaitForStaging at most); its bytes (RAM's copy, or what the
  // read brought), or nullptr, and where they came from (kRam, kPeer).
  FileBytes wait_for_staging(StagingCore::Turn& turn, EntryId id, Origin* from) REQUIRES(state_.lock());
  // A retired engine's miss: the next plan's engine may hold `id` or be staging it (its stager starts
  // before it serves): its copy, or nullptr. Without it a reader in the switch read SOURCE for a file the
  // new stager was reading (ASan's test_readers: 2 files of 1,500 read twice, 1 run in 4).
  FileBytes from_successor(EntryId id, Origin* from) EXCLUDES(state_.lock());
  // A reader or a peer asked for something now (idle=).
  void touch() { state_.touch(); }
  void touch(std::chrono::steady_clock::time_point now) { state_.touch(now); }
  // What placing an open did, acted on once the lock is let go: counted, logged, the stager woken, told.
  void placed(StagingCore::Placed& p) EXCLUDES(state_.lock());

  const Manifest& manifest_;
  const EngineConfig config_;
  const StreamSource streams_;
  EngineCounters counters_;
  RamTier ram_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<PeerStore> peers_;
  const uint64_t mean_size_;        // a sample's mean size: one walk over the samples, for the parts below
  mutable StagingCore state_;
  StoreChain chain_;  // its copies up to NVMe admitted by state_
  DemandReader demand_;
  // A watch on the mount tells the opens (watching_opens): first reads are reads, nothing is presumed.
  std::atomic<bool> watched_{false};
  std::atomic<ClairvoyantEngine*> successor_{nullptr};  // retire()'s `next`
  ReaderNews news_;                 // what placing opens changed, said and acted on after the lock
  uint64_t adopted_ = 0;            // files kept from the last plan's engine
  std::unique_ptr<Stager> stager_;  // last: it uses everything above
};

}  // namespace clairfs
