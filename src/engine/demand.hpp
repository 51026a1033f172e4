// Reads of files the RAM tier does not hold, on the request threads (a miss).
//
// A miss is read whole through the store chain (NVMe, the keeper, SOURCE) into a buffer of the demand
// allowance (the whole files held outside the RAM budget stay within it), served from that buffer, and
// handed to the stager to keep like a staged file (take_adopted), so SOURCE sees it once. A file with no
// room in the allowance is read from SOURCE piece by piece, as the kernel asks.
//
// OpenFile is a handle's file (opens); read_unopened serves reads that come without a handle (FUSE
// no-open mode), keeping what one read loaded for the kernel's next pieces of the same file.
//
// Thread-safe: its parts have their own locks (leaves in the engine's lock order).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/manifest.hpp"
#include "clairfs/store.hpp"
#include "engine/counters.hpp"
#include "engine/unopened.hpp"
#include "tiers/ram.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class DemandReader {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: manifest, stores, source, counters outlive the reader. `stores`: the node's (StoreChain:
  // NVMe, the keeper, SOURCE), a file's whole reads and the NVMe copies for peers; `source`: SOURCE,
  // read piecewise where a file has no room. `wake_keeper`: called when a miss finds the allowance full
  // (the stager takes the files read on demand and frees their room as it keeps them; it may be asleep).
  DemandReader(const Manifest& manifest, Store& stores, SourceStore& source, EngineCounters& counters,
               std::function<void()> wake_keeper);

  // A reader's miss, from the moment the engine finds `id` neither in RAM nor being staged (under its
  // lock) until the read is served: loading_whole(id) holds meanwhile, so no staging read of it starts
  // in the gap before the load begins (SOURCE would read it twice: the read came before the open was
  // told, so the plan still counts the use as to come).
  class Claim {
   public:
    Claim(DemandReader& demand, EntryId id);
    ~Claim();
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;

   private:
    DemandReader& demand_;
    const EntryId id_;
  };

  // Reads `id` whole through the chain (its bytes and stall counted, and offered to the stager to keep;
  // the use is its reader's to count, once). -EFBIG: no room in the allowance (read it piecewise).
  int load_whole(EntryId id, FileBytes* bytes, Origin* from);
  // A whole checked NVMe copy for a peer that asks, within the allowance; nullptr if none.
  FileBytes nvme_copy(EntryId id);

  // Without a handle: the read at `offset` of a file RAM does not hold (`first`: it is the file's open).
  // Both: a piece read from bytes held whole is left there when `held` is given (Engine::read_unopened).
  ssize_t read_unopened(EntryId id, pid_t pid, bool first, char* buf, size_t size, off_t offset, Clock::time_point t0,
                        HeldPiece* held);
  // Without a handle, of a file RAM holds (`data`, from `from`: kRam or kPeer).
  ssize_t read_unopened_held(EntryId id, const FileBytes& data, Origin from, bool first, char* buf, size_t size,
                             off_t offset, HeldPiece* held);

  // Files read whole on demand since the last call, for the stager to keep.
  std::vector<std::pair<EntryId, FileBytes>> take_adopted();
  // The plan changed (a re-plan: this reader's engine retires, `next`'s takes over). The files this one
  // loaded whole and its stager did not take, and those it loads from now on (its engine still serves
  // until the switch, and its handles after), go to `next` to keep; `next` counts this one's loads under
  // way as its own (loading_whole, reading). Without it a file read on demand in the switch was kept by
  // neither engine, and staged again for its next use: SOURCE read it twice. Called once, before `next`'s
  // stager starts; `next` must not outlive this reader.
  void hand_to(DemandReader& next);
  // `next` failed to start: what this one reads on demand is its own to keep again.
  void hand_back();
  // Whether a reader is reading `id` from the stores itself right now (a whole-file miss being loaded, or
  // pieces read from SOURCE within the last second): a staging read of it would read it a second time.
  bool reading(EntryId id);
  // Whether a reader is loading `id` whole right now, or loaded it since the stager last took the files
  // to keep: its bytes are in RAM by the stager's next turn (if room is found), a staging read of it
  // would be a second read of SOURCE.
  bool loading_whole(EntryId id);

  SourceStore& source() { return source_; }
  uint64_t source_changed() const { return source_.changed(); }
  EngineCounters& counters() { return counters_; }
  const DemandAllowance& allowance() const { return allowance_; }

 private:
  // Copies the piece of `bytes` at `offset` (or points `held` at it); the file's last piece ends
  // RecentLoads' hold on it.
  ssize_t copy(EntryId id, const FileBytes& bytes, char* buf, size_t size, off_t offset, HeldPiece* held);
  void adopt(EntryId id, FileBytes bytes);
  // A buffer of `size` bytes from the allowance, waiting a little for room if there is none; nullptr if
  // none came.
  Buffer room_for(uint64_t size);

  const Manifest& manifest_;
  Store& stores_;
  SourceStore& source_;
  Store* const nvme_;  // the NVMe store among them, if any
  EngineCounters& counters_;
  DemandAllowance allowance_;
  const std::function<void()> wake_keeper_;
  std::atomic<Clock::rep> no_wait_until_{0};  // room_for waits for room from then on (a steady-clock count)
  RecentLoads recent_;
  SourceHandles source_handles_;
  Mutex mutex_;
  std::vector<std::pair<EntryId, FileBytes>> adopted_ GUARDED_BY(mutex_);
  std::unordered_map<EntryId, unsigned> loading_ GUARDED_BY(mutex_);  // load_whole under way, by file
  DemandReader* next_ GUARDED_BY(mutex_) = nullptr;                   // hand_to's: where copies go
  std::atomic<DemandReader*> earlier_{nullptr};                       // the reader that handed to this one
  // The loads under way and the files adopted, not yet taken: changed under mutex_, read without it
  // (none: nothing to look up).
  std::atomic<size_t> whole_{0};
};

// A file opened through a handle. NVMe and SOURCE are read only when the first read arrives: a file
// whose pages the kernel still caches (keep_cache) is opened and read without any read reaching us.
class OpenFile {
 public:
  using Clock = std::chrono::steady_clock;

  // `ram`: the file's RAM copy at the open (nullptr if none); `from` where that came from (kRam, kPeer).
  OpenFile(EntryId id, pid_t pid, FileBytes ram, Origin from);
  EntryId id() const { return id_; }
  ssize_t read(DemandReader& demand, char* buf, size_t size, off_t offset, HeldPiece* held);
  // The handle's end: a SOURCE handle goes; a file no read reached was served by the page cache.
  void close(DemandReader& demand);

 private:
  void load(DemandReader& demand, Clock::time_point t0) REQUIRES(mutex_);

  const EntryId id_;
  const pid_t pid_;
  const bool from_ram_;
  std::atomic<bool> read_any_{false};  // a read reached us (else the kernel's cache served every byte)
  Mutex mutex_;                        // taken by the lazy load (the kernel may send reads in parallel)
  // The lazy load is done (or was not needed): what it set below may be read without the mutex.
  std::atomic<bool> ready_{false};
  bool tried_ GUARDED_BY(mutex_) = false;
  FileBytes data_;                 // whole file from RAM, NVMe, a peer, or read whole from SOURCE
  Origin from_;                    // where data_ came from
  uint64_t source_handle_ = 0;     // piecewise from SOURCE
  bool source_open_ = false;
  int error_ = 0;                  // the lazy load's -errno
};

}  // namespace clairfs
