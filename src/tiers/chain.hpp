// StoreChain: the stores a file not in RAM is read from, tried in order — the node's NVMe copy, the node
// that keeps it for all, SOURCE — each asked only if it may hold the file, the next on any failure. It is
// a store itself (a composite): the request threads' misses (fetch) and the stager (start_fetch) read
// through it alone, so the order and the handling of a bad copy (the store removes and counts it; the
// chain goes on) exist once.
//
// It also copies up: a file read from below the store that keeps copies (NVMe) is offered to that store
// when the node's admission rule (Admission: room by next use, made by evicting what is needed later)
// makes room for it, one write a file at a time. Files read on demand wait for their write in a queue, as
// the stager's ring has room.
//
// Thread-safe as its stores are for fetch; start_fetch and the copy-up on the IoLoop's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_set>
#include <vector>

#include "clairfs/store.hpp"

namespace clairfs {

// Which copies the store that keeps them takes: the node's rule (StagingCore, by next use).
class Admission {
 public:
  // A copy to write up, for its use at `key`.
  struct Copy {
    EntryId id;
    FileBytes bytes;
    uint64_t key = 0;
  };
  virtual ~Admission() = default;
  // Room for a staged file's copy (`size` bytes) kept for its use at `key`, reserved on the keeping store
  // (copies needed later evicted): whether there is.
  virtual bool admit(EntryId id, uint64_t size, uint64_t key) = 0;
  // Of the copies read on demand that wait (in the order read), up to `most` to write now, their room
  // reserved and their use found; those looked at and not admitted are let go (or kept elsewhere: the
  // rule's to say). What it looked at is taken out of `waiting`.
  virtual std::vector<Copy> admit_waiting(std::vector<Copy>& waiting, size_t most) = 0;
  // `id`'s copy is held by the keeping store now, for its use at `key`.
  virtual void kept(EntryId id, uint64_t key) = 0;
};

class StoreChain final : public Store {
 public:
  using Clock = std::chrono::steady_clock;

  // `above`: the stores tried before SOURCE, in order (null ones left out); `admission`: the rule for
  // copies up (nullptr: none are made). REQUIRES: they outlive the chain.
  StoreChain(std::vector<Store*> above, SourceStore& source, Admission* admission = nullptr);

  // Store, as one: SOURCE's origin (it holds everything), the first store that has the file answers.
  Origin origin() const override { return Origin::kSource; }
  bool may_hold(EntryId) const override { return true; }
  int fetch(EntryId id, const Buffer& buf) override;
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override;

  // Reads `id` whole into *buf from the first store that has it. Returns 0 or the last store's -errno;
  // *from is the store that answered (or was asked last).
  int find(EntryId id, const Buffer& buf, Origin* from) override;
  // The same on `io` without blocking, from route.first on; a file found below the store that keeps
  // copies is written up to it for the use `done` names, if the rule makes room and no copy is held or
  // being written (copy-up).
  void start_find(IoLoop& io, EntryId id, Buffer buf, Route route, FoundDone done) override;

  // The store of that origin, or nullptr.
  Store* part(Origin origin) override;

  // Files read on demand wait for their write up as the ring has room (kMaxWaiting wait at most; more
  // are let go); if the keeping store takes no copies any more, they are let go. On io's thread.
  void hold_copy(EntryId id, FileBytes bytes) override;
  unsigned write_held(IoLoop& io, unsigned room) override;
  bool copies_held() override;
  static constexpr size_t kMaxWaiting = 4096;

 private:
  void try_from(IoLoop& io, EntryId id, size_t index, Buffer buf, FoundDone done, bool only_this);
  // A file found below the keeping store, offered up for its use at `key` if the rule makes room and no
  // copy is held or being written.
  void copy_up(IoLoop& io, EntryId id, FileBytes bytes, uint64_t key);
  void write(IoLoop& io, EntryId id, FileBytes bytes, uint64_t key);

  std::vector<Store*> stores_;  // those above, then SOURCE
  Store* keeper_ = nullptr;  // the store that keeps copies (NVMe's), if any
  Admission* const admission_;
  std::unordered_set<EntryId> writing_;  // writes under way: one at a time a file
  std::vector<Admission::Copy> waiting_;  // files read on demand waiting for their write
};

}  // namespace clairfs
