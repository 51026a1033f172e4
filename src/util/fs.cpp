#include "util/fs.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace clairfs {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

int openat2_beneath(int dir_fd, const char* path, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC | O_NOFOLLOW);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (unsigned again = 0;;) {
    long fd = ::syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno == EAGAIN && ++again < kOpenEagainTries) continue;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

int open_beneath(int root_fd, const std::vector<std::string_view>& components, int flags) {
  if (components.empty()) return openat2_beneath(root_fd, ".", flags);
  size_t total = 0;
  for (auto c : components) total += c.size() + 1;
  if (total < PATH_MAX) {
    std::string path;
    path.reserve(total);
    for (auto c : components) {
      if (!path.empty()) path += '/';
      path.append(c);
    }
    return openat2_beneath(root_fd, path.c_str(), flags);
  }
  // Too long for one call: walk down with O_PATH descriptors.
  UniqueFd dir;
  int at = root_fd;
  for (size_t i = 0; i + 1 < components.size(); ++i) {
    const std::string name(components[i]);
    int fd = openat2_beneath(at, name.c_str(), O_PATH | O_DIRECTORY);
    if (fd < 0) return fd;
    dir = UniqueFd(fd);
    at = dir.get();
  }
  const std::string last(components.back());
  return openat2_beneath(at, last.c_str(), flags);
}

ssize_t xattr_beneath(int root_fd, const std::vector<std::string_view>& components, const char* name, std::string* out) {
  const int fd = open_beneath(root_fd, components, O_PATH);  // no rights needed on the file itself
  if (fd < 0) return fd;
  UniqueFd held(fd);
  // A symlink put in its place: getxattr through /proc would follow it out of SOURCE.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return -ENODATA;
  // A descriptor opened O_PATH has no fgetxattr; its /proc link reaches the same inode.
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  for (int tries = 0; tries < 4; ++tries) {
    const ssize_t size = ::getxattr(link.c_str(), name, nullptr, 0);
    if (size < 0) return -errno;
    out->resize(static_cast<size_t>(size));
    const ssize_t got = ::getxattr(link.c_str(), name, out->data(), out->size());
    if (got >= 0) {
      out->resize(static_cast<size_t>(got));
      return got;
    }
    if (errno != ERANGE) return -errno;  // ERANGE: it grew between the two calls
  }
  return -EIO;
}

int make_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) return -errno;
  return 0;
}

ssize_t pread_full(int fd, char* buf, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, buf + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace clairfs
