// The stager: the engine's I/O in the background. Each turn it drops and pushes pages for the page-cache
// window and asks the kernel which it holds, keeps files the request threads read on demand, takes the
// files the staging core picks (StagingCore::pick, while RAM and its ring have room), chooses the store
// each is asked of first, starts their reads through the store chain on its IoLoop, and runs what
// finished: a staged file goes into RAM under its next-use key (StagingCore::staged), and up to NVMe
// through the chain when the core's admission keeps it there. Its planning thread adds the epochs the
// plan wants (StagingCore::plan_next).
//
// Runs on its own threads only (it owns the IoLoop and its ring); what it decides is the core's, under
// StagingCore::mutex, never held across I/O.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "clairfs/store.hpp"
#include "engine/core.hpp"
#include "engine/counters.hpp"
#include "engine/demand.hpp"
#include "io/io_loop.hpp"
#include "peer/peer_store.hpp"
#include "tiers/page_cache.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

struct StagerParts {
  const Manifest& manifest;
  StagingCore& state;
  RamTier& ram;
  Store& stores;  // the node's (StoreChain): NVMe, the keeper, SOURCE; copies up to NVMe
  DemandReader& demand;
  EngineCounters& counters;
  PageCache* kernel;     // nullptr: no pushes or drops
  unsigned depth;        // reads and writes in flight
  std::chrono::nanoseconds idle;  // RAM given back after this long without a read; zero: never
  // After a shortage of memory (give_back_memory), the RAM budget is raised again by steps, each after
  // this long without another.
  std::chrono::nanoseconds memory_retry;
};

class Stager {
 public:
  // REQUIRES: the parts outlive the stager. Makes the ring (throws std::runtime_error if io_uring cannot
  // be set up) and starts the thread.
  explicit Stager(StagerParts parts);
  ~Stager();  // stops and joins the threads
  // Picks nothing more, keeps what its reads in flight bring, then ends the thread (a plan replaced:
  // what SOURCE already sent is not read again).
  void finish() EXCLUDES(state_.lock());
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  double seconds_per_file(bool peer) const { return model_.seconds(peer); }

 private:
  // A file picked for staging (StagingCore::pick), and the store asked first.
  struct Pick {
    StagingCore::Pick what;
    Origin first;
    bool peer_only = false;  // the keeper alone: a refusal defers the file (StagingCore::defer), not SOURCE
    EntryId id() const { return what.id; }
  };

  void run();
  // One turn; false once the engine stops.
  bool turn();
  // The planning thread: the epochs after the readers' built as they come within the horizon. An epoch of
  // 14.2 M files takes seconds to build, which staging (its first file above all) does not wait for.
  void plan_loop() EXCLUDES(state_.lock());
  // Builds the next epoch wanted, if any: whether it was added.
  bool plan_ahead() EXCLUDES(state_.lock());
  // idle=: nothing asked for in idle_after_: RAM and pushed pages given back, once (staging waits for
  // the next read, which ends the idle state: StagingCore::place).
  void give_back_if_idle() REQUIRES(state_.lock());
  void run_drops();
  void push_ahead();
  // Asks the kernel whether it still holds the files the staging walk comes to next whose pages the
  // readers read (StagingCore::questions); the walk leaves those it holds to it.
  void ask_kernel();
  void answered(EntryId id, bool held) EXCLUDES(state_.lock());
  // Runs a push or a drop of `bytes` into the kernel, saying when it is overdue
  // (StagingCore::in_kernel_until).
  int in_kernel(uint64_t bytes, const std::function<int()>& call);
  // Files read whole on demand kept in RAM (under the mutex) and held for NVMe (Store::hold_copy).
  void keep_adopted(std::vector<std::pair<EntryId, FileBytes>> adopted) REQUIRES(state_.lock());
  // The store each pick is asked of first: NVMe's copy, a peer when the model says it is worth it, else
  // SOURCE.
  std::vector<Pick> choose_stores(const std::vector<StagingCore::Pick>& picks);
  // The walk waits on a file's attributes: the next ones asked of the fill first, this one read now,
  // off the lock.
  void know_now();
  // The process could not allocate `bytes` (an address-space limit, overcommit off), here or where
  // requests are served (StagingCore::short_of_memory): the RAM budget comes down to kServingRoom more
  // than that below what is held, and the files needed last are let go until RAM is within it, so that
  // reading goes on. Said once; the stats show the budget.
  void give_back_memory(uint64_t bytes) EXCLUDES(state_.lock());
  // What is left free for serving besides: what requests allocate, the reads of files nobody staged.
  static constexpr uint64_t kServingRoom = uint64_t{32} << 20;
  // The budget back by steps after a shortage: kServingRoom once memory_retry has passed without
  // another, twice as much after the next, and so on up to ram=; a failure on the way lowers it again
  // and starts the steps over (a limit lifted, memory freed elsewhere: staging takes it up again).
  void raise_ram_budget();
  // The I/O of a pick, and its end.
  void stage(const Pick& pick);
  // Returns the use after this one, for which NVMe should hold it, if any (the chain writes it up).
  Store::Keep staged(const Pick& pick, const Store::Found& found);
  // Keeps a staged file in RAM; the use after this one, for which NVMe should hold it (kNever: none).
  uint64_t keep(const Pick& pick, const Store::Found& found) EXCLUDES(state_.lock());
  // No longer in flight: opens waiting for it go on. `defer`: its keeper refused it (StagingCore::defer).
  void finish(const Pick& pick, bool defer = false) EXCLUDES(state_.lock());

  const Manifest& manifest_;
  StagingCore& state_;
  RamTier& ram_;
  Store& stores_;
  Store* const peers_;  // the peer store among them, if any
  DemandReader& demand_;
  EngineCounters& counters_;
  PageCache* kernel_;
  uint64_t introductions_seen_ = 0;  // kernel_->introductions() at the last look
  const std::chrono::nanoseconds idle_after_;
  // The stager thread's own.
  IoLoop io_;
  PeerModel model_;
  const StagingCore::Outside outside_;           // the readers' loads, for the walk
  std::optional<EntryId> know_first_;            // the file the walk waits on, its attributes to be read
  std::vector<EntryId> to_know_;                 // the next ones after it, for the fill to read first
  // A file whose attributes could not be read now (out of descriptors or memory): the walk waits as it
  // does for room, and the stager reads them again from then on.
  std::chrono::steady_clock::time_point know_again_at_{};
  absl::flat_hash_map<EntryId, std::chrono::steady_clock::time_point> asking_;  // questions unanswered, since
  // Runs `step` (false: stop); a std::bad_alloc in it is said once and waited out, not fatal.
  bool survive_out_of_memory(const std::function<bool()>& step);
  void out_of_memory();  // an allocation failed: said in the log the first time
  const std::chrono::nanoseconds memory_retry_;
  std::optional<std::chrono::steady_clock::time_point> raise_budget_at_;  // set while below ram= by a shortage
  uint64_t raise_step_ = 0;
  std::atomic<unsigned> out_of_memory_said_ = 0;  // allocations that failed (said in the log once)
  std::atomic<bool> finishing_{false};
  std::condition_variable plan_wake_;  // stop or finish (the planning thread looks again every kPlanLook)
  std::thread thread_;
  std::thread planning_;
};

}  // namespace clairfs
