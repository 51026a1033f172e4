#include "engine/clairvoyant.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/memory.hpp"

namespace clairfs {

namespace {

using Clock = std::chrono::steady_clock;

// How long an open waits for a staging read of its file before reading SOURCE itself: far above a
// read's time on a working file system, short enough that a stuck read costs little.
constexpr auto kWaitForStaging = std::chrono::seconds(5);
// Pushes per stager round: between rounds the stager reaps reads and picks new ones.
constexpr int kPushesPerRound = 64;
// Samples staged ahead of a reader reading in sample order off the plan (a validation pass, `tar`, a
// sequential sampler): enough to keep a ring's worth of reads busy.
constexpr uint32_t kReadAhead = 32;
// Key of a read-ahead file in RAM: after every planned use, so it is the first to go.
constexpr uint64_t kReadAheadKey = kNever - 1;
// Key of a file this node keeps for the others but will not read itself within the plan: kept, and the
// first of those to go.
constexpr uint64_t kKeptForPeers = kNever - 2;
// Completed fetches each way before the model may send the stager to SOURCE rather than to a peer.
constexpr uint64_t kWarmUp = 16;
// Fetches from peers that count as "busy" in the choice between a peer and SOURCE.
constexpr double kPeerParallel = 8;
// A file read on demand (not staged) is read whole at its first read — from NVMe, its keeper or SOURCE —
// and kept like a staged one, while the whole files so held outside the RAM budget stay within this
// many bytes; beyond it (a larger file, or several readers' misses at once) files are read from SOURCE
// piece by piece, as the kernel asks. A peer asking for an NVMe copy is refused beyond it.
constexpr uint64_t kDemandBytes = 8 << 20;
// Demand-read files waiting for the stager to keep them: beyond this many, the rest are not kept.
constexpr size_t kMaxAdopted = 4096;
// Reads without a handle: files read whole on demand are held this long (in files and bytes) for the
// kernel's later pieces of them — a few readers' current files, well inside the 64 MiB of overhead the
// daemon allows itself, with kDemandBytes; files larger than kRecentFileMax (or finding no room in the
// allowance) are read from SOURCE piece by piece instead, through one of kSourceHandles kept descriptors.
constexpr size_t kRecentFiles = 64;
constexpr uint64_t kRecentBytes = 16 << 20;
constexpr uint64_t kRecentFileMax = 8 << 20;
constexpr size_t kSourceHandles = 16;
// Beacons: one use in every beacon_every_ steps of a rank is left unpushed, a quarter of the steps the
// page-cache budget covers, so the readers' news comes several times per window; at least every 256
// steps (a read through the daemon in 256 costs little), at most every 4.
constexpr uint64_t kBeaconsPerWindow = 4;
constexpr uint64_t kBeaconMin = 4, kBeaconMax = 256;
// When pushes the kernel refused (an inode it has not looked up yet) are tried again.
constexpr auto kPushRetry = std::chrono::milliseconds(50);
// Drops waiting for the cursor (no-open mode) at most: beyond, the oldest go at once (readers off the
// plan evict files from RAM while the cursor stands still).
constexpr size_t kMaxLateDrops = 1 << 16;
// How often the allocator's free pages go back to the system (util/memory.hpp).
constexpr auto kReturnFreePages = std::chrono::seconds(1);
// Readers whose last file the engine remembers (no-open mode); beyond, it forgets them all.
constexpr size_t kMaxReaders = 4096;
// Opens between updates of a rank's rate (files/s), which turns its lead in files into seconds.
constexpr uint64_t kRateWindow = 64;
// How far the stats look for a rank's lead: enough to say "more than the window a loader keeps".
constexpr uint64_t kLeadScanSteps = 100000;

uint64_t ns_since(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

StreamSource node_streams(const Manifest& manifest, const Oracle& oracle, std::vector<uint64_t> ranks) {
  return [&manifest, &oracle, ranks = std::move(ranks)](uint64_t epoch) {
    const EpochOrder order = oracle.epoch(epoch);
    const auto& samples = manifest.samples();
    std::vector<std::vector<EntryId>> seq(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] >= order.world_size()) continue;
      seq[i].reserve(order.loaded(ranks[i]));
      for (uint64_t k = 0; k < order.loaded(ranks[i]); ++k) {
        const EntryId id = samples[order.at(ranks[i], k)];
        if (S_ISREG(manifest.entry(id).mode)) seq[i].push_back(id);
      }
    }
    return seq;
  };
}

PlannerConfig planner_config(const Manifest& manifest, const EngineConfig& c) {
  PlannerConfig p;
  p.ranks = c.ranks.empty() ? 1 : c.ranks.size();
  p.entries = manifest.size();
  p.start_epoch = c.start_epoch;
  p.end_epoch = c.epochs ? c.start_epoch + *c.epochs : UINT64_MAX;
  p.tolerance = c.tolerance;
  p.horizon = c.horizon;
  // Without opens, an empty file's use never reaches us: the kernel has nothing to read.
  if (c.no_open) p.unseen = [&manifest](EntryId id) { return manifest.entry(id).size == 0; };
  return p;
}

}  // namespace

// A file served from RAM, NVMe or SOURCE. NVMe and SOURCE are read only when the first read arrives: a
// file whose pages the kernel still caches (keep_cache) is opened and read without any read reaching us.
struct ClairvoyantEngine::Handle {
  FileBytes data;              // whole file from RAM, NVMe, or read whole from SOURCE
  EntryId id = 0;
  pid_t pid = 0;
  std::mutex mutex;            // guards the lazy open below (the kernel may send reads in parallel)
  // The lazy open is done (or was not needed): what it set may be read without the mutex.
  std::atomic<bool> ready{false};
  bool tried = false;          // the lazy open ran
  uint64_t source_handle = 0;
  int source_error = 0;        // the lazy open's -errno
  bool source_open = false;
  bool from_ram = false;
  bool from_peer = false;      // its RAM copy came from a peer
  bool from_nvme = false;
  std::atomic<bool> read_any{false};  // a read reached us (else the kernel's cache served every byte)
};

// One file on its way through the ring: opened, read whole, maybe written to NVMe.
struct ClairvoyantEngine::Pending {
  enum class Step { kOpen, kRead, kWrite, kPeer } step = Step::kOpen;
  EntryId id = 0;
  uint64_t key = 0;           // the use it is staged for
  bool from_nvme = false;
  bool readahead = false;     // staged for a reader off the plan
  bool from_peer = false;     // asked of the node that keeps it
  std::chrono::steady_clock::time_point started;
  UniqueFd fd;
  std::shared_ptr<std::vector<char>> buf;
  FileBytes keep;             // a write's bytes (also in RAM, maybe evicted meanwhile)
  uint64_t checksum = 0;
};

ClairvoyantEngine::ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceReader& source,
                                     EngineConfig config)
    : manifest_(manifest), oracle_(oracle), source_(source), config_(std::move(config)),
      streams_(node_streams(manifest_, oracle_, config_.ranks.empty() ? std::vector<uint64_t>{0} : config_.ranks)),
      ram_(config_.ram), planner_(planner_config(manifest_, config_), streams_),
      demand_(kDemandBytes), recent_(kRecentFiles, kRecentBytes), source_handles_(source, kSourceHandles) {
  if (!config_.nvme.empty()) nvme_ = std::make_unique<NvmeTier>(config_.nvme, config_.nvme_size);
  in_kernel_.assign(manifest_.size(), 0);
  origin_.assign(manifest_.size(), 0);
  if (config_.peers) node_ = config_.peers->node();
  if (!config_.owner.empty() && config_.owner.size() != manifest_.size())
    throw std::logic_error("engine: an owner per entry, please");
  rates_.resize(config_.ranks.empty() ? 1 : config_.ranks.size());
  was_live_.assign(rates_.size(), 1);  // the planner starts with every rank live
  // 1/16 of the budget in files of mean size, or the loaders' windows and a ring's worth, if larger.
  uint64_t bytes = 0;
  for (EntryId id : manifest_.samples()) bytes += manifest_.entry(id).size;
  const uint64_t mean = std::max<uint64_t>(1, bytes / std::max<size_t>(1, manifest_.samples().size()));
  evict_window_ = std::max<uint64_t>(config_.ram / 16 / mean, config_.loader_window * rates_.size() + config_.depth);
  if (config_.no_open) {
    // Half the budget at most: the other half is for pushing ahead.
    drop_delay_ = std::min((config_.tolerance / 2 + 1) * rates_.size(), std::max<uint64_t>(1, config_.pagecache / mean / 2));
    beacon_every_ = std::clamp<uint64_t>(config_.pagecache / mean / rates_.size() / kBeaconsPerWindow, kBeaconMin, kBeaconMax);
  }
  stage_key_ = push_key_ = planner_.cursor();
  ring_ = std::make_unique<Ring>(config_.depth);
  stager_ = std::thread([this] { stage_loop(); });
}

ClairvoyantEngine::~ClairvoyantEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  progress_.notify_all();
  staged_.notify_all();
  stager_.join();
}

// ---- progress --------------------------------------------------------------------------------------

void ClairvoyantEngine::drop_pages(EntryId id) {
  if (in_kernel_[id] == kNone || in_kernel_[id] == kDropping) return;
  if (in_kernel_[id] == kPushed) kernel_bytes_ -= manifest_.entry(id).size;
  in_kernel_[id] = kDropping;
  if (open_count_.count(id)) drop_on_release_.insert(id);
  else drops_.push_back(id);
}

void ClairvoyantEngine::evict_ram(EntryId id) {
  ram_.erase(id);
  ram_keys_.erase(id);
  ram_evictions_++;
  // Without opens, the file may be being read right now (it was just passed, say): its pages go once
  // the readers have moved on. With opens, drop_pages waits for its last release.
  if (drop_delay_ > 0 && (in_kernel_[id] == kRead || in_kernel_[id] == kPushed)) late_drops_.emplace_back(planner_.cursor(), id);
  else drop_pages(id);
}

void ClairvoyantEngine::after_progress() {
  for (const auto& [key, id] : planner_.take_passed()) {
    const uint64_t next = planner_.next_use(id, key + 1);
    ram_keys_.passed(id, key, next);
    nvme_keys_.passed(id, key, next);
    // The readers are past it: its pages go (once nobody has it open, or, without opens, once the
    // readers are well past it), whether pushed or read through the mount, so the kernel holds only
    // what is about to be read — unless they were pushed for a later use already.
    if (in_kernel_[id] == kPushed && next < push_key_) continue;
    if (drop_delay_ == 0) drop_pages(id);
    else late_drops_.emplace_back(key, id);
  }
  const uint64_t cursor = planner_.cursor();
  while (!late_drops_.empty() && (late_drops_.front().first + drop_delay_ <= cursor || late_drops_.size() > kMaxLateDrops)) {
    const EntryId id = late_drops_.front().second;
    late_drops_.pop_front();
    if (late_drops_.size() >= kMaxLateDrops) {  // readers off the plan, the cursor still: no waiting
      drop_pages(id);
      continue;
    }
    // Needed again soon (within the stretch the stager keeps staged): the pages stay, and that use is
    // presumed read from them. Dropping them instead could race with that read: a reader quicker than
    // the drop reads them without a word, where the stager expects it to ask.
    const uint64_t next = planner_.next_use(id, cursor);
    if (next < std::max(push_key_, cursor + evict_window_)) {
      if (in_kernel_[id] != kNone && in_kernel_[id] != kDropping) planner_.presume(next);
      continue;
    }
    drop_pages(id);
  }
  if (stage_key_ < cursor) stage_key_ = cursor;
  if (push_key_ < cursor) push_key_ = cursor;
}

FileBytes ClairvoyantEngine::note_open(EntryId id, pid_t pid, bool handle, bool* from_peer, bool* again) {
  FileBytes data;
  *again = false;
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // A file being staged right now arrives sooner from that read than from a second one.
    staged_.wait_for(lock, kWaitForStaging, [&] { return stop_ || !in_flight_.count(id); });
    data = ram_.get(id);
    *from_peer = data && origin_[id] == 1;
    if (handle) open_count_[id]++;
    // Without opens, the same reader reading the file from its start again is the same use: the kernel
    // reads a page again when its cached copy went while it was being read.
    if (!handle) {
      if (last_read_.size() > kMaxReaders) last_read_.clear();
      auto [it, fresh] = last_read_.try_emplace(pid, id);
      if (!fresh && it->second == id) {
        *again = true;
        return data;
      }
      it->second = id;
    }
    const Planner::Open o = planner_.on_open(id, pid);
    bool returned = false;
    for (uint64_t r = 0; r < rates_.size(); ++r) {
      const bool live = planner_.live(r), was = was_live_[r];
      was_live_[r] = live;
      if (live == was) continue;
      if (live) {
        returned = true;
        continue;
      }
      // Lost: the pages pushed ahead for it will not be read.
      for (uint64_t key = planner_.cursor() + (r + rates_.size() - planner_.cursor() % rates_.size()) % rates_.size();
           key < push_key_; key += rates_.size())
        if (const auto item = planner_.item(key); item && in_kernel_[*item] == kPushed) drop_pages(*item);
    }
    if (returned) stage_key_ = push_key_ = planner_.cursor();  // a rank came back: stage for it again
    if (o.expected) {
      cached_files_ += o.presumed;
      RankRate& rate = rates_[o.rank];
      const auto now = Clock::now();
      if (rate.opens == 0) rate.since = now;
      rate.opens += 1 + o.presumed;
      if (rate.opens - rate.opens_since >= kRateWindow) {
        const double s = std::chrono::duration<double>(now - rate.since).count();
        const double r = s > 0 ? static_cast<double>(rate.opens - rate.opens_since) / s : 0;
        rate.per_second = rate.per_second == 0 ? r : 0.7 * rate.per_second + 0.3 * r;
        rate.since = now;
        rate.opens_since = rate.opens;
      }
    }
    after_progress();
    if (!o.expected) read_ahead(id, pid);
    if (data && ram_keys_.key(id) == kReadAheadKey) ram_keys_.set(id, kNever, false);  // read: first to go
    if (in_kernel_[id] == kNone || in_kernel_[id] == kDropping) in_kernel_[id] = kRead;
    // Its pages are in the kernel now: a later use the stager has walked past already (not presumed
    // then, with no pages to read) may be read from them.
    if (config_.no_open) {
      const uint64_t later = planner_.next_use(id, o.expected ? o.key + 1 : planner_.cursor());
      if (later < push_key_) planner_.presume(later);
    }
    wake = stager_waiting_ && (planner_.cursor() >= wake_at_cursor_ || !readahead_.empty() || returned);
  }
  if (wake) progress_.notify_all();
  return data;
}

int ClairvoyantEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  auto* h = new Handle;
  h->id = id;
  h->pid = pid;
  bool again = false;
  h->data = note_open(id, pid, true, &h->from_peer, &again);
  h->from_ram = h->data != nullptr;
  h->ready = h->from_ram;
  *handle = reinterpret_cast<uint64_t>(h);
  return 0;
}

void ClairvoyantEngine::read_ahead(EntryId id, pid_t pid) {
  if (sample_of_.empty()) {
    sample_of_.assign(manifest_.size(), UINT32_MAX);
    const auto& samples = manifest_.samples();
    for (uint32_t i = 0; i < samples.size(); ++i) sample_of_[samples[i]] = i;
  }
  const uint32_t i = sample_of_[id];
  if (i == UINT32_MAX) return;
  auto [it, fresh] = last_unexpected_.try_emplace(pid, i);
  const uint32_t last = it->second;
  it->second = i;
  if (fresh || i != last + 1) return;  // not (yet) sequential
  const auto& samples = manifest_.samples();
  // The stager skips those already staged or on their way: the window slides by one sample per open.
  for (uint32_t j = i + 1; j <= i + kReadAhead && j < samples.size(); ++j) readahead_.push_back(samples[j]);
}

// ---- demand reads ----------------------------------------------------------------------------------

FileBytes ClairvoyantEngine::read_nvme(EntryId id) {
  const auto held = nvme_->find(id);
  if (!held) return nullptr;
  UniqueFd fd(::openat(nvme_->dir_fd(), NvmeTier::name(id).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return nullptr;
  auto buf = demand_.allocate(held->size);
  if (!buf) return nullptr;
  if (pread_full(fd.get(), buf->data(), buf->size(), 0) != static_cast<ssize_t>(buf->size()) || NvmeTier::checksum(buf->data(), buf->size()) != held->checksum) {
    checksum_failures_++;
    log_warning("NVMe copy of '" + manifest_.path(id) + "' is damaged; not served, SOURCE is read instead");
    std::lock_guard<std::mutex> lock(mutex_);
    nvme_->erase(id);
    nvme_keys_.erase(id);
    return nullptr;
  }
  return buf;
}

PeerTransport::Lookup ClairvoyantEngine::peer_lookup() {
  return [this](EntryId id) -> PeerBytes {
    // A peer's message carries a file id only: checked against the manifest before anything is read.
    if (id >= manifest_.size() || !S_ISREG(manifest_.entry(id).mode)) return nullptr;
    if (FileBytes b = ram_.get(id)) return b;
    if (nvme_) return read_nvme(id);
    return nullptr;
  };
}

bool ClairvoyantEngine::prefer_peer(EntryId id, uint64_t key, unsigned source_in_flight) {
  if (!config_.peers || config_.owner.empty()) return false;
  const int keeper = config_.owner[id];
  if (keeper == node_ || !config_.peers->usable(keeper)) return false;
  // Latency matters only for a file the readers will want soon; one further ahead goes to its keeper
  // however slow, which spares the shared file system.
  if (key >= planner_.cursor() + std::max<uint64_t>(1, evict_window_ / 2)) return true;
  // The model, for files needed soon: seconds per file each way as measured (submission to completion,
  // so queueing included), scaled by how busy each way is now.
  // SOURCE is chosen only when a peer is clearly slower (4×): peers spare the shared file system. Every
  // 32nd choice goes to the peer anyway, so its estimate follows the present.
  const double peer = secs_peer_.load(), source = secs_source_.load();
  if (peer_samples_ < kWarmUp || source_samples_ < kWarmUp || ++peer_choices_ % 32 == 0) return true;
  const double wait_peer = peer * (1.0 + static_cast<double>(peer_in_flight_) / kPeerParallel);
  const double wait_source = source * (1.0 + static_cast<double>(source_in_flight) / config_.depth);
  return wait_peer <= 4 * wait_source;
}

void ClairvoyantEngine::note_duration(bool peer, Clock::time_point started) {
  const double d = std::chrono::duration<double>(Clock::now() - started).count();
  std::atomic<double>& ewma = peer ? secs_peer_ : secs_source_;
  uint64_t& samples = peer ? peer_samples_ : source_samples_;
  // The first answers from a peer include setting up the connection: they count only as a mean, and
  // the model decides nothing until kWarmUp of each are in.
  const double old = ewma.load();
  ++samples;
  ewma = samples <= kWarmUp ? old + (d - old) / static_cast<double>(samples) : 0.8 * old + 0.2 * d;
}

int ClairvoyantEngine::load_from_peer(EntryId id, FileBytes* bytes) {
  if (!config_.peers || config_.owner.empty()) return -ENOENT;
  const int keeper = config_.owner[id];
  const uint64_t size = manifest_.entry(id).size;
  if (keeper == node_ || size == 0 || !config_.peers->usable(keeper)) return -ENOENT;
  struct Answer {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    int64_t result = 0;
  };
  auto buf = demand_.allocate(size);
  if (!buf) return -EFBIG;
  auto answer = std::make_shared<Answer>();  // outlives a wait given up on
  config_.peers->fetch(keeper, id, buf, [answer](int64_t result) {
    std::lock_guard<std::mutex> lock(answer->mutex);
    answer->result = result;
    answer->done = true;
    answer->cv.notify_all();
  });
  {
    // The transport answers within its timeout; the bound here only guards against it hanging.
    std::unique_lock<std::mutex> lock(answer->mutex);
    if (!answer->cv.wait_for(lock, config_.peer_wait, [&] { return answer->done; })) return -ETIMEDOUT;
    if (answer->result != static_cast<int64_t>(size)) return -EIO;
  }
  peer_files_++;
  demand_peer_files_++;
  *bytes = buf;
  std::lock_guard<std::mutex> lock(mutex_);
  if (adopted_.size() < kMaxAdopted) adopted_.emplace_back(id, std::move(buf));
  return 0;
}

int ClairvoyantEngine::load_from_source(EntryId id, FileBytes* bytes) {
  const uint64_t size = manifest_.entry(id).size;
  auto buf = demand_.allocate(size);
  if (!buf) return -EFBIG;
  const int fd = source_.open_verified(id);
  if (fd < 0) return fd;
  UniqueFd file(fd);
  const ssize_t done = pread_full(fd, buf->data(), size, 0);
  if (done != static_cast<ssize_t>(size)) {
    log_warning("'" + manifest_.path(id) + "' read " + std::to_string(done) + " of " + std::to_string(size) +
                " bytes from SOURCE: changed since the scan");
    return -EIO;
  }
  if (source_.verify(id, fd) < 0) return -EIO;  // changed while we read: maybe a mix, never served
  source_files_++;
  source_bytes_ += size;
  *bytes = buf;
  std::lock_guard<std::mutex> lock(mutex_);
  if (adopted_.size() < kMaxAdopted) adopted_.emplace_back(id, std::move(buf));
  return 0;
}

int ClairvoyantEngine::load_whole(EntryId id, FileBytes* bytes, From* from) {
  if (nvme_) {
    if ((*bytes = read_nvme(id))) {
      nvme_files_++;
      *from = From::kNvme;
      return 0;
    }
  }
  const auto t0 = Clock::now();
  int rc = load_from_peer(id, bytes);
  *from = From::kPeer;
  if (rc < 0) {
    *from = From::kSource;
    rc = load_from_source(id, bytes);
  }
  if (rc != -EFBIG) stall_ns_ += ns_since(t0);
  return rc;
}

ssize_t ClairvoyantEngine::read(uint64_t handle, char* buf, size_t size, off_t offset) {
  auto* h = reinterpret_cast<Handle*>(handle);
  const auto t0 = Clock::now();
  if (h->from_ram && !h->read_any.exchange(true)) (h->from_peer ? peer_files_ : ram_files_)++;
  if (!h->ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(h->mutex);
    if (!h->tried) {
      h->tried = true;
      h->read_any = true;
      From from = From::kSource;
      h->source_error = load_whole(h->id, &h->data, &from);
      h->from_nvme = from == From::kNvme;
      h->from_peer = from == From::kPeer;
      if (h->source_error == -EFBIG) {
        h->source_error = source_.open(h->id, h->pid, &h->source_handle);
        h->source_open = h->source_error == 0;
        if (h->source_open) source_files_++, piecewise_files_++;
        stall_ns_ += ns_since(t0);
      }
      h->ready.store(true, std::memory_order_release);
    }
  }
  if (h->data) {
    const auto& data = *h->data;
    if (static_cast<uint64_t>(offset) >= data.size()) return 0;
    const size_t n = std::min(size, data.size() - static_cast<size_t>(offset));
    std::memcpy(buf, data.data() + offset, n);
    if (h->from_ram) (h->from_peer ? peer_bytes_ : ram_bytes_) += n;
    else if (h->from_nvme) nvme_bytes_ += n;
    else if (h->from_peer) peer_bytes_ += n;
    return static_cast<ssize_t>(n);
  }
  if (!h->source_open) return h->source_error;
  const ssize_t n = source_.read(h->source_handle, buf, size, offset);
  stall_ns_ += ns_since(t0);
  if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
  return n;
}

ssize_t ClairvoyantEngine::read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset) {
  const auto t0 = Clock::now();
  bool first = offset == 0;  // the kernel reads a file from its start: this is its open
  bool from_peer = false;
  FileBytes data;
  if (first) {
    bool again = false;
    data = note_open(id, pid, false, &from_peer, &again);
    first = !again;  // counted once
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    data = ram_.get(id);
    from_peer = data && origin_[id] == 1;
  }
  // Copies the piece; at the file's last piece, RecentLoads need not hold it any longer (a RAM copy held
  // there after RAM evicted it would count against the RAM budget until it went).
  auto copy = [&](const std::vector<char>& bytes) -> ssize_t {
    const size_t start = std::min(bytes.size(), static_cast<size_t>(offset));
    const size_t n = std::min(size, bytes.size() - start);
    std::memcpy(buf, bytes.data() + start, n);
    if (start + n == bytes.size()) recent_.forget(id);
    return static_cast<ssize_t>(n);
  };
  if (data) {
    if (first) (from_peer ? peer_files_ : ram_files_)++;
    // More pieces to come: they must not find the file gone if RAM evicts it now that it is passed.
    if (offset == 0 && data->size() > size && data->size() <= kRecentFileMax)
      recent_.put(id, data, static_cast<int>(from_peer ? From::kPeer : From::kRam));
    const ssize_t n = copy(*data);
    (from_peer ? peer_bytes_ : ram_bytes_) += static_cast<uint64_t>(n);
    return n;
  }
  int tag = 0;
  // A file begun piece by piece (no room to hold it whole then) goes on that way.
  if (manifest_.entry(id).size <= kRecentFileMax && (offset == 0 || !source_handles_.holds(id))) {
    const int rc = recent_.get(
        id,
        [&](FileBytes* bytes, int* from) {
          From f = From::kSource;
          const int r = load_whole(id, bytes, &f);
          *from = static_cast<int>(f);
          return r;
        },
        &data, &tag);
    if (rc < 0 && rc != -EFBIG) return rc;
  }
  if (data) {
    const ssize_t n = copy(*data);
    const auto from = static_cast<From>(tag);
    if (from == From::kRam) ram_bytes_ += static_cast<uint64_t>(n);
    else if (from == From::kNvme) nvme_bytes_ += static_cast<uint64_t>(n);
    else if (from == From::kPeer) peer_bytes_ += static_cast<uint64_t>(n);  // SOURCE's: counted whole by the load
    return n;
  }
  bool opened = false;
  const ssize_t n = source_handles_.read(id, pid, buf, size, offset, &opened);
  stall_ns_ += ns_since(t0);
  if (opened) piecewise_files_++;
  if (opened && first) source_files_++;
  if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
  return n;
}

void ClairvoyantEngine::release(uint64_t handle) {
  auto* h = reinterpret_cast<Handle*>(handle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_count_.find(h->id);
    if (it != open_count_.end() && --it->second == 0) {
      open_count_.erase(it);
      if (drop_on_release_.erase(h->id)) drops_.push_back(h->id);
    }
  }
  if (h->source_open) source_.release(h->source_handle);
  if (!h->read_any) cached_files_++;  // every byte came from the kernel's page cache
  delete h;
}

// ---- the stager ------------------------------------------------------------------------------------

bool ClairvoyantEngine::make_ram_room(uint64_t size, uint64_t key, bool owned) {
  while (!ram_.reserve(size)) {
    const auto victim = ram_keys_.victim(key, owned);
    if (!victim) return false;  // all held are needed sooner (or kept for peers): wait for the readers
    evict_ram(*victim);
  }
  return true;
}

bool ClairvoyantEngine::make_nvme_room(uint64_t size, uint64_t key, bool owned) {
  while (!nvme_->reserve(size)) {
    if (!nvme_->admitting() || size > nvme_->capacity()) return false;
    const auto victim = nvme_keys_.victim(key, owned);
    if (!victim) return false;
    nvme_->erase(*victim);
    nvme_keys_.erase(*victim);
    nvme_evictions_++;
  }
  return true;
}

void ClairvoyantEngine::plan_ahead() {
  std::optional<uint64_t> want;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    want = planner_.wanted_epoch();
  }
  if (!want) return;
  // Built off the lock: an epoch of a large data set takes tens of milliseconds.
  EpochStreams e = Planner::build(streams_, *want, rates_.size(), manifest_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  if (planner_.wanted_epoch() == want) planner_.add_epoch(std::move(e));
}

void ClairvoyantEngine::run_drops() {
  std::vector<EntryId> drops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    drops.swap(drops_);
  }
  if (config_.page_cache)
    for (EntryId id : drops)
      if (config_.page_cache->drop(id) == 0) drops_done_++;
  if (drops.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (EntryId id : drops)
    if (in_kernel_[id] == kDropping) in_kernel_[id] = kNone;
}

void ClairvoyantEngine::push_ahead() {
  // Without opens the walk runs even with nothing to push: it presumes the uses of files in the kernel.
  if (!config_.page_cache || (config_.pagecache == 0 && !config_.no_open)) return;
  if (push_retry_at_ && Clock::now() >= *push_retry_at_) {
    push_retry_at_.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    push_key_ = planner_.cursor();
  }
  for (int i = 0; i < kPushesPerRound; ++i) {
    EntryId id = 0;
    uint64_t key = 0;
    FileBytes data;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const uint64_t end = planner_.planned_end();
      while (push_key_ < end) {
        const auto item = planner_.item(push_key_);
        if (!item || !planner_.live(planner_.rank_of(push_key_)) || manifest_.entry(*item).size == 0) {
          ++push_key_;
          continue;
        }
        if (config_.no_open && beacon(push_key_)) {
          // Left for its reader to ask the daemon; pages still there from an earlier use go (and if
          // the reader is quicker than that, it read them: presumed).
          if (in_kernel_[*item] != kNone) {
            drop_pages(*item);
            planner_.presume(push_key_);
          }
          ++push_key_;
          continue;
        }
        if (config_.no_open ? in_kernel_[*item] != kNone : in_kernel_[*item] == kPushed) {
          // Pushed for an earlier use, or (without opens) read through the mount: this use is likely
          // read from those pages (if they went meanwhile, the read reaches us and counts as usual).
          if (config_.no_open) planner_.presume(push_key_);
          ++push_key_;
          continue;
        }
        break;
      }
      if (push_key_ >= end) return;
      key = push_key_;
      id = *planner_.item(key);
      const uint64_t size = manifest_.entry(id).size;
      if (kernel_bytes_ + size > config_.pagecache) return;  // the window is full: wait for the readers
      data = ram_.get(id);
      if (!data) return;  // not staged yet
      in_kernel_[id] = kPushed;
      kernel_bytes_ += size;
      ++push_key_;
    }
    if (const int rc = config_.page_cache->push(id, data->data(), data->size()); rc < 0) {
      // The kernel does not know the inode yet (never looked up), or is unmounting: reads will reach us
      // and be served from RAM.
      // Tried again once the window is walked anew (kPushRetry later): a listing or an open may have
      // introduced the inode by then.
      push_failures_++;
      std::lock_guard<std::mutex> lock(mutex_);
      if (in_kernel_[id] == kPushed) {
        kernel_bytes_ -= data->size();
        in_kernel_[id] = kNone;
      }
      if (!push_retry_at_) push_retry_at_ = Clock::now() + kPushRetry;
    } else {
      pushes_++;
      if (config_.no_open) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (in_kernel_[id] == kPushed) planner_.presume(key);
      }
    }
  }
}

bool ClairvoyantEngine::beacon(uint64_t key) const {
  // The last use of each epoch too, so that by an epoch's end every silent read in it is counted.
  return (key / rates_.size()) % beacon_every_ == beacon_every_ - 1 || planner_.last_in_epoch(key);
}

void ClairvoyantEngine::stage_loop() {
  Ring& ring = *ring_;
  std::unordered_map<uint64_t, Pending> pending;  // by tag
  uint64_t next_tag = 1;
  bool nvme_full_logged = false;
  std::unordered_set<EntryId> writing;  // NVMe writes in flight: one at a time per file
  std::vector<std::pair<EntryId, FileBytes>> to_write;  // demand-read files waiting for a slot to go to NVMe

  auto give_up = [&](EntryId id) {
    ram_.unreserve(manifest_.entry(id).size);
    stage_failures_++;
    finish_staging(id);
  };
  auto start_open = [&](uint64_t tag, Pending& p) {
    if (p.from_nvme) {
      ring.submit_open(nvme_->dir_fd(), NvmeTier::name(p.id), tag);
    } else {
      std::string path = manifest_.path(p.id);
      if (path.size() + 1 >= PATH_MAX) return false;
      ring.submit_open(source_.root_fd(), std::move(path), tag);
    }
    p.step = Pending::Step::kOpen;
    return true;
  };
  // True if a read is now in flight for p; otherwise p is finished (staged, or given up).
  auto start_read = [&](uint64_t tag, Pending& p) {
    const uint64_t size = manifest_.entry(p.id).size;
    if (!p.from_nvme && source_.verify(p.id, p.fd.get()) < 0) {
      give_up(p.id);
      return false;
    }
    p.buf = std::make_shared<std::vector<char>>(size);
    p.step = Pending::Step::kRead;
    if (size == 0) return false;  // handled by the caller as a finished read
    ring.submit(p.fd.get(), p.buf->data(), size, tag);
    return true;
  };
  auto log_full = [&](int error) {
    if (nvme_full_logged) return;
    nvme_full_logged = true;
    log_warning("NVMe directory " + nvme_->path() + ": " +
                (error ? std::string(std::strerror(-error)) : std::string("short write")) +
                "; no more files admitted, the rest keeps working");
  };
  // Writes p.keep to the NVMe tier (its room reserved); true if the write is in flight.
  auto start_write = [&](uint64_t tag, Pending& p, uint64_t next_use) {
    const uint64_t size = p.keep->size();
    const int fd = nvme_->create(p.id);
    if (fd < 0) {
      if (nvme_->abandon(p.id, size, fd)) log_full(fd);
      nvme_write_failures_++;
      return false;
    }
    p.fd = UniqueFd(fd);
    writing.insert(p.id);
    p.checksum = NvmeTier::checksum(p.keep->data(), size);
    p.key = next_use;
    p.step = Pending::Step::kWrite;
    ring.submit_write(p.fd.get(), p.keep->data(), size, tag);
    return true;
  };
  // Asks the file's keeper for it; the answer arrives through peer_done_.
  auto start_peer = [&](uint64_t tag, Pending& p) {
    p.step = Pending::Step::kPeer;
    p.buf = std::make_shared<std::vector<char>>(manifest_.entry(p.id).size);
    peer_in_flight_++;
    config_.peers->fetch(config_.owner[p.id], p.id, p.buf, [this, tag](int64_t result) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        peer_done_.emplace_back(tag, result);
      }
      progress_.notify_all();
    });
  };
  // A read finished with `result`: checks it, puts the file in RAM, maybe starts its NVMe write.
  // Returns true if p stays pending (re-read from SOURCE, or a write in flight).
  auto finish_read = [&](uint64_t tag, Pending& p, int64_t result) {
    const uint64_t size = manifest_.entry(p.id).size;
    if (p.from_nvme) {
      const auto held = nvme_->find(p.id);
      if (result != static_cast<int64_t>(size) || !held ||
          NvmeTier::checksum(p.buf->data(), size) != held->checksum) {
        checksum_failures_++;
        log_warning("NVMe copy of '" + manifest_.path(p.id) + "' is damaged; staged from SOURCE instead");
        {
          std::lock_guard<std::mutex> lock(mutex_);
          nvme_->erase(p.id);
          nvme_keys_.erase(p.id);
        }
        p.from_nvme = false;
        p.fd = UniqueFd();
        if (start_open(tag, p)) return true;
        give_up(p.id);
        return false;
      }
    } else if (result != static_cast<int64_t>(size)) {
      // Short (the file shrank) or failed: never stage bytes that disagree with the manifest.
      log_warning("staging '" + manifest_.path(p.id) + "' read " + std::to_string(result) + " of " +
                  std::to_string(size) + " bytes; left to SOURCE");
      give_up(p.id);
      return false;
    } else if (!p.from_peer && p.fd && source_.verify(p.id, p.fd.get()) < 0) {
      give_up(p.id);  // changed while it was read: the bytes may mix old and new
      return false;
    }
    p.fd = UniqueFd();
    if (p.from_peer) {
      staged_from_peer_++;
      staged_peer_bytes_ += size;
    } else if (!p.from_nvme) {
      staged_source_bytes_ += size;
    }
    bool write = false;
    uint64_t after = kNever;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Kept in RAM for the other nodes only while NVMe does not keep it for them.
      const bool keep_for_peers = !p.readahead && owned(p.id) && !(nvme_ && nvme_->find(p.id));
      uint64_t key = p.readahead ? kReadAheadKey : planner_.next_use(p.id, planner_.cursor());
      if (key == kNever && keep_for_peers) key = kKeptForPeers;
      if (key == kNever) {  // the readers passed it (or left the plan) while it was read
        ram_.unreserve(size);
      } else {
        FileBytes bytes = p.buf;
        ram_.insert(p.id, bytes);
        ram_keys_.set(p.id, key, keep_for_peers);
        origin_[p.id] = p.from_peer ? 1 : 0;
        staged_files_++;
        staged_bytes_ += size;
        if (p.from_nvme) staged_from_nvme_++;
        if (p.readahead) readahead_files_++;
        // Into NVMe too, for the use after this one, if MIN keeps it there (and for the other nodes, if
        // this one keeps it for them).
        after = key == kKeptForPeers ? kKeptForPeers : planner_.next_use(p.id, key + 1);
        if (after == kNever && keep_for_peers) after = kKeptForPeers;
        if (nvme_ && !p.from_nvme && !p.readahead && after != kNever && !writing.count(p.id) && !nvme_->find(p.id) &&
            make_nvme_room(size, after, keep_for_peers)) {
          write = true;
          p.keep = std::move(bytes);
        }
      }
    }
    finish_staging(p.id);
    return write && start_write(tag, p, after);
  };
  auto finish_write = [&](Pending& p, int64_t result) {
    const uint64_t size = manifest_.entry(p.id).size;
    p.fd = UniqueFd();
    writing.erase(p.id);
    if (result == static_cast<int64_t>(size)) {
      nvme_->commit(p.id, size, p.checksum);
      nvme_writes_++;
      std::lock_guard<std::mutex> lock(mutex_);
      uint64_t key = planner_.next_use(p.id, std::min(p.key, planner_.cursor()));
      if (key == kNever && owned(p.id)) key = kKeptForPeers;
      nvme_keys_.set(p.id, key, owned(p.id));
      // Kept for the other nodes on NVMe now: its RAM copy no longer needs to stay for them.
      if (owned(p.id))
        if (auto k = ram_keys_.key(p.id)) ram_keys_.set(p.id, *k == kKeptForPeers ? kNever : *k, false);
      return;
    }
    nvme_write_failures_++;
    const int error = result < 0 ? static_cast<int>(result) : 0;
    if (nvme_->abandon(p.id, size, error)) log_full(error);
  };

  FreePageReturner free_pages(kReturnFreePages);
  for (;;) {
    free_pages.tick();
    plan_ahead();
    run_drops();
    push_ahead();
    // Pick the next files to stage: from the cursor on, while the budget and the ring have room.
    std::vector<uint64_t> picks;  // tags
    std::vector<std::pair<uint64_t, uint64_t>> writes;  // tags and next uses of adopted files to write
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) break;
      unsigned room = ring.depth() - ring.in_flight();
      const uint64_t end = planner_.planned_end();
      // Files read whole from SOURCE on demand: kept like staged ones, so SOURCE sees them once.
      for (auto& [id, bytes] : adopted_) {
        if (ram_keys_.contains(id) || in_flight_.count(id)) continue;
        uint64_t key = planner_.next_use(id, planner_.cursor());
        if (key != kNever && planner_.opened(key)) key = planner_.next_use(id, key + 1);
        if (key == kNever && owned(id)) key = kKeptForPeers;
        if (key == kNever) continue;
        const uint64_t size = bytes->size();
        if (key < planner_.cursor() + evict_window_ ? make_ram_room(size, key, owned(id)) : ram_.reserve(size)) {
          ram_.insert(id, bytes);
          DemandAllowance::hand_over(bytes);
          ram_keys_.set(id, key, owned(id));
        }
        if (nvme_ && to_write.size() < kMaxAdopted && !writing.count(id) && !nvme_->find(id))
          to_write.emplace_back(id, std::move(bytes));
      }
      adopted_.clear();
      // Their NVMe writes, as the ring has room (it may be full of reads for a while).
      size_t w = 0;
      for (; w < to_write.size() && writes.size() < room; ++w) {
        const auto& [id, bytes] = to_write[w];
        uint64_t key = planner_.next_use(id, planner_.cursor());
        if (key != kNever && planner_.opened(key)) key = planner_.next_use(id, key + 1);
        if (key == kNever && owned(id)) key = kKeptForPeers;
        if (key == kNever || writing.count(id) || nvme_->find(id) || !make_nvme_room(bytes->size(), key, owned(id))) continue;
        const uint64_t tag = next_tag++;
        Pending& p = pending[tag];
        p.id = id;
        p.keep = bytes;
        writes.emplace_back(tag, key);
      }
      to_write.erase(to_write.begin(), to_write.begin() + static_cast<std::ptrdiff_t>(w));
      room -= static_cast<unsigned>(writes.size());
      uint64_t live_ranks = 0;
      for (uint64_t r = 0; r < rates_.size(); ++r) live_ranks += planner_.live(r);
      size_t n = 0;
      for (; n < readahead_.size() && picks.size() < room; ++n) {
        const EntryId id = readahead_[n];
        const uint64_t size = manifest_.entry(id).size;
        if (!S_ISREG(manifest_.entry(id).mode) || ram_keys_.contains(id) || in_flight_.count(id)) continue;
        // Free room, or room held by files no plan needs (read-ahead files already opened among them),
        // or, when every rank has left the plan, by anything.
        bool room_found = true;
        while (!ram_.reserve(size)) {
          const auto far = ram_keys_.farthest_unowned();
          if (!far || (far->first != kNever && live_ranks > 0)) {
            room_found = false;
            break;
          }
          evict_ram(far->second);
        }
        if (!room_found) {  // drop the rest
          n = readahead_.size();
          break;
        }
        const uint64_t tag = next_tag++;
        Pending& p = pending[tag];
        p.id = id;
        p.key = kReadAheadKey;
        p.readahead = true;
        p.from_nvme = nvme_ && nvme_->find(id).has_value();
        picks.push_back(tag);
        in_flight_.insert(id);
      }
      readahead_.erase(readahead_.begin(), readahead_.begin() + static_cast<std::ptrdiff_t>(n));
      while (picks.size() < room && stage_key_ < end) {
        const uint64_t key = stage_key_;
        const auto item = planner_.item(key);
        if (!item || !planner_.live(planner_.rank_of(key)) || planner_.opened(key)) {
          ++stage_key_;  // a hole, a rank off the plan, or opened already (read on demand)
          continue;
        }
        const EntryId id = *item;
        const uint64_t size = manifest_.entry(id).size;
        if (ram_keys_.contains(id) || in_flight_.count(id) || size > ram_.budget()) {
          ++stage_key_;  // there already, on its way, or never fits (read on demand)
          continue;
        }
        // Full of files needed sooner, or this one is beyond the eviction window: wait for the readers.
        if (key < planner_.cursor() + evict_window_ ? !make_ram_room(size, key, owned(id)) : !ram_.reserve(size)) break;
        const uint64_t tag = next_tag++;
        Pending& p = pending[tag];
        p.id = id;
        p.key = key;
        p.from_nvme = nvme_ && nvme_->find(id).has_value();
        p.from_peer = !p.from_nvme && prefer_peer(id, key, ring.in_flight() + static_cast<unsigned>(picks.size()));
        picks.push_back(tag);
        in_flight_.insert(id);
        ++stage_key_;
      }
      if (picks.empty() && writes.empty() && ring.in_flight() == 0 && peer_in_flight_ == 0 && peer_done_.empty() &&
          (to_write.empty() || !nvme_->admitting())) {
        to_write.clear();
        // Woken by opens only once the readers have moved some way (or read-ahead is queued): a wake-up
        // per open would cost every open a context switch.
        stager_waiting_ = true;
        wake_at_cursor_ = planner_.cursor() + std::max<uint64_t>(1, evict_window_ / 8);
        progress_.wait_for(lock, std::chrono::milliseconds(drops_.empty() ? 100 : 1));
        stager_waiting_ = false;
        continue;
      }
    }
    for (const auto& [tag, next_use] : writes)
      if (!start_write(tag, pending[tag], next_use)) pending.erase(tag);
    for (uint64_t tag : picks) {
      Pending& p = pending[tag];
      p.started = Clock::now();
      if (p.from_peer) {
        start_peer(tag, p);
        continue;
      }
      if (start_open(tag, p)) continue;
      const int fd = source_.open_verified(p.id);  // too long for one openat2: walk down synchronously
      if (fd < 0) {
        give_up(p.id);
        pending.erase(tag);
        continue;
      }
      p.fd = UniqueFd(fd);
      if (start_read(tag, p)) continue;
      if (p.step != Pending::Step::kRead || !finish_read(tag, p, 0)) pending.erase(tag);
    }
    std::vector<std::pair<uint64_t, int64_t>> answers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      answers.swap(peer_done_);
    }
    for (const auto& [tag, result] : answers) {
      auto it = pending.find(tag);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      peer_in_flight_--;
      const uint64_t size = manifest_.entry(p.id).size;
      bool keep = false;
      if (result == static_cast<int64_t>(size)) {
        note_duration(true, p.started);
        keep = finish_read(tag, p, result);
      } else {
        // Refused, timed out, or the peer left: SOURCE it is.
        p.from_peer = false;
        p.buf.reset();
        p.started = Clock::now();
        keep = start_open(tag, p);
        if (!keep) give_up(p.id);
      }
      if (!keep) pending.erase(it);
    }
    const bool idle = picks.empty() && writes.empty() && answers.empty();
    const auto completions = peer_in_flight_ > 0 ? ring.reap_for(idle ? std::chrono::milliseconds(1)
                                                                     : std::chrono::milliseconds(0))
                                                : ring.reap(idle);
    for (const auto& c : completions) {
      auto it = pending.find(c.tag);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      bool keep = false;
      if (p.step == Pending::Step::kOpen) {
        if (c.result < 0) {
          log_warning("cannot stage '" + manifest_.path(p.id) + "': " + std::strerror(static_cast<int>(-c.result)));
          give_up(p.id);
        } else {
          p.fd = UniqueFd(static_cast<int>(c.result));
          keep = start_read(c.tag, p) || (p.step == Pending::Step::kRead && finish_read(c.tag, p, 0));
        }
      } else if (p.step == Pending::Step::kRead) {
        if (!p.from_nvme && c.result > 0) note_duration(false, p.started);
        keep = finish_read(c.tag, p, c.result);
      } else {
        finish_write(p, c.result);
      }
      if (!keep) pending.erase(it);
    }
  }
  while (ring.in_flight() > 0) ring.reap(true);  // their buffers (in `pending`) must outlive the I/O
}

void ClairvoyantEngine::finish_staging(EntryId id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.erase(id);
  }
  staged_.notify_all();
}

// ---- stats -----------------------------------------------------------------------------------------

uint64_t ClairvoyantEngine::lead_files(uint64_t rank) const {
  const uint64_t ranks = rates_.size();
  uint64_t key = planner_.progress(rank).next_key;
  uint64_t lead = 0;
  for (uint64_t n = 0; n < kLeadScanSteps && key < planner_.planned_end(); ++n, key += ranks) {
    const auto item = planner_.item(key);
    if (!item) continue;
    if (!ram_keys_.contains(*item) && in_kernel_[*item] != kPushed) break;
    ++lead;
  }
  return lead;
}

std::string ClairvoyantEngine::stats_json() const {
  nlohmann::json j;
  // Without opens, files read from pushed pages are presumed read once their reader reads past them.
  j["tiers"]["pagecache"] = {{"files", cached_files_.load()}};
  j["progress"] = {{"from", config_.no_open ? "reads" : "opens"}, {"beacon_every", config_.no_open ? beacon_every_ : 0}};
  j["tiers"]["ram"] = {{"files", ram_files_.load()}, {"bytes", ram_bytes_.load()}};
  j["tiers"]["nvme"] = {{"files", nvme_files_.load()}, {"bytes", nvme_bytes_.load()}};
  j["tiers"]["peer"] = {{"files", peer_files_.load()}, {"bytes", peer_bytes_.load()}};
  j["tiers"]["source"] = {{"files", source_files_.load()}, {"bytes", source_bytes_.load()}};
  j["staged"] = {{"files", staged_files_.load()},       {"bytes", staged_bytes_.load()},
                 {"from_nvme", staged_from_nvme_.load()}, {"from_peer", staged_from_peer_.load()},
                 {"failures", stage_failures_.load()},
                 {"source_bytes", staged_source_bytes_.load()}};
  // Everything read from SOURCE, for any reason: what a parallel file system sees of this node.
  j["source_traffic"] = {{"bytes", staged_source_bytes_.load() + source_bytes_.load()}};
  // Files refused because SOURCE no longer matched the scan (before or after a read): never served.
  j["source_changed"] = source_.counters().changed.load();
  j["ram"] = {{"budget", ram_.budget()}, {"used", ram_.used()}, {"files", ram_.files()}, {"evictions", ram_evictions_.load()}};
  if (nvme_)
    j["nvme"] = {{"dir", nvme_->path()},          {"capacity", nvme_->capacity()},     {"used", nvme_->used()},
                 {"files", nvme_->files()},        {"admitting", nvme_->admitting()},   {"writes", nvme_writes_.load()},
                 {"write_failures", nvme_write_failures_.load()}, {"evictions", nvme_evictions_.load()}};
  j["checksum_failures"] = checksum_failures_.load();
  if (config_.peers) {
    const auto c = config_.peers->counters();
    j["peers"] = {{"node", node_},
                  {"nodes", config_.peers->nodes()},
                  {"staged_files", staged_from_peer_.load()},
                  {"staged_bytes", staged_peer_bytes_.load()},
                  {"demand_files", demand_peer_files_.load()},
                  {"requests", c.requests},
                  {"hits", c.hits},
                  {"refused", c.refused},
                  {"timeouts", c.timeouts},
                  {"failures", c.failures},
                  {"served_files", c.served},
                  {"served_bytes", c.served_bytes},
                  {"refused_to_peers", c.refused_to_peers},
                  {"seconds_per_file", {{"peer", secs_peer_.load()}, {"source", secs_source_.load()}}}};
    int usable = 0;
    for (int n = 0; n < config_.peers->nodes(); ++n) usable += n != node_ && config_.peers->usable(n);
    j["peers"]["usable"] = usable;
  }
  j["readahead_files"] = readahead_files_.load();
  // Whole files held outside the RAM budget (read on demand), and files read piecewise for want of room.
  j["demand"] = {{"limit", demand_.limit()}, {"used", demand_.used()}, {"piecewise_files", piecewise_files_.load()}};
  j["stalls"] = {{"opens", source_files_.load()}, {"seconds", static_cast<double>(stall_ns_.load()) / 1e9}};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    j["pagecache"] = {{"budget", config_.page_cache ? config_.pagecache : 0}, {"used", kernel_bytes_},
                      {"pushes", pushes_.load()}, {"push_failures", push_failures_.load()}, {"drops", drops_done_.load()}};
    j["mispredicted_opens"] = planner_.mispredicted();
    nlohmann::json ranks = nlohmann::json::array();
    uint64_t min_epoch = UINT64_MAX, lead_min = UINT64_MAX;
    for (uint64_t r = 0; r < rates_.size(); ++r) {
      const Planner::RankProgress p = planner_.progress(r);
      const uint64_t lead = lead_files(r);
      const double rate = rates_[r].per_second;
      ranks.push_back({{"rank", config_.ranks.empty() ? 0 : config_.ranks[r]},
                       {"epoch", p.epoch},
                       {"done", p.done},
                       {"total", p.total},
                       {"live", p.live},
                       {"lead_files", lead},
                       {"lead_seconds", rate > 0 ? static_cast<double>(lead) / rate : 0.0},
                       {"files_per_second", rate},
                       {"mispredicted_opens", p.mispredicted}});
      if (p.live) min_epoch = std::min(min_epoch, p.epoch), lead_min = std::min(lead_min, lead);
    }
    j["ranks"] = ranks;
    j["epoch"] = min_epoch == UINT64_MAX ? planner_.progress(0).epoch : min_epoch;
    j["plan"] = {{"cursor", planner_.cursor()}, {"staged_up_to", stage_key_}, {"planned_up_to", planner_.planned_end()},
                 {"lead_files", lead_min == UINT64_MAX ? 0 : lead_min}};
  }
  return j.dump(2) + "\n";
}

}  // namespace clairfs
