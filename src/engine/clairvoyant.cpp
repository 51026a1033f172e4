#include "engine/clairvoyant.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/fs.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

using Clock = std::chrono::steady_clock;

// How long an open waits for a staging read of its file before reading SOURCE itself: far above a
// read's time on a working file system, short enough that a stuck read costs little.
constexpr auto kWaitForStaging = std::chrono::seconds(5);

uint64_t ns_since(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// Each file's first position in a stream.
std::unordered_map<EntryId, uint64_t> first_positions(const std::vector<EntryId>& stream) {
  std::unordered_map<EntryId, uint64_t> position;
  position.reserve(stream.size());
  for (uint64_t p = stream.size(); p-- > 0;) position[stream[p]] = p;
  return position;
}

}  // namespace

// A file served from RAM, or from SOURCE — opened there only when the first read arrives, since a
// file whose pages the kernel still caches (keep_cache) is opened and read without any read reaching
// us, and opening it in SOURCE would cost a metadata round trip for nothing.
struct ClairvoyantEngine::Handle {
  FileBytes ram;
  EntryId id = 0;
  pid_t pid = 0;
  std::mutex mutex;            // guards the lazy open below (the kernel may send reads in parallel)
  uint64_t source_handle = 0;
  int source_error = 0;        // the lazy open's -errno, once tried
  bool source_open = false;
};

ClairvoyantEngine::ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceReader& source,
                                     EngineConfig config)
    : manifest_(manifest), oracle_(oracle), source_(source), config_(std::move(config)), ram_(config_.ram),
      epoch_(config_.start_epoch) {
  stream_ = build_stream(epoch_);
  position_ = first_positions(stream_);
  opened_.assign(stream_.size(), 0);
  served_.assign(manifest_.size(), 0);
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

std::vector<EntryId> ClairvoyantEngine::build_stream(uint64_t epoch) const {
  const EpochOrder order = oracle_.epoch(epoch);
  const auto& samples = manifest_.samples();
  uint64_t longest = 0;
  for (uint64_t r : config_.ranks) longest = std::max(longest, order.loaded(r));
  std::vector<EntryId> stream;
  stream.reserve(longest * config_.ranks.size());
  for (uint64_t k = 0; k < longest; ++k)
    for (uint64_t r : config_.ranks)
      if (k < order.loaded(r)) {
        const EntryId id = samples[order.at(r, k)];
        if (S_ISREG(manifest_.entry(id).mode)) stream.push_back(id);
      }
  return stream;
}

void ClairvoyantEngine::note_open(EntryId id) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = position_.find(id);
  const bool expected = it != position_.end() && !opened_[it->second];
  if (!expected && cursor_ * 2 >= stream_.size() && epoch_ + 1 < config_.epochs.value_or(UINT64_MAX)) {
    // Not (or no longer) expected in this epoch, and its readers are past half of it: maybe they moved on
    // to the next epoch, which reads the same files again in a new order. Its plan is built once.
    if (!next_) {
      next_ = std::make_unique<Plan>();
      next_->stream = build_stream(epoch_ + 1);
      next_->position = first_positions(next_->stream);
    }
    if (next_->position.count(id)) {
      for (uint64_t p = evict_pos_; p < stream_.size(); ++p) ram_.erase(stream_[p]);
      ++epoch_;
      stream_ = std::move(next_->stream);
      position_ = std::move(next_->position);
      next_.reset();
      opened_.assign(stream_.size(), 0);
      cursor_ = stage_pos_ = evict_pos_ = 0;
      it = position_.find(id);
    }
  }
  served_[id] = 1;
  if (it == position_.end()) {
    mispredicted_++;
    return;
  }
  opened_[it->second] = 1;
  while (cursor_ < stream_.size() && opened_[cursor_]) ++cursor_;
  if (stage_pos_ < cursor_) stage_pos_ = cursor_;
  // Files behind the cursor have been opened: their budget goes to the files ahead. A reader still
  // holding one keeps its bytes alive through its Handle.
  for (; evict_pos_ < cursor_; ++evict_pos_) ram_.erase(stream_[evict_pos_]);
  lock.unlock();
  progress_.notify_all();
}

int ClairvoyantEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  {
    // A file being staged right now arrives sooner from that read than from a second one to SOURCE.
    std::unique_lock<std::mutex> lock(mutex_);
    staged_.wait_for(lock, kWaitForStaging, [&] { return stop_ || !in_flight_.count(id); });
  }
  FileBytes data = ram_.get(id);  // before note_open, which evicts what is opened
  note_open(id);
  auto* h = new Handle;
  h->id = id;
  h->pid = pid;
  if (data) {
    ram_files_++;
    h->ram = std::move(data);
  }
  *handle = reinterpret_cast<uint64_t>(h);
  return 0;
}

ssize_t ClairvoyantEngine::read(uint64_t handle, char* buf, size_t size, off_t offset) {
  auto* h = reinterpret_cast<Handle*>(handle);
  if (h->ram) {
    const auto& data = *h->ram;
    if (static_cast<uint64_t>(offset) >= data.size()) return 0;
    const size_t n = std::min(size, data.size() - static_cast<size_t>(offset));
    std::memcpy(buf, data.data() + offset, n);
    ram_bytes_ += n;
    return static_cast<ssize_t>(n);
  }
  const auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    if (!h->source_open && h->source_error == 0) {
      h->source_error = source_.open(h->id, h->pid, &h->source_handle);
      h->source_open = h->source_error == 0;
      if (h->source_open) source_files_++;
    }
  }
  if (!h->source_open) return h->source_error;
  const ssize_t n = source_.read(h->source_handle, buf, size, offset);
  stall_ns_ += ns_since(t0);
  if (n > 0) source_bytes_ += static_cast<uint64_t>(n);
  return n;
}

void ClairvoyantEngine::release(uint64_t handle) {
  auto* h = reinterpret_cast<Handle*>(handle);
  if (h->source_open) source_.release(h->source_handle);
  else if (!h->ram) cached_files_++;  // every byte came from the kernel's page cache
  delete h;
}

void ClairvoyantEngine::stage_loop() {
  Ring& ring = *ring_;
  // A file goes through the ring twice: opened (openat2 beneath SOURCE), then read whole.
  struct Pending {
    EntryId id;
    UniqueFd fd;
    std::shared_ptr<std::vector<char>> buf;
  };
  std::unordered_map<uint64_t, Pending> pending;  // by tag
  uint64_t next_tag = 1;

  auto give_up = [&](EntryId id) {
    ram_.unreserve(manifest_.entry(id).size);
    stage_failures_++;
    finish_staging(id);
  };
  // True if a read is now in flight for p; otherwise p is finished (staged, or given up).
  auto start_read = [&](uint64_t tag, Pending& p) {
    const uint64_t size = manifest_.entry(p.id).size;
    if (source_.verify(p.id, p.fd.get()) < 0) {
      give_up(p.id);
      return false;
    }
    p.buf = std::make_shared<std::vector<char>>(size);
    if (size == 0) {
      ram_.insert(p.id, std::move(p.buf));
      staged_files_++;
      finish_staging(p.id);
      return false;
    }
    ring.submit(p.fd.get(), p.buf->data(), size, tag);
    return true;
  };

  for (;;) {
    // Pick the next files to stage: from the cursor on, while the budget and the ring have room.
    std::vector<EntryId> picks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) break;
      const unsigned room = ring.depth() - ring.in_flight();
      while (picks.size() < room && stage_pos_ < stream_.size()) {
        const EntryId id = stream_[stage_pos_];
        const uint64_t size = manifest_.entry(id).size;
        if (ram_.contains(id) || opened_[stage_pos_] || in_flight_.count(id) || served_[id] ||
            size > ram_.budget()) {
          ++stage_pos_;  // there already, passed, on its way, in the kernel's cache, or never fits
          continue;
        }
        if (!ram_.reserve(size)) break;  // full: wait for readers to move on
        picks.push_back(id);
        in_flight_.insert(id);
        ++stage_pos_;
      }
      if (picks.empty() && ring.in_flight() == 0) {
        progress_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
    }
    for (EntryId id : picks) {
      const uint64_t tag = next_tag++;
      std::string path = manifest_.path(id);
      if (path.size() + 1 < PATH_MAX) {
        ring.submit_open(source_.root_fd(), std::move(path), tag);
        pending.emplace(tag, Pending{id, UniqueFd(), nullptr});
        continue;
      }
      const int fd = source_.open_verified(id);  // too long for one openat2: walk down synchronously
      if (fd < 0) {
        give_up(id);
        continue;
      }
      auto [it, _] = pending.emplace(tag, Pending{id, UniqueFd(fd), nullptr});
      if (!start_read(tag, it->second)) pending.erase(it);
    }
    for (const auto& c : ring.reap(picks.empty())) {
      auto it = pending.find(c.tag);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      if (!p.fd) {  // the open finished
        if (c.result < 0) {
          log_warning("cannot stage '" + manifest_.path(p.id) + "': " + std::strerror(static_cast<int>(-c.result)));
          give_up(p.id);
          pending.erase(it);
        } else {
          p.fd = UniqueFd(static_cast<int>(c.result));
          if (!start_read(c.tag, p)) pending.erase(it);
        }
        continue;
      }
      const uint64_t size = manifest_.entry(p.id).size;
      bool wanted;  // the readers may have passed it, or moved to another epoch, while it was read
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto pos = position_.find(p.id);
        wanted = pos != position_.end() && pos->second >= cursor_;
      }
      if (!wanted) {
        ram_.unreserve(size);
        finish_staging(p.id);
      } else if (c.result != static_cast<int64_t>(size)) {
        // Short (the file shrank) or failed: never stage bytes that disagree with the manifest.
        log_warning("staging '" + manifest_.path(p.id) + "' read " + std::to_string(c.result) + " of " +
                    std::to_string(size) + " bytes; left to SOURCE");
        give_up(p.id);
      } else {
        ram_.insert(p.id, std::move(p.buf));
        staged_files_++;
        staged_bytes_ += size;
        finish_staging(p.id);
      }
      pending.erase(it);
    }
  }
  while (ring.in_flight() > 0) ring.reap(true);  // their buffers (in `pending`) must outlive the reads
}

void ClairvoyantEngine::finish_staging(EntryId id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.erase(id);
  }
  staged_.notify_all();
}

std::string ClairvoyantEngine::stats_json() const {
  nlohmann::json j;
  j["tiers"]["ram"] = {{"files", ram_files_.load()}, {"bytes", ram_bytes_.load()}};
  j["tiers"]["source"] = {{"files", source_files_.load()}, {"bytes", source_bytes_.load()}};
  j["tiers"]["pagecache"] = {{"files", cached_files_.load()}};
  j["staged"] = {{"files", staged_files_.load()}, {"bytes", staged_bytes_.load()}, {"failures", stage_failures_.load()}};
  j["ram"] = {{"budget", ram_.budget()}, {"used", ram_.used()}, {"files", ram_.files()}};
  j["stalls"] = {{"opens", source_files_.load()}, {"seconds", static_cast<double>(stall_ns_.load()) / 1e9}};
  j["mispredicted_opens"] = mispredicted_.load();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    j["epoch"] = epoch_;
    j["plan"] = {{"files", stream_.size()}, {"cursor", cursor_}, {"staged_up_to", stage_pos_},
                 {"lead_files", stage_pos_ - cursor_}};
  }
  return j.dump(2) + "\n";
}

}  // namespace clairfs
