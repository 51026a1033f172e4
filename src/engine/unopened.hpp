// What a handle keeps between the reads of one open file, for reads that come without a handle (FUSE
// no-open mode): the kernel asks for a file larger than one request in pieces, and each piece must not
// read the file again.
//
// RecentLoads holds files read whole on demand (from NVMe, a peer or SOURCE), and RAM copies of files
// being read, until their last piece is read, and makes concurrent first reads of one file wait for a
// single load.
// SourceHandles keeps SOURCE descriptors of files too large to read whole, for their later pieces.
// Both are small and bounded; the oldest entry goes first.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>

#include "clairfs/store.hpp"
#include "clairfs/types.hpp"
#include "tiers/ram.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class RecentLoads {
 public:
  // A load's result: 0 and the bytes and where they came from, or -errno.
  using Load = std::function<int(FileBytes* bytes, Origin* from)>;

  RecentLoads(size_t max_files, uint64_t max_bytes) : max_files_(max_files), max_bytes_(max_bytes) {}

  // The bytes of `id`: held, or being loaded by another caller (waited for), or loaded now with `load`.
  // Returns 0 or the load's -errno (not kept: the next read tries again).
  int get(EntryId id, const Load& load, FileBytes* bytes, Origin* from) EXCLUDES(mutex_);
  // Holds `bytes` for the file's later pieces (its RAM copy, which RAM may evict meanwhile).
  void put(EntryId id, FileBytes bytes, Origin from) EXCLUDES(mutex_);
  // The file's last piece was read: no longer held (a load in progress is left alone).
  void forget(EntryId id) EXCLUDES(mutex_);

 private:
  struct Slot {
    FileBytes bytes;
    Origin from = Origin::kSource;
    bool loading = true;
  };
  const size_t max_files_;
  const uint64_t max_bytes_;
  Mutex mutex_;
  std::condition_variable loaded_;
  void hold(EntryId id, FileBytes bytes, Origin from) REQUIRES(mutex_);

  std::unordered_map<EntryId, Slot> slots_ GUARDED_BY(mutex_);
  std::deque<EntryId> order_ GUARDED_BY(mutex_);  // held slots, oldest first
  uint64_t held_bytes_ GUARDED_BY(mutex_) = 0;
};

class SourceHandles {
 public:
  // REQUIRES: source outlives this.
  SourceHandles(SourceStore& source, size_t max_open) : source_(source), max_open_(max_open) {}

  // Reads through a kept handle of `id`, opening one if there is none. Returns like SourceTier::read;
  // *opened says whether SOURCE was opened for it.
  ssize_t read(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, bool* opened) EXCLUDES(mutex_);
  // Whether a handle of `id` is kept (its reader reads it piece by piece).
  bool holds(EntryId id) EXCLUDES(mutex_);
  // Whether a kept handle of `id` was read from at `since` or later (its reader is at it now).
  bool read_since(EntryId id, std::chrono::steady_clock::time_point since) EXCLUDES(mutex_);

 private:
  struct Open;  // releases its SourceTier handle when the last reader lets go
  SourceStore& source_;
  const size_t max_open_;
  Mutex mutex_;
  std::unordered_map<EntryId, std::shared_ptr<Open>> open_ GUARDED_BY(mutex_);
  std::deque<EntryId> order_ GUARDED_BY(mutex_);  // oldest first
};

}  // namespace clairfs
