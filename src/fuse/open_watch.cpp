#include "fuse/open_watch.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/fanotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <system_error>

#include "util/log.hpp"
#include "util/mounts.hpp"

namespace clairfs {

namespace {

// Bytes read from the group at once (an event with FUSE's handle is 56 bytes: about 290).
constexpr size_t kEventBuffer = 16 * 1024;
// How often the thread looks whether the session has started (the kernel's INIT answered).
constexpr int kInitPollMs = 5;
// How long the thread lets events gather after it has read all there were (the kernel's queue holds
// 16,384: at 50,000 opens and closes a second, 50 gather in this time).
constexpr int kGatherMs = 1;
// Threads that mark the directories, at most (and no more than the machine has cores).
constexpr unsigned kMarkers = 4;
// After a read that failed (not expected: events hold nothing that can fail), the thread pauses this long.
constexpr int kPauseMs = 10;
// Events read and not yet handed to the engine, at most (16 bytes each): beyond, they are dropped and
// the engine told of a loss.
constexpr size_t kMaxPending = 1 << 20;

std::string errno_text(int e) { return std::strerror(e); }

// A detached copy of the clairfs mount at `mountpoint_abs` (made by this user), or none: root may clone a
// mount (open_tree), a user may not. Descriptors opened through the copy hold it, not the user's mount, so
// an unmount meanwhile succeeds (the file system then lives until the copy is closed). The original is held
// for three system calls and no FUSE request: the session need not be answering yet.
UniqueFd clone_of_mount(const std::string& mountpoint_abs) {
  if (::geteuid() != 0) return UniqueFd();
  const int root = open_own_clairfs_mount(mountpoint_abs);
  if (root < 0) return UniqueFd();
  const UniqueFd held(root);
  return UniqueFd(::open_tree(root, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
}

}  // namespace

OpenWatch::OpenWatch(const std::string& mountpoint_abs, const Manifest& manifest, Engine& engine,
                     const Frontend& frontend, std::function<void()> started)
    : mountpoint_(mountpoint_abs),
      manifest_(manifest),
      engine_(engine),
      frontend_(frontend),
      self_(::getpid()),
      started_(std::move(started)),
      clone_(clone_of_mount(mountpoint_abs)),
      stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!stop_) {
    clone_ = UniqueFd();  // (held, the copy would keep the file system alive after the user's unmount)
    give_up("eventfd: " + errno_text(errno));
    if (started_) started_();
    return;
  }
  thread_ = std::thread([this] { run(); });
}

OpenWatch::~OpenWatch() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
    thread_.join();  // before the dispatcher: it starts the dispatcher
  }
  if (dispatcher_.joinable()) {
    {
      MutexLock lock(queue_mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    dispatcher_.join();
  }
}

std::string OpenWatch::watch() {
  // Events name their file by a file handle, not by a descriptor opened for us: nothing they hold keeps
  // the mount busy. Root may mark any number of directories; a user as many as fs.fanotify.max_user_marks
  // allows (and is not told other processes' pids).
  // Root is told the opener's thread (FAN_REPORT_TID), as FUSE's requests tell it: a loader whose
  // workers are threads of one process (tf.data, a C++ loader) has each judged by its own opens, where
  // the process's would interleave several batches (and was judged to read another order).
  constexpr unsigned kFlags = FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_FID;
  int group = ::fanotify_init(kFlags | FAN_UNLIMITED_MARKS | FAN_REPORT_TID, O_RDONLY | O_LARGEFILE | O_CLOEXEC);
  if (group < 0 && errno == EPERM) group = ::fanotify_init(kFlags, O_RDONLY | O_LARGEFILE | O_CLOEXEC);
  if (group < 0) {
    if (errno == ENOSYS) return "this kernel has no fanotify";
    if (errno == EINVAL) return "this kernel's fanotify cannot report file handles (Linux 5.1 or later can)";
    if (errno == EPERM) return "this kernel lets only root use fanotify (Linux 5.13 or later lets a user)";
    return "fanotify_init: " + errno_text(errno);
  }
  group_ = UniqueFd(group);
  // Marking sends requests to this very daemon (lookups, statfs). Were the daemon killed while one is in
  // flight, the kernel would wait for its answer uninterruptibly, with the marking thread holding
  // /dev/fuse open — which is what would end the wait (the connection aborts when the last descriptor
  // of it closes): the process could never end. So the marks are made by threads each with a table of
  // descriptors of its own, without the session's (the group's descriptor is copied into it); several,
  // since each mark waits for the daemon's answers (a statfs, a lookup) and their waits overlap.
  const unsigned markers = std::clamp(std::thread::hardware_concurrency(), 1u, kMarkers);
  std::vector<bool> holds_dirs(manifest_.size());
  for (EntryId dir = 1; dir < manifest_.size(); ++dir)
    if (manifest_.is_dir(dir)) holds_dirs[manifest_.entry(dir).parent] = true;
  std::vector<std::string> why(markers);
  std::vector<std::thread> threads;
  std::string failed;
  for (unsigned k = 0; k < markers; ++k) {
    try {
      threads.emplace_back([&, k] {
        why[k] = own_descriptors() ? mark(group, holds_dirs, k, markers)
                                   : "a descriptor table of its own: " + errno_text(errno);
      });
    } catch (const std::system_error& e) {
      failed = std::string("a thread to mark the directories: ") + e.what();
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  if (!failed.empty()) return failed;
  for (const std::string& w : why)
    if (!w.empty()) return w;
  return "";
}

std::string OpenWatch::mark(int group, const std::vector<bool>& holds_dirs, unsigned part, unsigned parts) {
  // The mount itself, reached without following a symlink and made by us: a path a user can change
  // must not turn the watch onto another mount.
  const int root = clone_ ? ::dup(clone_.get()) : open_own_clairfs_mount(mountpoint_);
  if (root < 0 && clone_) return "cannot copy a descriptor: " + errno_text(errno);
  if (root < 0) return "cannot find this mount at " + mountpoint_ + ": " + errno_text(-root);
  const UniqueFd root_fd(root);
  struct stat root_st {};
  if (::fstat(root, &root_st) != 0) return "cannot stat the mount: " + errno_text(errno);
  list_parents(root, holds_dirs, part, parts);
  // A mark on each directory, for its children's opens and closes: the kernel tells of every open of a
  // file in it, by any path (a bind mount too), whether or not a request reaches us.
  for (EntryId dir = 0, n = 0; dir < manifest_.size(); ++dir) {
    if (!manifest_.is_dir(dir) || n++ % parts != part) continue;
    // O_PATH: no OPENDIR for the daemon to answer. fanotify_mark takes no such descriptor, but a path
    // through it: /proc/thread-self/fd/N is that very directory (in this thread's own table).
    const int fd = open_beneath(root, manifest_.components(dir), O_PATH | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) return "cannot open /" + manifest_.path(dir) + " in the mount: " + errno_text(-fd);
    const UniqueFd dir_fd(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_dev != root_st.st_dev || st.st_ino != Frontend::ino_of(dir))
      return "/" + manifest_.path(dir) + " in the mount is not this mount's directory";
    const std::string held = "/proc/thread-self/fd/" + std::to_string(fd);
    if (::fanotify_mark(group, FAN_MARK_ADD, FAN_OPEN | FAN_CLOSE_NOWRITE | FAN_EVENT_ON_CHILD, AT_FDCWD,
                        held.c_str()) != 0) {
      if (errno == ENODEV || errno == EOPNOTSUPP || errno == EXDEV)
        return "this kernel's fanotify cannot name FUSE files (Linux 6.8 or later can)";
      if (errno == ENOSPC) return "more directories than fs.fanotify.max_user_marks lets a user watch";
      return "fanotify_mark: " + errno_text(errno);
    }
  }
  return "";
}

void OpenWatch::list_parents(int root, const std::vector<bool>& holds_dirs, unsigned part, unsigned parts) const {
  alignas(8) char buf[32 * 1024];
  for (EntryId dir = 0, n = 0; dir < manifest_.size(); ++dir) {
    if (!holds_dirs[dir] || n++ % parts != part) continue;
    // A listing that cannot be made only leaves those lookups to the marks.
    const int fd = open_beneath(root, manifest_.components(dir), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) continue;
    const UniqueFd dir_fd(fd);
    while (::syscall(SYS_getdents64, fd, buf, sizeof(buf)) > 0) {
    }
  }
}

bool OpenWatch::own_descriptors() {
  if (::unshare(CLONE_FILES) != 0) return false;
  DIR* fds = ::opendir("/proc/thread-self/fd");
  if (!fds) return false;
  std::vector<int> fuse;
  char target[32];
  while (const dirent* d = ::readdir(fds)) {
    const int fd = std::atoi(d->d_name);
    if (d->d_name[0] == '.' || fd == ::dirfd(fds)) continue;
    const std::string link = "/proc/thread-self/fd/" + std::string(d->d_name);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::string_view(target, static_cast<size_t>(n)) == "/dev/fuse") fuse.push_back(fd);
  }
  ::closedir(fds);
  // Closed in this table only; through the system call itself, since ThreadSanitizer (which knows one
  // table per process) takes close() here for a race with the session's reads of the same number.
  for (int fd : fuse) ::syscall(SYS_close, fd);
  return true;
}

void OpenWatch::run() {
  const bool watching = start();
  clone_ = UniqueFd();  // marked or given up: the user's unmount ends the file system from here on
  if (started_) started_();
  if (watching) drain();
}

bool OpenWatch::give_up(const std::string& why) {
  group_ = UniqueFd();  // and the marks made with it: they count against the user's
  log_warning("cannot watch the mount's opens (" + why + "): progress is inferred from first reads");
  return false;
}

bool OpenWatch::start() {
  pollfd stop{stop_.get(), POLLIN, 0};
  // Whether the kernel opens files without asking is known once the session has started.
  while (!frontend_.initialised()) {
    if (::poll(&stop, 1, kInitPollMs) > 0) return false;
  }
  if (!frontend_.opens_unasked()) return false;  // the kernel sends every open to the daemon: nothing to watch
  if (std::string why = watch(); !why.empty()) return give_up(why);
  try {
    dispatcher_ = std::thread([this] { dispatch(); });
  } catch (const std::system_error& e) {
    return give_up(std::string("a thread to dispatch them: ") + e.what());
  }
  // At once: a file opened from here on and read before this would be counted twice (its first read
  // as its open, then the event).
  engine_.watching_opens();
  log_info("watching every open and close of the mount (fanotify)");
  return true;
}

void OpenWatch::drain() {
  pollfd fds[2] = {{group_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  alignas(fanotify_event_metadata) char buf[kEventBuffer];
  for (;;) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    for (;;) {
      const ssize_t n = ::read(group_.get(), buf, sizeof(buf));
      if (n > 0) {
        try {
          handle(buf, static_cast<size_t>(n));
        } catch (const std::bad_alloc&) {  // these events are lost, and said to be
          {
            MutexLock lock(queue_mutex_);
            lost_ = true;
          }
          ready_.notify_one();
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        // Drained: a pause lets the next events gather, so that a reader opening tens of thousands of
        // files a second wakes this thread (and the dispatcher) a thousand times a second, not once an open.
        if (::poll(&fds[1], 1, kGatherMs) > 0) return;
        break;
      }
      // Events may have gone with it: said to be lost, and read on.
      pass_on({Event{0, 0, Event::kLost}});
      if (::poll(&fds[1], 1, kPauseMs) > 0) return;
    }
  }
}

std::optional<EntryId> OpenWatch::entry_of(const fanotify_event_metadata& m) const {
  // The event's records after its metadata: the file's handle is FUSE's, its node id in two words (the
  // daemon's inode number: Frontend::ino_of).
  const char* at = reinterpret_cast<const char*>(&m) + m.metadata_len;
  const char* end = reinterpret_cast<const char*>(&m) + m.event_len;
  while (end - at >= static_cast<ptrdiff_t>(sizeof(fanotify_event_info_header))) {
    fanotify_event_info_header header;
    std::memcpy(&header, at, sizeof(header));
    if (header.len < sizeof(header) || header.len > end - at) break;
    if (header.info_type == FAN_EVENT_INFO_TYPE_FID) {
      const size_t handle_at = offsetof(fanotify_event_info_fid, handle);
      file_handle handle;
      uint32_t words[2];
      if (header.len < handle_at + sizeof(handle) + sizeof(words)) return std::nullopt;
      std::memcpy(&handle, at + handle_at, sizeof(handle));
      if (handle.handle_type != kFuseHandle || handle.handle_bytes < sizeof(words)) return std::nullopt;
      std::memcpy(words, at + handle_at + sizeof(handle), sizeof(words));
      const uint64_t ino = uint64_t{words[0]} << 32 | words[1];
      if (ino < Frontend::ino_of(0)) return std::nullopt;
      return static_cast<EntryId>(ino - Frontend::ino_of(0));
    }
    at += header.len;
  }
  return std::nullopt;
}

void OpenWatch::handle(const char* events, size_t len) {
  // All this thread does is read the events: the engine hears of them on the dispatcher's thread.
  std::vector<Event> batch;
  auto left = static_cast<ssize_t>(len);
  for (auto* m = reinterpret_cast<const fanotify_event_metadata*>(events); FAN_EVENT_OK(m, left);
       m = FAN_EVENT_NEXT(m, left)) {
    if (m->mask & FAN_Q_OVERFLOW) {
      batch.push_back(Event{0, 0, Event::kLost});
      continue;
    }
    // pid 0: not told (a user's group hears only its own pid).
    if (m->pid == self_) continue;
    const std::optional<EntryId> id = entry_of(*m);
    if (!id || *id >= manifest_.size() || !S_ISREG(manifest_.mode(*id))) continue;  // a control file, say
    // Both in one event when the kernel merged a close into the open still queued.
    const uint8_t what = static_cast<uint8_t>(((m->mask & FAN_OPEN) ? Event::kOpen : 0) |
                                              ((m->mask & FAN_CLOSE_NOWRITE) ? Event::kClose : 0));
    batch.push_back(Event{*id, static_cast<pid_t>(m->pid), what});
  }
  pass_on(std::move(batch));
}

void OpenWatch::pass_on(std::vector<Event> batch) {
  if (batch.empty()) return;
  {
    MutexLock lock(queue_mutex_);
    if (pending_.size() > kMaxPending) {  // the engine far behind: these are lost, and said to be
      pending_.clear();
      lost_ = true;
    } else {
      try {
        pending_.insert(pending_.end(), batch.begin(), batch.end());
      } catch (const std::bad_alloc&) {  // (the daemon near an address-space limit)
        lost_ = true;
      }
    }
  }
  ready_.notify_one();
}

void OpenWatch::dispatch() {
  std::deque<Event> now;
  for (;;) {
    bool lost = false;
    {
      MutexLock lock(queue_mutex_);
      while (!stopping_ && pending_.empty() && !lost_) lock.wait(ready_);
      if (stopping_) return;
      now.swap(pending_);  // (allocates nothing)
      lost = lost_;
      lost_ = false;
    }
    // Nothing the engine throws (it may fail to allocate near an address-space limit) ends the thread:
    // what it could not take in is a loss, as when the kernel's queue overflows.
    try {
      if (lost) engine_.opens_lost();
      for (const Event& e : now) {
        if (e.what & Event::kLost) engine_.opens_lost();
        if (e.what & Event::kOpen) engine_.opened(e.id, e.pid);
        if (e.what & Event::kClose) engine_.closed(e.id, e.pid);
      }
    } catch (const std::exception&) {
      engine_.opens_lost();
    }
    now.clear();
  }
}

}  // namespace clairfs
