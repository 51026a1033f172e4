// The engine's counters: one place for every number the engine counts, written by any thread (relaxed
// atomics: each is a tally, read only for the stats: ClairvoyantEngine::snapshot).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "clairfs/store.hpp"

namespace clairfs {

struct EngineCounters {
  // Reads served, by where their bytes came from: files at their first read (or, for the page cache,
  // uses presumed read from pushed pages and handles no read reached), bytes as read.
  void served_file(Origin o) { served_[index(o)].files++; }
  void served_bytes(Origin o, uint64_t n) { served_[index(o)].bytes += n; }
  void served_files(Origin o, uint64_t n) { served_[index(o)].files += n; }
  uint64_t files(Origin o) const { return served_[index(o)].files.load(); }
  uint64_t bytes(Origin o) const { return served_[index(o)].bytes.load(); }

  // Staging.
  std::atomic<uint64_t> staged_files{0}, staged_bytes{0}, stage_failures{0};
  // Staged files whose use passed while they were read (their reader on the staging's heels): NVMe keeps
  // them for their next use.
  std::atomic<uint64_t> staged_after_their_use{0};
  std::atomic<uint64_t> staged_from_nvme{0}, staged_from_peer{0}, staged_peer_bytes{0}, staged_source_bytes{0};
  // Files a keeper refused while not needed soon, asked again later rather than read from SOURCE.
  std::atomic<uint64_t> peer_deferrals{0};
  // Files kept here for the others although another node reads them first: their staging reads started
  // (a read that fails counts under stage_failures too).
  std::atomic<uint64_t> handed_staged{0};
  // Files a peer keeps that staging read from SOURCE instead, the peer being far slower (PeerModel).
  std::atomic<uint64_t> source_over_peer{0}, source_over_peer_bytes{0};
  std::atomic<uint64_t> readahead_files{0};
  // Files whose attributes the stager read itself, its walk waiting on them (a mount up before the fill
  // had read them all; the next ones are asked of the fill first).
  std::atomic<uint64_t> attributes_read{0};
  // Tiers.
  std::atomic<uint64_t> ram_evictions{0}, nvme_evictions{0};
  std::atomic<uint64_t> idle_releases{0};  // idle=: times RAM was given back
  std::atomic<uint64_t> pushes{0}, push_failures{0}, drops{0};
  // Files the kernel was asked about before staging them, uses left to the pages it said it held, and
  // files it had taken back when asked again as their use came near (staged then).
  std::atomic<uint64_t> kernel_asks{0}, left_to_kernel{0}, kernel_took_back{0};
  // Reads on demand.
  std::atomic<uint64_t> demand_peer_files{0};
  std::atomic<uint64_t> piecewise_files{0};  // read from SOURCE piece by piece: no room to hold them whole
  std::atomic<uint64_t> demand_waits{0};     // misses that waited for room in the demand allowance
  std::atomic<uint64_t> demand_waits_given_up{0};  // ... and found none in time (read piece by piece)
  // Uses not staged: their readers were reading them on demand (or had read them, the watch behind).
  std::atomic<uint64_t> left_to_readers{0};
  std::atomic<uint64_t> stall_ns{0};          // time readers waited on a peer or SOURCE
  // Opens that stopped waiting for their file's staging because the stager was held in the kernel, and
  // read it themselves (a second read of that file).
  std::atomic<uint64_t> staging_waits_given_up{0};
  // Opens and closes a watch on the mount told (no-open mode), and the times it lost some.
  std::atomic<uint64_t> watched_opens{0}, watched_closes{0}, watch_losses{0};

 private:
  static size_t index(Origin o) { return static_cast<size_t>(o); }
  struct Served {
    std::atomic<uint64_t> files{0}, bytes{0};
  };
  std::array<Served, 5> served_;
};

}  // namespace clairfs
