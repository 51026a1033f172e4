// One-line diagnostics. In the foreground they go to stderr; once the daemon has detached they go to
// syslog (facility daemon, ident "clairfs"), since nobody is left to read its stderr.
#pragma once

#include <string>

namespace clairfs {

enum class LogLevel { kInfo, kWarning, kError };

void log_line(LogLevel level, const std::string& message);
inline void log_info(const std::string& m) { log_line(LogLevel::kInfo, m); }
inline void log_warning(const std::string& m) { log_line(LogLevel::kWarning, m); }
inline void log_error(const std::string& m) { log_line(LogLevel::kError, m); }

// Names where the lines come from, "clairfs[ORIGIN]: ...": under a launcher, the node and host, since the
// job sees every node's lines mixed in one stream. REQUIRES: called before a second thread logs.
void set_log_origin(const std::string& origin);

// Switch to syslog (called after the daemon detaches from its terminal).
void log_to_syslog();

}  // namespace clairfs
