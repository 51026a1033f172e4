// File-system helpers shared by the scanner and the source reader.
#pragma once

#include <sys/types.h>

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
ssize_t xattr_beneath(int root_fd, const std::vector<std::string_view>& components, const char* name, std::string* out);

// Reads up to `size` bytes at `offset`, going on after short reads and EINTR: the bytes read (fewer
// only at end of file), or -errno.
ssize_t pread_full(int fd, char* buf, size_t size, off_t offset);

}  // namespace clairfs
