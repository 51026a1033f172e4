// The RAM tier: whole staged files, held under a hard byte budget.
//
// Each file counts its bytes and what holding it costs besides (charge()): its allocation's rounding,
// the index entries here and in the staging policy. Without that a million empty files, each "free",
// took 240 MB outside any budget.
//
// Small files (up to kSmallFile bytes, the 64-200 B files of a tokenized or thumbnail data set) are kept
// in one allocation each, their size in front, and handed out as copies: a shared buffer's header, its
// control block and its hash-map node cost ~245 B a file, more than such a file. Larger files are
// immutable once inserted and shared (shared_ptr) with the readers serving from them; the budget counts
// inserted files, reservations for reads in flight, and files evicted while something still held them
// (a reader's handle, a write to NVMe, a peer's answer) until their bytes are freed: a reader of a large
// file does not make its bytes vanish from the count while they stay in memory.
//
// DemandAllowance bounds the other whole files the daemon holds: those read on demand (a miss, a
// peer's request for an NVMe copy), which no budget reserved room for. Their buffers come from it and
// give their share back when freed, or when the RAM tier takes them in (its budget counts them then).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "clairfs/store.hpp"
#include "clairfs/types.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

// The RAM the staging core fills (StagingCore): room reserved before a read, a file held or let go, what
// is held. RamTier holds the bytes; a simulation of the daemon counts them alone (bench/core_driver.hpp),
// driving the same core. A file's bytes are its size in the manifest.
class StagedRam {
 public:
  virtual ~StagedRam() = default;
  // Reserves `bytes` for a read about to start; false if that would pass the budget.
  virtual bool reserve(uint64_t bytes) = 0;
  // Gives back a reservation whose read failed or was dropped.
  virtual void unreserve(uint64_t bytes) = 0;
  // Turns a reservation into a held file. REQUIRES: reserve(its size) succeeded.
  virtual void insert(EntryId id, FileBytes data) = 0;
  // The held file, or nullptr (always, in a simulation).
  virtual FileBytes get(EntryId id) const = 0;
  // Drops a held file; returns the bytes freed (0 if it was not held).
  virtual uint64_t erase(EntryId id) = 0;
  virtual uint64_t used() const = 0;  // held + reserved (+ what is still to be freed)
  // The files held, by id.
  virtual std::vector<EntryId> ids() const = 0;
};

class RamTier final : public StagedRam {
 public:
  // Files up to this size are kept as small files (above).
  static constexpr uint64_t kSmallFile = 4096;
  // What a file costs besides its bytes: a small file its allocation (rounded as glibc's malloc
  // rounds, with the size in front) and kSmallIndex; a larger one kBookkeeping, its buffer's header,
  // control block and index entries. Both include the staging policy's entry (next_use.hpp). Measured in
  // tests/unit/ram_test.cpp (RamTierTest.BookkeepingIsWhatItCosts).
  static constexpr uint64_t kSmallIndex = 96;
  static constexpr uint64_t kBookkeeping = 256;
  static uint64_t charge(uint64_t bytes) {
    return bytes <= kSmallFile ? std::max<uint64_t>(32, (bytes + sizeof(uint32_t) + 8 + 15) / 16 * 16) + kSmallIndex
                               : bytes + kBookkeeping;
  }

  explicit RamTier(uint64_t budget) : budget_(budget), configured_(budget) {}

  // StagedRam. The budget counts each file's charge(); a small file is handed out as a copy.
  bool reserve(uint64_t bytes) override EXCLUDES(mutex_);
  void unreserve(uint64_t bytes) override EXCLUDES(mutex_);
  void insert(EntryId id, FileBytes data) override EXCLUDES(mutex_);
  FileBytes get(EntryId id) const override EXCLUDES(mutex_);
  uint64_t erase(EntryId id) override EXCLUDES(mutex_);
  bool contains(EntryId id) const EXCLUDES(mutex_);

  uint64_t budget() const EXCLUDES(mutex_);
  // The budget comes down to `less` bytes below what is held now (reserved and lingering bytes
  // included), or to 0: the process could not allocate more (an address-space limit, overcommit off).
  // Files are not let go here (the stager picks which). Returns the new budget.
  uint64_t lower_budget_below_used(uint64_t less) EXCLUDES(mutex_);
  // The budget goes up by `more` bytes, to the one it was made with at most (memory may be allocated
  // again). Returns the new budget.
  uint64_t raise_budget(uint64_t more) EXCLUDES(mutex_);
  uint64_t configured_budget() const { return configured_; }
  uint64_t used() const override EXCLUDES(mutex_);  // held + reserved + evicted but not yet freed
  uint64_t files() const EXCLUDES(mutex_);
  std::vector<EntryId> ids() const override EXCLUDES(mutex_);
  // What the held files count besides their bytes (the sum of charge(size) - size).
  uint64_t bookkeeping() const EXCLUDES(mutex_);

 private:
  struct Lingering {
    std::weak_ptr<const Bytes> bytes;
    uint64_t size;
  };
  // A small file: one allocation, its size in the first 4 bytes, then its bytes.
  struct SmallDelete {
    void operator()(char* p) const { ::operator delete(p); }
  };
  using Small = std::unique_ptr<char, SmallDelete>;
  static Small make_small(const Bytes& bytes);
  static uint32_t small_size(const Small& s);

  void settle() REQUIRES(mutex_);  // Stops counting lingering files that have been freed.

  mutable Mutex mutex_;  // a leaf: never held across I/O, nothing taken under it
  uint64_t budget_ GUARDED_BY(mutex_);
  const uint64_t configured_;
  absl::flat_hash_map<EntryId, Small> small_ GUARDED_BY(mutex_);
  absl::flat_hash_map<EntryId, FileBytes> large_ GUARDED_BY(mutex_);
  uint64_t held_ GUARDED_BY(mutex_) = 0;        // charge() of the held files
  uint64_t held_bytes_ GUARDED_BY(mutex_) = 0;  // their bytes
  uint64_t reserved_ GUARDED_BY(mutex_) = 0;
  std::vector<Lingering> lingering_ GUARDED_BY(mutex_);  // evicted while held elsewhere
  uint64_t lingering_bytes_ GUARDED_BY(mutex_) = 0;
};

class DemandAllowance {
 public:
  using Clock = std::chrono::steady_clock;
  explicit DemandAllowance(uint64_t limit) : limit_(limit), shared_(std::make_shared<Shared>()) {}

  // A buffer of `size` bytes (not zeroed: include/clairfs/bytes.hpp) counted against the limit, or nullptr
  // if it would pass the limit.
  std::shared_ptr<Bytes> allocate(uint64_t size);
  // The same, waiting until `deadline` for buffers to be freed or handed over when there is no room now
  // (nullptr at once if `size` is over the limit; *waited says whether it waited).
  std::shared_ptr<Bytes> allocate_by(uint64_t size, Clock::time_point deadline, bool* waited);
  // `bytes` are now counted elsewhere (inserted into the RAM tier): their share is given back now.
  // No effect on buffers that did not come from allocate() or were handed over already.
  // REQUIRES: one thread hands over a given buffer (the stager).
  static void hand_over(const FileBytes& bytes);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return shared_->used.load(); }

 private:
  struct Release;  // the buffers' deleter
  // Shared with the deleters: buffers may outlive the allowance.
  struct Shared {
    std::atomic<uint64_t> used{0};
    std::atomic<unsigned> waiting{0};  // allocate_by's waiting now: a share given back wakes them
    Mutex mutex;                       // a leaf: only for the wake-up
    std::condition_variable freed;
    void give_back(uint64_t size);
  };
  const uint64_t limit_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace clairfs
