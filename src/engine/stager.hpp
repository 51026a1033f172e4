// The stager: the engine's one background thread. Each turn it plans the next epoch when the planner
// wants one, drops and pushes pages for the page-cache window, keeps files the request threads read on
// demand, picks the next files to stage from the policy (while RAM and its ring have room), starts their
// reads through the store chain on its IoLoop, and runs what finished: a staged file goes into RAM under
// its next-use key, and into NVMe too when next-use admission keeps it there.
//
// Runs on its own thread only (it owns the IoLoop and its ring); shares the engine's state under
// StagingCore::mutex, never holding it across I/O.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/core.hpp"
#include "engine/counters.hpp"
#include "engine/demand.hpp"
#include "io/io_loop.hpp"
#include "peer/peer_store.hpp"
#include "tiers/chain.hpp"
#include "tiers/nvme.hpp"
#include "tiers/page_cache.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

struct StagerParts {
  const Manifest& manifest;
  StagingCore& state;
  RamTier& ram;
  StoreChain& chain;
  NvmeTier* nvme;        // nullptr: no NVMe tier
  PeerStore* peers;      // nullptr: alone
  DemandReader& demand;
  EngineCounters& counters;
  const StreamSource& streams;
  PageCache* kernel;     // nullptr: no pushes or drops
  unsigned depth;        // reads and writes in flight
  uint64_t bytes_in_flight;       // bytes of staging reads in flight at most (one file at least)
  std::chrono::nanoseconds idle;  // RAM given back after this long without a read; zero: never
  // After a shortage of memory (give_back_memory), the RAM budget is raised again by steps, each after
  // this long without another.
  std::chrono::nanoseconds memory_retry;
  // Files this node keeps for the others that another node reads first (it had no room for them):
  // staged from SOURCE before anything else (Keepers::handed).
  std::vector<EntryId> handed;
};

class Stager {
 public:
  // REQUIRES: the parts outlive the stager. Makes the ring (throws std::runtime_error if io_uring cannot
  // be set up) and starts the thread.
  explicit Stager(StagerParts parts);
  ~Stager();  // stops and joins the threads
  // Picks nothing more, keeps what its reads in flight bring, then ends the thread (a plan replaced:
  // what SOURCE already sent is not read again).
  void finish() EXCLUDES(state_.mutex);
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  double seconds_per_file(bool peer) const { return model_.seconds(peer); }

 private:
  // A file picked for staging.
  struct Pick {
    EntryId id;
    uint64_t key;      // the use it is staged for (kReadAheadKey for read-ahead)
    bool readahead;
    Origin first;      // the store asked first
    bool peer_only = false;  // the keeper alone: a refusal defers the file (deferred_), not SOURCE
  };
  // An adopted file's NVMe write.
  struct Write {
    EntryId id;
    FileBytes bytes;
    uint64_t key;
  };

  void run();
  // One turn; false once the engine stops.
  bool turn();
  // The planning thread: the epochs after the readers' built as they come within the horizon. An epoch of
  // 14.2 M files takes seconds to build, which staging (its first file above all) does not wait for.
  void plan_loop() EXCLUDES(state_.mutex);
  // Builds the next epoch wanted, if any: whether it was added.
  bool plan_ahead() EXCLUDES(state_.mutex);
  // idle=: nothing asked for in idle_after_: RAM and pushed pages given back, once (staging waits for
  // the next read, which ends the idle state: ClairvoyantEngine::touch).
  void give_back_if_idle() REQUIRES(state_.mutex);
  void run_drops();
  void push_ahead();
  // Asks the kernel whether it still holds the files the staging walk comes to next whose pages the
  // readers read (PageWindow::should_ask); the walk leaves those it holds to it.
  void ask_kernel();
  void answered(EntryId id, bool held) EXCLUDES(state_.mutex);
  // Runs a push or a drop of `bytes` into the kernel, saying when it is overdue
  // (StagingCore::in_kernel_until).
  int in_kernel(uint64_t bytes, const std::function<int()>& call);
  // Picks, under the mutex: adopted files kept, their writes, read-ahead, then the plan. `room`: ring slots.
  void keep_adopted(std::vector<std::pair<EntryId, FileBytes>> adopted) REQUIRES(state_.mutex);
  std::vector<Write> pick_writes(unsigned room) REQUIRES(state_.mutex);
  void pick_readahead(unsigned room, std::vector<Pick>& picks) REQUIRES(state_.mutex);
  void pick_planned(unsigned room, std::vector<Pick>& picks) REQUIRES(state_.mutex);
  // The walk met a file whose attributes are still to be read: the next ones are asked of the fill
  // first (to_know_), and this one is read now, off the lock (know_now()).
  void wait_for_attributes(uint64_t key, EntryId id) REQUIRES(state_.mutex);
  void know_now();
  void pick_deferred(unsigned room, std::vector<Pick>& picks) REQUIRES(state_.mutex);
  void pick_handed(unsigned room, std::vector<Pick>& picks) REQUIRES(state_.mutex);
  // Whether a pick going to the keeper first may wait for it (not needed `soon`, room in deferred_).
  bool may_defer(bool soon) const;
  // On its way to RAM: a staging read of it, or a reader's load of the whole file (whose copy is kept at
  // the stager's next turn, keep_adopted). Staged too, SOURCE would read it twice (TSan's test_readers:
  // 1.001x, 1.003x).
  bool on_its_way(EntryId id) const REQUIRES(state_.mutex);
  // The process could not allocate `bytes` (an address-space limit, overcommit off), here or where
  // requests are served (StagingCore::short_of_memory): the RAM budget comes down to kServingRoom more
  // than that below what is held, and the files needed last are let go until RAM is within it, so that
  // reading goes on. Said once; the stats show the budget.
  void give_back_memory(uint64_t bytes) EXCLUDES(state_.mutex);
  // What is left free for serving besides: what requests allocate, the reads of files nobody staged.
  static constexpr uint64_t kServingRoom = uint64_t{32} << 20;
  // The budget back by steps after a shortage: kServingRoom once memory_retry has passed without
  // another, twice as much after the next, and so on up to ram=; a failure on the way lowers it again
  // and starts the steps over (a limit lifted, memory freed elsewhere: staging takes it up again).
  void raise_ram_budget();
  // The I/O of a pick, and its end.
  void stage(const Pick& pick);
  void staged(const Pick& pick, const StoreChain::Result& result);
  // Keeps a staged file in RAM; true if it should go to NVMe for the use at *after.
  bool keep(const Pick& pick, const StoreChain::Result& result, uint64_t* after) EXCLUDES(state_.mutex);
  void write(EntryId id, FileBytes bytes, uint64_t key);
  void written(EntryId id, uint64_t key, int rc) EXCLUDES(state_.mutex);
  void finish(EntryId id) EXCLUDES(state_.mutex);  // no longer in flight: opens waiting for it go on
  // Whether a staging read of `size` bytes may start (StagerParts::bytes_in_flight), and its start.
  bool room_in_flight(uint64_t size) const REQUIRES(state_.mutex);
  void take_off(EntryId id, uint64_t size) REQUIRES(state_.mutex);

  const Manifest& manifest_;
  StagingCore& state_;
  RamTier& ram_;
  StoreChain& chain_;
  NvmeTier* nvme_;
  PeerStore* peers_;
  DemandReader& demand_;
  EngineCounters& counters_;
  const StreamSource& streams_;
  PageCache* kernel_;
  uint64_t introductions_seen_ = 0;  // kernel_->introductions() at the last look
  const uint64_t max_bytes_in_flight_;
  const std::chrono::nanoseconds idle_after_;
  // The stager thread's own.
  IoLoop io_;
  PeerModel model_;
  uint64_t ask_key_ = 0;         // next key whose file the kernel may be asked about
  uint64_t again_key_ = 0;       // next key whose file the kernel said it held, to ask again as it comes near
  uint64_t left_up_to_ = 0;      // uses below it left to the kernel's pages are counted
  uint64_t said_wait_at_ = UINT64_MAX;  // the step staging last waited at (log_level=debug says it once)
  std::vector<EntryId> to_ask_;  // read-ahead's questions, asked at the next turn
  std::optional<EntryId> know_first_;            // the file the walk waits on, its attributes to be read
  std::vector<EntryId> to_know_;                 // the next ones after it, for the fill to read first
  uint64_t known_ahead_to_ = 0;                  // the keys up to which they were asked for
  // A file whose attributes could not be read now (out of descriptors or memory): the walk waits as it
  // does for room, and the stager reads them again from then on.
  std::chrono::steady_clock::time_point know_again_at_{};
  absl::flat_hash_set<EntryId> readahead_asks_;  // read ahead once the kernel says it does not hold them
  absl::flat_hash_map<EntryId, std::chrono::steady_clock::time_point> asking_;  // questions unanswered, since
  std::unordered_set<EntryId> writing_;  // NVMe writes in flight: one at a time per file
  std::vector<std::pair<EntryId, FileBytes>> to_write_;  // demand-read files waiting for a slot to go to NVMe
  // Files their keeper refused while the readers did not need them soon. Most likely the keeper had not
  // read them yet: it is the node whose rank reads a file first, and this node staged far ahead (a RAM
  // budget larger than its share). Read from SOURCE then, such a file would be read there twice; it is
  // asked again once needed soon, by then read by its keeper, and goes to SOURCE only if refused again:
  // the stager asks at most twice a file. By key, the soonest first.
  // Once deferred, a file's later uses are not asked for either: it comes for the first, and RAM keeps it
  // for the next.
  std::priority_queue<std::pair<uint64_t, EntryId>, std::vector<std::pair<uint64_t, EntryId>>, std::greater<>> deferred_;
  absl::flat_hash_set<EntryId> deferred_ids_;  // the files in deferred_
  uint64_t bytes_in_flight_ GUARDED_BY(state_.mutex) = 0;  // of the files in state_.in_flight
  void pop_deferred();
  // Runs `step` (false: stop); a std::bad_alloc in it is said once and waited out, not fatal.
  bool survive_out_of_memory(const std::function<bool()>& step);
  void out_of_memory();  // an allocation failed: said in the log the first time
  const std::chrono::nanoseconds memory_retry_;
  std::vector<EntryId> handed_;                                           // StagerParts::handed
  size_t next_handed_ = 0;                                                // the first of them not staged yet
  std::optional<std::chrono::steady_clock::time_point> raise_budget_at_;  // set while below ram= by a shortage
  uint64_t raise_step_ = 0;
  std::atomic<unsigned> out_of_memory_said_ = 0;  // allocations that failed (said in the log once)
  std::atomic<bool> finishing_{false};
  std::condition_variable plan_wake_;  // stop or finish (the planning thread looks again every kPlanLook)
  std::thread thread_;
  std::thread planning_;
};

}  // namespace clairfs
