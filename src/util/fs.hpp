// File-system helpers shared by the scanner and the source reader, and the way the daemon and its tools
// write files on paths a user may have a say in (log=, trace=, metrics_file=, an index).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace clairfs {

// An owned file descriptor; closes on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// openat2(dir_fd, path) with `resolve` (RESOLVE_* flags), close-on-exec, tried again on EINTR and, up to
// kOpenEagainTries times, on EAGAIN: the fd, or -errno.
int open_resolved(int dir_fd, const char* path, int flags, uint64_t resolve);

// Opens the path made of `components` under the directory `root_fd` without following any symlink and
// without leaving root_fd (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), one component at a time when
// the joined path would exceed PATH_MAX. Returns the fd, or -errno.
int open_beneath(int root_fd, const std::vector<std::string_view>& components, int flags);
// How often an open beneath a root that fails with EAGAIN is tried (open_beneath, and the io_uring
// opens): the kernel could not rule out an escape through a concurrent rename; with O_NONBLOCK, a lease
// another process holds, which is not waited for.
constexpr unsigned kOpenEagainTries = 64;

// Opening a SOURCE file that someone replaced with a FIFO (or a device) must not block: such files are
// opened O_NONBLOCK, their kind checked with fstat, and only then made blocking again (make_blocking): a
// read of a regular file through io_uring with O_NONBLOCK set fails with EAGAIN where the page cache
// misses. make_blocking returns 0 or -errno.
int make_blocking(int fd);

// The extended attribute `name` of the regular file or directory at `components` beneath root_fd, into
// *out: its size, or -errno (-ENODATA: it has none, or the entry is of another kind, a symlink say).
// The file's attributes as it was read go to *st when given (st_mode 0 if it could not be opened).
ssize_t xattr_beneath(int root_fd, const std::vector<std::string_view>& components, const char* name, std::string* out,
                      struct stat* st = nullptr);

// Files written where a user may have planted something. Run as root, no symlink is followed anywhere
// in the path (openat2 RESOLVE_NO_SYMLINKS: a user who can write a parent directory could swap it for a
// link); otherwise never the last name. Only a regular file with a single link is written to (a hard
// link to another file, a FIFO or a device in its place is refused), and opening never blocks.
//
// The directory that holds `path`, opened O_PATH, its last name in *name: the fd, or -errno (-ELOOP: a
// symlink in the path).
int open_parent_dir(const std::string& path, std::string* name);
// Opens `path` to append to it, created with `mode` if missing: the fd (blocking, close-on-exec), or -errno.
int open_for_append(const std::string& path, mode_t mode);
// Why a file could not be opened or written, from -errno: strerror's words, but a symlink (-ELOOP), a file
// of another kind (-EINVAL) and one with other hard links (-EMLINK) said as such.
std::string why_not_written(int rc);

// A file written whole, then put in place: bytes go to a temporary beside `path` (a fresh random name,
// O_EXCL, never a name that was there before), which commit() renames over `path`. Not committed, the
// temporary is removed.
class ReplacingFile {
 public:
  // -errno in error() when the temporary could not be made.
  ReplacingFile(const std::string& path, mode_t mode);
  ~ReplacingFile();
  ReplacingFile(const ReplacingFile&) = delete;
  ReplacingFile& operator=(const ReplacingFile&) = delete;
  int fd() const { return fd_.get(); }
  int error() const { return error_; }
  // fsync (when `sync`), close and rename over the path: 0 or -errno.
  int commit(bool sync);

 private:
  UniqueFd dir_;
  UniqueFd fd_;
  std::string name_, tmp_;
  int error_ = 0;
};

// Reads up to `size` bytes at `offset`, going on after short reads and EINTR: the bytes read (fewer
// only at end of file), or -errno.
ssize_t pread_full(int fd, char* buf, size_t size, off_t offset);

}  // namespace clairfs
