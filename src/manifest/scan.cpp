// The one scan of SOURCE: a breadth-first walk that never follows symlinks (they are recorded as
// symlinks, with their targets), so the tree is exactly what lstat sees. Directories are opened beneath
// the SOURCE descriptor without following symlinks, so a directory swapped for a symlink while we scan
// cannot lead the scan outside SOURCE.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// Calls `each` with every name in a directory but "." and ".." and its type (DT_*). Returns 0 or -errno.
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
    each(static_cast<const char*>(d->d_name), d->d_type);
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
  Scan(int root, const std::string& source, unsigned threads, bool files_later)
      : root_(root), source_(source), files_later_(files_later) {
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
    bool late = false;  // a regular file as listed, not stat-ed: its attributes come later
    Entry e;      // from lstat (or the listing's type); the tree's fields are filled in by the walk
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
  // lstat calls after them cost no round trip), its symlinks' targets, sorted by name. With files_later_,
  // a name listed as a regular file is not stat-ed (as `find -type f` does not): stat-ing it is what
  // costs the kernel an inode and a dentry for every file of SOURCE.
  void list(Listing& l) {
    std::vector<std::string_view> parts(l.path.begin(), l.path.end());
    int fd = open_beneath(root_, parts, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      l.rc = fd;
      return;
    }
    UniqueFd dir(fd);
    l.rc = list_names(dir.get(), [&](const char* name, unsigned char type) {
      Child& c = l.children.emplace_back();
      c.name_off = l.text.size();
      c.name_len = static_cast<uint16_t>(std::strlen(name));
      l.text.append(name, c.name_len);
      if (files_later_ && type == DT_REG) {
        c.late = true;
        c.e.mode = S_IFREG;
        return;
      }
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
      if (c.late) entries_.push_back_late(e);
      else entries_.push_back(e);
    }
  }

  const int root_;
  const std::string& source_;
  const bool files_later_;
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

Manifest Manifest::scan(const std::string& source, const std::vector<std::string>& extensions, unsigned threads,
                        Attributes files) {
  UniqueFd root(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) throw std::runtime_error("cannot open SOURCE '" + source + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(root.get(), &st) != 0) throw std::runtime_error("cannot stat SOURCE '" + source + "'");
  if (threads == 0) threads = kScanThreads;
  Scan walk(root.get(), source, threads, files == Attributes::kLater);
  walk.run(st);
  Manifest m = from_parts(std::move(walk.entries()), std::move(walk.names()), extensions, source);
  if (m.tree_->entries.has_late()) m.tree_->late = std::make_unique<LateFill>(std::move(root), m.tree_->entries);
  return m;
}

// ---- late attributes --------------------------------------------------------------------------------

struct Manifest::LateFill {
  LateFill(UniqueFd r, const EntryTable& table) : root(std::move(r)) {
    for (size_t i = 0; i < table.size(); ++i) pending += table.late_state(i) == EntryTable::kUnknown;
  }
  UniqueFd root;
  Mutex mutex;  // serializes set_late()
  std::atomic<uint64_t> pending{0};  // entries whose attributes are not known yet
  std::atomic<uint64_t> gone{0};     // found gone (or of another type) when stat-ed
  Mutex wanted_mutex;
  std::deque<EntryId> wanted GUARDED_BY(wanted_mutex);  // want_first()'s, in the order asked
  std::atomic<bool> any_wanted{false};
};

void Manifest::want_first(const std::vector<EntryId>& ids) const {
  if (!tree_->late || ids.empty()) return;
  MutexLock lock(tree_->late->wanted_mutex);
  tree_->late->wanted.insert(tree_->late->wanted.end(), ids.begin(), ids.end());
  if (tree_->late->wanted.size() > kWantedFirst)
    tree_->late->wanted.erase(tree_->late->wanted.begin(),
                              tree_->late->wanted.end() - static_cast<std::ptrdiff_t>(kWantedFirst));
  tree_->late->any_wanted.store(true, std::memory_order_release);
}

Manifest::Tree::Tree() = default;
Manifest::Tree::~Tree() = default;
Manifest::Manifest() : tree_(std::make_shared<Tree>()) {}
Manifest::~Manifest() = default;
Manifest::Manifest(Manifest&&) noexcept = default;
Manifest& Manifest::operator=(Manifest&&) noexcept = default;

uint64_t Manifest::attributes_pending() const {
  return tree_->late ? tree_->late->pending.load(std::memory_order_acquire) : 0;
}

void Manifest::set_late(EntryId id, const struct stat* st) const {
  MutexLock lock(tree_->late->mutex);
  if (tree_->entries.late_state(id) != EntryTable::kUnknown) return;  // stat-ed meanwhile by another thread
  tree_->entries.set_late(id, st);
  if (tree_->entries.late_state(id) == EntryTable::kGone) tree_->late->gone++;
  tree_->late->pending.fetch_sub(1, std::memory_order_release);
}

bool Manifest::ensure(EntryId id) const {
  EntryTable::LateState state = tree_->entries.late_state(id);
  if (state == EntryTable::kUnknown) {
    const int fd = open_beneath(tree_->late->root.get(), components(tree_->entries.parent(id)), O_RDONLY | O_DIRECTORY);
    struct stat st {};
    int err = fd < 0 ? -fd : 0;
    if (fd >= 0 && ::fstatat(fd, std::string(name(id)).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) err = errno;
    if (fd >= 0) ::close(fd);
    // Out of descriptors, memory, a signal: not known now, asked again next time (the fill too).
    if (err != 0 && err != ENOENT && err != ENOTDIR && err != ELOOP && err != EXDEV && err != EACCES) return false;
    set_late(id, err == 0 ? &st : nullptr);
    state = tree_->entries.late_state(id);
  }
  return state == EntryTable::kKnown;
}

uint64_t Manifest::gone_at_fill() const { return tree_->late ? tree_->late->gone.load() : 0; }

void Manifest::fill_attributes(const std::atomic<bool>& stop, unsigned threads) const {
  if (!attributes_pending()) return;
  std::vector<EntryId> dirs;  // those with late children
  for (size_t i = 0; i < size(); ++i) {
    if (!is_dir(static_cast<EntryId>(i))) continue;
    const Entry d = tree_->entries[i];
    for (EntryId c = d.first_child; c < d.first_child + d.child_count; ++c)
      if (tree_->entries.late_state(c) == EntryTable::kUnknown) {
        dirs.push_back(static_cast<EntryId>(i));
        break;
      }
  }
  // Each directory opened once and its late files stat-ed by name beneath it: listing it again, to have
  // a FUSE SOURCE hand the attributes over with the names, made a 200,000-file fill slower here.
  std::atomic<size_t> next{0};
  // The entries asked for first (want_first), one by one, before each directory and between its files.
  auto wanted = [&] {
    while (tree_->late->any_wanted.load(std::memory_order_acquire) && !stop.load(std::memory_order_relaxed)) {
      EntryId id = 0;
      {
        MutexLock lock(tree_->late->wanted_mutex);
        if (tree_->late->wanted.empty()) {
          tree_->late->any_wanted.store(false, std::memory_order_relaxed);
          return;
        }
        id = tree_->late->wanted.front();
        tree_->late->wanted.pop_front();
      }
      ensure(id);
    }
  };
  auto work = [&] {
    for (size_t k; !stop.load(std::memory_order_relaxed) && (wanted(), k = next.fetch_add(1)) < dirs.size();) {
      UniqueFd dir(open_beneath(tree_->late->root.get(), components(dirs[k]), O_RDONLY | O_DIRECTORY));
      if (!dir)
        log_warning("cannot open directory '" + path(dirs[k]) + "' in SOURCE again: " + std::strerror(-dir.get()) +
                    "; its files are taken as gone");
      const Entry d = tree_->entries[dirs[k]];
      for (EntryId c = d.first_child; c < d.first_child + d.child_count && !stop.load(std::memory_order_relaxed); ++c) {
        if (tree_->entries.late_state(c) != EntryTable::kUnknown) continue;
        wanted();
        struct stat st {};
        const bool ok = dir && ::fstatat(dir.get(), std::string(name(c)).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
        set_late(c, ok ? &st : nullptr);
      }
    }
  };
  if (threads == 0) threads = kScanThreads;
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace clairfs
