// One-line diagnostics, and where they go.
//
// Before the daemon detaches (and always in the foreground, -f, or under a launcher) lines go to stderr.
// Once it detaches they go where `log=` says: syslog (facility daemon, ident "clairfs"), a FILE, or
// stderr (kept open: for a supervisor that captures it). Without `log=`: syslog when the node has one
// (/dev/log accepts a connection), else the file default_log_file() names — a node without syslog loses
// no line. Lines of the daemon's life (after the mount is up) carry a UTC timestamp on stderr and in
// files; syslog adds its own. A line the same as the one before, within a minute, is not repeated: the
// count is said with the next different line or at exit ("the last line came N more times").
//
// Levels: debug < info < warning < error; `log_level=` drops what is below it. Errors and notices (the
// daemon's life: mounted, stopped and why) always go.
//
// Thread-safe: every thread may log; configuration (set_log_*) happens at start-up, before other threads.
#pragma once

#include <string>
#include <thread>

#include "util/fs.hpp"

namespace clairfs {

// kNotice: the daemon's life (mounted, stopped and why): written whatever log_level= says.
enum class LogLevel { kDebug, kInfo, kWarning, kNotice, kError };

void log_line(LogLevel level, const std::string& message);
inline void log_debug(const std::string& m) { log_line(LogLevel::kDebug, m); }
inline void log_info(const std::string& m) { log_line(LogLevel::kInfo, m); }
inline void log_warning(const std::string& m) { log_line(LogLevel::kWarning, m); }
inline void log_notice(const std::string& m) { log_line(LogLevel::kNotice, m); }
inline void log_error(const std::string& m) { log_line(LogLevel::kError, m); }

// Names where the lines come from, "clairfs[ORIGIN]: ...": under a launcher, the node and host, since the
// job sees every node's lines mixed in one stream.
void set_log_origin(const std::string& origin);
// Lines below `level` are dropped.
void set_log_level(LogLevel level);
// Whether lines at `level` are written: a debug line costly to make is made only then.
bool log_enabled(LogLevel level);

// Where lines go once the daemon detaches: "syslog", "stderr", or a file path; "" for the default.
// Returns a one-line reason when it cannot be used (a file that cannot be opened for appending), "" if
// it can. Does not switch yet.
std::string set_log_target(const std::string& target, const std::string& mountpoint);
// Switches to the target (the daemon detached from its terminal).
void log_detached();
// From here on lines carry timestamps (the mount is up: the daemon's life, not the command's words).
void log_serving();
// Where lines go now, as the stats show it ("syslog", "stderr" or the file's path).
std::string log_destination();
// Says a pending count of repeated lines (at exit).
void log_flush();

// Opens the log file again at its path, for lines to go to a new file once the old one was renamed (log
// rotation), and says so in it; nothing to do for syslog or stderr. When the path cannot be opened the
// lines go on to the old file, and a warning there says why.
void log_reopen();

// Reopens the log (log_reopen) each time the process gets SIGHUP, on a thread of its own, while it lives:
// the convention of daemons, and what a logrotate postrotate step sends. REQUIRES: every thread blocks
// SIGHUP (cli.cpp's held_signals()), so that it reaches only this listener and never ends the process.
class LogReopener {
 public:
  LogReopener();
  ~LogReopener();
  LogReopener(const LogReopener&) = delete;
  LogReopener& operator=(const LogReopener&) = delete;

 private:
  void run();
  UniqueFd signals_;  // a signalfd for SIGHUP
  UniqueFd stop_;     // an eventfd: written to stop the thread
  std::thread thread_;
};

// The file a mount of `mountpoint` logs to when the node has no syslog and log= is not given, in a folder
// no other user can make first: /var/log/clairfs/ for root, $XDG_STATE_HOME/clairfs/ (default
// ~/.local/state/clairfs/) for a user, /var/tmp/clairfs-UID/ for one without a HOME; the mount point's
// '/' written as '-' ("/mnt/train" -> "mnt-train.log").
std::string default_log_file(const std::string& mountpoint);
// True when syslog can be reached here (a socket at /dev/log that accepts a connection).
bool syslog_reachable();

}  // namespace clairfs
