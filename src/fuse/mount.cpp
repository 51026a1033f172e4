#include "fuse/mount.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/mounts.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

namespace {

// libfuse's option parser splits at commas; a comma in a value (fsname) must be escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// 16 threads: enough that a slow SOURCE read does not hold up lookups and cached reads; requests are
// short, so more would only add contention on 2-core nodes.
constexpr unsigned kMaxThreads = 16;

// libfuse's own errors (a worker's buffer it could not allocate, which ends the session) go where the
// daemon's lines go: once detached, its stderr is gone. Its debug lines (-d) stay on stderr.
void forward_fuse_log(enum fuse_log_level level, const char* format, va_list args) {
  if (level > FUSE_LOG_NOTICE) {
    std::vfprintf(stderr, format, args);
    return;
  }
  char line[512];  // on the stack: the message may be about memory that ran out
  std::vsnprintf(line, sizeof line, format, args);
  std::string_view text(line);
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.substr(0, 6) == "fuse: ") text.remove_prefix(6);
  try {
    log_line(level <= FUSE_LOG_ERR       ? LogLevel::kError
             : level == FUSE_LOG_WARNING ? LogLevel::kWarning
                                         : LogLevel::kNotice,
             "libfuse: " + std::string(text));
  } catch (const std::bad_alloc&) {  // the line is lost; libfuse's C frames must not see an exception
  }
}

// A file the kernel holds no pages of is read through the daemon in requests as large as the mount's
// readahead window: 128 KiB by default, which INIT can lower but not raise. 1 MiB, FUSE's largest
// request (libfuse asks for 256 pages), reads a large file in an eighth of the requests. The window is
// this mount's own (its backing device, named by the mount's device number), set in sysfs after INIT,
// which root alone may write; a user's mount keeps the default.
constexpr int kReadaheadKiB = 1024;

void widen_readahead(const std::string& device) {
  if (device.empty() || device.find_first_not_of("0123456789:") != std::string::npos) return;
  const std::string path = "/sys/class/bdi/" + device + "/read_ahead_kb";
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  const std::string value = std::to_string(kReadaheadKiB);
  if (!fd || ::write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
    log_debug("reads through the daemon keep the kernel's readahead (" + path + ": " + std::strerror(errno) + ")");
    return;
  }
  log_debug("reads through the daemon in requests of up to " + value + " KiB (" + path + ")");
}

// A crash (a fatal signal that dumps core) ends the FUSE connection before anything else. The kernel's
// core dump first waits for every thread of the process to stop, and a thread of ours waiting on a
// request to this very mount (the watch marking its directories, a stat) whose request another of our
// threads had already read waits uninterruptibly for that answer: it never comes, the dump never ends,
// and the process stays in D state with its mount dead (4 of 5 SIGSEGVs during the watch's marking of
// 20,000 directories did that). Closing the connection's last descriptor aborts it: every request ends
// (ENOTCONN), the dump goes on, and the process ends (with auto_unmount, its mount goes too). Then the
// signal is handled as before (the handler found there: a sanitizer's report, or the default action).
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGQUIT, SIGTRAP};
std::atomic<int> crash_fd{-1};
struct sigaction crash_before[std::size(kCrashSignals)];

void on_crash(int sig) {
  const int fd = crash_fd.exchange(-1);
  if (fd >= 0) ::close(fd);
  for (size_t i = 0; i < std::size(kCrashSignals); ++i)
    if (kCrashSignals[i] == sig) ::sigaction(sig, &crash_before[i], nullptr);
  ::raise(sig);  // delivered as this handler returns (a fault's instruction would raise it again anyway)
}

void close_connection_on_crash(int fd) {
  crash_fd = fd;
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK;
  for (size_t i = 0; i < std::size(kCrashSignals); ++i) ::sigaction(kCrashSignals[i], &sa, &crash_before[i]);
}

void keep_connection_on_crash() {
  if (crash_fd.exchange(-1) < 0) return;
  for (size_t i = 0; i < std::size(kCrashSignals); ++i) ::sigaction(kCrashSignals[i], &crash_before[i], nullptr);
}

// The threads that serve the session's requests. As in libfuse's own loop, one starts, and another
// each time every thread is busy, up to kMaxThreads; unlike it, a thread that cannot allocate its
// request buffer (libfuse allocates it at the thread's first receive) does not end the session: libfuse
// then stopped its loop and, started again, had dropped the requests its other threads had read
// meanwhile, whose readers waited forever (CI's squeeze test at 5626913). Here the thread gives memory
// back and tries again, while the others serve; no request read goes unanswered (an allocation that
// fails while handling one answers ENOMEM: libfuse's own, or Frontend's Guarded).
class ServingThreads {
 public:
  ServingThreads(fuse_session* session, int ended_fd, const std::function<void()>& low_on_memory)
      : session_(session), ended_fd_(ended_fd), low_on_memory_(low_on_memory) {
    // As libfuse's own threads: no signal meant for the process (MPI's, a user's) lands in a request's
    // system calls (the threads started later inherit it). A fault of their own still reaches the
    // crash handler (a fault's signal blocked would be taken with the default action).
    sigset_t held, before;
    sigfillset(&held);
    for (const int sig : kCrashSignals) sigdelset(&held, sig);
    pthread_sigmask(SIG_BLOCK, &held, &before);
    MutexLock lock(mutex_);
    start_one();
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
  }
  ~ServingThreads() { stop(); }
  ServingThreads(const ServingThreads&) = delete;
  ServingThreads& operator=(const ServingThreads&) = delete;

  size_t started() const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return threads_.size();
  }
  int start_error() const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return start_error_;
  }
  int error() const { return error_.load(); }  // the first receive that failed so (negative errno), or 0

  // Once the session has exited: a thread waiting for a request is cancelled there, one handling a
  // request finishes it first.
  void stop() EXCLUDES(mutex_) {
    std::vector<pthread_t> threads;
    {
      MutexLock lock(mutex_);
      stopping_ = true;  // none started from here on
      threads.swap(threads_);
    }
    for (const pthread_t t : threads) pthread_cancel(t);
    for (const pthread_t t : threads) pthread_join(t, nullptr);
  }

 private:
  struct Buffer {  // freed however its thread ends (a cancellation unwinds the stack)
    fuse_buf buf{};
    ~Buffer() { std::free(buf.mem); }
  };

  static void* run(void* self) {
    static_cast<ServingThreads*>(self)->serve();
    return nullptr;
  }

  void start_one() REQUIRES(mutex_) {
    if (stopping_ || threads_.size() >= kMaxThreads) return;
    pthread_t t;
    if (const int err = pthread_create(&t, nullptr, &ServingThreads::run, this); err != 0) {
      start_error_ = err;  // tried again when all are busy again
      return;
    }
    threads_.push_back(t);
    idle_++;
  }

  void serve() {
    Frontend::ThreadMemory memory;
    Buffer b;
    int state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    std::chrono::steady_clock::time_point no_buffer_since{};  // the epoch's start: it has its buffer
    while (!fuse_session_exited(session_)) {
      pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &state);
      const int n = fuse_session_receive_buf(session_, &b.buf);
      pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
      if (n == -EINTR || n == -EAGAIN) continue;
      if (n == -ENOMEM && !b.buf.mem) {  // its buffer: no request was read
        if (wait_for_buffer(no_buffer_since)) continue;
        if (without_buffer_gives_up()) {
          log_warning("libfuse could not allocate a request buffer for " + std::to_string(kNoBufferFor.count()) +
                      " s (an address-space limit?); the mount is served by fewer threads");
          return;
        }
        log_error("libfuse could not allocate a request buffer for " + std::to_string(kNoBufferFor.count()) +
                  " s (an address-space limit?), and no thread has one; the mount ends");
      }
      if (n <= 0) {  // unmounted (0), or the connection failed
        int none = 0;
        if (n < 0) error_.compare_exchange_strong(none, n);
        fuse_session_exit(session_);
        break;
      }
      if (no_buffer_since != std::chrono::steady_clock::time_point{}) {
        no_buffer_since = {};
        MutexLock lock(mutex_);
        without_buffer_--;
      }
      {
        MutexLock lock(mutex_);
        if (--idle_ == 0) start_one();  // every thread busy: one more for the next request
      }
      fuse_session_process_buf(session_, &b.buf);
      MutexLock lock(mutex_);
      idle_++;
    }
    const uint64_t one = 1;
    (void)!::write(ended_fd_, &one, sizeof one);
  }

  // libfuse could not allocate this thread's buffer (at its first request; the process near an
  // address-space limit): memory is given back and it tries again in a while. False once that has
  // gone on for kNoBufferFor.
  bool wait_for_buffer(std::chrono::steady_clock::time_point& since) EXCLUDES(mutex_) {
    const auto now = std::chrono::steady_clock::now();
    if (since == std::chrono::steady_clock::time_point{}) {
      since = now;
      MutexLock lock(mutex_);
      without_buffer_++;
    }
    if (now - since > kNoBufferFor) return false;
    low_on_memory_();
    int state;
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &state);
    ::usleep(100'000);
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    return true;
  }

  // After kNoBufferFor without a buffer: true if other threads have theirs (this one ends, the others
  // serve), false if none has (the mount ends).
  bool without_buffer_gives_up() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (without_buffer_ >= threads_.size()) return false;
    without_buffer_--;
    idle_--;  // (it ends: no longer waiting for a request)
    return true;
  }

  static constexpr std::chrono::seconds kNoBufferFor{30};
  fuse_session* const session_;
  const int ended_fd_;
  const std::function<void()>& low_on_memory_;
  std::atomic<int> error_{0};
  mutable Mutex mutex_;
  std::vector<pthread_t> threads_ GUARDED_BY(mutex_);  // started, not joined
  unsigned idle_ GUARDED_BY(mutex_) = 0;               // waiting for a request (or about to)
  unsigned without_buffer_ GUARDED_BY(mutex_) = 0;     // whose buffer libfuse could not allocate
  int start_error_ GUARDED_BY(mutex_) = 0;
  bool stopping_ GUARDED_BY(mutex_) = false;
};

// Closes the connection at descriptor `fd` and leaves there a descriptor that polls POLLERR.
void end_connection_quietly(int fd) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return;
  ::close(ends[0]);
  if (::dup2(ends[1], fd) < 0) log_warning(std::string("cannot close the FUSE connection: ") + std::strerror(errno));
  ::close(ends[1]);
}

// The descriptors this process has open, in ascending order.
std::vector<int> open_descriptors() {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return fds;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') fds.push_back(std::atoi(e->d_name));
  ::closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

// The socket's inode number if `fd` is one end of a Unix stream socket pair this process made, else 0.
// `fd` may be another thread's,
// opened or closed meanwhile (the stager's, MPI's): it is named through /proc and asked with bare system
// calls, which read only what kind of descriptor it is (ThreadSanitizer would take the libc calls for a
// race on the descriptor with the thread that closes it, and halt).
uint64_t own_socket_pair_end(int fd) {
  char link[64];
  const std::string at = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(at.c_str(), link, sizeof link - 1);
  if (n < 8 || std::memcmp(link, "socket:[", 8) != 0) return 0;
  link[n] = '\0';
  const uint64_t inode = std::strtoull(link + 8, nullptr, 10);
  auto option = [fd](int name, void* value, socklen_t size) {
    return ::syscall(SYS_getsockopt, fd, SOL_SOCKET, name, value, &size) == 0;
  };
  int domain = 0, type = 0;
  ucred peer{};
  const bool own = option(SO_DOMAIN, &domain, sizeof domain) && domain == AF_UNIX &&
                   option(SO_TYPE, &type, sizeof type) && type == SOCK_STREAM &&
                   option(SO_PEERCRED, &peer, sizeof peer) && peer.pid == ::getpid();
  return own ? inode : 0;
}

// The inode numbers of the socket pair ends this process holds, sorted. By inode, not by descriptor
// number: another thread (the attribute fill, the stager) may close a descriptor and the mount's socket
// take its number meanwhile, which then looked as if it had been there before (1 daemon in 20 had no
// keeper in a CI run).
std::vector<uint64_t> own_socket_pairs() {
  std::vector<uint64_t> inodes;
  for (int fd : open_descriptors())
    if (const uint64_t inode = own_socket_pair_end(fd)) inodes.push_back(inode);
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

// Where the keeper finds the daemon's pidfd: after the socket (its stdin), stdout and stderr.
constexpr int kKeeperPidfd = 3;

// With auto_unmount, fusermount3 stays behind, waits for the daemon's end of a socket pair to close,
// and then unmounts if the mount answers ENOTCONN. A process that dies closes its descriptors one at a
// time, though, and the kernel releases the socket before the FUSE connection when the socket's number
// is the higher (as libfuse leaves them): fusermount3 may then look while the connection still stands,
// its open fails with ECONNABORTED, not ENOTCONN, and the dead mount stays (1 daemon death in 12 under
// mpiexec on a busy 2-core machine). So a keeper process holds a copy of the socket until the daemon
// has wholly exited — every descriptor released, the connection with them — and fusermount3 looks only
// then. Finds the socket the mount made (`before`: the socket pairs held before it, own_socket_pairs)
// and starts the keeper; says so and goes on without one when it cannot.
void start_unmount_keeper(const std::vector<uint64_t>& before, int connection, const std::string& mountpoint) {
  int socket = -1;
  int found = 0;
  for (int fd : open_descriptors()) {
    if (fd == connection) continue;
    const uint64_t inode = own_socket_pair_end(fd);
    if (inode != 0 && !std::binary_search(before.begin(), before.end(), inode)) {
      socket = fd;
      ++found;
    }
  }
  if (found != 1) {
    log_warning("auto_unmount: cannot tell fusermount3's socket among " + std::to_string(found) +
                " candidates; a daemon killed may leave its mount dead (clairfs cleanup removes it)");
    return;
  }
  ::fcntl(socket, F_SETFD, FD_CLOEXEC);  // no other child holds it
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));  // (close-on-exec, as every pidfd)
  if (pidfd < 0) {
    log_warning(std::string("auto_unmount: cannot open a pidfd for the keeper of fusermount3's socket: ") +
                std::strerror(errno) + "; a daemon killed may leave its mount dead (clairfs cleanup removes it)");
    return;
  }
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attributes;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_adddup2(&files, socket, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&files, pidfd, kKeeperPidfd);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&files, kKeeperPidfd + 1);
  posix_spawnattr_init(&attributes);
  // A session of its own (a launcher that kills its job's process groups leaves it), every signal held.
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  std::string name = "clairfs-keeper";
  std::string command = kUnmountKeeperCommand;
  std::string self = std::to_string(::getpid());
  std::string path = mountpoint;
  char* argv[] = {name.data(), command.data(), self.data(), path.data(), nullptr};
  pid_t keeper = -1;
  const int rc = posix_spawn(&keeper, "/proc/self/exe", &files, &attributes, argv, environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&files);
  ::close(pidfd);
  if (rc != 0)
    log_warning(std::string("auto_unmount: cannot start the keeper of fusermount3's socket: ") + std::strerror(rc) +
                "; a daemon killed may leave its mount dead (clairfs cleanup removes it)");
}

}  // namespace

int run_unmount_keeper(int argc, char** /*argv*/) {
  if (argc < 3) return 2;
  ::prctl(PR_SET_NAME, "clairfs-keeper");
  // The daemon's pidfd, opened by the daemon and left at kKeeperPidfd: readable once every thread of it
  // has exited, each descriptor with them. (Opened here from the daemon's PID, a keeper still starting
  // when the daemon was killed could open it late — its parent then already another process once the
  // thread that started it had exited, the others perhaps still closing the connection — and went at once:
  // fusermount3 could then look too early.)
  pollfd gone{kKeeperPidfd, POLLIN, 0};
  while (::poll(&gone, 1, -1) < 0 && errno == EINTR) {
  }
  return 0;
}

MountedSession::MountedSession(const Options& o, Frontend& frontend, FusePageCache* page_cache)
    : page_cache_(page_cache) {
  try {
    start(o, frontend);
  } catch (...) {
    stop();
    throw;
  }
}

void MountedSession::start(const Options& o, Frontend& frontend) {
  // nosuid, nodev: a setuid file or a device node in SOURCE is data here, whoever mounts it and however.
  std::string mount_opts = "ro,nosuid,nodev,subtype=clairfs,fsname=" + escape(o.fsname);
  if (o.allow_other) mount_opts += ",allow_other";
  if (o.default_permissions) mount_opts += ",default_permissions";
  if (o.auto_unmount) mount_opts += ",auto_unmount";
  for (const auto& flag : o.mount_flags) mount_opts += "," + flag;

  std::vector<std::string> argv = {"clairfs", "-o", mount_opts};
  if (o.debug) argv.push_back("-d");
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  fuse_set_log_func(forward_fuse_log);
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(cargv.size()), cargv.data());
  session_ = fuse_session_new(&args, &Frontend::ops(), sizeof(fuse_lowlevel_ops), &frontend);
  fuse_opt_free_args(&args);
  if (!session_) throw std::runtime_error("cannot create the FUSE session (see the message above)");
  // (For SIGPIPE ignored: its handlers of the ending signals never run, serve() reads those.)
  if (fuse_set_signal_handlers(session_) != 0) throw std::runtime_error("cannot install signal handlers");
  signals_set_ = true;
  const std::vector<uint64_t> before = o.auto_unmount ? own_socket_pairs() : std::vector<uint64_t>{};
  if (fuse_session_mount(session_, o.mountpoint_abs.c_str()) != 0)
    throw std::runtime_error("cannot mount at '" + o.mountpoint + "' (is /dev/fuse usable? see the message above)");
  mounted_ = true;
  close_connection_on_crash(fuse_session_fd(session_));
  if (o.auto_unmount) start_unmount_keeper(before, fuse_session_fd(session_), o.mountpoint_abs);
  mountpoint_ = o.mountpoint_abs;
  std::string device;
  if (const auto m = mount_at(mountpoint_); m && m->fstype == "fuse.clairfs") mount_id_ = m->id, device = m->device;
  answer_init();
  widen_readahead(device);
  if (page_cache_) page_cache_->attach(session_);
}

void MountedSession::answer_init() {
  // The kernel queued INIT as the mount was made, and sends nothing else before its answer: answered
  // here, before the loop starts, so that what is set after it (the readahead window) stays.
  fuse_buf buf{};
  int n;
  while ((n = fuse_session_receive_buf(session_, &buf)) == -EINTR) {
  }
  if (n > 0) fuse_session_process_buf(session_, &buf);
  std::free(buf.mem);
}

MountedSession::~MountedSession() { stop(); }

void MountedSession::stop() {
  if (!session_) return;
  if (page_cache_) page_cache_->detach();  // waits for a push in progress
  keep_connection_on_crash();              // (the descriptor goes below)
  if (mounted_) {
    // libfuse unmounts by closing the connection first and then unmounting the path: in between every
    // access (a reader, `clairfs status --watch`) fails with ENOTCONN as if the daemon had died, and as
    // root it unmounts whatever the path names by then. So the mount this session made is detached
    // first, by its id through a descriptor; then the connection is closed by putting in its place a
    // descriptor that polls as an ended connection (a pipe's write end with no reader), which tells
    // libfuse that the mount is gone already.
    if (detach_mount_by_id(mountpoint_, mount_id_)) end_connection_quietly(fuse_session_fd(session_));
    fuse_session_unmount(session_);
  }
  if (signals_set_) fuse_remove_signal_handlers(session_);
  fuse_session_destroy(session_);
  session_ = nullptr;
}

int MountedSession::serve(const sigset_t& ending, const std::function<void()>& low_on_memory) {
  // Every thread blocks the ending signals (cli.cpp): they are read here, as the workers' ends are.
  const UniqueFd signals(::signalfd(-1, &ending, SFD_CLOEXEC | SFD_NONBLOCK));
  const UniqueFd ended(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!signals || !ended) {
    log_error(std::string("cannot start serving: ") + std::strerror(errno));
    return -EIO;
  }
  ServingThreads threads(session_, ended.get(), low_on_memory);
  if (threads.started() == 0) {
    log_error("cannot start a thread to serve the mount: " + std::string(std::strerror(threads.start_error())));
    return -EIO;
  }
  int rc = 0;
  for (;;) {
    pollfd fds[2] = {{signals.get(), POLLIN, 0}, {ended.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    signalfd_siginfo info{};
    if (::read(signals.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      log_notice(std::string("stopped by SIG") + sigabbrev_np(static_cast<int>(info.ssi_signo)) + "; unmounting");
      fuse_session_exit(session_);
      break;
    }
    uint64_t count;
    (void)!::read(ended.get(), &count, sizeof count);
    if (fuse_session_exited(session_)) {
      rc = threads.error();
      break;
    }
  }
  threads.stop();
  return rc;
}

}  // namespace clairfs
