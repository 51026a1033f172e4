#include "engine/trace.hpp"

#include "util/text.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace clairfs {

TraceEngine::TraceEngine(Engine& inner, const Manifest& manifest, const std::string& file)
    : inner_(inner), manifest_(manifest), fd_(::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
  if (!fd_) throw std::runtime_error("trace '" + file + "': " + std::strerror(errno));
}

int TraceEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  const int rc = inner_.open(id, pid, handle);
  if (rc == 0) {
    std::string line = std::to_string(pid) + " ";
    append_escaped_line(line, manifest_.path(id));
    (void)!::write(fd_.get(), line.data(), line.size());
  }
  return rc;
}

}  // namespace clairfs
