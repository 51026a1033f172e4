#include "fuse/open_watch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/log.hpp"
#include "util/mounts.hpp"

namespace clairfs {

namespace {

// Bytes read from the group at once: each event's descriptor is open until it is handled, so this bounds
// the descriptors the thread holds (an event is 24 bytes: about 680).
constexpr size_t kEventBuffer = 16 * 1024;
// How often the thread looks whether the session has started (the kernel's INIT answered).
constexpr int kInitPollMs = 5;
// Reads that failed in a row (the kernel could not open an event's file: out of descriptors, say)
// before the thread pauses.
constexpr unsigned kErrorsBeforePause = 64;
constexpr int kPauseMs = 10;
// Events read and not yet handed to the engine, at most (16 bytes each): beyond, they are dropped and
// the engine told of a loss.
constexpr size_t kMaxPending = 1 << 20;

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

OpenWatch::OpenWatch(const std::string& mountpoint_abs, const Manifest& manifest, Engine& engine,
                     const Frontend& frontend)
    : mountpoint_(mountpoint_abs),
      manifest_(manifest),
      engine_(engine),
      frontend_(frontend),
      self_(::getpid()),
      stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!stop_) {
    log_warning("cannot watch the mount's opens (eventfd: " + errno_text(errno) +
                "): progress is inferred from first reads");
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
  const int group = ::fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, O_RDONLY | O_LARGEFILE | O_CLOEXEC);
  if (group < 0) {
    if (errno == EPERM) return "a watch on a mount needs root (CAP_SYS_ADMIN)";
    if (errno == ENOSYS) return "this kernel has no fanotify";
    return "fanotify_init: " + errno_text(errno);
  }
  group_ = UniqueFd(group);
  // The mount itself, reached without following a symlink and made by us: a path a user can change
  // must not turn the watch onto another mount.
  const int root = open_own_clairfs_mount(mountpoint_);
  if (root < 0) return "cannot find this mount at " + mountpoint_ + ": " + errno_text(-root);
  const UniqueFd root_fd(root);
  // fanotify_mark takes no O_PATH descriptor, but a path through it: /proc/self/fd/N is that very mount.
  const std::string path = "/proc/self/fd/" + std::to_string(root);
  if (::fanotify_mark(group, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN | FAN_CLOSE_NOWRITE, AT_FDCWD, path.c_str()) != 0)
    return "fanotify_mark: " + errno_text(errno);
  return "";
}

void OpenWatch::run() {
  pollfd stop{stop_.get(), POLLIN, 0};
  // Whether the kernel opens files without asking is known once the session has started.
  while (!frontend_.initialised()) {
    if (::poll(&stop, 1, kInitPollMs) > 0) return;
  }
  if (!frontend_.opens_unasked()) return;  // the kernel sends every open to the daemon: nothing to watch
  if (std::string why = watch(); !why.empty()) {
    log_warning("cannot watch the mount's opens (" + why + "): progress is inferred from first reads");
    return;
  }
  // At once: a file opened from here on and read before this would be counted twice (its first read
  // as its open, then the event).
  engine_.watching_opens();
  dispatcher_ = std::thread([this] { dispatch(); });
  log_info("watching every open and close of the mount (fanotify)");
  pollfd fds[2] = {{group_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  alignas(fanotify_event_metadata) char buf[kEventBuffer];
  unsigned failed = 0;
  for (;;) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    for (;;) {
      const ssize_t n = ::read(group_.get(), buf, sizeof(buf));
      if (n > 0) {
        failed = 0;
        handle(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      // The kernel could not open an event's file for us (the event is gone): lost, and read on.
      pass_on({Event{0, 0, Event::kLost}});
      if (++failed >= kErrorsBeforePause) {
        failed = 0;
        if (::poll(&fds[1], 1, kPauseMs) > 0) return;
      }
    }
  }
}

void OpenWatch::handle(const char* events, size_t len) {
  // Each event holds the mount (an unmount meanwhile fails as busy) until it is read and its descriptor
  // closed: that is all this thread does. The engine hears of them on the dispatcher's thread.
  std::vector<Event> batch;
  auto left = static_cast<ssize_t>(len);
  for (auto* m = reinterpret_cast<const fanotify_event_metadata*>(events); FAN_EVENT_OK(m, left);
       m = FAN_EVENT_NEXT(m, left)) {
    if (m->mask & FAN_Q_OVERFLOW) batch.push_back(Event{0, 0, Event::kLost});
    if (m->fd < 0) continue;
    struct statx sx {};
    const int rc = ::statx(m->fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &sx);  // cached: no request
    ::close(m->fd);
    if (rc != 0 || m->pid == self_ || sx.stx_ino < Frontend::ino_of(0)) continue;
    const auto id = static_cast<EntryId>(sx.stx_ino - Frontend::ino_of(0));
    if (id >= manifest_.size() || !S_ISREG(manifest_.mode(id))) continue;  // a control file, say
    // Both in one event when the kernel merged a close into the open still queued.
    const uint8_t what = static_cast<uint8_t>(((m->mask & FAN_OPEN) ? Event::kOpen : 0) |
                                              ((m->mask & FAN_CLOSE_NOWRITE) ? Event::kClose : 0));
    batch.push_back(Event{id, static_cast<pid_t>(m->pid), what});
  }
  pass_on(std::move(batch));
}

void OpenWatch::pass_on(std::vector<Event> batch) {
  if (batch.empty()) return;
  {
    MutexLock lock(queue_mutex_);
    if (pending_.size() > kMaxPending) {  // the engine far behind: these are lost, and said to be
      pending_.clear();
      batch.assign(1, Event{0, 0, Event::kLost});
    }
    pending_.insert(pending_.end(), batch.begin(), batch.end());
  }
  ready_.notify_one();
}

void OpenWatch::dispatch() {
  std::vector<Event> now;
  for (;;) {
    {
      MutexLock lock(queue_mutex_);
      while (!stopping_ && pending_.empty()) lock.wait(ready_);
      if (stopping_) return;
      now.assign(pending_.begin(), pending_.end());
      pending_.clear();
    }
    for (const Event& e : now) {
      if (e.what & Event::kLost) engine_.opens_lost();
      if (e.what & Event::kOpen) engine_.opened(e.id, e.pid);
      if (e.what & Event::kClose) engine_.closed(e.id, e.pid);
    }
  }
}

}  // namespace clairfs
