// The seam between the engine and the places whole files come from: a store.
//
// The engine keeps upcoming files in RAM; the bytes get there from a chain of stores tried in order —
// the node's NVMe copy, the peer node that keeps the file for the others, SOURCE itself. Each store
// owns its I/O and its checks (a checksum, a comparison with the manifest), so what it hands back is the
// file as the manifest describes it, or an error; a bad copy is the store's to remove and count.
//
// A store is used two ways: the request threads fetch() a file and wait (a miss), and the stager starts
// many reads at once on its IoLoop (start_fetch) and hears of each on its own thread. A store that can
// keep copies (NVMe) takes them through start_offer.
//
// Stores make one: StoreChain (tiers/chain.hpp) is the node's stores in order, itself a Store, and the
// only one the engine's readers and stager hold. What a store of stores says beyond a single store —
// which of them answered (find), where to begin (start_find), which copies to keep above (the use a
// found file's copy is for, and copies held until there is room) — is part of this interface, a single
// store answering it as itself.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "clairfs/bytes.hpp"
#include "clairfs/types.hpp"

namespace clairfs {

class IoLoop;  // io/io_loop.hpp: the stager's ring and the completions it runs

using FileBytes = std::shared_ptr<const Bytes>;
using Buffer = std::shared_ptr<Bytes>;

class Store {
 public:
  virtual ~Store() = default;

  virtual Origin origin() const = 0;
  // Whether asking makes sense (cheap, any thread): NVMe holds a copy, the keeper is another usable
  // node. SOURCE holds everything.
  virtual bool may_hold(EntryId id) const = 0;

  // Reads file `id` whole into `*buf` (sized to the file) and checks it. Returns 0, or -errno: -ENOENT
  // (not held here), -EIO (a damaged or changed copy, removed and counted by the store), others.
  // Any thread but the stager's; may block for the store's own time limit. The store may hold on to
  // `buf` after giving up on it (a peer's late answer lands there).
  virtual int fetch(EntryId id, const Buffer& buf) = 0;

  // The same without blocking: `done` runs later on io's thread with 0 or -errno.
  // REQUIRES: called on io's thread.
  using Done = std::function<void(int rc)>;
  virtual void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) = 0;

  // Offers a copy read from elsewhere for keeping; `done` runs on io's thread with 0 (kept) or -errno.
  // REQUIRES: called on io's thread, room reserved by the caller (see NvmeTier::reserve).
  virtual void start_offer(IoLoop& io, EntryId id, FileBytes bytes, Done done);
  // Whether it takes copies now (start_offer): NVMe while it admits. Others never.
  virtual bool keeps_copies() const { return false; }
  // Its fetches under way (a peer's requests, which the stager weighs against SOURCE's reads).
  virtual unsigned in_flight() const { return 0; }

  // ---- as a store of stores (StoreChain); a single store answers as itself

  // fetch(), saying which store answered (or was asked last) in *from.
  virtual int find(EntryId id, const Buffer& buf, Origin* from);

  // A found file, on io's thread.
  struct Found {
    int rc = 0;                                   // 0: buf holds the file, checked
    Origin from = Origin::kSource;                // the store that answered (or was asked last)
    std::chrono::steady_clock::time_point since;  // when that store was asked
    Buffer buf;  // the bytes (a fresh buffer after a store that may still write into the first)
  };
  // Where to begin: at the store of origin `first` (none before it is asked); with `only_first`, its
  // failure is the answer (the next is not asked) if it may hold the file.
  struct Route {
    Origin first = Origin::kPageCache;
    bool only_first = false;
  };
  // What the caller says of a file found: the use a copy of it kept above is for (a key of the keeping
  // store's admission rule), if one should be.
  using Keep = std::optional<uint64_t>;
  using FoundDone = std::function<Keep(const Found&)>;
  // start_fetch() along `route`; `done` runs on io's thread. REQUIRES: called on io's thread.
  virtual void start_find(IoLoop& io, EntryId id, Buffer buf, Route route, FoundDone done);

  // The store of origin `o` within it (itself, if that is its origin); nullptr if none.
  virtual Store* part(Origin o) { return o == origin() ? this : nullptr; }

  // Copies found elsewhere, held until the ring has room for their writes to the store that keeps them
  // (files read on demand): one held, up to `room` writes started (how many), whether any are held.
  // REQUIRES: on io's thread. A store that keeps no copies of others' files holds none.
  virtual void hold_copy(EntryId /*id*/, FileBytes /*bytes*/) {}
  virtual unsigned write_held(IoLoop& /*io*/, unsigned /*room*/) { return 0; }
  virtual bool copies_held() { return false; }
};

// SOURCE as a store, which can also be read piece by piece for files too large to hold whole.
class SourceStore : public Store {
 public:
  Origin origin() const override { return Origin::kSource; }
  bool may_hold(EntryId) const override { return true; }

  // Piecewise reads through a handle, like Engine's open/read/release.
  virtual int open(EntryId id, pid_t pid, uint64_t* handle) = 0;
  virtual ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) = 0;
  virtual void release(uint64_t handle) = 0;
  // Files refused because SOURCE no longer matched the manifest.
  virtual uint64_t changed() const = 0;
};

}  // namespace clairfs
