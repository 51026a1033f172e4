#include "engine/trace.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "util/fs.hpp"
#include "util/text.hpp"

namespace clairfs {

TraceEngine::TraceEngine(Engine& inner, const Manifest& manifest, const std::string& file)
    : inner_(inner), manifest_(manifest) {
  // 0600: the trace names every file read.
  const int fd = open_for_append(file, 0600);
  if (fd < 0) throw std::runtime_error("trace '" + file + "': " + why_not_written(fd));
  fd_ = UniqueFd(fd);
}

EngineStats TraceEngine::stats() const { return inner_.stats(); }

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
