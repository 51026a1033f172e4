// seed=auto: a mount that learns the job's seed from its first reads, then stages by it.
//
// Until the seed is known, every read goes to SOURCE as on a plain mount (ram=0) and the opens are
// kept. A thread of its own tries the likely seeds against them (learn_seed) each time their count
// passes the next step (16, 24, 32, 48, 64, ...). When one fits, it builds the oracle for that seed and
// the clairvoyant engine, hands the engine every open kept so far (so the plan starts where the job
// is), and from then on every call goes to the engine. Files opened before keep reading from SOURCE.
// When no seed fits the first kMaxOpens opens, it stops trying, says so once, and the mount stays plain:
// never more SOURCE reads than a plain mount's.
//
// With the seed told (`told`, the oracle of the mount), there is nothing to learn. With files whose
// attributes a scan left for later (Manifest::Attributes::kLater, read in the background), the engine is
// built on this class's thread (it reads a spread of sizes for their mean) and starts as above with the
// opens kept meanwhile; its stager reads the attributes of the files it comes to before the fill does.
//
// Only the job's readers teach it: an open counts when its process runs as one of `learn_from`'s users
// (any user when that is empty), so another user's reads in some order cannot choose the seed.
//
// Once running, it plans again when the job does not read as the plan's world size (an elastic restart
// with 3 ranks on a world_size=2 mount; world_size=auto, which starts as 1): the engine says when a
// reader is found to read as another world size (ReaderTracker::readers_as), and once no live process
// reads as the plan's while some read as another (replan_for), a new oracle and engine are built for
// that world size: placed by those readers' latest opens, given the files the old engine held in RAM,
// and switched to. The old engine stops staging but stays for the handles opened through it. Handles
// carry their plan's number in two bits, so a mount plans kPlans times at most.
//
// Threads: the request threads call the Engine methods (stats() among them); the learning thread builds the
// engines. One mutex guards the kept opens and the switches; once an engine is there, calls take no lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/oracle.hpp"
#include "engine/clairvoyant.hpp"
#include "engine/diagnosis.hpp"
#include "tiers/source.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

// What a job's readers call for when they do not read as the plan's world size: a plan for `world`,
// serving `ranks`.
struct Replan {
  uint64_t world = 0;
  std::vector<uint64_t> ranks;
  uint64_t epoch = 0;  // the epoch they read (the latest any was found in)
  std::vector<uint64_t> shift;  // per rank, its epoch's distance from `epoch` (EngineConfig::epoch_shift)
};
// From what each process was found to read as (ReaderTracker::readers_as): none while a live process
// (or its parent: a DataLoader's workers come and go between epochs, its rank's process stays) reads
// as `world`; else the world size most live readers read as. `whole`: the node serves every rank of its
// world (its ranks follow the world size), else the ranks those readers read.
std::optional<Replan> replan_for(const std::unordered_map<pid_t, ReaderTracker::ReadsAs>& readers,
                                 const std::function<bool(pid_t)>& alive, uint64_t world, bool whole);

// When the mount plans again (see above).
struct Replanning {
  bool on = false;          // a torch order on a node alone (with peers, every node's plan would have to change)
  bool whole_node = false;  // the node serves every rank of its world, and so of the world planned for next
  bool world_auto = false;  // world_size=auto: the first plan (world_size=1) is a stand-in, its change expected
  // Called on the re-planning thread once a rank started late was looked for, before the plan is built
  // (tests: the ranks that follow read on meanwhile, as they do while a slow diagnosis runs).
  std::function<void()> after_late_diagnosis = nullptr;
  // Called on the re-planning thread once an order was learned again, before it is planned for (tests:
  // the plan's own readers read meanwhile, as they do while a slow learning runs).
  std::function<void()> after_relearning = nullptr;
  // Called on the re-planning thread as it switches to a new plan: before it is published (opens then go
  // to the old plan's engine) and once it is, before the old one's last opens are handed over (tests:
  // readers read on meanwhile, as they do while a thread at nice 10 waits for a core a busy job holds).
  std::function<void(bool published)> while_switching = nullptr;
};

// The files a job opened, a bit each (any thread; no lock): once it opened some of them again (an epoch
// of its ended), they are the files of its list — where that list is a walk some files are left out of
// (ImageFolder's is_valid_file), the walk less the files never opened.
class OpenedFiles {
 public:
  explicit OpenedFiles(size_t entries);
  void opened(EntryId id);
  bool has(EntryId id) const {
    return id / 64 < words_ && (bits_[id / 64].load(std::memory_order_relaxed) >> (id % 64)) & 1;
  }
  uint64_t files() const { return files_.load(std::memory_order_relaxed); }  // distinct
  uint64_t again() const { return again_.load(std::memory_order_relaxed); }  // opens of a file opened before

 private:
  size_t words_;
  std::unique_ptr<std::atomic<uint64_t>[]> bits_;
  std::atomic<uint64_t> files_{0}, again_{0};
};

class LearningEngine final : public Engine {
 public:
  static constexpr size_t kMaxOpens = 65536;
  static constexpr size_t kPlans = 4;  // handles carry the plan's number in two bits
  static constexpr size_t kSubfolderDepth = 3;  // folders below the samples' root tried as the job's (candidate_views)
  static constexpr size_t kGlobSuffixes = 8;    // more suffixes among the opens: no glob tried
  static constexpr size_t kGlobAfter = 64;      // opens a glob is tried on at the fewest
  static constexpr size_t kViews = 6;           // views kept at most (each holds its samples: 4 bytes a file)

  // REQUIRES: manifest, reader and `told` outlive it. `schedule`: the mount's, its seed to be learned;
  // `config`: the engine's. `told`: the oracle of the seed given instead (nothing learned), or nullptr:
  // then, with every file's attributes known, the engine is built at once (its errors thrown from here).
  // `learn_from`: the users whose opens are learned from (empty: anyone's). `replans`: plans again for
  // another world size (a torch order on a node alone: with peers, every node would have to).
  LearningEngine(const Manifest& manifest, SourceTier& reader, Schedule schedule, LearnQuestion question,
                 EngineConfig config, const Oracle* told = nullptr, std::vector<uid_t> learn_from = {},
                 Replanning replanning = {});
  ~LearningEngine() override;

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) override;
  void release(uint64_t handle) override;
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) override;
  // Watched opens are learned from (a first read is then only a read), and go to the engine once it runs.
  void watching_opens() override EXCLUDES(mutex_);
  void opened(EntryId id, pid_t pid) override EXCLUDES(mutex_);
  void closed(EntryId id, pid_t pid) override;
  void opens_lost() override;
  void low_on_memory() override;
  void caller(pid_t pid, uid_t uid) override EXCLUDES(pids_mutex_);

  // The engine's stats once it runs (SOURCE's before), with what was learned ("learned").
  EngineStats stats() const override;
  // The current plan's engine's, typed, with what was read before it and by earlier plans' engines
  // (nullopt before an engine runs).
  std::optional<EngineStats> snapshot() const EXCLUDES(mutex_);
  // What it learned and planned, typed: .clairfs/stats' "plan.world", "learned" and "waited".
  using Learning = LearningStats;
  Learning learning() const EXCLUDES(mutex_);
  // The oracle of the seed found (of the latest plan); nullptr until then.
  const Oracle* oracle() const { return oracle_ready_.load(std::memory_order_acquire); }

 private:
  // The engine of the current plan, if any, and its number.
  ClairvoyantEngine* current(uint64_t* plan = nullptr) const;
  std::optional<EngineStats> snapshot_locked() const REQUIRES(mutex_);
  Learning learning_locked() const REQUIRES(mutex_);
  // The engine a handle was opened through.
  ClairvoyantEngine* engine_of(uint64_t handle) const {
    return plans_[(handle >> 1) & (kPlans - 1)].load(std::memory_order_acquire);
  }
  // Keeps an open for learning; returns the engine instead once there is one (and its plan's number).
  ClairvoyantEngine* keep(EntryId id, pid_t pid, uint64_t* plan = nullptr) EXCLUDES(mutex_);
  // True when `pid` runs as one of learn_from_'s users (or learn_from_ is empty). Answered once per
  // process, while it is there: keep() asks for each open's, so that a process gone by the time its
  // opens are learned from (a DataLoader worker of an epoch past) is still known as the job's.
  bool from_the_job(pid_t pid) EXCLUDES(pids_mutex_);
  // Drops the opens of processes not from_the_job.
  void keep_the_jobs(std::vector<std::pair<EntryId, pid_t>>& opens) EXCLUDES(pids_mutex_);
  void run() EXCLUDES(mutex_);
  // Builds the first plan's engine for `oracle`, placed by `kept` then by the opens kept meanwhile,
  // and switches to it. Returns false (said) when it cannot start.
  bool start(const Oracle& oracle, std::vector<std::pair<EntryId, pid_t>> kept) EXCLUDES(mutex_);
  // Plans again each time the engine says a reader reads as another world size, until stopped.
  void replan_loop() EXCLUDES(mutex_);
  // One re-plan, if the readers call for it (replan_for). False while it waits for the plan's readers
  // to leave.
  bool replan() EXCLUDES(mutex_);
  // A learned seed learned again — or a told one replaced by the job's —, when no rank of its plan is
  // followed and the job's processes read in another order: learn_seed on their latest opens, and a plan
  // for the seed found. False while it waits for more of their opens (or for the plan's readers to go).
  bool relearn() EXCLUDES(mutex_);
  // Whether a rank of `e`'s plan is followed (the other order is then another job's, beside it); if so,
  // the next relearning waits for new opens again.
  bool plan_followed(const ClairvoyantEngine& e) EXCLUDES(mutex_);
  // A told seed: when each rank off the plan reads the planned order of another epoch (a job started at
  // another epoch than the mount was told, or restarted), or a rank that never read does (started epochs
  // after the others on the node), a plan from the earliest of them with each rank shifted to its own
  // epoch. False while a rank is off and the diagnosis has not found its epoch (looked at again).
  bool follow_epoch() EXCLUDES(mutex_);
  // A process reads in another order than the current plan's, or one of its ranks is off it.
  bool off_the_plan() const;
  // The opens a new plan is placed by: those after the `after`-th of the old engine's count; *last: the count.
  using OpensSince = std::function<std::vector<std::pair<EntryId, pid_t>>(uint64_t after, uint64_t* last)>;
  // Builds plan number n + 1 for `schedule`, serving `ranks` from `epoch` (each shifted to its own epoch
  // and starting at its item or idle, EngineConfig::epoch_shift, start_items, idle_ranks), placed by `opens` (those
  // kept before it was built, then those made meanwhile), hands it plan n's RAM copies, and switches to it; its
  // samples are `list`'s (nullptr: plan n's). False (said, after `words`) when it could not start.
  bool switch_plan(uint64_t n, const Schedule& schedule, std::vector<uint64_t> ranks, uint64_t epoch,
                   const std::string& words, const OpensSince& opens, std::vector<uint64_t> shift = {},
                   std::vector<uint64_t> start_items = {}, std::vector<bool> idle = {}, const Manifest* list = nullptr)
      EXCLUDES(mutex_);
  // The engine's configuration for plan number `plan`, of `world` ranks, serving `ranks`.
  EngineConfig plan_config(std::vector<uint64_t> ranks, uint64_t world, uint64_t plan);
  // Makes plan number `plan` (its engine in engines_) the one served.
  void publish(uint64_t plan, const Oracle* oracle);
  static constexpr uint64_t kTagBits = 7;  // a handle's low bits: SOURCE's (kSourceHandle), the plan's number
  static constexpr auto kLookAgain = std::chrono::seconds(1);
  static constexpr auto kLookSoon = std::chrono::milliseconds(100);  // relearn() waits for a few more opens
  // learn_seed on the subfolders' walks the opens point to, on `list`'s samples, then on the globs
  // (candidate_views). *used: the manifest whose samples it was found with.
  std::optional<Learned> learn_on(const Manifest& list, const LearnQuestion& q, const std::vector<EntryId>& ids,
                                  const Manifest** used);
  // What a job's opens point to: the mount's samples' root (nullopt where they are a list, samples=), the
  // folders below it that every file opened lies in (the shallowest first: ImageFolder(MOUNTPOINT/train)
  // where SOURCE holds val/ too), and the opened names' suffixes (".jpg"; none where they are many).
  struct Pointed {
    std::optional<std::string> root;
    std::vector<std::string> folders;
    std::vector<std::string> suffixes;
  };
  Pointed pointed_to(const std::vector<EntryId>& ids) const;
  // Views of the mount's tree whose samples a job reading there may have (`list` itself left out):
  // ImageFolder of each of those folders; or, `globs`, a sorted glob of the files with those suffixes, of
  // the root and of each folder. Made once each and kept (views_).
  std::vector<const Manifest*> candidate_views(const Manifest& list, const Pointed& pointed, bool globs);
  // `list` less the files the job never opened, once an epoch of its ended (opened_), every file it
  // opened being in `list` and some of `list` never opened; nullptr otherwise. Made again when the job
  // opened more files since.
  const Manifest* opened_view(const Manifest& list);
  // Whether an epoch of the job ended with some of `list` never opened (opened_view's first test: cheap).
  bool epoch_ended_short(const Manifest& list) const;
  // Tries the likely seeds each time enough opens are kept; the seed found (and the opens it fits in
  // `kept`), or nullopt when stopped or given up.
  std::optional<Learned> learn(std::vector<std::pair<EntryId, pid_t>>& kept) EXCLUDES(mutex_);

  const Manifest& manifest_;
  SourceTier& reader_;
  const Schedule schedule_;
  const LearnQuestion question_;
  const EngineConfig config_;
  const Oracle* const told_;
  const std::vector<uid_t> learn_from_;
  const Replanning replanning_;
  bool gave_up_ = false;  // a new plan failed once the old one was retired: no more plans (the learning thread's)

  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::pair<EntryId, pid_t>> opens_ GUARDED_BY(mutex_);
  std::unordered_map<pid_t, EntryId> last_unopened_ GUARDED_BY(mutex_);  // no-open mode: a reader's last file
  Mutex pids_mutex_ ACQUIRED_AFTER(mutex_);
  std::unordered_map<pid_t, bool> job_pids_ GUARDED_BY(pids_mutex_);     // from_the_job's answers
  uint64_t not_the_job_ GUARDED_BY(mutex_) = 0;                          // opens of other users', not learned from
  size_t tried_at_ GUARDED_BY(mutex_) = 0;  // opens the last try saw
  std::string state_ GUARDED_BY(mutex_);  // learning, found, not found, failed; told: waiting, told, failed
  std::string found_ GUARDED_BY(mutex_);   // "seed=43" once found
  size_t found_after_ GUARDED_BY(mutex_) = 0;
  // Tries of the first opens made before one found the seed (each with every open kept by then: a try
  // that starts late, behind a job at full speed, has more to go by).
  size_t tries_ GUARDED_BY(mutex_) = 0;
  bool stop_ GUARDED_BY(mutex_) = false;
  Replan plan_ GUARDED_BY(mutex_);                  // the current plan's world size and ranks
  uint64_t replanned_ GUARDED_BY(mutex_) = 0;       // plans made after the first
  uint64_t relearned_ GUARDED_BY(mutex_) = 0;       // seeds learned again (relearn)
  size_t relearn_tried_ GUARDED_BY(mutex_) = 0;     // the plan's opens when relearning last tried
  size_t late_tried_ GUARDED_BY(mutex_) = 0;        // the same, looking for ranks started late (follow_epoch)
  bool look_soon_ GUARDED_BY(mutex_) = false;       // relearn() waits for a few more opens (kLookSoon)
  uint64_t relearn_seen_ GUARDED_BY(mutex_) = 0;    // the plan's opens when relearn() last waited for more

  // Each plan's oracle and engine, written by the learning thread before the plan's number is published
  // (plans_, plan_now_); the engines stay to the end, for the handles opened through them.
  std::unique_ptr<Oracle> oracles_[kPlans];
  std::unique_ptr<ClairvoyantEngine> engines_[kPlans];
  // The same of the manifest whose samples each plan is of: the mount's, or a view of the subfolder the
  // job was found to read. The views are made on the learning thread and kept to the end.
  const Manifest* lists_[kPlans] = {};
  std::vector<std::unique_ptr<Manifest>> views_;
  OpenedFiles opened_;                     // the job's (from_the_job)
  const Manifest* opened_view_ = nullptr;  // the last opened_view made (in views_): of this list, these files
  const Manifest* opened_view_base_ = nullptr;
  uint64_t opened_view_files_ = 0;
  const Manifest* learned_list_ = nullptr;  // the samples learn() found the seed on (the learning thread's)
  std::string samples_words_ GUARDED_BY(mutex_);  // the current plan's list, where learned (folder_words)
  std::atomic<ClairvoyantEngine*> plans_[kPlans] = {};
  std::atomic<uint64_t> plan_now_{0};
  std::atomic<uint64_t> source_bytes_{0};  // read from SOURCE for the engine's callers before it was there
  std::atomic<uint64_t> source_files_{0};  // files opened there then
  // Opens and closes the watch told before there was an engine (the plans' count from theirs on): in the
  // progress counts, which then hold every open and close told.
  std::atomic<uint64_t> opens_before_{0}, closes_before_{0};
  std::atomic<const Oracle*> oracle_ready_{nullptr};
  std::atomic<bool> watched_{false};  // set under mutex_, so that the engine is told once it is there
  std::atomic<bool> world_said_{false};  // the engine found a reader of another world size since the last look
  std::atomic<bool> other_said_{false};  // the engine judged a reader to read in another order (none did)
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace clairfs
