// The one scan of SOURCE: a breadth-first walk that never follows symlinks (they are recorded as
// symlinks, with their targets), so the tree is exactly what lstat sees. Directories are opened beneath
// the SOURCE descriptor without following symlinks, so a directory swapped for a symlink while we scan
// cannot lead the scan outside SOURCE.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "clairfs/manifest.hpp"
#include "io/uring.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

struct Child {
  std::string name;
  Entry e;  // from lstat; the tree's fields filled in later
  std::string target;
};

Entry entry_from_stat(const struct stat& st) {
  Entry e;
  e.mode = st.st_mode;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  e.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return e;
}

Entry entry_from_statx(const struct statx& st) {
  Entry e;
  e.mode = st.stx_mode;
  e.uid = st.stx_uid;
  e.gid = st.stx_gid;
  e.size = st.stx_size;
  e.mtime_ns = static_cast<int64_t>(st.stx_mtime.tv_sec) * 1000000000 + st.stx_mtime.tv_nsec;
  return e;
}

// Lists one directory's names (without "." and ".."), calling `each` after each one is added. Returns 0
// or -errno.
template <typename Each>
int list_names(int dir_fd, std::vector<Child>& out, Each each) {
  int fd = ::dup(dir_fd);
  if (fd < 0) return -errno;
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  int err = 0;
  for (;;) {
    errno = 0;
    dirent* d = ::readdir(dir);
    if (!d) {
      err = errno;
      break;
    }
    if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
    out.emplace_back().name = d->d_name;
    each(out.size() - 1);
  }
  ::closedir(dir);
  return -err;
}

// What the scan accumulates, grown in chunks: a vector that doubles holds its old and new arrays at
// once (up to three times what it keeps: 1.4 GB for the entries of 14 M files), chunks never more than
// one chunk beyond. take() makes the manifest's table, chunk by chunk, freeing each.
class ChunkedEntries {
 public:
  void push_back(const Entry& e) {
    if (chunks_.empty() || chunks_.back().size() == kPerChunk) chunks_.emplace_back().reserve(kPerChunk);
    chunks_.back().push_back(e);
    ++size_;
  }
  Entry& operator[](size_t i) { return chunks_[i / kPerChunk][i % kPerChunk]; }
  const Entry& operator[](size_t i) const { return chunks_[i / kPerChunk][i % kPerChunk]; }
  size_t size() const { return size_; }
  EntryTable take() {
    EntryTable out;
    out.reserve(size_);
    for (auto& c : chunks_) {
      for (const Entry& e : c) out.push_back(e);
      std::vector<Entry>().swap(c);
    }
    return out;
  }

 private:
  static constexpr size_t kPerChunk = 1 << 18;  // 14 MiB of entries
  std::vector<std::vector<Entry>> chunks_;
  size_t size_ = 0;
};

// The names (each followed by a symlink's target), the same way; a name never spans two chunks.
class ChunkedNames {
 public:
  // Appends a name and its target; returns where they start in the whole.
  uint64_t append(std::string_view name, std::string_view target) {
    const size_t need = name.size() + target.size();
    if (chunks_.empty() || chunks_.back().size() + need > kPerChunk) {
      base_.push_back(size_);
      chunks_.emplace_back().reserve(std::max(kPerChunk, need));
    }
    const uint64_t at = size_;
    chunks_.back().append(name).append(target);
    size_ += need;
    return at;
  }
  std::string_view view(uint64_t at, size_t len) const {
    const size_t c = static_cast<size_t>(std::upper_bound(base_.begin(), base_.end(), at) - base_.begin()) - 1;
    return std::string_view(chunks_[c]).substr(at - base_[c], len);
  }
  std::string take() {
    std::string out;
    out.reserve(size_);
    for (auto& c : chunks_) {
      out += c;
      std::string().swap(c);
    }
    return out;
  }

 private:
  static constexpr size_t kPerChunk = 4 << 20;
  std::vector<std::string> chunks_;
  std::vector<uint64_t> base_;  // where each chunk starts in the whole
  uint64_t size_ = 0;
};

// The breadth-first walk. Directories are taken in the order of their entries; the lstat calls of the
// next kWindow directories' children go out together through io_uring once SOURCE is seen to answer
// slowly (a lookup costs a round trip to a metadata server: lookups in one directory are answered one at
// a time by the kernel, in different directories at once), else one at a time, which costs less when
// the answers are at hand.
class Scan {
 public:
  Scan(int root, const std::string& source, bool stats_together) : root_(root), source_(source) {
    if (stats_together) start_ring();
  }

  void run(const struct stat& root_st) {
    entries_.push_back(entry_from_stat(root_st));
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!S_ISDIR(entries_[i].mode)) continue;
      // The listings ahead: directories already known, in entry order.
      if (listed_ <= i) listed_ = i;
      while (window_.size() < (ring_ ? kWindow : 1) && listed_ < entries_.size()) {
        if (S_ISDIR(entries_[listed_].mode)) open_listing(listed_);
        ++listed_;
      }
      Listing& l = window_.front();
      finish(l);
      add_children(l);
      // Its arrays serve the next directory listed: allocated afresh for each of thousands of
      // directories, they cost page faults.
      spare_children_.swap(l.children);
      spare_err_.swap(l.err);
      window_.pop_front();
      ++done_;
    }
  }
  ChunkedEntries& entries() { return entries_; }
  ChunkedNames& names() { return names_; }

 private:
  static constexpr size_t kWindow = 16;
  static constexpr unsigned kDepth = 64;
  // The first this many lstat calls are timed; a mean at or above kSlowStat turns the ring on.
  static constexpr unsigned kProbe = 256;
  static constexpr auto kSlowStat = std::chrono::microseconds(50);

  struct Listing {
    size_t dir = 0;
    UniqueFd fd;
    std::vector<Child> children;
    std::vector<struct statx> got;
    std::vector<int> err;  // per child: errno of its lstat, 0 if it worked
    size_t submitted = 0, answered = 0;
  };

  std::string where(size_t dir) const {
    std::string out;
    for (auto p : components(dir)) out += (out.empty() ? "" : "/") + std::string(p);
    return out;
  }
  std::vector<std::string_view> components(size_t dir) const {
    std::vector<std::string_view> parts;
    for (size_t id = dir; id != 0; id = entries_[id].parent)
      parts.push_back(names_.view(entries_[id].name_off, entries_[id].name_len));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }

  void open_listing(size_t dir) {
    Listing& l = window_.emplace_back();
    l.dir = dir;
    l.children.swap(spare_children_);
    l.children.clear();
    l.err.swap(spare_err_);
    l.err.clear();
    int rc = open_beneath(root_, components(dir), O_RDONLY | O_DIRECTORY);
    const bool ring = ring_ != nullptr;
    if (rc >= 0) {
      l.fd = UniqueFd(rc);
      // One at a time, each name is stat-ed as it is listed: on a FUSE SOURCE, a lookup between two reads
      // of a directory has the kernel ask for the next names with their attributes (readdirplus), so that
      // the lstat calls after them cost no round trip.
      rc = list_names(l.fd.get(), l.children, [&](size_t k) {
        if (!ring) lstat_timed(l, k);
      });
    }
    if (rc < 0) {
      if (dir == 0) throw std::runtime_error("cannot read SOURCE '" + source_ + "': " + std::strerror(-rc));
      log_warning("cannot read directory '" + where(dir) + "' in SOURCE: " + std::strerror(-rc) + "; shown empty");
      l.children.clear();
    }
    l.err.resize(l.children.size(), 0);
    if (ring) l.got.resize(l.children.size());
    else l.submitted = l.answered = l.children.size();
  }

  void lstat_one(Listing& l, size_t k) {
    if (l.err.size() <= k) l.err.resize(k + 1, 0);
    struct stat st {};
    if (::fstatat(l.fd.get(), l.children[k].name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) l.err[k] = errno;
    else l.children[k].e = entry_from_stat(st);
  }
  // The same, the first kProbe of the scan timed.
  void lstat_timed(Listing& l, size_t k) {
    if (probed_ >= kProbe) return lstat_one(l, k);
    const auto t0 = std::chrono::steady_clock::now();
    lstat_one(l, k);
    probe_time_ += std::chrono::steady_clock::now() - t0;
    if (++probed_ == kProbe && probe_time_ / kProbe >= kSlowStat) want_ring_ = true;
  }

  // Every child of `l` stat-ed.
  void finish(Listing& l) {
    if (want_ring_ && !ring_) start_ring();
    while (l.answered < l.children.size()) {
      submit();
      for (const auto& c : ring_->reap(true)) {
        Listing& to = window_[(c.tag >> 32) - done_];
        const size_t k = c.tag & 0xffffffffu;
        // A failure other than a file gone is asked again the plain way: a kernel whose io_uring has no
        // statx (before 5.6) answers EINVAL to every one.
        if (c.result == -ENOENT) to.err[k] = ENOENT;
        else if (c.result < 0) lstat_one(to, k);
        else to.children[k].e = entry_from_statx(to.got[k]);
        ++to.answered;
      }
    }
  }

  // Queues the window's lstat calls while the ring has room, one directory's after another's in turn:
  // lookups in one directory wait for each other, in different ones they do not.
  void submit() {
    for (bool any = true; any && ring_->in_flight() < ring_->depth();) {
      any = false;
      for (size_t w = 0; w < window_.size() && ring_->in_flight() < ring_->depth(); ++w) {
        Listing& l = window_[w];
        if (l.submitted == l.children.size()) continue;
        const uint64_t tag = uint64_t{done_ + w} << 32 | l.submitted;
        ring_->submit_statx(l.fd.get(), l.children[l.submitted].name, &l.got[l.submitted], tag);
        ++l.submitted;
        any = true;
      }
    }
  }

  void start_ring() {
    try {
      ring_ = std::make_unique<Ring>(kDepth);
    } catch (const std::runtime_error&) {
      // No io_uring here (disabled, or a kernel without it): one at a time.
    }
  }

  void add_children(Listing& l) {
    size_t kept = 0;
    for (size_t k = 0; k < l.children.size(); ++k) {
      Child& c = l.children[k];
      if (l.err[k] == ENOENT) continue;  // removed while we listed
      if (l.err[k]) {
        log_warning("cannot stat '" + c.name + "': " + std::strerror(l.err[k]) + "; left out");
        continue;
      }
      if (S_ISLNK(c.e.mode)) {
        char buf[PATH_MAX];
        ssize_t n = ::readlinkat(l.fd.get(), c.name.c_str(), buf, sizeof(buf));
        if (n < 0) continue;
        c.target.assign(buf, static_cast<size_t>(n));
        c.e.size = static_cast<uint64_t>(n);
      }
      if (kept != k) l.children[kept] = std::move(c);
      ++kept;
    }
    l.children.resize(kept);
    std::sort(l.children.begin(), l.children.end(), [](const Child& a, const Child& b) { return a.name < b.name; });
    if (entries_.size() + kept >= kNoEntry) throw std::runtime_error("SOURCE has too many entries (2^32)");
    const size_t i = l.dir;
    entries_[i].first_child = static_cast<EntryId>(entries_.size());
    entries_[i].child_count = static_cast<uint32_t>(kept);
    for (const Child& c : l.children) {
      Entry e = c.e;
      e.parent = static_cast<EntryId>(i);
      e.name_len = static_cast<uint16_t>(c.name.size());
      e.link_len = static_cast<uint16_t>(c.target.size());
      e.name_off = names_.append(c.name, c.target);
      if (S_ISDIR(e.mode)) ++entries_[i].subdir_count;
      entries_.push_back(e);
    }
  }

  const int root_;
  const std::string& source_;
  ChunkedEntries entries_;
  ChunkedNames names_;
  std::unique_ptr<Ring> ring_;
  std::deque<Listing> window_;  // window_[w] is the (done_ + w)-th directory taken
  std::vector<Child> spare_children_;
  std::vector<int> spare_err_;
  size_t done_ = 0;             // directories finished
  size_t listed_ = 0;           // the next entry to look at for a directory to list
  unsigned probed_ = 0;
  bool want_ring_ = false;  // the probe found SOURCE slow; the ring starts with the next directory
  std::chrono::steady_clock::duration probe_time_{};
};

}  // namespace

Manifest Manifest::scan(const std::string& source, const std::vector<std::string>& extensions, bool stats_together) {
  UniqueFd root(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) throw std::runtime_error("cannot open SOURCE '" + source + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(root.get(), &st) != 0) throw std::runtime_error("cannot stat SOURCE '" + source + "'");
  Scan walk(root.get(), source, stats_together);
  walk.run(st);
  return from_parts(walk.entries().take(), walk.names().take(), extensions, source);
}

}  // namespace clairfs
