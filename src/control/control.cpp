#include "control/control.hpp"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <charconv>

#include "util/text.hpp"

namespace clairfs {

namespace {

// Inode layout under bit 62: kind in bits 56-59, then the kind's fields.
constexpr uint64_t kBase = uint64_t{1} << 62;
constexpr uint64_t kKindShift = 56;
enum Kind : uint64_t { kFixed = 0, kEpochDir = 1, kRankFile = 2, kRendering = 3 };
constexpr uint64_t kRootIno = kBase | 1;   // .clairfs
constexpr uint64_t kOrderIno = kBase | 2;  // .clairfs/order
constexpr uint64_t kReadmeIno = kBase | 3;
// The live files' names in listings only: their inodes are their renderings' (rendering_ino).
constexpr uint64_t kStatsIno = kBase | 4;
constexpr uint64_t kMetricsIno = kBase | 5;
constexpr const char* kLiveNames[2] = {"stats", "metrics"};
constexpr uint64_t kMaxEpoch = (uint64_t{1} << 32) - 1;
constexpr uint64_t kMaxRank = (uint64_t{1} << 24) - 1;
// Listings stop here; any epoch or rank still opens by name.
constexpr uint64_t kListedEpochs = 100;
constexpr uint64_t kListedRanks = 4096;
// Rank files kept, newest first, while their bytes stay within this; the newest is kept whatever its size
// (at 14.2 M samples and world size 1, 57 MB). 8 ranks of 1.28 M samples take 5.2 MB.
constexpr size_t kCachedBytes = size_t{32} << 20;
// A rank file marks the byte offset of every this many lines: a read renders at most this many lines
// beyond what it returns.
constexpr uint64_t kMarkEvery = 256;
// stats are made afresh at most this often: a reader polling in a loop costs the engine's lock little;
// fresh enough for anyone watching.
constexpr auto kLiveRefresh = std::chrono::milliseconds(1);
// Other users than the mount's owner get a rendering at most this old: 20 processes of another user
// reading stats and metrics in a loop took 0.53 of a core (made afresh every 1 ms), 0.21 now, the rest
// their FUSE requests (bench/control_load.sh).
constexpr auto kOthersRefresh = std::chrono::seconds(1);
// A rendering that costs less than this is not kept longer than kLiveRefresh (see look_up_live).
constexpr auto kCheapRender = std::chrono::milliseconds(20);
// Renderings held at most (see control.hpp): another user's processes holding thousands of stats open
// cost the daemon no more than this.
constexpr size_t kHeldRenderings = 4096;
constexpr size_t kHeldRenderingBytes = size_t{64} << 20;

uint64_t kind_of(uint64_t ino) { return (ino >> kKindShift) & 0xf; }
uint64_t epoch_dir_ino(uint64_t epoch) { return kBase | (kEpochDir << kKindShift) | epoch; }
uint64_t rank_file_ino(uint64_t epoch, uint64_t rank) {
  return kBase | (kRankFile << kKindShift) | (epoch << 24) | rank;
}
// Rendering n (from 1, below 2^48) of live file `which`.
uint64_t rendering_ino(uint64_t which, uint64_t n) { return kBase | (kRendering << kKindShift) | (which << 48) | n; }
uint64_t live_file_of(uint64_t ino) { return (ino >> 48) & 1; }

// The processor time the calling thread has used: what a rendering costs, not counting the time it
// waited for the engine's locks (a plan being switched holds them for a while).
std::chrono::nanoseconds thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Parses "<prefix><decimal>" strictly (no sign, no leading zeros but "0").
std::optional<uint64_t> number_after(std::string_view name, std::string_view prefix, uint64_t max) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  if (name.empty() || (name.size() > 1 && name[0] == '0')) return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc() || p != name.data() + name.size() || v > max) return std::nullopt;
  return v;
}

ControlAttr dir_attr(uint64_t ino, mode_t who = 0777) { return {ino, S_IFDIR | (0555 & who), 0}; }

// Who may read the order files, as permission classes of the root's owner and group (0777: all): an
// order file names every sample, so it is for those who could list every directory of SOURCE (read and
// search), as the kernel judges by the modes copied from it (default_permissions). A directory with an
// ACL of named users or groups may deny any of them whatever the mode bits say: then only the owner.
mode_t who_lists_everything(const Manifest& m, const std::function<bool(EntryId)>& extended_acl) {
  const Entry& root = m.entry(0);
  mode_t who = 0777;
  for (size_t i = 0; i < m.size() && who != 0; ++i) {
    if (!m.is_dir(static_cast<EntryId>(i))) continue;  // a file's attributes may not be known yet
    const Entry& e = m.entry(static_cast<EntryId>(i));
    const bool acl = extended_acl && extended_acl(static_cast<EntryId>(i));
    const bool others = !acl && (e.mode & 05) == 05;
    const bool group = others || (!acl && e.gid == root.gid && (e.mode & 050) == 050);
    const bool owner = group || (e.uid == root.uid && (e.mode & 0500) == 0500);
    if (!others) who &= ~mode_t{07};
    if (!group) who &= ~mode_t{070};
    if (!owner) who &= ~mode_t{0700};
  }
  return who;
}

class TextFile final : public ControlFile {
 public:
  explicit TextFile(std::string text) : text_(std::move(text)) { text_.shrink_to_fit(); }
  uint64_t size() const override { return text_.size(); }
  std::string_view read(uint64_t off, size_t len, std::string&) const override {
    return std::string_view(text_).substr(std::min<uint64_t>(off, text_.size()), len);
  }
  size_t memory_bytes() const override { return text_.capacity(); }

 private:
  std::string text_;
};

// A rank's order: one escaped path a line (append_escaped_line), rendered as it is read.
class RankOrderFile final : public ControlFile {
 public:
  RankOrderFile(const Manifest& manifest, std::vector<uint32_t> samples)
      : manifest_(manifest), samples_(std::move(samples)) {
    samples_.shrink_to_fit();
    marks_.reserve((samples_.size() + kMarkEvery - 1) / kMarkEvery);
    std::string line;
    for (uint64_t k = 0; k < samples_.size(); ++k) {
      if (k % kMarkEvery == 0) marks_.push_back(size_);
      line.clear();
      append_escaped_line(line, manifest_.sample_path(samples_[k]));
      size_ += line.size();
    }
  }
  uint64_t size() const override { return size_; }
  std::string_view read(uint64_t off, size_t len, std::string& scratch) const override {
    scratch.clear();
    if (off >= size_ || len == 0) return {};
    // The last mark at or before `off`, and the lines from there until the range is covered.
    const size_t m = static_cast<size_t>(std::upper_bound(marks_.begin(), marks_.end(), off) - marks_.begin()) - 1;
    const uint64_t end = std::min<uint64_t>(size_, off + len);
    for (uint64_t k = m * kMarkEvery; k < samples_.size() && marks_[m] + scratch.size() < end; ++k)
      append_escaped_line(scratch, manifest_.sample_path(samples_[k]));
    return std::string_view(scratch).substr(off - marks_[m], end - off);
  }
  size_t memory_bytes() const override {
    return samples_.capacity() * sizeof(uint32_t) + marks_.capacity() * sizeof(uint64_t) + sizeof(*this);
  }

 private:
  const Manifest& manifest_;
  std::vector<uint32_t> samples_;
  std::vector<uint64_t> marks_;  // marks_[m]: the byte offset of line m * kMarkEvery
  uint64_t size_ = 0;
};

}  // namespace

ControlTree::ControlTree(const Manifest& manifest, const Oracle& oracle, ControlConfig config)
    : manifest_(manifest),
      oracle_(oracle),
      config_(std::move(config)),
      order_who_(who_lists_everything(manifest, config_.extended_acl)) {
  std::string readme =
      "This directory is clairfs's, not SOURCE's. It does not show in listings of the mount's root.\n\n"
      "order/epoch-E/rank-R   the samples training rank R loads in epoch E, in order: one path relative to\n"
      "                       the mount root a line ('\\' and newlines in names escaped as \\\\ and \\n).\n"
      "stats                  what the engine served from where, its budget and lead (JSON).\n"
      "metrics                the same numbers in Prometheus text (see metrics_file=).\n\n"
      "Order: " +
      std::string(order_name(oracle.schedule().order)) + ", seed " +
      (config_.learned ? std::string("auto (learned from the first reads: see stats; no order files until then)")
                       : seed_text(oracle.schedule().seed)) +
      (oracle.schedule().order == Order::kTorchGlobal ? ", draws " + std::to_string(oracle.schedule().draws) : "") +
      ", world_size " + std::to_string(oracle.schedule().world_size) + ", batch_size " +
      std::to_string(oracle.schedule().batch_size) + ", " + std::to_string(oracle.num_samples()) + " samples.\n";
  readme_ = std::make_shared<const TextFile>(std::move(readme));
}

uint64_t ControlTree::root_ino() { return kRootIno; }

bool ControlTree::is_live(uint64_t ino) { return owns(ino) && kind_of(ino) == kRendering; }

std::optional<ControlAttr> ControlTree::file_attr(uint64_t ino) const {
  auto c = content(ino);
  if (!c) return std::nullopt;
  return ControlAttr{ino, static_cast<mode_t>(S_IFREG | (0444 & (kind_of(ino) == kRankFile ? order_who_ : 0777))), c->size()};
}

std::optional<ControlAttr> ControlTree::lookup(uint64_t dir, std::string_view name, Reader who) const {
  if (dir == kRootIno) {
    if (name == "order") return dir_attr(kOrderIno, order_who_);
    if (name == "README") return file_attr(kReadmeIno);
    for (uint64_t which : {0, 1})
      if (name == kLiveNames[which]) return look_up_live(which, who);
    return std::nullopt;
  }
  if (dir == kOrderIno) {
    if (auto e = number_after(name, "epoch-", kMaxEpoch)) return dir_attr(epoch_dir_ino(*e), order_who_);
    return std::nullopt;
  }
  if (kind_of(dir) == kEpochDir && owns(dir)) {
    const uint64_t epoch = dir & kMaxEpoch;
    if (auto r = number_after(name, "rank-", kMaxRank); r && *r < oracle_.schedule().world_size && order())
      return file_attr(rank_file_ino(epoch, *r));
  }
  return std::nullopt;
}

std::optional<ControlAttr> ControlTree::getattr(uint64_t ino) const {
  if (ino == kRootIno) return dir_attr(ino);
  if (ino == kOrderIno) return dir_attr(ino, order_who_);
  if (is_live(ino)) {
    MutexLock lock(live_mutex_);
    const auto it = renderings_.find(ino);
    if (it == renderings_.end()) return std::nullopt;
    return rendering_attr(ino, it->second);
  }
  if (!owns(ino)) return std::nullopt;
  if (kind_of(ino) == kEpochDir) return dir_attr(ino, order_who_);
  return file_attr(ino);
}

std::optional<std::vector<std::pair<std::string, ControlAttr>>> ControlTree::list(uint64_t dir) const {
  std::vector<std::pair<std::string, ControlAttr>> out;
  if (dir == kRootIno) {
    out.push_back({"README", {kReadmeIno, S_IFREG | 0444, readme_->size()}});
    out.push_back({"order", dir_attr(kOrderIno, order_who_)});
    out.push_back({kLiveNames[0], {kStatsIno, S_IFREG | 0444, 0}});
    out.push_back({kLiveNames[1], {kMetricsIno, S_IFREG | 0444, 0}});
  } else if (dir == kOrderIno) {
    const uint64_t end = config_.epochs ? *config_.epochs : config_.start_epoch + kListedEpochs;
    for (uint64_t e = config_.start_epoch; e < end && e < config_.start_epoch + kListedEpochs; ++e)
      out.push_back({"epoch-" + std::to_string(e), dir_attr(epoch_dir_ino(e), order_who_)});
  } else if (owns(dir) && kind_of(dir) == kEpochDir) {
    // Sizes are left 0 here: they would cost a full order per rank; getattr gives the real one.
    const uint64_t epoch = dir & kMaxEpoch;
    for (uint64_t r = 0; r < oracle_.schedule().world_size && r < kListedRanks && order(); ++r)
      out.push_back({"rank-" + std::to_string(r), {rank_file_ino(epoch, r), static_cast<mode_t>(S_IFREG | (0444 & order_who_)), 0}});
  } else {
    return std::nullopt;
  }
  return out;
}

std::shared_ptr<const ControlFile> ControlTree::content(uint64_t ino) const {
  if (ino == kReadmeIno) return readme_;
  if (is_live(ino)) {
    MutexLock lock(live_mutex_);
    const auto it = renderings_.find(ino);
    return it == renderings_.end() ? nullptr : it->second.text;
  }
  if (!owns(ino) || kind_of(ino) != kRankFile) return nullptr;
  const uint64_t rank = ino & kMaxRank;
  const uint64_t epoch = (ino >> 24) & kMaxEpoch;
  if (rank >= oracle_.schedule().world_size || !order()) return nullptr;
  return rank_file(epoch, rank);
}

ControlAttr ControlTree::rendering_attr(uint64_t ino, const Rendering& r) const {
  return ControlAttr{ino, S_IFREG | 0444, r.text->size(), r.made_ns};
}

ControlAttr ControlTree::look_up_live(uint64_t which, Reader who) const {
  MutexLock lock(live_mutex_);
  Live& l = live_[which];
  const auto now = std::chrono::steady_clock::now();
  const auto every =
      who == Reader::kOwner ? l.every : std::max<std::chrono::steady_clock::duration>(l.every, kOthersRefresh);
  const bool full = renderings_.size() >= kHeldRenderings || rendering_bytes_ >= kHeldRenderingBytes;
  if (l.latest == 0 || (now - l.at >= every && !full)) {
    const auto cpu = thread_cpu();
    std::string text = which == 1 ? (config_.metrics ? config_.metrics() : std::string())
                                  : (config_.stats ? config_.stats() : std::string("{}\n"));
    Rendering fresh{
        std::make_shared<const TextFile>(std::move(text)),
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count()};
    if (l.latest != 0) {
      auto old = renderings_.find(l.latest);
      fresh.made_ns = std::max(fresh.made_ns, old->second.made_ns + 1);  // strictly after the last one's
      if (old->second.lookups == 0) drop(old);
    }
    l.latest = rendering_ino(which, ++renderings_made_);
    rendering_bytes_ += fresh.text->memory_bytes();
    renderings_.emplace(l.latest, std::move(fresh));
    renderings_held_ = renderings_.size();
    l.at = std::chrono::steady_clock::now();
    // A rendering that cost much (thousands of ranks) is kept for four times as long, up to
    // kOthersRefresh: readers polling cost the engine at most a fifth of a core (for renderings of up to
    // a quarter of a second). A cheap one is made
    // afresh for the next reader, who sees its own reads counted. (Timed by the clock, a rendering that
    // waited for a plan being switched would keep numbers from before the switch four times that long.)
    const auto cost = thread_cpu() - cpu;
    l.every = cost < kCheapRender ? std::chrono::steady_clock::duration(kLiveRefresh)
                                  : std::min<std::chrono::steady_clock::duration>(4 * cost, kOthersRefresh);
  }
  Rendering& r = renderings_.at(l.latest);
  ++r.lookups;
  return rendering_attr(l.latest, r);
}

void ControlTree::forget(uint64_t ino, uint64_t n) const {
  if (!is_live(ino)) return;  // every other control inode is for good
  MutexLock lock(live_mutex_);
  const auto it = renderings_.find(ino);
  if (it == renderings_.end()) return;
  it->second.lookups -= std::min(n, it->second.lookups);
  if (it->second.lookups == 0 && live_[live_file_of(ino)].latest != ino) drop(it);
}

void ControlTree::drop(std::unordered_map<uint64_t, Rendering>::iterator it) const {
  rendering_bytes_ -= it->second.text->memory_bytes();
  renderings_.erase(it);
  renderings_held_ = renderings_.size();
}

std::shared_ptr<const ControlFile> ControlTree::rank_file(uint64_t epoch, uint64_t rank) const {
  const uint64_t key = rank_file_ino(epoch, rank);
  {
    MutexLock lock(mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first == key) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().second;
      }
    }
  }
  // Built outside the lock: two threads may build the same file once each, which is harmless.
  auto file = std::make_shared<const RankOrderFile>(manifest_, this->order()->epoch(epoch).rank_sequence(rank));
  MutexLock lock(mutex_);
  cache_.emplace_front(key, file);
  size_t kept = 0;
  for (auto it = cache_.begin(); it != cache_.end();) {
    kept += it->second->memory_bytes();
    it = it == cache_.begin() || kept <= kCachedBytes ? std::next(it) : cache_.erase(it);
  }
  return file;
}

size_t ControlTree::cached_bytes() const {
  MutexLock lock(mutex_);
  size_t bytes = rendering_bytes();
  for (const auto& [key, file] : cache_) bytes += file->memory_bytes();
  return bytes;
}

}  // namespace clairfs
