#include "util/log.hpp"

#include <syslog.h>

#include <atomic>
#include <cstdio>

namespace clairfs {

namespace {
std::atomic<bool> g_syslog{false};
}

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
  const char* tag = level == LogLevel::kError ? "error: " : level == LogLevel::kWarning ? "warning: " : "";
  std::fprintf(stderr, "clairfs: %s%s\n", tag, message.c_str());
}

}  // namespace clairfs
