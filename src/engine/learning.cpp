#include "engine/learning.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "util/log.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

void apply(const Learned& found, Schedule& s) {
  s.seed = found.seed;
  s.order = found.order;
  s.draws = found.draws;
}

// What was learned, for the log: "seed=5", or the global generator's seed with the options that say it.
std::string learned_words(const Learned& found) {
  if (found.order == Order::kTorch) return learned_options(found);
  return "RandomSampler without a generator, its seed from torch's global one after torch.manual_seed(" +
         seed_text(found.seed) + ") and " + std::to_string(found.draws) + " draws before the loader's (" +
         learned_options(found) + ")";
}

// How a job reading another list than the mount's is named in the log and the stats:
// "ImageFolder(MOUNTPOINT/train) (1459 samples)", "sorted(glob('MOUNTPOINT/**/*.jpg')) (1500 samples)".
std::string folder_words(const Manifest& view) {
  const std::string dir = "MOUNTPOINT" + (view.sample_root().value_or("").empty() ? "" : "/" + *view.sample_root());
  std::string what = "ImageFolder(" + dir + ")";
  if (view.globbed()) {
    what = "sorted(glob('" + dir + "/**/*" + view.sample_suffixes().front() + "'))";
    for (size_t i = 1; i < view.sample_suffixes().size(); ++i) what += " + *" + view.sample_suffixes()[i];
  }
  if (view.left_out() > 0)  // (opened_view)
    return what + " less the " + std::to_string(view.left_out()) + " files it never opened (" +
           std::to_string(view.samples().size()) + " samples: is_valid_file?)";
  return what + " (" + std::to_string(view.samples().size()) + " samples)";
}

// Handles of files opened before the engine was there are SOURCE's, marked by their low bit (both kinds
// are pointers to objects aligned to at least 8).
constexpr uint64_t kSourceHandle = 1;

// The opens at which the next try is made: 16, 24, 32, 48, 64, 96, ... (each try shuffles the data set
// a few hundred times, so tries grow apart as the opens do).
size_t next_try(size_t tried) {
  if (tried < kMinDiagnosisOpens) return kMinDiagnosisOpens;
  size_t step = kMinDiagnosisOpens;
  while (step * 2 <= tried) step *= 2;
  return tried < step + step / 2 ? step + step / 2 : 2 * step;
}

// Runs `work` on a thread of its own at nice 10 and waits for it: shuffles of the whole data set are
// background work, below the threads that serve reads. Not on the calling thread: the engine's threads
// are started from it and would inherit its priority (a learned engine's stager ran at nice 10 and fell
// behind a job reading at full speed).
void run_niced(const std::function<void()>& work) {
  std::thread shuffler([&] {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    work();
  });
  shuffler.join();
}

// True while a process runs (or runs as another user).
bool process_alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

std::optional<Replan> replan_for(const std::unordered_map<pid_t, ReaderTracker::ReadsAs>& readers,
                                 const std::function<bool(pid_t)>& alive, uint64_t world, bool whole) {
  // A reader gone counts by its parent while that lives, unless the parent also has a live reader of
  // another world size (workers=0 under torchrun: one agent is the parent of the ranks before and after
  // an elastic restart).
  std::map<pid_t, std::set<uint64_t>> live_worlds_of_parent;
  for (const auto& [pid, as] : readers)
    if (as.parent > 1 && alive(pid)) live_worlds_of_parent[as.parent].insert(as.world);
  std::map<uint64_t, size_t> count;
  std::map<uint64_t, std::set<uint64_t>> ranks;
  std::map<uint64_t, uint64_t> epoch;
  for (const auto& [pid, as] : readers) {
    bool live = alive(pid);
    if (!live && as.parent > 1 && alive(as.parent)) {
      const auto& worlds = live_worlds_of_parent[as.parent];
      live = worlds.empty() || (worlds.size() == 1 && *worlds.begin() == as.world);
    }
    if (!live) continue;
    if (as.world == world) return Replan{};  // the plan's readers are still there
    ++count[as.world];
    ranks[as.world].insert(as.rank);
    epoch[as.world] = std::max(epoch[as.world], as.epoch);
  }
  if (count.empty()) return std::nullopt;
  const uint64_t most = std::max_element(count.begin(), count.end(), [](const auto& a, const auto& b) {
                          return a.second < b.second;
                        })->first;
  Replan r{most, {}, epoch[most], {}};
  if (whole)
    for (uint64_t k = 0; k < most; ++k) r.ranks.push_back(k);
  else
    r.ranks.assign(ranks[most].begin(), ranks[most].end());
  return r;
}

OpenedFiles::OpenedFiles(size_t entries)
    : words_((entries + 63) / 64), bits_(std::make_unique<std::atomic<uint64_t>[]>(words_)) {}

void OpenedFiles::opened(EntryId id) {
  if (id / 64 >= words_) return;
  const uint64_t bit = uint64_t{1} << (id % 64);
  if (bits_[id / 64].fetch_or(bit, std::memory_order_relaxed) & bit)
    again_.fetch_add(1, std::memory_order_relaxed);
  else
    files_.fetch_add(1, std::memory_order_relaxed);
}

LearningEngine::LearningEngine(const Manifest& manifest, SourceTier& reader, Schedule schedule, LearnQuestion question,
                               EngineConfig config, const Oracle* told, std::vector<uid_t> learn_from,
                               Replanning replanning)
    : manifest_(manifest),
      reader_(reader),
      schedule_(std::move(schedule)),
      question_(std::move(question)),
      config_(std::move(config)),
      told_(told),
      learn_from_(std::move(learn_from)),
      replanning_(replanning),
      // (kept only where a list may be learned: a walk's samples, and a seed learned or plans made again)
      opened_(manifest.sample_root() && (!told || replanning.on) ? manifest.size() : 0) {
  lists_[0] = &manifest_;
  {
    MutexLock lock(mutex_);
    state_ = told_ ? "waiting" : "learning";
    plan_ = {schedule_.world_size, config_.ranks, config_.start_epoch, {}};
  }
  // The seed told and every file's size known: nothing to wait for, and the engine's errors are the
  // mount's.
  if (told_ && manifest_.attributes_pending() == 0) {
    engines_[0] = std::make_unique<ClairvoyantEngine>(manifest_, *told_, reader_,
                                                      plan_config(config_.ranks, told_->schedule().world_size, 0));
    publish(0, told_);
    MutexLock lock(mutex_);
    state_ = "told";
  }
  thread_ = std::thread([this] { run(); });
}

LearningEngine::~LearningEngine() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (size_t n = kPlans; n-- > 0;) engines_[n].reset();  // before the oracles they read
}

EngineConfig LearningEngine::plan_config(std::vector<uint64_t> ranks, uint64_t world, uint64_t plan) {
  EngineConfig c = config_;
  if (plan > 0) c.start_window = 0;  // a plan made again is placed by the job's opens: where it is, is known
  c.horizon = plan_horizon(world, ranks.size());
  c.ranks = std::move(ranks);
  c.replans = replanning_.on && plan + 1 < kPlans;
  c.watched = watched_.load();  // a watched mount's plan judges the opens it is handed process by process
  c.on_world = [this] {
    world_said_.store(true);
    wake_.notify_all();
  };
  c.on_other_order = [this] {
    other_said_.store(true);
    wake_.notify_all();
  };
  return c;
}

void LearningEngine::publish(uint64_t plan, const Oracle* oracle) {
  plans_[plan].store(engines_[plan].get(), std::memory_order_release);
  oracle_ready_.store(oracle, std::memory_order_release);
  plan_now_.store(plan, std::memory_order_release);
}

ClairvoyantEngine* LearningEngine::current(uint64_t* plan) const {
  const uint64_t n = plan_now_.load(std::memory_order_acquire);
  if (plan) *plan = n;
  return plans_[n].load(std::memory_order_acquire);
}

ClairvoyantEngine* LearningEngine::keep(EntryId id, pid_t pid, uint64_t* plan) {
  const bool job = from_the_job(pid);  // (asked while the process is there, for learning again later)
  if (job) opened_.opened(id);
  if (ClairvoyantEngine* e = current(plan)) return e;
  bool wake = false;
  {
    MutexLock lock(mutex_);
    if (ClairvoyantEngine* e = current(plan)) return e;
    if (opens_.size() < kMaxOpens && (state_ == "learning" || state_ == "waiting")) {
      if (!job) {
        ++not_the_job_;
        return nullptr;
      }
      opens_.emplace_back(id, pid);
      wake = opens_.size() >= next_try(tried_at_);
    }
  }
  if (wake) wake_.notify_all();
  return nullptr;
}

bool LearningEngine::from_the_job(pid_t pid) {
  if (learn_from_.empty()) return true;
  MutexLock lock(pids_mutex_);
  if (job_pids_.size() > 4096) job_pids_.clear();
  auto [it, added] = job_pids_.try_emplace(pid, false);
  if (!added) return it->second;
  // The real uid, from /proc (the request's own uid is not passed down to engines): a process gone
  // already is not the job's.
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "Uid:") {
      uid_t uid = 0;
      if (status >> uid) it->second = std::find(learn_from_.begin(), learn_from_.end(), uid) != learn_from_.end();
      break;
    }
  }
  return it->second;
}

void LearningEngine::keep_the_jobs(std::vector<std::pair<EntryId, pid_t>>& opens) {
  std::erase_if(opens, [this](const auto& o) { return !from_the_job(o.second); });
}

int LearningEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  uint64_t plan = 0;
  if (ClairvoyantEngine* e = keep(id, pid, &plan)) {
    const int rc = e->open(id, pid, handle);
    if (rc == 0) *handle |= plan << 1;
    return rc;
  }
  const int rc = reader_.open(id, pid, handle);
  if (rc == 0) *handle |= kSourceHandle, ++source_files_;
  return rc;
}

ssize_t LearningEngine::read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) {
  if (handle & kSourceHandle) {
    const ssize_t n = reader_.read(handle & ~kSourceHandle, buf, size, offset);
    if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
    return n;
  }
  return engine_of(handle)->read(handle & ~kTagBits, buf, size, offset, held);
}

void LearningEngine::release(uint64_t handle) {
  if (handle & kSourceHandle) return reader_.release(handle & ~kSourceHandle);
  engine_of(handle)->release(handle & ~kTagBits);
}

ssize_t LearningEngine::read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) {
  uint64_t plan = 0;
  if (ClairvoyantEngine* e = current(&plan)) {
    // A use told to an earlier plan's engine and read first now (the plan changed in between) is the
    // current engine's to count, at this read or its close — not both engines'.
    if (plan > 0 && watched_.load(std::memory_order_acquire))
      for (uint64_t p = plan; p-- > 0;)
        if (ClairvoyantEngine* was = plans_[p].load(std::memory_order_acquire); was && was->give_up_unread_open(id)) {
          e->take_unread_open(id);
          break;
        }
    return e->read_unopened(id, pid, buf, size, offset, held);
  }
  if (offset == 0) {
    // The first read of a file is its open; the same reader reading its file from the start again is not.
    bool fresh = false;
    {
      MutexLock lock(mutex_);
      if (last_unopened_.size() > 4096) last_unopened_.clear();
      auto [it, added] = last_unopened_.try_emplace(pid, id);
      fresh = added || it->second != id;
      it->second = id;
    }
    if (fresh) {
      if (!watched_.load(std::memory_order_acquire))
        if (ClairvoyantEngine* e = keep(id, pid)) return e->read_unopened(id, pid, buf, size, offset, held);
      ++source_files_;
    }
  }
  const ssize_t n = reader_.read_unopened(id, pid, buf, size, offset);
  if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
  return n;
}

void LearningEngine::watching_opens() {
  MutexLock lock(mutex_);
  watched_.store(true, std::memory_order_release);
  if (ClairvoyantEngine* e = current()) e->watching_opens();
}

void LearningEngine::opened(EntryId id, pid_t pid) {
  if (ClairvoyantEngine* e = keep(id, pid)) {
    e->opened(id, pid);
  } else {
    opens_before_++;
  }
}

void LearningEngine::closed(EntryId id, pid_t pid) {
  uint64_t n = 0;
  ClairvoyantEngine* e = current(&n);
  if (!e) {
    closes_before_++;
    return;
  }
  // An open told to an earlier plan's engine (the plan changed while the file was open) is counted there.
  if (!e->unread_open(id))
    for (uint64_t p = n; p-- > 0;)
      if (ClairvoyantEngine* was = plans_[p].load(std::memory_order_acquire); was && was->unread_open(id)) {
        was->close_told(id, pid);
        return;
      }
  e->closed(id, pid);
}

void LearningEngine::caller(pid_t pid, uid_t uid) {
  if (learn_from_.empty() || told_) return;
  MutexLock lock(pids_mutex_);
  if (job_pids_.size() > 4096) job_pids_.clear();
  job_pids_.try_emplace(pid, std::find(learn_from_.begin(), learn_from_.end(), uid) != learn_from_.end());
}

void LearningEngine::low_on_memory() {
  if (ClairvoyantEngine* e = current()) e->low_on_memory();
}

void LearningEngine::opens_lost() {
  if (ClairvoyantEngine* e = current()) e->opens_lost();
}

void LearningEngine::run() {
  if (!current()) {
    std::vector<std::pair<EntryId, pid_t>> kept;  // the opens the engine is placed by
    const Oracle* oracle = told_;
    if (!told_) {
      std::optional<Learned> found;
      run_niced([&] {
        if (question_.global) prepare_learning();
        found = learn(kept);
      });
      if (!found) return;
      Schedule s = schedule_;
      apply(*found, s);
      lists_[0] = learned_list_;
      log_info("seed=auto: the job reads " + (lists_[0] != &manifest_ ? folder_words(*lists_[0]) + " " : "") + "as " +
               learned_words(*found) + " from epoch " + std::to_string(question_.start_epoch) + " (found after " +
               std::to_string(kept.size()) + " opens, " + std::to_string(found->candidates) +
               " orders tried); staging follows it");
      {
        MutexLock lock(mutex_);
        found_ = learned_options(*found);
        found_after_ = kept.size();
        if (lists_[0] != &manifest_) samples_words_ = folder_words(*lists_[0]);
      }
      try {
        oracles_[0] = std::make_unique<Oracle>(lists_[0]->samples().size(), s);
      } catch (const std::exception& e) {
        MutexLock lock(mutex_);
        state_ = "failed";
        log_warning(std::string("seed=auto: staging could not start: ") + e.what() +
                    "; reads go to SOURCE as on a plain mount");
        return;
      }
      oracle = oracles_[0].get();
    }
    if (!start(*oracle, std::move(kept))) return;
  }
  replan_loop();
}

bool LearningEngine::start(const Oracle& oracle, std::vector<std::pair<EntryId, pid_t>> kept) {
  // With a scan that left the files' attributes for later, the engine starts while the fill reads them:
  // its staging walk reads those of the files it comes to first (Stager::know_now).
  {
    MutexLock lock(mutex_);
    if (stop_) return false;
    if (told_) kept = opens_;
  }
  // The engine, placed where the opens kept put the job, then the opens kept since, then the switch
  // (under the lock, so that no open falls between the two).
  const size_t placed = kept.size();
  std::string failure;
  try {
    EngineConfig c = plan_config(config_.ranks, oracle.schedule().world_size, 0);
    c.opened_before = std::move(kept);
    engines_[0] = std::make_unique<ClairvoyantEngine>(*lists_[0], oracle, reader_, std::move(c));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // The epochs the opens kept meanwhile reach, built before the lock (under it, opens wait for the switch).
  size_t meanwhile = 0;
  {
    MutexLock lock(mutex_);
    meanwhile = opens_.size() - placed;
  }
  if (failure.empty() && meanwhile > 0) engines_[0]->plan_for(meanwhile);
  MutexLock lock(mutex_);
  if (!failure.empty()) {
    state_ = "failed";
    log_warning(std::string(told_ ? "" : "seed=auto: ") + "staging could not start: " + failure +
                "; reads go to SOURCE as on a plain mount");
    engines_[0].reset();
    return false;
  }
  if (watched_.load()) engines_[0]->watching_opens();
  engines_[0]->catch_up({opens_.begin() + static_cast<ptrdiff_t>(placed), opens_.end()});
  state_ = told_ ? "told" : "found";
  publish(0, &oracle);
  opens_.clear();
  opens_.shrink_to_fit();
  return true;
}

void LearningEngine::replan_loop() {
  if (!replanning_.on) return;
  bool pending = false;     // a reader of another world size was found: look again until planned or gone
  bool relearning = false;  // a reader in another order was found: look again until learned or followed
  bool shifting = false;    // told: a rank off the plan, maybe at another epoch: look again until followed
  for (;;) {
    {
      MutexLock lock(mutex_);
      // (world_said_ and other_said_ are set without the lock: a wake-up between the look and the wait
      // is caught a few seconds later.)
      if (!stop_ && !world_said_.load() && !other_said_.load())
        lock.wait_for(wake_, look_soon_                          ? kLookSoon
                             : pending || relearning || shifting ? kLookAgain
                                                                 : std::chrono::seconds(5));
      look_soon_ = false;
      if (stop_) return;
    }
    if (world_said_.exchange(false)) pending = true;
    // Also at each look: the news of a reader in another order comes once per plan (until a rank is
    // followed again), and the relearning it starts may end while the job's processes change.
    if (other_said_.exchange(false) || (!relearning && !shifting && off_the_plan())) {
      relearning = !told_;
      shifting = told_ != nullptr;
    }
    if (pending) pending = !replan();
    if (relearning && !pending) relearning = !relearn();
    // (Not held up by a plan for another world size that waits: a process or two of the job, judged to
    // read as another world size in an order the plan does not hold, would keep it waiting.)
    if (shifting) shifting = !follow_epoch();
    // A told seed whose ranks read in an order no epoch of it explains: the job's own seed is learned from
    // them (the told seed won for the first batch; the evidence wins after it), as seed=auto learns again.
    if (shifting && !pending) shifting = !relearn();
  }
}

bool LearningEngine::replan() {
  if (gave_up_) return true;
  uint64_t n = 0;
  ClairvoyantEngine* old = current(&n);
  const Oracle* was = oracle_ready_.load(std::memory_order_acquire);
  Replan plan;
  {
    MutexLock lock(mutex_);
    plan = plan_;
  }
  const std::optional<Replan> next =
      replan_for(old->readers().readers_as(), process_alive, plan.world, replanning_.whole_node);
  if (!next) return true;              // no reader of another world size is left
  if (next->world == 0) return false;  // the plan's readers are still there
  const std::string words = "the job reads as world_size=" + std::to_string(next->world) + ", ranks " +
                            rank_list_text(next->ranks) +
                            " on this node (planned: world_size=" + std::to_string(plan.world) + ", ranks " +
                            rank_list_text(plan.ranks) + ")";
  if (n + 1 >= kPlans) {
    log_warning(words + "; this mount planned " + std::to_string(kPlans) + " times already: remount to follow it");
    return true;
  }
  Schedule s = was->schedule();
  s.world_size = next->world;
  const uint64_t world = next->world;
  if (!switch_plan(n, s, next->ranks, next->epoch, words, [old, world](uint64_t after, uint64_t* last) {
        return old->readers().opens_as(world, after, last);
      }))
    return true;
  MutexLock lock(mutex_);
  plan_ = *next;
  ++replanned_;
  const std::string done = words + ": planned again for it (" + std::to_string(engines_[n + 1]->adopted()) +
                           " files in RAM kept); staging follows it";
  if (replanning_.world_auto && n == 0)
    log_info("world_size=auto: " + done);
  else
    log_warning(done);
  return true;
}

bool LearningEngine::follow_epoch() {
  if (gave_up_) return true;
  uint64_t n = 0;
  ClairvoyantEngine* old = current(&n);
  if (!old || (old->readers().ranks_off() == 0 && old->readers().other_readers() == 0 &&
               !old->readers().late_start_suspected()))
    return true;  // followed again, or idle
  using Is = ClairvoyantEngine::RankAt::Is;
  std::vector<ClairvoyantEngine::RankAt> at = old->ranks_at();
  // Each rank's own epoch: where it follows the plan, or where the diagnosis found it reads the planned
  // order of another epoch; a rank that never read, where a process that follows no rank reads its items
  // of an earlier (or later) epoch — a rank started after the others on its node.
  std::optional<uint64_t> followed;  // the earliest epoch a following rank reads
  for (const auto& a : at)
    if (a.is == Is::kFollowing) followed = std::min(followed.value_or(UINT64_MAX), *a.epoch);
  const bool unread = std::any_of(at.begin(), at.end(), [](const auto& a) { return a.is == Is::kUnread; });
  if (unread) {
    uint64_t seen = 0;
    std::vector<std::pair<EntryId, pid_t>> others = old->readers().opens_unplaced(0, &seen);
    keep_the_jobs(others);
    bool try_now = false;
    {
      MutexLock lock(mutex_);
      try_now = others.size() >= kMinDiagnosisOpens && seen >= next_try(late_tried_);
      if (try_now) late_tried_ = seen;
    }
    if (try_now) {
      std::vector<std::optional<uint64_t>> late;
      run_niced([&] { late = old->late_epochs(others, followed.value_or(old->reading_epoch())); });
      for (size_t r = 0; r < at.size(); ++r)
        if (late[r]) at[r] = {Is::kOff, late[r]};
      if (replanning_.after_late_diagnosis) replanning_.after_late_diagnosis();
      // The places of the ranks that follow, taken again: they read on while the diagnosis ran (seconds
      // under a sanitizer), and a rank started where it was then, more than the tolerance behind where
      // it reads now, would be off the new plan from its first open.
      const std::vector<ClairvoyantEngine::RankAt> now = old->ranks_at();
      followed.reset();
      for (size_t r = 0; r < at.size(); ++r) {
        if (at[r].is == Is::kFollowing && now[r].is == Is::kFollowing) at[r] = now[r];
        if (at[r].is == Is::kFollowing) followed = std::min(followed.value_or(UINT64_MAX), *at[r].epoch);
      }
    }
  }
  // A plan from the earliest of those epochs, each rank shifted to its own; an idle rank at the plan's.
  std::vector<std::string> found;
  const uint64_t end = config_.epochs.value_or(UINT64_MAX);
  uint64_t from = followed.value_or(UINT64_MAX);
  const std::vector<uint64_t> ranks = [&] {
    MutexLock lock(mutex_);
    return plan_.ranks;
  }();
  for (size_t r = 0; r < at.size(); ++r) {
    if (at[r].is != Is::kOff) continue;
    if (!at[r].epoch) return false;  // the diagnosis is to come, or named another mistake (looked at again)
    if (*at[r].epoch >= end) {       // beyond the epochs the mount was told
      at[r] = {Is::kIdle, std::nullopt};
      continue;
    }
    from = std::min(from, *at[r].epoch);
    found.push_back("rank " + std::to_string(r < ranks.size() ? ranks[r] : r) + " epoch " +
                    std::to_string(*at[r].epoch));
  }
  if (found.empty()) return false;  // none found (yet): looked at again while a rank or a reader is off
  std::vector<uint64_t> shift(at.size(), 0);
  bool shifted = false;
  for (size_t r = 0; r < at.size(); ++r)
    if (at[r].epoch && (at[r].is == Is::kOff || at[r].is == Is::kFollowing))
      shifted |= (shift[r] = *at[r].epoch - from) != 0;
  if (!shifted) shift.clear();
  const Oracle* was = oracle_ready_.load(std::memory_order_acquire);
  std::string words = "the job reads epoch " + std::to_string(from) + " of seed=" + seed_text(was->schedule().seed) +
                      ", not the plan's (started or restarted at another epoch than start_epoch=" +
                      std::to_string(config_.start_epoch) + "?)";
  if (followed) {
    words = "the job's ranks read epochs of seed=" + seed_text(was->schedule().seed) + " the plan does not hold: ";
    for (size_t i = 0; i < found.size(); ++i) words += (i ? ", " : "") + found[i];
    words += ", where the others read epoch " + std::to_string(*followed) +
             " (a rank started or restarted after the others on this node?)";
  }
  if (n + 1 >= kPlans) {
    log_warning(words + "; this mount planned " + std::to_string(kPlans) + " times already: remount" +
                (shifted ? "" : " with start_epoch=" + std::to_string(from)) + " to follow it");
    return true;
  }
  {
    MutexLock lock(mutex_);
    if (n > 0 && plan_.epoch == from && plan_.shift == shift) return false;  // planned so already: would not help
  }
  // Ranks that follow start where they are, idle ones idle; the rest are placed by the opens of the
  // processes that follow no rank (those reading for them: not the opens of a job before, on the same
  // ranks, started again since), then by the opens made while the plan is built.
  std::vector<uint64_t> start_items;
  std::vector<bool> idle;
  for (const auto& a : at) {
    start_items.push_back(a.is == Is::kFollowing ? a.done : 0);
    idle.push_back(a.is == Is::kIdle || a.is == Is::kUnread);
  }
  if (!followed) start_items.clear();
  if (std::none_of(idle.begin(), idle.end(), [](bool i) { return i; })) idle.clear();
  if (!switch_plan(
          n, was->schedule(), ranks, from, words,
          [old](uint64_t after, uint64_t* last) {
            return after == 0 ? old->readers().opens_unplaced(after, last) : old->readers().latest_opens(after, last);
          },
          shift, start_items, idle))
    return true;
  MutexLock lock(mutex_);
  plan_.epoch = from;
  plan_.shift = shift;
  ++replanned_;
  log_warning(words + ": planned again from epoch " + std::to_string(from) +
              (shifted ? " with each rank at its own" : "") + " (" + std::to_string(engines_[n + 1]->adopted()) +
              " files in RAM kept); staging follows it");
  return true;
}

bool LearningEngine::switch_plan(uint64_t n, const Schedule& schedule, std::vector<uint64_t> ranks, uint64_t epoch,
                                 const std::string& words, const OpensSince& opens, std::vector<uint64_t> shift,
                                 std::vector<uint64_t> start_items, std::vector<bool> idle, const Manifest* list) {
  ClairvoyantEngine* old = plans_[n].load(std::memory_order_acquire);
  const Manifest& samples = list ? *list : *lists_[n];
  // The new plan, placed by its readers' latest opens (and, below, by those made while it was built);
  // it takes the old engine's RAM copies before it starts staging.
  std::unique_ptr<ClairvoyantEngine> e;
  std::unique_ptr<Oracle> oracle;
  uint64_t seen = 0;
  try {
    oracle = std::make_unique<Oracle>(samples.samples().size(), schedule);
    const uint64_t world = schedule.world_size;
    EngineConfig c = plan_config(std::move(ranks), world, n + 1);
    c.start_epoch = epoch;
    if (epoch != config_.start_epoch || !shift.empty()) c.start_item = 0;  // start_batch= is the mounted start epoch's
    c.epoch_shift = std::move(shift);
    c.start_items = std::move(start_items);
    c.idle_ranks = std::move(idle);
    c.opened_before = opens(0, &seen);
    c.handed_over = true;
    c.adopt = [this, old](ClairvoyantEngine& next) {
      MutexLock lock(mutex_);  // stats() reads the engines under it
      return old->retire(next);
    };
    e = std::make_unique<ClairvoyantEngine>(samples, *oracle, reader_, std::move(c));
  } catch (const std::exception& x) {
    old->successor_gone();  // (it may have taken the old one's files before it failed)
    gave_up_ = old->retired();
    log_warning(
        words + ", but its plan could not start: " + x.what() +
        (gave_up_ ? "; staging stopped, reads go on (remount to stage again)" : "; staging follows the old plan"));
    return false;
  }
  const std::vector<std::pair<EntryId, pid_t>> meanwhile = opens(seen, &seen);  // (`opens` may take mutex_)
  if (replanning_.while_switching) replanning_.while_switching(false);
  ClairvoyantEngine* const now = e.get();
  {
    MutexLock lock(mutex_);
    if (watched_.load()) e->watching_opens();
    e->catch_up(meanwhile);
    late_tried_ = 0;  // the new plan's opens are counted from 0
    oracles_[n + 1] = std::move(oracle);
    engines_[n + 1] = std::move(e);
    lists_[n + 1] = &samples;
    samples_words_ = &samples == &manifest_ ? "" : folder_words(samples);
    publish(n + 1, oracles_[n + 1].get());
    old->free_ram();
  }
  // The opens the old plan took after those, until the new one was published: its readers' too (a job
  // reading 1,700 files a second left 120 of its epoch's opens counted by neither plan under ASan); then
  // those the new one was told meanwhile.
  if (replanning_.while_switching) replanning_.while_switching(true);
  now->take_over(opens(seen, &seen));
  return true;
}

bool LearningEngine::off_the_plan() const {
  uint64_t n = 0;
  const ClairvoyantEngine* e = current(&n);
  return e && (e->readers().other_readers() > 0 || e->readers().ranks_off() > 0);
}

bool LearningEngine::relearn() {
  if (gave_up_) return true;
  uint64_t n = 0;
  ClairvoyantEngine* old = current(&n);
  if (!old) return true;
  // Processes judged to read in another order, or (the job's processes placed in its ranks before the
  // order turned) ranks off the plan: what they read now is the evidence.
  const bool other = old->readers().other_readers() > 0;
  if (!other && old->readers().ranks_off() == 0) return true;  // none reads in another order (any more)
  if (told_) {
    // A rank that never read may have started after the others, and one whose diagnosis found an epoch of
    // the told seed reads that epoch: follow_epoch's, both (their opens would teach a seed of neither).
    using Is = ClairvoyantEngine::RankAt::Is;
    for (const auto& a : old->ranks_at())
      if (a.is == Is::kUnread || (a.is == Is::kOff && a.epoch)) return false;
  }
  if (plan_followed(*old)) return false;  // the learned order has its readers: the other is another job's, or not yet
  uint64_t seen = 0;  // the tracker's opens so far: tries are spaced by them, the kept ones being capped
  std::vector<std::pair<EntryId, pid_t>> others =
      other ? old->readers().opens_other(0, &seen) : old->readers().latest_opens(0, &seen);
  LearnQuestion q = question_;
  std::string learned_before;
  {
    MutexLock lock(mutex_);
    learned_before = found_;
    keep_the_jobs(others);
    if (others.size() < kMinDiagnosisOpens || seen < next_try(relearn_tried_)) {
      // More to come: while they come (a batch or two), looked at again shortly, not in a second.
      look_soon_ = seen != relearn_seen_;
      relearn_seen_ = seen;
      return false;
    }
    relearn_tried_ = seen;
    q.world_size = plan_.world;
    q.ranks = plan_.ranks;
  }
  // All the opens kept, then their latest half, quarter, ...: the kept opens can span an epoch's end (a
  // job's workers ended and new ones began), and no one order explains both epochs; the latest part
  // of them lies in one.
  std::optional<Learned> found;
  size_t from = 0;                   // the first of the opens it is found on
  const Manifest* list = lists_[n];  // the samples it is found on: the plan's, or a subfolder's
  run_niced([&] {
    try {
      for (;;) {
        std::vector<EntryId> ids;
        for (size_t i = from; i < others.size(); ++i) ids.push_back(others[i].first);
        found = learn_on(*lists_[n], q, ids, &list);
        if (found || ids.size() / 2 < 4 * kMinDiagnosisOpens) break;
        from += ids.size() / 2;
      }
    } catch (const std::exception& e) {
      log_warning(std::string("seed=auto: ") + e.what());
    }
  });
  const size_t used = others.size() - from;
  const Oracle* was = oracle_ready_.load(std::memory_order_acquire);
  const Schedule& before = was->schedule();
  const bool new_list = list != lists_[n];
  if (!found ||
      (!new_list && found->seed == before.seed && found->order == before.order && found->draws == before.draws))
    return false;  // tried again after more opens
  if (replanning_.after_relearning) replanning_.after_relearning();
  // Looked for while the plan's readers read on (seconds, niced, under a sanitizer): followed by now, the
  // order found is another job's beside them, not the job's own.
  if (plan_followed(*old)) return false;
  // Told: an order that is the told seed's at a later epoch (torch shuffles epoch e of seed s by s + e) is
  // a job at another epoch, which follow_epoch plans for by its epoch once the diagnosis names it.
  // On another list it is that epoch of the told seed, planned so here (the list changes with the plan).
  uint64_t epoch = q.start_epoch;
  if (told_ && found->order == Order::kTorch && before.order == Order::kTorch) {
    const SeedInt at = found->seed + static_cast<SeedInt>(q.start_epoch) - before.seed;
    if (at >= 0 && at <= static_cast<SeedInt>(kFollowedEpochs)) {
      if (!new_list) return false;
      found->seed = before.seed;
      epoch = static_cast<uint64_t>(at);
    }
  }
  const std::string not_as =
      new_list ? "not the " + std::to_string(lists_[n]->samples().size()) + " of the plan's"
               : "not as " + (told_ ? "seed=" + seed_text(before.seed) + " told" : learned_before + " learned before");
  const std::string words = std::string(told_ ? "" : "seed=auto: ") + "the job reads " +
                            (new_list ? folder_words(*list) + " " : "") + "as " + learned_words(*found) +
                            " from epoch " + std::to_string(epoch) + ", " + not_as + " (found from " +
                            std::to_string(used) + " opens of processes reading in another order)";
  if (n + 1 >= kPlans) {
    log_warning(words + "; this mount planned " + std::to_string(kPlans) + " times already: remount to follow it");
    return true;
  }
  Schedule s = was->schedule();
  apply(*found, s);
  std::vector<uint64_t> ranks;
  {
    MutexLock lock(mutex_);
    ranks = plan_.ranks;
  }
  // The new plan is placed by the opens the order was found on, not by earlier ones (of an epoch before:
  // in a small data set, many of those lie near some place of the new plan's epoch, and move its rank on
  // by epochs), then by those made since.
  others.erase(others.begin(), others.begin() + static_cast<ptrdiff_t>(from));
  if (!switch_plan(
          n, s, ranks, epoch, words,
          [this, old, other, found_on = std::move(others), found_at = seen](uint64_t after, uint64_t* last) {
            if (after == 0) {
              *last = found_at;
              return found_on;
            }
            std::vector<std::pair<EntryId, pid_t>> opens =
                other ? old->readers().opens_other(after, last) : old->readers().latest_opens(after, last);
            MutexLock lock(mutex_);
            keep_the_jobs(opens);
            return opens;
          },
          {}, {}, {}, list))
    return true;
  MutexLock lock(mutex_);
  found_ = learned_options(*found);
  found_after_ = used;
  plan_.epoch = epoch;
  relearn_tried_ = 0;
  ++(told_ ? replanned_ : relearned_);
  log_warning(words + ": planned again for it (" + std::to_string(engines_[n + 1]->adopted()) +
              " files in RAM kept); staging follows it");
  return true;
}

bool LearningEngine::plan_followed(const ClairvoyantEngine& e) {
  if (!e.readers().followed()) return false;
  MutexLock lock(mutex_);
  relearn_tried_ = 0;
  return true;
}

std::optional<Learned> LearningEngine::learn_on(const Manifest& list, const LearnQuestion& q,
                                                const std::vector<EntryId>& ids, const Manifest** used) {
  auto on = [&](const Manifest& samples) {
    std::optional<Learned> found = learn_seed(samples, q, ids);
    if (found) *used = &samples;
    return found;
  };
  // A subfolder's walk first: opens that all lie in one are evidence of it (of a walk of the root over
  // train/ and val/, 16 opens lie in train/ alone 1 time in 20); a seed is found on a list only if it fits.
  // Then the list's own samples; then the globs, made only when those fail on a few batches' opens (each
  // walks the tree: seconds at 14 M files); then the opened files.
  const Pointed pointed = pointed_to(ids);
  for (const Manifest* view : candidate_views(list, pointed, false))
    if (std::optional<Learned> found = on(*view)) return found;
  if (std::optional<Learned> found = on(list)) return found;
  // Last, once an epoch of the job ended, the list less the files it never opened: a rule of its own
  // left them out. A glob that lists the same files in the same order is the likelier account, so the
  // globs go first then, however few the opens (a fast job's epoch may end before the learner's try
  // has kGlobAfter of them: torch 2's glob job in CI was named by the files it never opened).
  const bool ended = epoch_ended_short(list);
  if (ids.size() >= kGlobAfter || ended)
    for (const Manifest* view : candidate_views(list, pointed, true))
      if (std::optional<Learned> found = on(*view)) return found;
  if (const Manifest* kept = ended ? opened_view(list) : nullptr) return on(*kept);
  return std::nullopt;
}

LearningEngine::Pointed LearningEngine::pointed_to(const std::vector<EntryId>& ids) const {
  const std::optional<std::string>& root = manifest_.sample_root();
  if (!root || ids.empty()) return {};  // the mount's samples are the job's list (samples=)
  // The folders every file lies in, below the root's: the longest common run of their paths' folders.
  std::vector<std::string_view> common = manifest_.components(ids[0]);
  if (!common.empty()) common.pop_back();  // the file's own name
  for (size_t i = 1; i < ids.size() && !common.empty(); ++i) {
    const std::vector<std::string_view> path = manifest_.components(ids[i]);
    size_t k = 0;
    while (k < common.size() && k + 1 < path.size() && path[k] == common[k]) ++k;
    common.resize(k);
  }
  const size_t below = root->empty() ? 0 : static_cast<size_t>(std::count(root->begin(), root->end(), '/')) + 1;
  Pointed pointed{*root, {}, {}};
  std::string folder;
  for (size_t k = 0; k < common.size() && pointed.folders.size() < kSubfolderDepth; ++k) {
    folder += (k ? "/" : "") + std::string(common[k]);
    if (k + 1 == below && folder != *root) return {};  // not under the root (a path through a symlink)
    if (k >= below) pointed.folders.push_back(folder);
  }
  // The names' suffixes, as a glob's pattern matches them ("*.jpg"): a few, or no glob.
  std::vector<std::string>& suffixes = pointed.suffixes;
  for (EntryId id : ids) {
    const std::string_view name = manifest_.name(id);
    const size_t dot = name.rfind('.');
    if (dot == std::string_view::npos || dot == 0) continue;
    const std::string suffix(name.substr(dot));
    if (std::find(suffixes.begin(), suffixes.end(), suffix) == suffixes.end()) suffixes.push_back(suffix);
  }
  if (suffixes.size() > kGlobSuffixes) suffixes.clear();
  std::sort(suffixes.begin(), suffixes.end());
  return pointed;
}

std::vector<const Manifest*> LearningEngine::candidate_views(const Manifest& list, const Pointed& pointed, bool globs) {
  if (!pointed.root) return {};
  const std::vector<std::string>& suffixes = pointed.suffixes;
  // A view of each kind asked for, made once and kept while there is room: at most kViews (each holds 4
  // bytes a sample), those no plan reads (nor this call returns) given up first.
  std::vector<const Manifest*> views;
  auto view = [&](bool glob, const std::string& dir) -> const Manifest* {
    for (const auto& v : views_)
      if (v->globbed() == glob && *v->sample_root() == dir && v->left_out() == 0 &&
          (!glob || v->sample_suffixes() == suffixes))
        return v.get();
    if (views_.size() >= kViews)
      std::erase_if(views_, [&](const auto& v) {
        return v.get() != &list && std::find(std::begin(lists_), std::end(lists_), v.get()) == std::end(lists_) &&
               std::find(views.begin(), views.end(), v.get()) == views.end();
      });
    if (views_.size() >= kViews) return nullptr;
    std::optional<Manifest> made = glob ? manifest_.with_sorted_glob(dir, suffixes) : manifest_.with_root(dir);
    if (!made) return nullptr;
    views_.push_back(std::make_unique<Manifest>(std::move(*made)));
    return views_.back().get();
  };
  // ImageFolder of a subfolder, the shallowest first; or a sorted glob of the root and of each. (A glob
  // that lists the walk's very files adds nothing: left out.)
  if (!globs)
    for (const std::string& f : pointed.folders) views.push_back(view(false, f));
  if (globs && !suffixes.empty()) {
    views.push_back(view(true, *pointed.root));
    for (const std::string& f : pointed.folders) views.push_back(view(true, f));
  }
  std::erase_if(views, [&](const Manifest* v) {
    return v == nullptr || v == &list || (v->globbed() && std::ranges::equal(v->samples(), list.samples()));
  });
  return views;
}

bool LearningEngine::epoch_ended_short(const Manifest& list) const {
  // An epoch ended: more files opened again than a DistributedSampler pads an epoch with (a few).
  return opened_.again() >= kMinDiagnosisOpens && opened_.files() < list.samples().size();
}

const Manifest* LearningEngine::opened_view(const Manifest& list) {
  if (!epoch_ended_short(list)) return nullptr;
  const uint64_t files = opened_.files();
  if (opened_view_ && opened_view_base_ == &list && opened_view_files_ == files &&
      std::find_if(views_.begin(), views_.end(), [&](const auto& v) { return v.get() == opened_view_; }) !=
          views_.end())
    return opened_view_;
  Manifest view = list.with_samples_kept([&](EntryId id) { return opened_.has(id); });
  if (view.samples().size() != files) return nullptr;  // the job opened files not in `list`
  std::erase_if(views_, [&](const auto& v) {
    return v.get() == opened_view_ && std::find(std::begin(lists_), std::end(lists_), v.get()) == std::end(lists_);
  });
  views_.push_back(std::make_unique<Manifest>(std::move(view)));
  opened_view_ = views_.back().get();
  opened_view_files_ = files;
  opened_view_base_ = &list;
  return opened_view_;
}

std::optional<Learned> LearningEngine::learn(std::vector<std::pair<EntryId, pid_t>>& kept) {
  for (;;) {
    std::vector<EntryId> ids;
    {
      MutexLock lock(mutex_);
      while (!stop_ && state_ == "learning" && opens_.size() < next_try(tried_at_) && opens_.size() < kMaxOpens)
        lock.wait(wake_);
      if (stop_ || state_ != "learning") return std::nullopt;
      if (opens_.size() >= kMaxOpens && tried_at_ == opens_.size()) {
        state_ = "not found";
        log_warning("seed=auto: no likely seed fits the first " + std::to_string(opens_.size()) +
                    " opens; staging stays off, reads go to SOURCE as on a plain mount (give seed=; a "
                    "DataLoader(shuffle=True) with no generator of its own and no torch.manual_seed, or a model built "
                    "on the CPU before it, is out of reach: docs/order.md)");
        return std::nullopt;
      }
      tried_at_ = opens_.size();
      ++tries_;
      kept = opens_;
      for (const auto& o : opens_) ids.push_back(o.first);
    }
    try {
      if (std::optional<Learned> found = learn_on(manifest_, question_, ids, &learned_list_)) return found;
    } catch (const std::exception& e) {
      log_warning(std::string("seed=auto: ") + e.what());
    }
  }
}

std::optional<EngineStats> LearningEngine::snapshot() const {
  MutexLock lock(mutex_);
  return snapshot_locked();
}

std::optional<EngineStats> LearningEngine::snapshot_locked() const {
  uint64_t n = 0;
  ClairvoyantEngine* e = current(&n);
  if (!e) return std::nullopt;
  EngineStats s = e->stats();
  // What was read before the engine was there counts as SOURCE's.
  s.tier(Origin::kSource).bytes += source_bytes_.load();
  s.tier(Origin::kSource).files += source_files_.load();
  s.progress.opens_seen += opens_before_.load();
  s.progress.closes_seen += closes_before_.load();
  // What the engines of earlier plans served counts too.
  for (uint64_t p = 0; p < n; ++p) s.add_served(engines_[p]->stats());
  return s;
}

LearningEngine::Learning LearningEngine::learning() const {
  MutexLock lock(mutex_);
  return learning_locked();
}

LearningEngine::Learning LearningEngine::learning_locked() const {
  uint64_t n = 0;
  const ClairvoyantEngine* e = current(&n);
  Learning l;
  if (replanning_.on)
    l.world = Learning::World{plan_.world,
                              plan_.epoch,
                              replanned_,
                              n > 0 ? engines_[n]->adopted() : 0,
                              rank_list_text(plan_.ranks),
                              found_.empty() && told_ ? "seed=" + seed_text(told_->schedule().seed) : found_,
                              samples_words_};
  if (told_)
    l.waited = Learning::Waited{state_, source_bytes_.load(), source_files_.load()};
  else
    l.learned = Learning::Learned{state_,
                                  found_,
                                  found_after_,
                                  tries_,
                                  e ? found_after_ : opens_.size(),
                                  not_the_job_,
                                  relearned_,
                                  source_bytes_.load(),
                                  source_files_.load()};
  return l;
}

EngineStats LearningEngine::stats() const {
  MutexLock lock(mutex_);  // the engines of earlier plans retire under it
  const std::optional<EngineStats> s = snapshot_locked();
  EngineStats stats = s ? *s : reader_.stats();
  stats.learning = learning_locked();
  return stats;
}

}  // namespace clairfs
