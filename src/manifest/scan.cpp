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
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "clairfs/manifest.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

namespace {

// 16 directories listed at once: over a SOURCE whose every lookup is a 200 µs round trip, 16 threads
// scanned 2.7 times as fast as 4 (32 no faster again); where lookups are answered from the kernel's cache,
// 16 were as fast as 4 and 2.4 times as fast as 1 (docs/benchmarks.md).
constexpr unsigned kScanThreads = 16;

Entry entry_from_stat(const struct stat& st) {
  Entry e;
  e.mode = st.st_mode;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  e.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return e;
}

// Calls `each` with every name in a directory but "." and "..". Returns 0 or -errno.
template <typename Each>
int list_names(int dir_fd, Each each) {
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
    each(static_cast<const char*>(d->d_name));
  }
  ::closedir(dir);
  return -err;
}

// The breadth-first walk. Directories are taken in the order of their entries, so the tree is the
// same whatever the threads; their listings are made ahead by a pool of threads, each listing one
// directory and stat-ing its children as it lists them. Threads are what a scan needs on either kind of
// SOURCE: where lstat is a round trip to a metadata server, the kernel answers lookups in one directory
// one at a time but in different directories at once; where lstat is answered from the kernel's cache,
// the CPU is the limit, and the listings of a FUSE SOURCE wait for its server meanwhile.
class Scan {
 public:
  Scan(int root, const std::string& source, unsigned threads) : root_(root), source_(source) {
    window_limit_ = std::max<size_t>(2 * threads, 4);
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~Scan() {
    {
      MutexLock lock(mutex_);
      stopping_ = true;
    }
    queued_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  Scan(const Scan&) = delete;
  Scan& operator=(const Scan&) = delete;

  void run(const struct stat& root_st) {
    entries_.push_back(entry_from_stat(root_st));
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!S_ISDIR(entries_.mode(i))) continue;
      // The listings ahead: directories already known, in entry order.
      if (next_dir_ <= i) next_dir_ = i;
      while (next_dir_ < entries_.size() && in_window() < window_limit_) {
        if (S_ISDIR(entries_.mode(next_dir_))) queue_listing(next_dir_);
        ++next_dir_;
      }
      std::unique_ptr<Listing> l = take_front();
      if (l->rc < 0) {
        if (i == 0) throw std::runtime_error("cannot read SOURCE '" + source_ + "': " + std::strerror(-l->rc));
        log_warning("cannot read directory '" + where(i) + "' in SOURCE: " + std::strerror(-l->rc) + "; shown empty");
        l->children.clear();
        l->order.clear();
      }
      add_children(i, *l);
      spare_.push_back(std::move(l));
    }
  }
  // The tree, in the manifest's form: made as the walk goes, not copied after it.
  EntryTable& entries() { return entries_; }
  ReallocArray<char>& names() { return names_; }

 private:
  // One child as listed; its name and a symlink's target are in its listing's text (one allocation for
  // a directory's names, not one for each).
  struct Child {
    size_t name_off = 0, link_off = 0;
    uint16_t name_len = 0, link_len = 0;
    int err = 0;  // errno of its lstat (or readlink), 0 if they worked
    Entry e;      // from lstat; the tree's fields are filled in by the walk
  };
  // A directory's listing. Kept for the next directory once taken: its arrays, allocated afresh for each
  // of thousands of directories, would cost page faults.
  struct Listing {
    std::vector<std::string> path;  // the directory's components beneath SOURCE
    int rc = 0;                     // 0, or -errno of opening or listing it
    std::string text;
    std::vector<Child> children;  // in the order listed
    std::vector<uint32_t> order;  // children's indexes by name
    bool done = false;  // guarded by the scan's mutex: set by the worker once the rest is written

    std::string_view name(const Child& c) const { return std::string_view(text).substr(c.name_off, c.name_len); }
    std::string_view target(const Child& c) const { return std::string_view(text).substr(c.link_off, c.link_len); }
  };

  std::string where(size_t dir) const {
    std::string out;
    for (auto p : components(dir)) {
      if (!out.empty()) out += '/';
      out.append(p);
    }
    return out;
  }
  std::vector<std::string_view> components(size_t dir) const {
    std::vector<std::string_view> parts;
    for (size_t id = dir; id != 0; id = entries_.parent(id))
      parts.push_back(view(names_).substr(entries_.name_off(id), entries_.name_len(id)));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }

  size_t in_window() {
    MutexLock lock(mutex_);
    return window_.size();
  }
  void queue_listing(size_t dir) {
    std::unique_ptr<Listing> l;
    if (spare_.empty()) {
      l = std::make_unique<Listing>();
    } else {
      l = std::move(spare_.back());
      spare_.pop_back();
      l->path.clear();
      l->rc = 0;
      l->text.clear();
      l->children.clear();
      l->order.clear();
      l->done = false;
    }
    for (auto c : components(dir)) l->path.emplace_back(c);
    {
      MutexLock lock(mutex_);
      window_.push_back(std::move(l));
    }
    queued_cv_.notify_one();
  }
  std::unique_ptr<Listing> take_front() {
    MutexLock lock(mutex_);
    while (!window_.front()->done) lock.wait(done_cv_);
    std::unique_ptr<Listing> l = std::move(window_.front());
    window_.pop_front();
    --next_to_list_;
    return l;
  }

  void work() {
    for (;;) {
      Listing* l = nullptr;
      {
        MutexLock lock(mutex_);
        while (!stopping_ && next_to_list_ == window_.size()) lock.wait(queued_cv_);
        if (stopping_) return;
        l = window_[next_to_list_++].get();
      }
      list(*l);
      {
        MutexLock lock(mutex_);
        l->done = true;
      }
      done_cv_.notify_one();
    }
  }

  // One directory: its names, each stat-ed as it is listed (on a FUSE SOURCE, a lookup between two reads
  // of a directory has the kernel ask for the next names with their attributes, readdirplus, so that the
  // lstat calls after them cost no round trip), its symlinks' targets, sorted by name.
  void list(Listing& l) {
    std::vector<std::string_view> parts(l.path.begin(), l.path.end());
    int fd = open_beneath(root_, parts, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      l.rc = fd;
      return;
    }
    UniqueFd dir(fd);
    l.rc = list_names(dir.get(), [&](const char* name) {
      Child& c = l.children.emplace_back();
      c.name_off = l.text.size();
      c.name_len = static_cast<uint16_t>(std::strlen(name));
      l.text.append(name, c.name_len);
      struct stat st;  // NOLINT: filled by fstatat
      if (::fstatat(dir.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0) c.err = errno;
      else c.e = entry_from_stat(st);
    });
    if (l.rc < 0) return;
    for (Child& c : l.children) {
      if (c.err || !S_ISLNK(c.e.mode)) continue;
      char buf[PATH_MAX];
      const ssize_t n = ::readlinkat(dir.get(), std::string(l.name(c)).c_str(), buf, sizeof(buf));
      if (n < 0) {
        c.err = errno;
        continue;
      }
      c.link_off = l.text.size();
      c.link_len = static_cast<uint16_t>(n);
      c.e.size = static_cast<uint64_t>(n);
      l.text.append(buf, static_cast<size_t>(n));
    }
    l.order.resize(l.children.size());
    for (uint32_t k = 0; k < l.order.size(); ++k) l.order[k] = k;
    std::sort(l.order.begin(), l.order.end(),
              [&](uint32_t a, uint32_t b) { return l.name(l.children[a]) < l.name(l.children[b]); });
  }

  void add_children(size_t dir, const Listing& l) {
    uint32_t kept = 0, subdirs = 0;
    for (const Child& c : l.children) {
      if (c.err == ENOENT) continue;  // removed while we listed
      if (c.err) {
        log_warning("cannot stat '" + std::string(l.name(c)) + "': " + std::strerror(c.err) + "; left out");
        continue;
      }
      ++kept;
      subdirs += S_ISDIR(c.e.mode);
    }
    if (entries_.size() + kept >= kNoEntry) throw std::runtime_error("SOURCE has too many entries (2^32)");
    entries_.set_children(dir, static_cast<EntryId>(entries_.size()), kept, subdirs);
    for (uint32_t k : l.order) {
      const Child& c = l.children[k];
      if (c.err) continue;
      Entry e = c.e;
      e.parent = static_cast<EntryId>(dir);
      e.name_len = c.name_len;
      e.link_len = c.link_len;
      e.name_off = names_.size();
      for (std::string_view part : {l.name(c), l.target(c)}) names_.append(part.data(), part.size());
      entries_.push_back(e);
    }
  }

  const int root_;
  const std::string& source_;
  // Main thread only:
  EntryTable entries_;
  ReallocArray<char> names_;
  size_t next_dir_ = 0;  // the next entry to look at for a directory to list
  size_t window_limit_;  // listings queued or made ahead of the one the walk waits for
  std::vector<std::unique_ptr<Listing>> spare_;  // taken, for the next directories

  Mutex mutex_;  // guards the window; a Listing is its worker's from being taken until done
  std::deque<std::unique_ptr<Listing>> window_ GUARDED_BY(mutex_);  // in entry order
  size_t next_to_list_ GUARDED_BY(mutex_) = 0;  // window_[next_to_list_] is the next for a worker
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::condition_variable queued_cv_;  // a listing queued, or stopping
  std::condition_variable done_cv_;    // a listing done
  std::vector<std::thread> workers_;
};

}  // namespace

Manifest Manifest::scan(const std::string& source, const std::vector<std::string>& extensions, unsigned threads) {
  UniqueFd root(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) throw std::runtime_error("cannot open SOURCE '" + source + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(root.get(), &st) != 0) throw std::runtime_error("cannot stat SOURCE '" + source + "'");
  if (threads == 0) threads = kScanThreads;
  Scan walk(root.get(), source, threads);
  walk.run(st);
  return from_parts(std::move(walk.entries()), std::move(walk.names()), extensions, source);
}

}  // namespace clairfs
