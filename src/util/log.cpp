#include "util/log.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "util/fs.hpp"
#include "util/text.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

namespace {

using Clock = std::chrono::steady_clock;

// The same line again within this long is counted, not written.
constexpr auto kFoldFor = std::chrono::seconds(60);

enum class Kind { kStderr, kSyslog, kFile };

struct Sink {
  Kind kind = Kind::kStderr;
  int fd = STDERR_FILENO;
  std::string path;
};

Mutex g_mutex;
std::string g_name = "clairfs";  // written at start-up, before other threads
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
Sink g_target GUARDED_BY(g_mutex);  // after log_detached()
Sink g_now GUARDED_BY(g_mutex);     // where lines go now
bool g_stamps GUARDED_BY(g_mutex) = false;
std::string g_last GUARDED_BY(g_mutex);  // the last line written, its level and when
LogLevel g_last_level GUARDED_BY(g_mutex) = LogLevel::kInfo;
Clock::time_point g_last_at GUARDED_BY(g_mutex);
size_t g_repeats GUARDED_BY(g_mutex) = 0;  // the same line since, not written
// Warnings and errors said on stderr before the daemon detached: written to its log too once it does
// (a warning at start-up, say of an nvme_size= beyond the disk, would otherwise reach only the terminal
// that ran the mount). At most kEarlyLines.
constexpr size_t kEarlyLines = 64;
std::vector<std::pair<LogLevel, std::string>> g_early GUARDED_BY(g_mutex);
bool g_detached GUARDED_BY(g_mutex) = false;

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

void write_line(LogLevel level, const std::string& message) REQUIRES(g_mutex) {
  if (g_now.kind == Kind::kSyslog) {
    const int priority = level == LogLevel::kError     ? LOG_ERR
                         : level == LogLevel::kNotice  ? LOG_NOTICE
                         : level == LogLevel::kWarning ? LOG_WARNING
                         : level == LogLevel::kInfo    ? LOG_INFO
                                                       : LOG_DEBUG;
    ::syslog(priority, "%s", message.c_str());
    return;
  }
  // An error is the one line a command ends with ("clairfs: MOUNTPOINT ... is not a directory"): untagged.
  const char* tag = level == LogLevel::kWarning ? "warning: " : level == LogLevel::kDebug ? "debug: " : "";
  std::string line = g_stamps || g_now.kind == Kind::kFile ? utc_now() + " " : "";
  line += g_name + ": " + tag + message + "\n";
  // One write: lines of several threads (and, in a shared file, several daemons) do not mix.
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(g_now.fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void flush_repeats() REQUIRES(g_mutex) {
  if (g_repeats == 0) return;
  const size_t n = g_repeats;
  g_repeats = 0;
  write_line(g_last_level, "the last line came " + std::to_string(n) + " more time" + (n == 1 ? "" : "s"));
}

bool connects(int type) {
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, "/dev/log", sizeof addr.sun_path - 1);
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Opens a log file for appending; "" or why not.
std::string open_file(const std::string& path, Sink& sink) {
  const int fd = open_for_append(path, 0640);
  if (fd < 0) return "cannot log to '" + path + "': " + why_not_written(fd);
  sink = Sink{Kind::kFile, fd, path};
  return "";
}

}  // namespace

void set_log_origin(const std::string& origin) { g_name = "clairfs[" + origin + "]"; }

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

bool log_enabled(LogLevel level) {
  return level >= LogLevel::kNotice || static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

bool syslog_reachable() { return connects(SOCK_DGRAM) || connects(SOCK_STREAM); }

std::string default_log_file(const std::string& mountpoint) {
  std::string name;
  for (char c : mountpoint) name += c == '/' ? '-' : c;
  while (!name.empty() && name.front() == '-') name.erase(name.begin());
  if (name.empty()) name = "root";
  if (::geteuid() == 0) return "/var/log/clairfs/" + name + ".log";
  const char* state = std::getenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  if (state && state[0] == '/') return std::string(state) + "/clairfs/" + name + ".log";
  if (home && home[0] == '/') return std::string(home) + "/.local/state/clairfs/" + name + ".log";
  return "/var/tmp/clairfs-" + std::to_string(::getuid()) + "/" + name + ".log";
}

std::string set_log_target(const std::string& target, const std::string& mountpoint) {
  MutexLock lock(g_mutex);
  if (target == "stderr") {
    g_target = Sink{};
    return "";
  }
  if (target == "syslog") {
    if (!syslog_reachable()) return "log=syslog: this node has no syslog (nothing answers at /dev/log); give log=FILE";
    g_target = Sink{Kind::kSyslog, -1, ""};
    return "";
  }
  if (target.empty()) {
    if (syslog_reachable()) {
      g_target = Sink{Kind::kSyslog, -1, ""};
      return "";
    }
    // No syslog here: the documented file, in a folder of the user's own.
    const std::string path = default_log_file(mountpoint);
    const std::string dir = path.substr(0, path.rfind('/'));
    std::error_code ec;
    std::filesystem::create_directories(dir.substr(0, dir.rfind('/')), ec);  // ~/.local/state, say
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "cannot make '" + dir + "' for the log: " + std::strerror(errno);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      return "'" + dir + "' (for the log: this node has no syslog) is not a folder of this user's; give log=FILE";
    return open_file(path, g_target);
  }
  if (target[0] != '/') return "log=" + target + ": give syslog, stderr or an absolute path";
  return open_file(target, g_target);
}

void log_detached() {
  MutexLock lock(g_mutex);
  flush_repeats();
  if (g_target.kind == Kind::kSyslog) ::openlog("clairfs", LOG_PID, LOG_DAEMON);
  g_now = g_target;
  g_detached = true;
  if (g_now.kind != Kind::kStderr)
    for (const auto& [level, message] : g_early) write_line(level, "said at start-up: " + message);
  g_early.clear();
  g_early.shrink_to_fit();
}

void log_serving() {
  MutexLock lock(g_mutex);
  g_stamps = true;
}

std::string log_destination() {
  MutexLock lock(g_mutex);
  return g_now.kind == Kind::kSyslog ? "syslog" : g_now.kind == Kind::kFile ? g_now.path : "stderr";
}

void log_flush() {
  MutexLock lock(g_mutex);
  flush_repeats();
}

void log_reopen() {
  std::string why;
  bool failed = false;
  {
    MutexLock lock(g_mutex);
    if (g_now.kind != Kind::kFile) {
      why =
          "SIGHUP: the log (" + std::string(g_now.kind == Kind::kSyslog ? "syslog" : "stderr") + ") needs no reopening";
    } else {
      flush_repeats();
      const int fd = open_for_append(g_now.path, 0640);
      if (fd < 0) {
        why = "SIGHUP: cannot open the log '" + g_now.path + "' again (" + why_not_written(fd) + "): lines go on here";
        failed = true;
      } else {
        // Onto the same number: threads writing meanwhile go to one file or the other, never to a closed one.
        ::dup3(fd, g_now.fd, O_CLOEXEC);
        ::close(fd);
      }
    }
  }
  log_line(failed ? LogLevel::kWarning : LogLevel::kInfo,
           why.empty() ? "SIGHUP: the log file opened again at its path" : why);
}

LogReopener::LogReopener() {
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  signals_ = UniqueFd(::signalfd(-1, &hup, SFD_CLOEXEC | SFD_NONBLOCK));
  stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!signals_ || !stop_) {
    log_warning(std::string("SIGHUP will not reopen the log: ") + std::strerror(errno));
    return;
  }
  thread_ = std::thread([this] { run(); });
}

LogReopener::~LogReopener() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof one);
  thread_.join();
}

void LogReopener::run() {
  pollfd fds[2] = {{signals_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    signalfd_siginfo info{};
    bool hup = false;
    while (::read(signals_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) hup = true;
    if (hup) log_reopen();
  }
}

void log_line(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  MutexLock lock(g_mutex);
  const auto now = Clock::now();
  if (message == g_last && level == g_last_level && now - g_last_at < kFoldFor) {
    ++g_repeats;
    return;
  }
  flush_repeats();
  const std::string line = escape_controls(message);  // names from SOURCE may hold newlines and escapes
  write_line(level, line);
  if (!g_detached && level >= LogLevel::kWarning && level != LogLevel::kNotice && g_early.size() < kEarlyLines)
    g_early.emplace_back(level, line);
  g_last = message;
  g_last_level = level;
  g_last_at = now;
}

}  // namespace clairfs
