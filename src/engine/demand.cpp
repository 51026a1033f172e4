#include "engine/demand.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/clock.hpp"

namespace clairfs {

namespace {

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
// A file read from SOURCE piece by piece this lately is being read still (a reader asks for its pieces
// back to back; the next epoch's use of it comes far later).
constexpr auto kReadingNow = std::chrono::seconds(1);
// How long a miss waits for room in the allowance (DemandReader::room_for), and how long after a wait
// in vain misses do not wait.
constexpr auto kRoomWait = std::chrono::milliseconds(200);
constexpr auto kRoomWake = std::chrono::milliseconds(20);  // the stager woken again this often meanwhile
constexpr auto kNoRoomBackoff = std::chrono::seconds(2);

// The piece of `data` (a file held whole) at `offset`, at most `size` bytes (none past its end): left
// where it is for `held` when given, else copied into `buf`. Returns its length.
size_t piece_of(const FileBytes& data, char* buf, size_t size, off_t offset, HeldPiece* held) {
  const size_t start = std::min(data->size(), static_cast<size_t>(offset));
  const size_t n = std::min(size, data->size() - start);
  if (held) {
    held->bytes = data;
    held->at = data->data() + start;
  } else {
    std::memcpy(buf, data->data() + start, n);
  }
  return n;
}

}  // namespace

DemandReader::DemandReader(const Manifest& manifest, Store& stores, SourceStore& source, EngineCounters& counters,
                           std::function<void()> wake_keeper)
    : manifest_(manifest),
      stores_(stores),
      source_(source),
      nvme_(stores.part(Origin::kNvme)),
      counters_(counters),
      allowance_(kDemandBytes),
      wake_keeper_(std::move(wake_keeper)),
      recent_(kRecentFiles, kRecentBytes),
      source_handles_(source_, kSourceHandles) {}

DemandReader::Claim::Claim(DemandReader& demand, EntryId id) : demand_(demand), id_(id) {
  MutexLock lock(demand_.mutex_);
  demand_.loading_[id_]++;
  demand_.whole_++;
}

DemandReader::Claim::~Claim() {
  MutexLock lock(demand_.mutex_);
  if (--demand_.loading_[id_] == 0) demand_.loading_.erase(id_);
  demand_.whole_--;
}

void DemandReader::adopt(EntryId id, FileBytes bytes) {
  DemandReader* next = nullptr;
  {
    MutexLock lock(mutex_);
    next = next_;
    if (!next) {
      if (adopted_.size() >= kMaxAdopted) return;
      adopted_.emplace_back(id, std::move(bytes));
      whole_++;
      return;
    }
  }
  next->adopt(id, std::move(bytes));  // (not under this one's lock: the lock order has none between readers)
}

void DemandReader::hand_to(DemandReader& next) {
  std::vector<std::pair<EntryId, FileBytes>> left;
  {
    MutexLock lock(mutex_);
    next_ = &next;
    left = std::exchange(adopted_, {});
    whole_ -= left.size();
  }
  next.earlier_.store(this, std::memory_order_release);
  for (auto& [id, bytes] : left) next.adopt(id, std::move(bytes));
}

void DemandReader::hand_back() {
  MutexLock lock(mutex_);
  next_ = nullptr;
}

std::vector<std::pair<EntryId, FileBytes>> DemandReader::take_adopted() {
  MutexLock lock(mutex_);
  whole_ -= adopted_.size();
  return std::exchange(adopted_, {});
}

bool DemandReader::reading(EntryId id) {
  if (DemandReader* earlier = earlier_.load(std::memory_order_acquire); earlier && earlier->reading(id)) return true;
  if (whole_.load() != 0) {
    MutexLock lock(mutex_);
    if (loading_.count(id)) return true;
  }
  return source_handles_.read_since(id, Clock::now() - kReadingNow);
}

bool DemandReader::loading_whole(EntryId id) {
  if (DemandReader* earlier = earlier_.load(std::memory_order_acquire); earlier && earlier->loading_whole(id))
    return true;
  if (whole_.load() == 0) return false;  // the staging walk asks of every file it passes: mostly none
  MutexLock lock(mutex_);
  return loading_.count(id) != 0 ||
         std::any_of(adopted_.begin(), adopted_.end(), [id](const auto& a) { return a.first == id; });
}

Buffer DemandReader::room_for(uint64_t size) {
  // Full of copies on their way to be kept (the stager writes them to NVMe when RAM has no room): the
  // miss waits for one of them, so that its file is kept too, rather than read piece by piece and read
  // from SOURCE again for its next use — readers faster than the copies are kept (a SOURCE as fast as
  // tmpfs) go at the copies' pace. Copies that do not go (a disk that stalls) are not waited for again
  // for a while.
  const auto now = Clock::now();
  if (now.time_since_epoch().count() < no_wait_until_.load(std::memory_order_relaxed)) return allowance_.allocate(size);
  if (Buffer buf = allowance_.allocate(size); buf || size > allowance_.limit()) return buf;
  counters_.demand_waits++;
  // The stager woken now and then meanwhile (a wake-up between its look and its sleep is missed).
  const auto deadline = now + kRoomWait;
  for (auto t = now; t < deadline; t = Clock::now()) {
    if (wake_keeper_) wake_keeper_();
    bool waited = false;
    if (Buffer buf = allowance_.allocate_by(size, std::min(deadline, t + kRoomWake), &waited)) return buf;
  }
  counters_.demand_waits_given_up++;
  no_wait_until_.store((Clock::now() + kNoRoomBackoff).time_since_epoch().count(), std::memory_order_relaxed);
  return nullptr;
}

int DemandReader::load_whole(EntryId id, FileBytes* bytes, Origin* from) {
  const uint64_t size = manifest_.entry(id).size;
  const auto t0 = Clock::now();  // (a wait for room is the reader's stall too)
  Buffer buf = room_for(size);
  if (!buf) return -EFBIG;
  *from = Origin::kSource;
  int rc = 0;
  {
    const Claim loading(*this, id);
    rc = stores_.find(id, buf, from);
    // Handed over to be kept before it stops counting as loading: no moment when a staging read of it
    // would start (loading_whole).
    if (rc >= 0 && *from != Origin::kNvme) adopt(id, buf);  // kept, so SOURCE (or the peer) is asked once
  }
  if (rc < 0 || *from != Origin::kNvme) counters_.stall_ns += nanoseconds_since(t0);  // a peer or SOURCE: a stall
  if (rc < 0) return rc;
  if (*from == Origin::kPeer) counters_.demand_peer_files++;
  if (*from == Origin::kSource) counters_.served_bytes(Origin::kSource, size);  // counted whole here
  *bytes = std::move(buf);
  return 0;
}

FileBytes DemandReader::nvme_copy(EntryId id) {
  if (!nvme_ || !nvme_->may_hold(id)) return nullptr;
  auto buf = allowance_.allocate(manifest_.entry(id).size);
  if (!buf || nvme_->fetch(id, buf) < 0) return nullptr;
  return buf;
}

ssize_t DemandReader::copy(EntryId id, const FileBytes& data, char* buf, size_t size, off_t offset, HeldPiece* held) {
  const size_t n = piece_of(data, buf, size, offset, held);
  // At the file's last piece RecentLoads need not hold it any longer (a RAM copy held there after RAM
  // evicted it would count against the RAM budget until it went).
  if (static_cast<uint64_t>(offset) + n >= data->size()) recent_.forget(id);
  return static_cast<ssize_t>(n);
}

ssize_t DemandReader::read_unopened_held(EntryId id, const FileBytes& data, Origin from, bool first, char* buf,
                                         size_t size, off_t offset, HeldPiece* held) {
  if (first) counters_.served_file(from);
  // More pieces to come: they must not find the file gone if RAM evicts it now that it is passed.
  if (offset == 0 && data->size() > size && data->size() <= kRecentFileMax) recent_.put(id, data, from);
  const ssize_t n = copy(id, data, buf, size, offset, held);
  counters_.served_bytes(from, static_cast<uint64_t>(n));
  return n;
}

ssize_t DemandReader::read_unopened(EntryId id, pid_t pid, bool first, char* buf, size_t size, off_t offset,
                                    Clock::time_point t0, HeldPiece* held) {
  // At or past its end (the kernel's pages end there; a reader of direct I/O may ask): nothing to load.
  if (offset > 0 && static_cast<uint64_t>(offset) >= manifest_.entry(id).size) return 0;
  FileBytes data;
  Origin from = Origin::kSource;
  // A file begun piece by piece (no room to hold it whole then) goes on that way.
  if (manifest_.entry(id).size <= kRecentFileMax && (offset == 0 || !source_handles_.holds(id))) {
    const int rc = recent_.get(id, [&](FileBytes* bytes, Origin* f) { return load_whole(id, bytes, f); }, &data, &from);
    if (rc < 0 && rc != -EFBIG) return rc;
  }
  if (data) {
    // The use counted here, by its first read: a later piece that loads the file again (the kernel held
    // its first pages, or RAM let it go) is no other use — it was counted twice, as SOURCE's and again
    // as the page cache's once its reader passed it.
    if (first) counters_.served_file(from);
    const ssize_t n = copy(id, data, buf, size, offset, held);
    if (from != Origin::kSource) counters_.served_bytes(from, static_cast<uint64_t>(n));  // SOURCE's: counted whole
    return n;
  }
  bool opened = false;
  const ssize_t n = source_handles_.read(id, pid, buf, size, offset, &opened);
  counters_.stall_ns += nanoseconds_since(t0);
  if (opened) counters_.piecewise_files++;
  if (opened && first) counters_.served_file(Origin::kSource);
  if (n > 0) counters_.served_bytes(Origin::kSource, static_cast<uint64_t>(n));
  return n;
}

OpenFile::OpenFile(EntryId id, pid_t pid, FileBytes ram, Origin from)
    : id_(id), pid_(pid), from_ram_(ram != nullptr), data_(std::move(ram)), from_(from) {
  ready_ = from_ram_;
}

void OpenFile::load(DemandReader& demand, Clock::time_point t0) {
  tried_ = true;
  read_any_ = true;
  error_ = demand.load_whole(id_, &data_, &from_);
  if (error_ == 0) demand.counters().served_file(from_);
  if (error_ == -EFBIG) {
    error_ = demand.source().open(id_, pid_, &source_handle_);
    source_open_ = error_ == 0;
    if (source_open_) {
      demand.counters().served_file(Origin::kSource);
      demand.counters().piecewise_files++;
    }
    demand.counters().stall_ns += nanoseconds_since(t0);
  }
  ready_.store(true, std::memory_order_release);
}

ssize_t OpenFile::read(DemandReader& demand, char* buf, size_t size, off_t offset, HeldPiece* held) {
  const auto t0 = Clock::now();
  EngineCounters& counters = demand.counters();
  if (from_ram_ && !read_any_.exchange(true)) counters.served_file(from_);
  if (!ready_.load(std::memory_order_acquire)) {
    MutexLock lock(mutex_);
    if (!tried_) load(demand, t0);
  }
  if (data_) {
    if (static_cast<uint64_t>(offset) >= data_->size()) return 0;
    const size_t n = piece_of(data_, buf, size, offset, held);
    if (from_ != Origin::kSource) counters.served_bytes(from_, n);  // SOURCE's: counted whole by the load
    return static_cast<ssize_t>(n);
  }
  if (!source_open_) return error_;
  const ssize_t n = demand.source().read(source_handle_, buf, size, offset);
  counters.stall_ns += nanoseconds_since(t0);
  if (n > 0) counters.served_bytes(Origin::kSource, static_cast<uint64_t>(n));
  return n;
}

void OpenFile::close(DemandReader& demand) {
  if (source_open_) demand.source().release(source_handle_);
  if (!read_any_) demand.counters().served_file(Origin::kPageCache);  // every byte came from the kernel's cache
}

}  // namespace clairfs
