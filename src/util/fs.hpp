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

// Reads up to `size` bytes at `offset`, going on after short reads and EINTR: the bytes read (fewer
// only at end of file), or -errno.
ssize_t pread_full(int fd, char* buf, size_t size, off_t offset);

}  // namespace clairfs
