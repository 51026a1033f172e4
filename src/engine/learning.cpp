#include "engine/learning.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/log.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

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

}  // namespace

LearningEngine::LearningEngine(const Manifest& manifest, SourceReader& reader, Schedule schedule, LearnQuestion question,
                               Start start, const Oracle* told, std::vector<uid_t> learn_from)
    : manifest_(manifest), reader_(reader), schedule_(std::move(schedule)), question_(std::move(question)),
      start_(std::move(start)), told_(told), learn_from_(std::move(learn_from)) {
  {
    MutexLock lock(mutex_);
    state_ = told_ ? "waiting" : "learning";
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
  engine_.reset();  // before the oracle it reads
}

ClairvoyantEngine* LearningEngine::keep(EntryId id, pid_t pid) {
  if (ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire)) return e;
  bool wake = false;
  {
    MutexLock lock(mutex_);
    if (ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire)) return e;
    if (opens_.size() < kMaxOpens && (state_ == "learning" || state_ == "waiting")) {
      if (!from_the_job(pid)) {
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

int LearningEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  if (ClairvoyantEngine* e = keep(id, pid)) return e->open(id, pid, handle);
  const int rc = reader_.open(id, pid, handle);
  if (rc == 0) *handle |= kSourceHandle, ++source_files_;
  return rc;
}

ssize_t LearningEngine::read(uint64_t handle, char* buf, size_t size, off_t offset) {
  if (handle & kSourceHandle) {
    const ssize_t n = reader_.read(handle & ~kSourceHandle, buf, size, offset);
    if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
    return n;
  }
  return engine_ready_.load(std::memory_order_acquire)->read(handle, buf, size, offset);
}

void LearningEngine::release(uint64_t handle) {
  if (handle & kSourceHandle) return reader_.release(handle & ~kSourceHandle);
  engine_ready_.load(std::memory_order_acquire)->release(handle);
}

ssize_t LearningEngine::read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset) {
  if (ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire)) return e->read_unopened(id, pid, buf, size, offset);
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
        if (ClairvoyantEngine* e = keep(id, pid)) return e->read_unopened(id, pid, buf, size, offset);
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
  if (engine_ready_.load(std::memory_order_acquire)) engine_->watching_opens();
}

void LearningEngine::opened(EntryId id, pid_t pid) {
  if (ClairvoyantEngine* e = keep(id, pid)) e->opened(id, pid);
}

void LearningEngine::closed(EntryId id, pid_t pid) {
  if (ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire)) e->closed(id, pid);
}

void LearningEngine::opens_lost() {
  if (ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire)) e->opens_lost();
}

void LearningEngine::run() {
  std::vector<std::pair<EntryId, pid_t>> kept;  // the opens the engine is placed by
  Schedule s = schedule_;
  if (!told_) {
    // Shuffles of the whole data set are background work: below the threads that serve reads, on a
    // thread of their own. Not this one: the engine's threads are started from here and would inherit
    // its priority (a learned engine's stager ran at nice 10 and fell behind a job reading at full speed).
    std::optional<Learned> found;
    std::thread shuffler([&] {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
      found = learn(kept);
    });
    shuffler.join();
    if (!found) return;
    s.seed = found->seed;
    log_info("seed=auto: the job reads as seed=" + seed_text(found->seed) + " from epoch " +
             std::to_string(question_.start_epoch) + " (found after " + std::to_string(kept.size()) + " opens, " +
             std::to_string(found->candidates) + " orders tried); staging follows it");
    {
      MutexLock lock(mutex_);
      found_ = "seed=" + seed_text(found->seed);
      found_after_ = kept.size();
    }
  }
  // The engine stages by the files' sizes: with a scan that left them for later, it starts once the
  // fill has read them all (reads go to SOURCE meanwhile).
  {
    MutexLock lock(mutex_);
    while (!stop_ && manifest_.attributes_pending() != 0) lock.wait_for(wake_, std::chrono::milliseconds(50));
    if (stop_) return;
    if (told_) kept = opens_;
  }
  // The engine, placed where the opens kept put the job, then the opens kept since, then the switch
  // (under the lock, so that no open falls between the two).
  const size_t placed = kept.size();
  std::string failure;
  const Oracle* oracle = told_;
  try {
    if (!told_) {
      oracle_ = std::make_unique<Oracle>(manifest_.samples().size(), s);
      oracle = oracle_.get();
    }
    engine_ = start_(*oracle, std::move(kept));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  MutexLock lock(mutex_);
  if (!failure.empty()) {
    state_ = "failed";
    log_warning(std::string(told_ ? "" : "seed=auto: ") + "staging could not start: " + failure +
                "; reads go to SOURCE as on a plain mount");
    engine_.reset();
    return;
  }
  if (watched_.load()) engine_->watching_opens();
  engine_->catch_up({opens_.begin() + static_cast<ptrdiff_t>(placed), opens_.end()});
  state_ = told_ ? "told" : "found";
  oracle_ready_.store(oracle, std::memory_order_release);
  engine_ready_.store(engine_.get(), std::memory_order_release);
  opens_.clear();
  opens_.shrink_to_fit();
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
                    " opens; staging stays off, reads go to SOURCE as on a plain mount (give seed=)");
        return std::nullopt;
      }
      tried_at_ = opens_.size();
      kept = opens_;
      for (const auto& o : opens_) ids.push_back(o.first);
    }
    try {
      if (std::optional<Learned> found = learn_seed(manifest_, question_, ids)) return found;
    } catch (const std::exception& e) {
      log_warning(std::string("seed=auto: ") + e.what());
    }
  }
}

std::string LearningEngine::stats_json() const {
  ClairvoyantEngine* e = engine_ready_.load(std::memory_order_acquire);
  nlohmann::json j = nlohmann::json::parse(e ? e->stats_json() : reader_.stats_json());
  if (e) {  // what was read before the engine was there counts as SOURCE's
    j["source_traffic"]["bytes"] = j["source_traffic"].value("bytes", uint64_t{0}) + source_bytes_.load();
    j["tiers"]["source"]["bytes"] = j["tiers"]["source"].value("bytes", uint64_t{0}) + source_bytes_.load();
    j["tiers"]["source"]["files"] = j["tiers"]["source"].value("files", uint64_t{0}) + source_files_.load();
    j["stalls"]["opens"] = j["stalls"].value("opens", uint64_t{0}) + source_files_.load();
  }
  MutexLock lock(mutex_);
  if (told_) {  // what was read from SOURCE while the engine waited for the files' attributes
    j["waited"] = {{"state", fixed_width(state_, 9)},
                   {"source_bytes", source_bytes_.load()},
                   {"source_files", source_files_.load()}};
    return j.dump(2) + "\n";
  }
  // Strings of one width: the stats file keeps one length (control.hpp).
  j["learned"] = {{"state", fixed_width(state_, 9)},
                  {"seed", fixed_width(found_, 48)},
                  {"after_opens", found_after_},
                  {"opens_seen", e ? found_after_ : opens_.size()},
                  {"other_users_opens", not_the_job_},  // not learned from (learn_from=)
                  {"source_bytes", source_bytes_.load()},  // read before the engine was there (counted in
                  {"source_files", source_files_.load()}};  // source_traffic, tiers.source and stalls too)
  return j.dump(2) + "\n";
}

}  // namespace clairfs
