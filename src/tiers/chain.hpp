// StoreChain: the stores a file not in RAM is read from, tried in order — the node's NVMe copy, the node
// that keeps it for all, SOURCE — each asked only if it may hold the file, the next on any failure.
//
// Both the request threads' misses (fetch) and the stager (start_fetch) read through it, so the order and
// the handling of a bad copy (the store removes and counts it; the chain goes on) exist once.
//
// Thread-safe as its stores are; start_fetch on the IoLoop's thread only.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "clairfs/store.hpp"

namespace clairfs {

class StoreChain {
 public:
  using Clock = std::chrono::steady_clock;

  // `stores` in the order tried (null ones left out). REQUIRES: they outlive the chain; the last holds
  // everything (SOURCE).
  explicit StoreChain(std::vector<Store*> stores);

  // Reads `id` whole into *buf from the first store that has it. Returns 0 or the last store's -errno;
  // *from is the store that answered (or was asked last).
  int fetch(EntryId id, const Buffer& buf, Origin* from);

  struct Result {
    int rc = 0;                // 0: buf holds the file, checked
    Origin from = Origin::kSource;  // the store that answered (or was asked last)
    Clock::time_point since;   // when that store was asked
    Buffer buf;                // the bytes (a fresh buffer after a store that may still hold the first)
  };
  using Done = std::function<void(const Result&)>;
  // The same on `io` without blocking, starting at the store of origin `first` (skipped stores before it
  // are not asked); `done` runs on io's thread. With `only_first`, a failure of that store is the result
  // (the next is not asked), if it may hold the file.
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Origin first, Done done, bool only_first = false);

  // The store of that origin, or nullptr.
  Store* store(Origin origin) const;

 private:
  void try_from(IoLoop& io, EntryId id, size_t index, Buffer buf, Done done, bool only_this);

  std::vector<Store*> stores_;
};

}  // namespace clairfs
