// ClairvoyantEngine: stages the files this node's ranks will open next into RAM before they ask.
//
// The plan is the node's stream: for the current epoch, the oracle's sequences of every rank this mount
// serves, interleaved step by step (the k-th file of each rank, then the (k+1)-th, ...), which is the
// order their reads will arrive in. A stager thread walks the stream ahead of the readers and reads each
// upcoming file whole from SOURCE through io_uring (many reads in flight) into the RAM tier, as far
// ahead as the `ram=` budget allows. Opens are the progress signal: the cursor is the first position of
// the stream not yet opened; files behind it are evicted, which frees budget for the next ones.
// An open of a staged file is served from RAM without touching SOURCE; anything else is opened in
// SOURCE when its first read arrives (counted as a stall) — never, when the kernel's page cache still
// holds it from an earlier epoch, which is why files served once are not staged again. An open the plan does not expect is counted as a misprediction
// and served from SOURCE: bytes are right whatever the order.
//
// Not yet here (issue 5 continues): pushing staged pages into the kernel (notify_store), the NVMe tier,
// eviction by next use across epochs, detecting a reader that left the order and stopping for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/oracle.hpp"
#include "engine/source_reader.hpp"
#include "io/uring.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

struct EngineConfig {
  uint64_t ram = 0;              // bytes
  std::vector<uint64_t> ranks;   // the training ranks this node serves
  uint64_t start_epoch = 0;
  std::optional<uint64_t> epochs;
  unsigned depth = 32;           // reads in flight
};

class ClairvoyantEngine final : public Engine {
 public:
  // REQUIRES: manifest, oracle and source outlive the engine. Starts the stager thread; throws
  // std::runtime_error if io_uring cannot be set up.
  ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceReader& source, EngineConfig config);
  ~ClairvoyantEngine() override;

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) override;
  void release(uint64_t handle) override;

  // The counters as JSON (.clairfs/stats).
  std::string stats_json() const;

 private:
  struct Handle;
  void stage_loop();
  std::vector<EntryId> build_stream(uint64_t epoch) const;
  void note_open(EntryId id);  // advances the cursor; REQUIRES: mutex_ not held
  void finish_staging(EntryId id);  // wakes opens waiting for it; REQUIRES: mutex_ not held

  const Manifest& manifest_;
  const Oracle& oracle_;
  SourceReader& source_;
  const EngineConfig config_;
  RamTier ram_;

  // The plan. Guarded by mutex_ (lock order: mutex_ before RamTier's own).
  mutable std::mutex mutex_;
  std::condition_variable progress_;        // the cursor moved, or stop
  uint64_t epoch_;                          // the epoch being read
  std::vector<EntryId> stream_;             // this node's files for epoch_, in arrival order
  std::unordered_map<EntryId, uint64_t> position_;  // first position of each file in stream_
  std::vector<char> opened_;                // per position: opened already
  struct Plan {
    std::vector<EntryId> stream;
    std::unordered_map<EntryId, uint64_t> position;
  };
  std::unique_ptr<Plan> next_;              // epoch_ + 1's plan, once an open has asked for it
  uint64_t cursor_ = 0;                     // first position not yet opened
  uint64_t stage_pos_ = 0;                  // next position the stager considers
  uint64_t evict_pos_ = 0;                  // positions below this are evicted
  std::unordered_set<EntryId> in_flight_;   // being staged now: an open waits for it, not reads it twice
  std::vector<char> served_;                // per entry: opened through the mount before, so its pages
                                            // are likely in the kernel's cache (keep_cache): not staged
  std::condition_variable staged_;          // a staging read finished
  bool stop_ = false;

  // Counters.
  std::atomic<uint64_t> ram_files_{0}, ram_bytes_{0}, source_files_{0}, source_bytes_{0};
  std::atomic<uint64_t> staged_files_{0}, staged_bytes_{0}, stage_failures_{0}, mispredicted_{0};
  std::atomic<uint64_t> stall_ns_{0};
  std::atomic<uint64_t> cached_files_{0};  // opened and closed without a read reaching us

  std::unique_ptr<Ring> ring_;  // made here so a missing io_uring fails the constructor; used by stager_ only
  std::thread stager_;
};

}  // namespace clairfs
