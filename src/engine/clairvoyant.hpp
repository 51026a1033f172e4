// ClairvoyantEngine: stages the files this node's ranks will open next before they ask, and keeps what
// is needed again by next use.
//
// The planner (planner.hpp) turns the oracle's orders into keys — when each file will be opened, epoch
// after epoch — and follows the readers: every open (or read, below) is a progress signal. A stager thread
// walks the keys ahead of the readers and brings each upcoming file into the RAM tier through io_uring
// (many opens and reads in flight): from the NVMe tier when it holds the file (checksum verified), else
// from SOURCE. Budgets are hard: when RAM is full, the resident needed farthest in the future is evicted to
// make room, unless everything held is needed sooner than the file in question (Belady's MIN), and the
// stager waits for the readers. Files read from SOURCE are written to the NVMe tier when its own MIN
// admission keeps them; a full disk stops admission and nothing else; a checksum mismatch is re-read from
// SOURCE and counted. Up to `pagecache` bytes of staged files just ahead of the readers are pushed into the
// kernel's page cache, so their reads never reach the daemon; passed files' pages are dropped.
//
// Progress comes from opens, or — with `no_open`, where the kernel opens files without asking (FUSE
// no-open mode) so pushed files are read at page-cache speed — from reads: the first read of a file that
// reaches the daemon is its open. Pushed files are presumed read once their reader reads something past
// them, and one use in every `beacon_every` steps of each rank (and its last in each epoch) is left
// unpushed, so that reading it tells the engine where the reader is. Pages are dropped only half a
// tolerance behind the readers then (and kept if needed again soon), since no release says when a reader
// is done with a file.
//
// Opens of staged files are served from RAM (or the kernel's pages); anything else is read on demand
// from NVMe or SOURCE (opened there only when the first read arrives; time spent on SOURCE is counted as
// a stall). Opens no rank expects are counted as mispredictions; a rank that keeps missing is dropped
// from the plan (nothing staged for it) until it returns to the order. Bytes are right whatever happens.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/oracle.hpp"
#include "clairfs/peer.hpp"
#include "engine/planner.hpp"
#include "engine/source_reader.hpp"
#include "engine/unopened.hpp"
#include "io/uring.hpp"
#include "tiers/next_use.hpp"
#include "tiers/nvme.hpp"
#include "tiers/page_cache.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

struct EngineConfig {
  uint64_t ram = 0;                // bytes
  std::vector<uint64_t> ranks;     // the training ranks this node serves
  uint64_t start_epoch = 0;
  std::optional<uint64_t> epochs;
  unsigned depth = 32;             // opens, reads and writes in flight
  uint64_t tolerance = 256;        // steps an open may stray from its rank's place (Planner)
  uint64_t horizon = 2;            // epochs planned after the readers' one (Planner)
  uint64_t loader_window = 16;     // files a rank's DataLoader opens ahead: prefetch_factor × workers × batch
  std::string nvme;                // a directory; empty: no NVMe tier
  uint64_t nvme_size = 0;          // 0: 90% of what is free there
  uint64_t pagecache = 0;          // bytes pushed ahead into the kernel at most; 0: no pushes
  PageCache* page_cache = nullptr; // where pushes go; nullptr: no pushes
  bool no_open = false;            // the kernel opens files without asking: progress comes from reads
  PeerTransport* peers = nullptr;  // the other nodes' daemons; nullptr: alone
  std::vector<uint16_t> owner;     // per entry: the node that keeps it for all (empty: alone)
  std::chrono::milliseconds peer_wait{7000};  // a read waiting on a peer gives up after this
};

class ClairvoyantEngine final : public Engine {
 public:
  // REQUIRES: manifest, oracle, source and page_cache outlive the engine. Starts the stager thread;
  // throws std::runtime_error if io_uring cannot be set up or the NVMe directory cannot be used.
  ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceReader& source, EngineConfig config);
  ~ClairvoyantEngine() override;

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) override;
  void release(uint64_t handle) override;
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset) override;

  // The counters as JSON (.clairfs/stats).
  std::string stats_json() const;

  // What this node answers when a peer asks for a file (for PeerTransport::start): its RAM or NVMe copy.
  PeerTransport::Lookup peer_lookup();

 private:
  struct Handle;
  struct Pending;
  using Clock = std::chrono::steady_clock;

  // Where a reader is, from its open of `id` (or its first read in no-open mode): places it in the plan,
  // re-keys and drops what the readers passed, wakes the stager. Returns the file's RAM copy, if any
  // (after waiting for a staging read of it in flight); *from_peer if that copy came from a peer.
  // `handle`: a handle will be released later (its pages are not dropped before). *again: a reader
  // without a handle read the file it read last again (the same use: nothing placed).
  FileBytes note_open(EntryId id, pid_t pid, bool handle, bool* from_peer, bool* again);
  // Where the bytes of a file not in RAM came from.
  enum class From { kNvme, kPeer, kSource, kRam };
  // Reads a file not in RAM whole: from NVMe (checked), its keeper, or SOURCE, and offers it to the
  // tiers. -EFBIG if the demand allowance has no room for it (read it piecemeal from SOURCE).
  int load_whole(EntryId id, FileBytes* bytes, From* from);
  // A use the stager leaves unpushed in no-open mode, so that its read tells where the reader is.
  bool beacon(uint64_t key) const;  // REQUIRES: mutex_ held
  void stage_loop();
  void plan_ahead();
  void push_ahead();
  void run_drops();
  // REQUIRES: mutex_ held.
  void evict_ram(EntryId id);
  void after_progress();  // re-keys passed files, queues their page drops
  void drop_pages(EntryId id);  // queues a drop now, or at the file's last release
  bool make_ram_room(uint64_t size, uint64_t key, bool owned);
  bool make_nvme_room(uint64_t size, uint64_t key, bool owned);
  // This node keeps the file for the others (it owns it in the global plan).
  bool owned(EntryId id) const { return !config_.owner.empty() && config_.owner[id] == node_; }
  // Whether to ask the file's keeper rather than SOURCE (stager only).
  bool prefer_peer(EntryId id, uint64_t key, unsigned source_in_flight);  // REQUIRES: mutex_ held
  void note_duration(bool peer, Clock::time_point started);
  void finish_staging(EntryId id);  // REQUIRES: mutex_ not held
  // Demand paths (a handle's first read).
  FileBytes read_nvme(EntryId id);  // whole and checked, or nullptr (a bad copy is removed and counted)
  int load_from_source(EntryId id, FileBytes* bytes);  // reads the file whole and offers it to the tiers
  int load_from_peer(EntryId id, FileBytes* bytes);    // asks the file's keeper, and waits; offers it too
  uint64_t lead_files(uint64_t rank) const;  // REQUIRES: mutex_ held

  const Manifest& manifest_;
  const Oracle& oracle_;
  SourceReader& source_;
  const EngineConfig config_;
  const StreamSource streams_;
  // Keys ahead of the cursor within which staging may evict a resident needed later. Beyond it files
  // are staged into free room only: staging far ahead would push out files kept for later epochs and
  // fetch them again (prefetching only pays within the lead the readers need).
  uint64_t evict_window_ = 0;
  RamTier ram_;
  std::unique_ptr<NvmeTier> nvme_;

  // Guarded by mutex_ (lock order: mutex_ before RamTier's and NvmeTier's own).
  mutable std::mutex mutex_;
  std::condition_variable progress_;        // readers moved, or stop
  std::condition_variable staged_;          // a staging read finished
  Planner planner_;
  TierIndex ram_keys_;                      // RAM residents by next use
  TierIndex nvme_keys_;                     // NVMe residents by next use
  std::unordered_set<EntryId> in_flight_;   // being staged now: an open waits for it, not reads it twice
  uint64_t stage_key_ = 0;                  // next key the stager considers
  uint64_t push_key_ = 0;                   // next key whose file may be pushed into the kernel
  std::optional<Clock::time_point> push_retry_at_;  // stager only: when refused pushes are tried again
  // Per entry, what the kernel may hold of it: kNone (none of its pages, as far as we know), kRead (read
  // through the mount), kPushed (its size counted in kernel_bytes_), kDropping (a drop queued, not yet
  // done: the pages may still be read).
  enum InKernel : uint8_t { kNone = 0, kRead = 1, kPushed = 2, kDropping = 3 };
  std::vector<uint8_t> in_kernel_;
  std::vector<uint8_t> origin_;             // per entry: 1 if its RAM copy came from a peer
  std::vector<std::pair<uint64_t, int64_t>> peer_done_;  // answered fetches (tag, result), for the stager
  uint64_t kernel_bytes_ = 0;
  std::vector<EntryId> drops_;              // pages to drop, by the stager (never from a request handler)
  std::unordered_map<EntryId, uint32_t> open_count_;  // handles open per file: their pages are dropped
  std::unordered_set<EntryId> drop_on_release_;       // once the last is released, not while being read
  // No-open mode: passed files whose pages go once the cursor is drop_delay_ keys past them (a reader
  // of the rank may still be on one: workers read out of order within the tolerance).
  uint64_t drop_delay_ = 0;
  std::deque<std::pair<uint64_t, EntryId>> late_drops_;
  uint64_t beacon_every_ = 1;  // steps of a rank between beacons
  // Sequential read-ahead for readers off the plan: an unexpected open of the sample right after the
  // previous unexpected open of the same process queues the next kReadAhead samples, staged into free
  // RAM only (and evicted first).
  void read_ahead(EntryId id, pid_t pid);  // REQUIRES: mutex_ held
  std::vector<uint32_t> sample_of_;        // per entry: its sample index, or UINT32_MAX; built on first use
  std::unordered_map<pid_t, uint32_t> last_unexpected_;
  std::unordered_map<pid_t, EntryId> last_read_;  // no-open mode: the file each reader read last
  std::vector<EntryId> readahead_;         // queued by read_ahead, taken by the stager
  std::vector<std::pair<EntryId, FileBytes>> adopted_;  // read whole on demand, for the stager to keep
  struct RankRate {
    uint64_t opens = 0;        // files read (opened, or presumed read from pushed pages)
    uint64_t opens_since = 0;  // opens when `since` was taken
    Clock::time_point since{};
    double per_second = 0;
  };
  std::vector<RankRate> rates_;
  std::vector<uint8_t> was_live_;  // per rank, as of the last open: who got lost or came back
  bool stop_ = false;
  bool stager_waiting_ = false;             // the stager sleeps until the cursor reaches wake_at_cursor_
  uint64_t wake_at_cursor_ = 0;

  // Counters.
  std::atomic<uint64_t> ram_files_{0}, ram_bytes_{0}, nvme_files_{0}, nvme_bytes_{0};
  std::atomic<uint64_t> source_files_{0}, source_bytes_{0}, cached_files_{0};
  std::atomic<uint64_t> staged_files_{0}, staged_bytes_{0}, staged_from_nvme_{0}, staged_source_bytes_{0};
  std::atomic<uint64_t> stage_failures_{0};
  std::atomic<uint64_t> nvme_writes_{0}, nvme_write_failures_{0}, nvme_evictions_{0}, checksum_failures_{0};
  std::atomic<uint64_t> ram_evictions_{0}, pushes_{0}, push_failures_{0}, drops_done_{0};
  std::atomic<uint64_t> stall_ns_{0};
  std::atomic<uint64_t> readahead_files_{0};
  std::atomic<uint64_t> peer_files_{0}, peer_bytes_{0}, staged_from_peer_{0}, staged_peer_bytes_{0};
  std::atomic<double> secs_peer_{0}, secs_source_{0};  // seconds per staged file, each way (EWMA)
  unsigned peer_in_flight_ = 0;  // stager only: fetches asked of peers, not answered yet
  uint64_t peer_choices_ = 0;    // stager only
  uint64_t peer_samples_ = 0, source_samples_ = 0;  // stager only: durations noted each way
  std::atomic<uint64_t> demand_peer_files_{0};
  std::atomic<uint64_t> piecewise_files_{0};  // read from SOURCE piece by piece: no room to hold them whole
  int node_ = 0;

  // Whole files read on demand (misses, and NVMe copies peers ask for) are held within this allowance.
  DemandAllowance demand_;

  // Reads without a handle (no-open mode): files read whole on demand, for the kernel's next pieces of
  // them, and SOURCE descriptors of files too large for that.
  RecentLoads recent_;
  SourceHandles source_handles_;

  std::unique_ptr<Ring> ring_;  // made here so a missing io_uring fails the constructor; used by stager_ only
  std::thread stager_;
};

}  // namespace clairfs
