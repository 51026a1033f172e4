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
// With the seed told (`told`, the oracle of the mount), there is nothing to learn: the engine waits only
// for the files' attributes, which a scan that left them for later (Manifest::Attributes::kLater) has
// read in the background, and starts as above with the opens kept meanwhile. The same waiting applies
// after a seed is learned.
//
// Only the job's readers teach it: an open counts when its process runs as one of `learn_from`'s users
// (any user when that is empty), so another user's reads in some order cannot choose the seed.
//
// Threads: the request threads call the Engine methods and stats_json; the learning thread builds the
// engine. One mutex guards the kept opens and the switch; once the engine is there, calls take no lock.
#pragma once

#include <sys/types.h>

#include <atomic>
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
#include "engine/source_reader.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class LearningEngine final : public Engine {
 public:
  // Builds the engine for an oracle of the seed found, given the opens so far (on the learning thread;
  // may throw).
  using Start = std::function<std::unique_ptr<ClairvoyantEngine>(const Oracle&, std::vector<std::pair<EntryId, pid_t>>)>;

  static constexpr size_t kMaxOpens = 65536;

  // REQUIRES: manifest, reader and `told` outlive it. `schedule`: the mount's, its seed to be learned;
  // `told`: the oracle of the seed given instead (nothing learned), or nullptr. `learn_from`: the users
  // whose opens are learned from (empty: anyone's).
  LearningEngine(const Manifest& manifest, SourceReader& reader, Schedule schedule, LearnQuestion question, Start start,
                 const Oracle* told = nullptr, std::vector<uid_t> learn_from = {});
  ~LearningEngine() override;

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) override;
  void release(uint64_t handle) override;
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset) override;
  // Watched opens are learned from (a first read is then only a read), and go to the engine once it runs.
  void watching_opens() override EXCLUDES(mutex_);
  void opened(EntryId id, pid_t pid) override EXCLUDES(mutex_);
  void closed(EntryId id, pid_t pid) override;
  void opens_lost() override;

  // The engine's stats once it runs (SOURCE's before), with what was learned ("learned").
  std::string stats_json() const;
  // The oracle of the seed found; nullptr until then.
  const Oracle* oracle() const { return oracle_ready_.load(std::memory_order_acquire); }

 private:
  // Keeps an open for learning; returns the engine instead once there is one.
  ClairvoyantEngine* keep(EntryId id, pid_t pid) EXCLUDES(mutex_);
  // True when `pid` runs as one of learn_from_'s users (or learn_from_ is empty).
  bool from_the_job(pid_t pid) REQUIRES(mutex_);
  void run() EXCLUDES(mutex_);
  // Tries the likely seeds each time enough opens are kept; the seed found (and the opens it fits in
  // `kept`), or nullopt when stopped or given up.
  std::optional<Learned> learn(std::vector<std::pair<EntryId, pid_t>>& kept) EXCLUDES(mutex_);

  const Manifest& manifest_;
  SourceReader& reader_;
  const Schedule schedule_;
  const LearnQuestion question_;
  const Start start_;
  const Oracle* const told_;
  const std::vector<uid_t> learn_from_;

  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::pair<EntryId, pid_t>> opens_ GUARDED_BY(mutex_);
  std::unordered_map<pid_t, EntryId> last_unopened_ GUARDED_BY(mutex_);  // no-open mode: a reader's last file
  std::unordered_map<pid_t, bool> job_pids_ GUARDED_BY(mutex_);          // from_the_job's answers
  uint64_t not_the_job_ GUARDED_BY(mutex_) = 0;                          // opens of other users', not learned from
  size_t tried_at_ GUARDED_BY(mutex_) = 0;  // opens the last try saw
  std::string state_ GUARDED_BY(mutex_);  // learning, found, not found, failed; told: waiting, told, failed
  std::string found_ GUARDED_BY(mutex_);   // "seed=43" once found
  size_t found_after_ GUARDED_BY(mutex_) = 0;
  bool stop_ GUARDED_BY(mutex_) = false;

  std::unique_ptr<Oracle> oracle_;              // written once, by the learning thread, before engine_
  std::unique_ptr<ClairvoyantEngine> engine_;   // likewise
  std::atomic<uint64_t> source_bytes_{0};  // read from SOURCE for the engine's callers before it was there
  std::atomic<uint64_t> source_files_{0};  // files opened there then
  std::atomic<const Oracle*> oracle_ready_{nullptr};
  std::atomic<ClairvoyantEngine*> engine_ready_{nullptr};
  std::atomic<bool> watched_{false};  // set under mutex_, so that the engine is told once it is there
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace clairfs
