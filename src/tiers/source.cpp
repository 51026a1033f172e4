#include "tiers/source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "io/io_loop.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

struct OpenSourceFile {
  UniqueFd fd;
  EntryId id;
};

}  // namespace

SourceTier::SourceTier(const Manifest& manifest, const std::string& source)
    : manifest_(manifest), root_(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (!root_) throw std::runtime_error("cannot open SOURCE '" + source + "': " + std::strerror(errno));
}

int SourceTier::open_verified(EntryId id) {
  // Attributes not known yet (a scan that left them for later): the kernel asks for them before any
  // open, so this one is seldom the first; known now, or the file is gone.
  if (!manifest_.ensure(id)) {
    counters_.changed++;
    log_warning("'" + manifest_.path(id) + "' is gone from SOURCE or was replaced; read refused (EIO)");
    return -EIO;
  }
  // O_NONBLOCK: a FIFO put in the file's place must not hold this thread (verify() refuses it).
  int fd = open_beneath(root_.get(), manifest_.components(id), O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    // ENXIO: a socket in the file's place.
    if (fd == -ENOENT || fd == -ELOOP || fd == -EXDEV || fd == -ENOTDIR || fd == -ENXIO) {
      counters_.changed++;
      log_warning("'" + manifest_.path(id) + "' is gone from SOURCE or was replaced; read refused (EIO)");
    } else {
      counters_.errors++;
      log_warning("cannot open '" + manifest_.path(id) + "' in SOURCE: " + std::strerror(-fd));
    }
    return fd == -EACCES || fd == -EPERM ? fd : -EIO;
  }
  UniqueFd owned(fd);
  if (const int rc = verify(id, fd); rc < 0) return rc;
  if (make_blocking(fd) < 0) {
    counters_.errors++;
    return -EIO;
  }
  return owned.release();
}

int SourceTier::verify(EntryId id, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    counters_.errors++;
    return -EIO;
  }
  if (std::string why = difference(manifest_.entry(id), st); !why.empty()) {
    counters_.changed++;
    log_warning("'" + manifest_.path(id) + "' " + why + "; read refused (EIO)");
    return -EIO;
  }
  return 0;
}

int SourceTier::open(EntryId id, pid_t /*pid*/, uint64_t* handle) {
  const int fd = open_verified(id);
  if (fd < 0) return fd;
  counters_.opens++;
  *handle = reinterpret_cast<uint64_t>(new OpenSourceFile{UniqueFd(fd), id});
  return 0;
}

ssize_t SourceTier::read(uint64_t handle, char* buf, size_t size, off_t offset) {
  auto* file = reinterpret_cast<OpenSourceFile*>(handle);
  return read_at(file->id, file->fd.get(), buf, size, offset);
}

ssize_t SourceTier::read_unopened(EntryId id, pid_t /*pid*/, char* buf, size_t size, off_t offset) {
  const int fd = open_verified(id);
  if (fd < 0) return fd;
  UniqueFd file(fd);
  if (offset == 0) counters_.opens++;
  return read_at(id, fd, buf, size, offset);
}

ssize_t SourceTier::read_at(EntryId id, int fd, char* buf, size_t size, off_t offset) {
  const uint64_t file_size = manifest_.entry(id).size;
  if (static_cast<uint64_t>(offset) >= file_size) return 0;
  size = static_cast<size_t>(std::min<uint64_t>(size, file_size - static_cast<uint64_t>(offset)));
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, buf + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      counters_.errors++;
      return -EIO;
    }
    if (n == 0) {
      // Shorter than the manifest says: the file was truncated under us. Never pad with zeros.
      counters_.changed++;
      log_warning("'" + manifest_.path(id) + "' shrank in SOURCE during the run; read refused (EIO)");
      return -EIO;
    }
    done += static_cast<size_t>(n);
  }
  // Changed while we read? Then these bytes may be part old, part new: refused, never served.
  if (verify(id, fd) < 0) return -EIO;
  counters_.bytes += done;
  return static_cast<ssize_t>(done);
}

void SourceTier::release(uint64_t handle) { delete reinterpret_cast<OpenSourceFile*>(handle); }

int SourceTier::fetch(EntryId id, const Buffer& buf) {
  const int fd = open_verified(id);
  if (fd < 0) return fd;
  UniqueFd file(fd);
  const ssize_t done = pread_full(fd, buf->data(), buf->size(), 0);
  if (done != static_cast<ssize_t>(buf->size())) {
    log_warning("'" + manifest_.path(id) + "' read " + std::to_string(done) + " of " + std::to_string(buf->size()) +
                " bytes from SOURCE: changed since the scan");
    return -EIO;
  }
  return verify(id, fd) < 0 ? -EIO : 0;  // changed while we read: maybe a mix, never served
}

void SourceTier::start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) {
  std::string path = manifest_.path(id);
  if (path.size() + 1 >= PATH_MAX) {  // too long for one openat2: walked down synchronously
    const int fd = open_verified(id);
    if (fd < 0) return done(fd);
    return start_read(io, id, std::make_shared<UniqueFd>(fd), std::move(buf), std::move(done));
  }
  io.open(root_.get(), std::move(path), [this, &io, id, buf, done](int64_t opened) {
    if (opened < 0) {
      log_warning("cannot stage '" + manifest_.path(id) + "': " + std::strerror(static_cast<int>(-opened)));
      return done(static_cast<int>(opened));
    }
    auto fd = std::make_shared<UniqueFd>(static_cast<int>(opened));  // opened O_NONBLOCK (see Ring)
    if (verify(id, fd->get()) < 0 || make_blocking(fd->get()) < 0) return done(-EIO);
    start_read(io, id, std::move(fd), buf, done);
  });
}

void SourceTier::start_read(IoLoop& io, EntryId id, std::shared_ptr<UniqueFd> fd, Buffer buf, Done done) {
  if (buf->empty()) return done(0);
  const int raw = fd->get();
  io.read(raw, buf->data(), buf->size(), [this, id, fd, buf, done](int64_t result) {
    if (result != static_cast<int64_t>(buf->size())) {
      // Short (the file shrank) or failed: never stage bytes that disagree with the manifest.
      log_warning("staging '" + manifest_.path(id) + "' read " + std::to_string(result) + " of " +
                  std::to_string(buf->size()) + " bytes; left to SOURCE");
      return done(-EIO);
    }
    done(verify(id, fd->get()) < 0 ? -EIO : 0);  // changed while it was read: the bytes may mix old and new
  });
}

EngineStats SourceTier::stats() const {
  EngineStats s;
  s.staging = false;
  s.tier(Origin::kSource) = {counters_.opens.load(), counters_.bytes.load()};
  s.source_changed = counters_.changed.load();
  s.source_errors = counters_.errors.load();
  return s;
}

std::string SourceTier::spot_check(size_t samples) const {
  const size_t n = manifest_.size();
  const size_t step = std::max<size_t>(1, n / std::max<size_t>(1, samples));
  for (size_t i = 0; i < n; i += step) {
    const EntryId id = static_cast<EntryId>(i);
    const std::string rel = id == 0 ? "." : manifest_.path(id);
    // Through open_beneath (O_PATH: no rights needed, a symlink itself): paths beyond PATH_MAX too.
    const int fd = open_beneath(root_.get(), manifest_.components(id), O_PATH);
    if (fd < 0) return "'" + rel + "' is missing from SOURCE";
    UniqueFd held(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return "'" + rel + "' cannot be examined in SOURCE";
    if (std::string why = difference(manifest_.entry(id), st); !why.empty()) return "'" + rel + "' " + why;
  }
  return "";
}

}  // namespace clairfs
