#include "util/log.hpp"

#include <syslog.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace clairfs {

namespace {
std::atomic<bool> g_syslog{false};
std::string g_name = "clairfs";  // written once at start-up, before other threads (set_log_origin)
}  // namespace

void set_log_origin(const std::string& origin) { g_name = "clairfs[" + origin + "]"; }

void log_to_syslog() {
  ::openlog("clairfs", LOG_PID, LOG_DAEMON);
  g_syslog = true;
}

void log_line(LogLevel level, const std::string& message) {
  if (g_syslog) {
    const int priority = level == LogLevel::kError ? LOG_ERR : level == LogLevel::kWarning ? LOG_WARNING : LOG_INFO;
    ::syslog(priority, "%s", message.c_str());
    return;
  }
  // An error is the one line a command ends with ("clairfs: MOUNTPOINT ... is not a directory"): untagged.
  const char* tag = level == LogLevel::kWarning ? "warning: " : "";
  std::fprintf(stderr, "%s: %s%s\n", g_name.c_str(), tag, message.c_str());
}

}  // namespace clairfs
