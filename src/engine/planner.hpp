// The planner: where this node's readers are in their predicted streams, and when each file is needed next.
//
// Everything the node's ranks will open, epoch after epoch, gets a key that orders it in time:
//   key = (step) * R + ri,   step = the epoch's first step + k,
// for the k-th item of the ri-th served rank's sequence (R ranks served). Ranks advance roughly step by
// step together, so keys order files as they will be opened, and "next use" is simply the smallest key
// of a file at or after a point — what Belady's MIN evicts by. The planner holds the streams of the
// readers' epoch and up to `horizon` epochs after it (built off the engine's lock by the stager, see
// wanted_epoch), so next use looks that far ahead; anything later counts as never.
//
// Progress: every open is placed in its rank's stream. Each rank has a next key (its first item not yet
// opened) and a set of items opened ahead of it — DataLoader workers open out of order within
// prefetch_factor × workers batches, so an open up to `tolerance` steps from the rank's next key is
// expected. A hole (an item never opened: padding, a skipped file) is stepped over once the rank's opens
// run tolerance/2 steps past it. The cursor is the smallest next key over the live ranks; items the
// cursor passes are reported (take_passed) so the tiers can re-key them by their next use.
//
// Silent uses (FUSE no-open mode): the kernel reads files whose pages it holds without a word to us. The
// engine presumes those uses (presume: it pushed the pages), or `unseen` says so (empty files, pages the
// kernel kept); a
// silent use counts as read once its rank opens something past it, and the distance of an open from
// its rank's place is measured from the first use there that is not silent. Reads of files the engine
// deliberately did not push (beacons) are then the opens that carry progress.
//
// Following the plan or not: each open a rank's reader makes is evidence. A reader in the plan's order
// opens near its rank's place (within the tolerance) nearly always (p1 = 0.97); a reader in any other
// order lands there only by chance, p0 = (2·tolerance + 1) / the rank's items in the epoch (at most 0.9).
// The planner keeps, per rank, the log-likelihood ratio of the two (a sequential test): an open near its
// place adds ln(p1/p0), one elsewhere (or one its processes make that no rank expects) adds
// ln((1-p1)/(1-p0)). After kMinEvidence opens, a ratio at or below -kDecide (odds of 100 to 1 that the
// order is another) makes the rank lost at once: typically after the least, 8 opens, when p0 <= 1/2; at
// most 48 over 50 other orders in planner_test when the tolerance covers three quarters of an epoch
// (small data sets with large batches). A rank is `confirmed` once its
// ratio reached +kDecide: only then are holes stepped over (so a reader in another order that lands near
// its place by chance cannot carry the progress away), and only then is the rank reported as following.
//
// Readers judged one by one: when every open is told with its opener (opens through handles, or the
// watch on the mount as root), each process is judged by its own opens instead, so that two jobs on one
// mount are two. Two tests run per process: its strays alone, as above; and how its opens lie against
// each other (Lay): a DataLoader worker reads a batch's items one after another, so its next open is
// within kStride items after its last in the same rank's stream nearly always (kNextShare), where a
// reader in another order lands there once per few hundred opens and elsewhere near the place the rest
// of the time. A process follows once the second test reached +kDecide with no strays against it; until
// then (and up to kMaxPending of them) its opens are held (pending) — counted as opened, so that they are
// not staged again, but not moving its rank — and taken then, or dropped if it is judged off, so that
// another job's chance hits never move a rank. A process at -kDecide in either test after kMinEvidence
// opens reads another order: its opens are counted
// apart (other_opens), are not placed, and make a rank lost only when none of its own readers followed
// it for stale_after opens; it brings a lost rank back only by a run of its own (below). A judged process
// is placed at the use of its file nearest its rank's place (one already opened counts a quarter of the
// tolerance further, unless a process not yet known to follow opened it: `tentative`), not at the first
// unopened one, which where the tolerance spans an epoch may be the next epoch's. A DataLoader's workers of the next
// epoch are new processes of the same parent and start from their predecessors' judgment (Lineage). A lost rank also
// comes back when one process's opens run on in its stream, each within kStride items of the one before
// (own_run_needed: as unlikely by chance as the resync run); that process follows, and its siblings are judged afresh.
//
// Misprediction: an open no live rank expects is counted. The node's opens are taken in blocks of
// `stale_after`; a rank with fewer than a quarter of its share of them expected in a block is lost (wrong
// seed, another sampler, finished, or idle — a random reader still lands inside the tolerance now and
// then, at a rate of about 2·tolerance / its epoch's length) — unless its opens in the block counted a
// quarter share of silent uses as read while its own processes' opens were mostly expected (a rank read
// from pushed pages opens little): it no longer holds the cursor back and
// nothing is staged for it. It is live again after enough of its opens in a row lie within the
// tolerance of each other ahead in its stream, in its epoch or the next (resync): kResync at least, and
// as many as a reader in another order reaches by chance less than once in 100 epochs (p0 as above;
// for an epoch of 3,000 items: 5 opens when p0 = 1/32, 15 when p0 = 0.38, 52 when p0 = 0.77). In a
// row: an open by one of its processes (known from their expected opens) that lies on none of its runs
// ends them, so a job that reads this rank's items in order between others' (another world size) stays
// lost.
//
// Thread-compatible: the engine guards it with its own mutex.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "clairfs/types.hpp"

namespace clairfs {

constexpr uint64_t kNever = UINT64_MAX;

// One epoch of this node's plan.
struct EpochStreams {
  uint64_t epoch = 0;
  std::vector<std::vector<EntryId>> seq;  // per served rank, in opening order
  uint64_t steps = 0;                     // the longest sequence
  // k * R + ri of each entry's first occurrence, or kAbsent: indexed by entry when the node reads a good
  // part of the data set each epoch, else as (entry, offset) pairs sorted by entry — a node serving one
  // rank of 64 needs 8 bytes per item rather than 4 per entry, for each epoch planned.
  std::vector<uint32_t> first;
  std::vector<std::pair<EntryId, uint32_t>> sparse;
  // Later occurrences in the epoch, sorted: the same file in two ranks' sequences (DistributedSampler's
  // padding; ranks at different epochs of their order, PlannerConfig::shift).
  std::vector<std::pair<EntryId, uint32_t>> more;
  std::vector<uint64_t> read;  // per rank: its items opened or presumed read (filled by the planner)
  static constexpr uint32_t kAbsent = UINT32_MAX;
  uint32_t first_of(EntryId id) const;
  // Calls f(offset) for each occurrence of id, first to last, until f returns true; whether one did.
  template <class F>
  bool each_use(EntryId id, F&& f) const {
    const uint32_t off = first_of(id);
    if (off == kAbsent) return false;
    if (f(off)) return true;
    for (auto it = std::lower_bound(more.begin(), more.end(), std::make_pair(id, uint32_t{0}));
         it != more.end() && it->first == id; ++it)
      if (f(it->second)) return true;
    return false;
  }
  size_t memory_bytes() const;
};

// Each served rank's sequence of entries for an epoch.
using StreamSource = std::function<std::vector<std::vector<EntryId>>(uint64_t epoch)>;

struct PlannerConfig {
  uint64_t ranks = 1;                 // R: ranks this node serves
  uint64_t entries = 0;               // manifest size
  uint64_t start_epoch = 0;
  uint64_t start_item = 0;            // each rank's first item in start_epoch (a job resumed mid-epoch)
  // Per rank (empty: all 0): its sequences in the plan's epoch e are those of its own epoch e + shift (the
  // StreamSource's doing); progress and epoch_of say the rank's own epochs.
  std::vector<uint64_t> shift;
  std::vector<uint64_t> start_items;  // per rank, its first item (empty: start_item for each)
  std::vector<bool> idle;             // per rank (empty: none): starts idle, not holding the cursor back
  uint64_t end_epoch = UINT64_MAX;    // exclusive
  uint64_t tolerance = 256;           // steps an open may lie from its rank's next key
  uint64_t stale_after = 0;           // node opens without an expected one before a rank is lost; 0: 2·tol·R + 64
  // Epochs planned after the readers' one. A node serving R of W ranks sees a file again about every
  // W/R epochs, so next use must look that far for eviction by next use to know it.
  uint64_t horizon = 2;
  // No-open mode: uses (key, entry) that do not reach the engine (empty files: the kernel reads nothing;
  // files whose pages the kernel holds). Also set later (set_unseen).
  std::function<bool(uint64_t, EntryId)> unseen;
  // Every open is told, with its opener (opens through handles): readers are judged one by one.
  bool every_open = false;
  // A StreamSource giving each rank's first `head_steps` items of an epoch alone, for a start epoch that
  // takes seconds to build whole (millions of files): the plan starts with that head, so staging starts
  // at once, and the whole epoch replaces it once built (wanted_epoch asks for it; estimates stand for
  // the uses beyond the head meanwhile, as for an epoch not built yet).
  StreamSource head;
  uint64_t head_steps = 0;
};

class Planner {
 public:
  // The chance that a rank whose reader follows the plan is called off it within `opens` opens of a
  // fresh start, when each of its opens falls outside the tolerance independently with chance `miss`
  // (p0 as above): the sequential test's walk, worked out exactly on a grid of its ratio (each step
  // rounded against the rank, so the answer is an upper bound).
  static double false_verdict_chance(double p0, double miss, uint64_t opens);
  static constexpr double kP1 = 0.97;  // an open near its place, for a reader in the plan's order
  static constexpr size_t kResync = 4;
  static constexpr uint64_t kMinEvidence = 8;
  static constexpr double kDecide = 4.6;  // ln 100

  static EpochStreams build(const StreamSource& source, uint64_t epoch, uint64_t ranks, uint64_t entries);

  // Builds start_epoch's plan at once.
  Planner(PlannerConfig config, const StreamSource& source);

  // The epoch the planner wants next, if any (build it with build(), off any lock, then add_epoch): the
  // start epoch itself while only its head is planned (PlannerConfig::head).
  std::optional<uint64_t> wanted_epoch() const;
  // REQUIRES: e.epoch == *wanted_epoch(). The whole of an epoch planned by its head replaces the head.
  void add_epoch(EpochStreams e);
  // No more epochs will be added (one could not be built): the plan ends where it is, and next use beyond
  // it is never.
  void close_plan() {
    config_.end_epoch = epochs_.back().epoch + 1;
    head_only_ = false;
  }
  // Whether the last epoch planned is the head of its epoch only.
  bool head_only() const { return head_only_; }

  struct Open {
    bool expected = false;
    uint64_t key = kNever;  // where it was placed (kNever when unexpected)
    uint64_t rank = 0;      // index among the served ranks
    uint64_t presumed = 0;  // silent uses of that rank this open counted as read
    bool blamed = false;    // unexpected, and counted against `rank` (its process's, or whose file it is)
  };
  // `pid`: the opener, 0 if not known (a user's watch is not told). `parent`: its parent process, if known
  // (0 if not): the workers of one DataLoader share it.
  Open on_open(EntryId id, pid_t pid, pid_t parent = 0);

  // The kernel holds the pages of the use at `key` (the engine pushed them), so its reader reads it
  // without asking: a silent use. Ignored for a lost rank or a use already opened.
  void presume(uint64_t key);
  // Which uses do not reach the engine (PlannerConfig::unseen), until opens are seen.
  void set_unseen(std::function<bool(uint64_t, EntryId)> unseen) {
    if (!every_open_) config_.unseen = std::move(unseen);
  }
  // Every open is told from now on (no-open mode with a watch on the mount): no use is unseen, and the
  // uses presumed read so far (pushed before the watch began) are not; readers are judged one by one.
  void opens_seen() {
    config_.unseen = nullptr;
    every_open_ = true;
    for (Rank& r : ranks_) r.silent.clear();
  }
  // Whether `key` is the last use of its rank in its epoch.
  bool last_in_epoch(uint64_t key) const;
  // Silent uses counted as read, in all.
  uint64_t presumed() const { return presumed_; }

  // Keys the cursor passed since the last call, with their entries, in key order.
  std::vector<std::pair<uint64_t, EntryId>> take_passed();

  uint64_t cursor() const { return cursor_; }
  // The next key of the live rank furthest on (the cursor when none is live).
  uint64_t furthest() const;
  // Keys below this are planned (items known).
  uint64_t planned_end() const;
  // The entry at a key; nullopt for a hole (a shorter rank) or a key outside the plan.
  std::optional<EntryId> item(uint64_t key) const;
  // The smallest planned key >= from holding id. Beyond the plan: kNever, unless an epoch within the
  // horizon is still to be added (wanted_epoch; built on another thread), when the use is not known yet
  // and lies at least as far as max(from, planned_end()) — the key returned then, an estimate that the
  // tiers key their residents by until the epoch is added (StagingPolicy::plan_grew). Counting such a file
  // as never needed would let it go while the readers outrun the planning, and read it again.
  uint64_t next_use(EntryId id, uint64_t from) const;
  uint64_t rank_of(uint64_t key) const { return key % config_.ranks; }
  // True if the use at `key` has been opened already (its rank is past it, or opened it out of order).
  bool opened(uint64_t key) const {
    const Rank& r = ranks_[key % config_.ranks];
    return key < r.next || r.ahead.count(key) != 0 || r.tentative.count(key) != 0;
  }
  bool live(uint64_t rank) const { return ranks_[rank].live; }
  bool confirmed(uint64_t rank) const { return ranks_[rank].confirmed; }
  // Whether an open was ever placed in the rank (of this plan).
  bool read_any(uint64_t rank) const { return ranks_[rank].read_any; }
  // The least key an open was placed at in the rank (kNever: none): where a job resumed mid-epoch began.
  uint64_t least_read(uint64_t rank) const { return ranks_[rank].least; }
  // First key of the epoch after the one `key` lies in (kNever beyond the plan).
  uint64_t epoch_end_key(uint64_t key) const;
  // The epoch `key` lies in, if planned: its rank's own (see PlannerConfig::shift).
  std::optional<uint64_t> epoch_of(uint64_t key) const {
    uint64_t base = 0;
    const EpochStreams* e = epoch_of_step(key / config_.ranks, &base);
    return e ? std::optional<uint64_t>(e->epoch + shift(key % config_.ranks)) : std::nullopt;
  }
  uint64_t shift(uint64_t rank) const { return config_.shift.empty() ? 0 : config_.shift[rank]; }
  // The step of `key` within its epoch (its item's index in its rank's sequence), if planned.
  std::optional<uint64_t> step_in_epoch(uint64_t key) const {
    uint64_t base = 0;
    if (!epoch_of_step(key / config_.ranks, &base)) return std::nullopt;
    return key / config_.ranks - base;
  }

  // Why a rank is not live: its reads follow another order, or it stopped reading (finished, idle).
  enum class Lost { kNo, kOtherOrder, kIdle };
  Lost lost(uint64_t rank) const { return ranks_[rank].lost; }
  struct RankProgress {
    uint64_t epoch = 0;       // the epoch its reader is in: never one it has not read a file of
    uint64_t done = 0;        // items of that epoch it read (opened, or read from pushed pages)
    uint64_t total = 0;       // items of that epoch
    uint64_t next_key = 0;
    uint64_t next_epoch = 0;  // the epoch of its next item: where the plan expects it
    bool live = true;
    bool confirmed = false;   // the evidence says it follows the plan (see above)
    Lost lost = Lost::kNo;
    // It came back to the plan in a later epoch than this one, having read little of it: it reads
    // another epoch's order than the plan expected (another seed or start epoch).
    std::optional<uint64_t> shifted_from;
    uint64_t mispredicted = 0;  // unexpected opens from this rank's processes
  };
  RankProgress progress(uint64_t rank) const;  // in the rank's own epochs
  uint64_t mispredicted() const { return mispredicted_; }
  // Whether process `pid` follows a rank of the plan: judged to (with every open told), or placed in a
  // live rank by its expected opens.
  bool follows(pid_t pid) const {
    if (const auto it = readers_.find(pid); it != readers_.end()) return it->second.follows;
    const auto it = rank_of_pid_.find(pid);
    return !every_open_ && it != rank_of_pid_.end() && ranks_[it->second].live;
  }
  // Whether process `pid` is of another job than the plan's readers so far: it does not follow, and no
  // child of its parent ever followed (a job started again from scratch has new rank processes; a job
  // without set_epoch has the next epoch's workers of the same rank process). False where not known.
  bool new_lineage(pid_t pid) const {
    const auto it = readers_.find(pid);
    return it != readers_.end() && !it->second.follows && it->second.parent > 0 &&
           followed_parents_.count(it->second.parent) == 0;
  }
  // Whether process `pid` was judged to read in another order (with every open told).
  bool reads_other(pid_t pid) const {
    const auto it = readers_.find(pid);
    return it != readers_.end() && it->second.off;
  }
  // Readers judged to read in another order (another job's, with every open told), now; and their opens.
  uint64_t other_readers() const { return other_readers_; }
  uint64_t other_opens() const { return other_opens_; }
  // Bytes the planned epochs hold (their sequences and first-use indexes).
  size_t memory_bytes() const;
  uint64_t opens() const { return opens_; }
  std::string debug_rank(uint64_t k) const {
    const Rank& r = ranks_[k];
    return "next " + std::to_string(r.next / config_.ranks) + " reached " + std::to_string(r.reached / config_.ranks) +
           " tent " + std::to_string(r.tentative.size()) + " ahead " + std::to_string(r.ahead.size());
  }
  std::string debug_uses(EntryId id) const {
    std::string out;
    for (size_t i = 0; i < epochs_.size(); ++i) {
      const uint32_t off = epochs_[i].first_of(id);
      if (off == EpochStreams::kAbsent) continue;
      const uint64_t R = config_.ranks, rank = off % R, key = key_at(i, off);
      const Rank& r = ranks_[rank];
      out += "[e" + std::to_string(epochs_[i].epoch) + " r" + std::to_string(rank) + " step " +
             std::to_string(off / R) + " d " + std::to_string(distance(r, rank, key)) + " opened " +
             std::to_string(opened(key)) + " tent " + std::to_string(r.tentative.count(key)) + " next " +
             std::to_string(r.next / R) + "] ";
    }
    return out;
  }

 private:
  struct Rank {
    uint64_t next = 0;            // key of its first item not yet opened
    std::set<uint64_t> ahead;     // keys opened past next
    std::set<uint64_t> silent;    // presumed keys not yet passed
    std::set<uint64_t> tentative;  // keys opened by processes still judged: held (Reader::pending), counted as opened
    uint64_t reached = 0;         // the largest key opened (0: none since it was last placed)
    bool read_any = false;        // an open was placed in it (a rank that never read may start late)
    uint64_t least = kNever;      // the least key an open was placed at
    uint64_t expected_in_block = 0;
    uint64_t presumed_in_block = 0;      // silent uses its opens counted as read
    uint64_t mispredicted_in_block = 0;  // unexpected opens by processes known to read for it
    bool live = true;
    Lost lost = Lost::kNo;
    double evidence = 0;         // the log-likelihood ratio: plan against another order
    uint64_t evidence_opens = 0; // opens that made it, since it was last placed
    bool confirmed = false;
    uint64_t followed_at = kNever;  // the node's opens when a reader known to follow it last opened its next items
    // Where it was in the latest epoch dropped from the plan that it had items in: that epoch, its items
    // read, and its items (all of them, once it finished it).
    struct Left {
      uint64_t epoch = 0, done = 0, total = 0;
    };
    std::optional<Left> left;
    std::optional<uint64_t> shifted_from;  // came back in a later epoch than this one, most of it unread
    std::vector<uint64_t> resync;  // a lost rank's latest opens found ahead in its stream, close together
    uint64_t mispredicted = 0;
  };

  // progress() in the plan's epochs.
  RankProgress plan_progress(uint64_t rank) const;
  // The loaded epoch holding a step, or nullptr.
  const EpochStreams* epoch_of_step(uint64_t step, uint64_t* base) const;
  // The key of a rank's item after `key` (skipping holes, across epochs).
  uint64_t following(uint64_t rank, uint64_t key) const;
  // The key of a rank's first item at or after `key`.
  uint64_t at_or_after(uint64_t rank, uint64_t key) const;
  bool is_silent(const Rank& r, uint64_t key) const;
  // Steps from the rank's place (its next key past silent uses) to `key`: negative behind it.
  int64_t distance(const Rank& r, uint64_t rank, uint64_t key) const;
  // The first key at or after `key` whose use is not silent.
  uint64_t past_silent(const Rank& r, uint64_t rank, uint64_t key) const;
  // Places an open at `key`; returns how many silent uses it counted as read.
  uint64_t consume(Rank& r, uint64_t rank, uint64_t key);
  // One open of a live rank's reader as evidence: near its place (hit) or not; may make it lost.
  void weigh(Rank& r, uint64_t rank, bool hit);
  void lose(Rank& r, Lost why);
  // The rank an unexpected open counts against: its process's, the only one, or whose stream holds it.
  std::optional<uint64_t> blame(EntryId id, pid_t pid) const;
  // Items of the rank's sequence in the epoch its next key lies in (at least 1).
  double epoch_items(uint64_t rank) const;
  // Opens in a row, each landing by chance with `chance`, that come about by chance less than once in
  // 100 epochs of `items` opens (at least `least`).
  static size_t run_needed(double chance, double items, size_t least);
  // The chance that an open in another order lands within the tolerance of the rank's place.
  double chance_near(uint64_t rank) const;
  // Opens in a row close together that bring a lost rank back (at least kResync).
  size_t resync_needed(uint64_t rank) const;
  // The same for one reader's own opens in a row, each within kStride items after the one before.
  size_t own_run_needed(uint64_t rank) const;
  // The loaded epoch index holding a key's step (epochs_.size() if none).
  size_t epoch_index(uint64_t key) const;
  void update_cursor();

  PlannerConfig config_;  // unseen goes once opens are seen (opens_seen)
  const uint64_t stale_after_;
  std::deque<EpochStreams> epochs_;  // consecutive epochs, oldest first
  std::deque<uint64_t> base_;        // first step of each
  // The key of the use at offset `off` of epoch epochs_[i] (its step off / R, its rank off % R).
  uint64_t key_at(size_t i, uint64_t off) const {
    const uint64_t R = config_.ranks;
    return (base_[i] + off / R) * R + off % R;
  }
  std::vector<Rank> ranks_;
  std::unordered_map<pid_t, uint64_t> rank_of_pid_;  // learnt from expected opens
  // Which rank a process reads for: the rank of its latest expected opens in a row, and how many; from
  // kSureOpens on, its opens are placed in that rank first.
  // With every open told (opens_seen, or opens through handles), each process is judged by its own
  // opens, as each rank is without: a reader that opens near its rank's place follows (a DataLoader
  // worker of the mounted job); one that does not reads another order (another job on the same mount),
  // and its opens are then counted as another reader's, not placed: they neither move a rank nor count
  // against one that its own readers follow.
  struct Reader {
    uint64_t rank = 0;
    uint32_t opens = 0;
    double evidence = 0;  // the log-likelihood ratio of how its opens lay (Lay)
    double strays = 0;    // the same of its strays alone (a rank's test)
    uint32_t weighed = 0;
    bool follows = false;  // reached +kDecide
    bool off = false;      // reached -kDecide after kMinEvidence opens: another order
    pid_t parent = 0;
    uint64_t last_key = kNever;  // where its latest open was placed
    std::vector<uint64_t> run;   // its latest opens in a lost rank's stream, each shortly after the one before
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // (rank, key): opens held while it is judged (kMaxPending)
  };
  static constexpr size_t kMaxPending = 64;
  // How one open of a judged reader lay, against its previous one: shortly after it in the same rank's
  // stream (within kStride items: a DataLoader worker reads a batch's items one after another, or with
  // batches of one, every workers-th item), elsewhere near that rank's place, near another rank's place,
  // or near none. A reader in the plan's order opens its next items nearly always (kNextShare: a batch
  // of B items gives B - 1 of them, and with batches of one each worker's next item is `workers` on);
  // one in another order only by chance (kStride in the rank's items), and elsewhere in the same rank
  // the rest of the time.
  enum class Lay { kNext, kNear, kAside, kFar };
  static constexpr uint64_t kStride = 16;
  static constexpr double kNextShare = 0.9;
  // Each parent's latest child's judgment: a DataLoader's workers of the next epoch are new processes of
  // the same parent, and start from where their predecessors ended.
  struct Lineage {
    double evidence = 0;
    double strays = 0;
    uint32_t weighed = 0;
  };
  std::unordered_map<pid_t, Lineage> lineage_;
  std::unordered_set<pid_t> followed_parents_;  // parents of readers that followed
  static constexpr uint32_t kSureOpens = 4;
  static constexpr size_t kMaxReaders = 1 << 16;  // beyond, both maps start again
  static constexpr uint64_t kManyRanks = UINT64_MAX;
  std::unordered_map<pid_t, Reader> readers_;
  std::unordered_map<pid_t, uint64_t> parents_;  // a parent whose children read for one rank, or kManyRanks
  bool every_open_ = false;
  bool head_only_ = false;  // epochs_.back() is its epoch's head (PlannerConfig::head)
  uint64_t other_readers_ = 0;
  uint64_t other_opens_ = 0;
  uint64_t other_in_block_ = 0;  // opens of readers judged off, in this block
  // One open of a judged reader as evidence (how it lay against `rank`'s stream); may judge it off.
  void weigh_reader(Reader& reader, uint64_t rank, Lay lay);
  // A rank whose place no following reader went on recently, when a reader in another order opens its
  // files: lost to that order.
  void lose_unless_followed(uint64_t rank);
  // A reader's held opens once it is judged: taken (it follows) or dropped (it reads another order).
  void settle_pending(Reader& reader, bool take);
  // A lost rank is back with `back`'s opens: it follows, and its siblings judged off are judged afresh
  // (a DataLoader's other workers read for the same rank).
  void judge_afresh(Reader& back);
  std::optional<uint64_t> rank_read_for(pid_t pid, pid_t parent) const;
  void note_reader(pid_t pid, pid_t parent, uint64_t rank);
  uint64_t cursor_ = 0;
  std::vector<std::pair<uint64_t, EntryId>> passed_;
  uint64_t opens_ = 0;
  uint64_t mispredicted_ = 0;
  uint64_t presumed_ = 0;
};

}  // namespace clairfs
