// The reader tracker: what the engine learns from each open (or, without opens, each first read) — where
// its rank is in the plan (the planner places it), which ranks left the plan or came back, how fast each
// rank reads (files per second, which turns a lead in files into seconds), and whether a reader off the
// plan reads in sample order, so the next samples can be read ahead for it.
//
// Called by the request threads, under the engine's mutex (thread-compatible); the stager takes the
// read-ahead queue under the same mutex.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/stats.hpp"
#include "engine/diagnosis.hpp"
#include "engine/planner.hpp"
#include "util/clock.hpp"

namespace clairfs {

// A process's parent, from /proc/PID/stat; 0 if it is gone.
pid_t parent_from_proc(pid_t pid);
// A thread's process (its thread group), from /proc/TID/status; the thread itself if it is gone.
pid_t process_from_proc(pid_t tid);

class ReaderTracker {
 public:
  // REQUIRES: manifest and planner outlive the tracker.
  // `time`: where the readers' rates are timed.
  ReaderTracker(const Manifest& manifest, Planner& planner, uint64_t ranks,
                const TimeSource& time = TimeSource::steady());

  // Whether a rank's reads follow the plan, as the status and the log say it.
  using Verdict = RankVerdict;

  struct Seen {
    bool again = false;          // without a handle: the reader read its last file again (same use)
    Planner::Open open;          // where the planner placed it
    std::vector<uint64_t> lost;  // ranks that left the plan with this open
    bool returned = false;       // a rank came back to the plan
    std::vector<std::pair<uint64_t, Verdict>> changed;  // ranks whose verdict changed with this open
    std::vector<uint64_t> diagnose;  // ranks off the plan with enough new opens to diagnose (see recent)
    pid_t other = 0;                 // judged to read in another order, the first such reader since none was
    pid_t other_world = 0;           // the first reader found to read as another world size (reads_as_world)
    uint64_t world = 0, mounted_world = 0;  // that world size, and the mounted one
    bool world_decided = false;  // a reader was found to read as another world size (any, not only the first)
  };
  // Without a handle (no-open mode, a file's first read is its open): whether `pid` read `id` last too —
  // the same use again, not a use; noted as its last if not.
  bool read_again(EntryId id, pid_t pid);
  // A use of `id` by `pid` (an open, or a first read not read_again): placed in the plan.
  Seen on_use(EntryId id, pid_t pid);
  // The order is DistributedSampler's split of a shuffle: rank r's k-th item is the shuffle's k·W + r-th
  // (W = world_size; `ranks`: the training rank of each served rank). A DataLoader worker opens its
  // batch's items one after another, so the shuffle positions of its consecutive opens differ by the
  // world size the job runs with: a job of another world size whose ranks all read on this node opens
  // exactly the plan's files in the plan's order in sum, and is told apart only by this.
  // With batches of one and several workers, each worker opens every `workers`-th item of its rank, so
  // its opens lie workers × W apart: `per_worker` (the loader's workers then, else 1) divides that out.
  void set_world(uint64_t world_size, std::vector<uint64_t> ranks, uint64_t per_worker = 1) {
    world_size_ = world_size;
    training_ranks_ = std::move(ranks);
    per_worker_ = std::max<uint64_t>(per_worker, 1);
  }
  // The world size a reader was found to read as, where it is not the mounted one (0: none found).
  uint64_t reads_as_world() const { return reads_as_world_; }
  // What each process was found to read as (the mounted world size included): the world size, and the
  // training rank under it whose share its opens lie in.
  struct ReadsAs {
    uint64_t world = 0;
    uint64_t rank = 0;
    pid_t parent = 0;    // its parent process (a DataLoader worker's: the rank's training process), 0 if unknown
    uint64_t epoch = 0;  // the epoch its opens were in then
  };
  const std::unordered_map<pid_t, ReadsAs>& readers_as() const { return readers_as_; }
  // The latest opens (up to kKeptOpens, oldest first) of processes found to read as `world`, after the
  // `after`-th open of all (0: all kept); *last: the count of opens so far. What a new plan for that
  // world size is placed by.
  std::vector<std::pair<EntryId, pid_t>> opens_as(uint64_t world, uint64_t after, uint64_t* last) const;
  // The same of the processes judged to read in another order (Planner::reads_other): what a seed is
  // learned again from.
  std::vector<std::pair<EntryId, pid_t>> opens_other(uint64_t after, uint64_t* last) const;
  // The same of the processes that follow no rank of the plan (Planner::follows): what a rank that
  // starts late reads is looked for in.
  std::vector<std::pair<EntryId, pid_t>> opens_unplaced(uint64_t after, uint64_t* last) const {
    return opens_of([&](pid_t pid) { return !planner_.follows(pid); }, after, last);
  }
  // The latest kept opens of every process.
  std::vector<std::pair<EntryId, pid_t>> opens_all(uint64_t after, uint64_t* last) const {
    return opens_of([](pid_t) { return true; }, after, last);
  }
  static constexpr size_t kKeptOpens = 4096;
  static constexpr uint32_t kWorldEvidence = 12;  // consecutive opens' differences, a batch of 13 gives
  // Where a process's parent is found (for the planner: a DataLoader's workers read for their parent's
  // rank); by default none is.
  void set_parent_lookup(std::function<pid_t(pid_t)> lookup) { parent_lookup_ = std::move(lookup); }
  // Where a thread's process is found (the opener told is a thread); by default each is its own.
  void set_process_lookup(std::function<pid_t(pid_t)> lookup) { process_lookup_ = std::move(lookup); }

  // Samples queued for reading ahead (readers off the plan reading in sample order), oldest first.
  std::vector<EntryId>& readahead() { return readahead_; }
  double files_per_second(uint64_t rank) const { return rates_[rank].per_second; }
  Verdict verdict(uint64_t rank) const { return verdicts_[rank].now; }
  // The rank's latest opens (up to kRecent), oldest first: what a diagnosis works from.
  std::vector<EntryId> recent(uint64_t rank) const;
  // Bytes of its per-entry index (sample_of_).
  size_t memory_bytes() const { return sample_of_.capacity() * sizeof(uint32_t); }
  static constexpr size_t kRecent = 64;
  uint64_t ranks() const { return rates_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  void note_rate(uint64_t rank, uint64_t opens);
  // An unexpected open of the sample right after the previous unexpected open of the same process
  // queues the next samples.
  void read_ahead(EntryId id, pid_t pid);

  const Manifest& manifest_;
  Planner& planner_;
  const TimeSource& time_;
  struct RankRate {
    uint64_t opens = 0;        // files read (opened, or presumed read from pushed pages)
    uint64_t opens_since = 0;  // opens when `since` was taken
    Clock::time_point since{};
    double per_second = 0;
  };
  std::vector<RankRate> rates_;
  std::vector<uint8_t> was_live_;  // per rank, as of the last open: who got lost or came back
  struct Judged {
    Verdict now = Verdict::kChecking;
    Verdict said = Verdict::kChecking;  // the last verdict logged
    std::vector<EntryId> recent;  // a ring of its latest opens
    size_t recent_at = 0;         // where the next goes, once full
    uint64_t opens_off = 0;       // its opens since it went off the plan
    bool diagnose_later = false;  // back in another epoch with too few opens seen to say which order
  };
  std::vector<Judged> verdicts_;
  // Records the open as its rank's evidence; fills seen.changed and seen.diagnose.
  void note_verdicts(Seen& seen, EntryId id);
  std::vector<uint32_t> sample_of_;  // per entry: its sample index, or UINT32_MAX; built on first use
  struct Sequential {
    uint32_t last;       // the sample it opened last
    uint32_t queued_to;  // the last sample queued for it
  };
  std::unordered_map<pid_t, Sequential> last_unexpected_;
  std::unordered_map<pid_t, EntryId> last_read_;  // no-open mode: the file each reader read last
  uint64_t world_size_ = 0;                       // 0: not a DistributedSampler split
  std::vector<uint64_t> training_ranks_;
  uint64_t per_worker_ = 1;
  uint64_t reads_as_world_ = 0;
  std::unordered_map<pid_t, ReadsAs> readers_as_;
  std::vector<std::pair<EntryId, pid_t>> kept_opens_;  // a ring of the latest opens (with an oracle's split)
  uint64_t opens_kept_ = 0;                            // opens that went into it
  // Per process: the shuffle position of its last placed open and how far each of its next ones lay
  // (up to kWidest), until kWorldEvidence of them are counted; then the most common distance is the
  // world size it reads as, if it holds three quarters of them.
  static constexpr uint64_t kWidest = 64;
  struct Strides {
    uint64_t last = UINT64_MAX;
    uint32_t counted = 0;
    std::vector<uint8_t> by_distance;  // kWidest + 1 counts; released once decided
    bool decided = false;
  };
  std::unordered_map<pid_t, Strides> strides_;
  // Per process: the shuffle positions of its threads' latest placed opens (up to kProcessPositions). A
  // rank of world size W only opens positions of its own residue mod W, whichever of its threads opens
  // them; threads of one process that take turns at one order (a thread pool) may each open every other
  // position for a while, but between them open the others too, and are no rank of world size 2.
  static constexpr size_t kProcessPositions = 64;
  std::unordered_map<pid_t, std::vector<uint64_t>> process_positions_;
  // Whether every position `process` opened lately lies in residue `rank` mod `world`.
  bool one_share(pid_t process, uint64_t world, uint64_t rank) const;
  void note_world(Seen& seen, pid_t pid);
  std::vector<std::pair<EntryId, pid_t>> opens_of(const std::function<bool(pid_t)>& keep, uint64_t after,
                                                  uint64_t* last) const;
  std::function<pid_t(pid_t)> parent_lookup_;
  std::unordered_map<pid_t, pid_t> parents_;  // looked up once per process
  pid_t parent_of(pid_t pid);
  std::function<pid_t(pid_t)> process_lookup_;
  std::unordered_map<pid_t, pid_t> processes_;  // looked up once per thread
  pid_t process_of(pid_t pid);
  std::vector<EntryId> readahead_;
};

}  // namespace clairfs
