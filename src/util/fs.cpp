#include "util/fs.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>

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

int open_resolved(int dir_fd, const char* path, int flags, uint64_t resolve) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = resolve;
  for (unsigned again = 0;;) {
    long fd = ::syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno == EAGAIN && ++again < kOpenEagainTries) continue;
    if (errno != EINTR) return -errno;
  }
}

namespace {

int openat2_beneath(int dir_fd, const char* path, int flags) {
  return open_resolved(dir_fd, path, flags | O_NOFOLLOW, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
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

ssize_t xattr_beneath(int root_fd, const std::vector<std::string_view>& components, const char* name, std::string* out,
                      struct stat* seen) {
  struct stat st {};
  if (seen) *seen = st;
  const int fd = open_beneath(root_fd, components, O_PATH);  // no rights needed on the file itself
  if (fd < 0) return fd;
  UniqueFd held(fd);
  if (::fstat(fd, &st) != 0) return -errno;
  if (seen) *seen = st;
  // A symlink put in its place: getxattr through /proc would follow it out of SOURCE.
  if (!(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return -ENODATA;
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

int open_parent_dir(const std::string& path, std::string* name) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  *name = slash == std::string::npos ? p : p.substr(slash + 1);
  if (name->empty() || *name == "." || *name == "..") return -EISDIR;
  return open_resolved(AT_FDCWD, dir.c_str(), O_PATH | O_DIRECTORY,
                       RESOLVE_NO_MAGICLINKS | (::geteuid() == 0 ? RESOLVE_NO_SYMLINKS : 0));
}

namespace {

// 0 when `fd` is a regular file with one link, else -errno (see why_not_written).
int check_plain_file(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode)) return -EINVAL;
  if (st.st_nlink > 1) return -EMLINK;
  return 0;
}

}  // namespace

int open_for_append(const std::string& path, mode_t mode) {
  std::string name;
  const int dir = open_parent_dir(path, &name);
  if (dir < 0) return dir;
  UniqueFd held(dir);
  // O_NONBLOCK: a FIFO put at the name would block the open (no reader) or every write after it.
  UniqueFd fd(::openat(dir, name.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode));
  if (!fd) return errno == ENXIO ? -EINVAL : -errno;  // ENXIO: a FIFO nobody reads
  if (const int rc = check_plain_file(fd.get()); rc < 0) return rc;
  if (const int rc = make_blocking(fd.get()); rc < 0) return rc;
  return fd.release();
}

std::string why_not_written(int rc) {
  switch (-rc) {
    case ELOOP:
      return ::geteuid() == 0 ? "a symlink in its path (as root, give the path with no symlink in it)"
                              : "it is a symlink";
    case EINVAL: return "not a regular file";
    case EMLINK: return "the file has other hard links";
    default: return std::strerror(-rc);
  }
}

ReplacingFile::ReplacingFile(const std::string& path, mode_t mode) {
  const int dir = open_parent_dir(path, &name_);
  if (dir < 0) {
    error_ = dir;
    return;
  }
  dir_ = UniqueFd(dir);
  std::random_device random;
  for (int tries = 0; tries < 16; ++tries) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(random()));
    tmp_ = "." + name_ + ".tmp." + suffix;
    // O_EXCL with O_NOFOLLOW: only a file made here and now, whatever was planted beside it.
    fd_ = UniqueFd(::openat(dir, tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (fd_ || errno != EEXIST) break;
  }
  if (!fd_) {
    error_ = -errno;
    tmp_.clear();
  }
}

ReplacingFile::~ReplacingFile() {
  if (!tmp_.empty()) ::unlinkat(dir_.get(), tmp_.c_str(), 0);
}

int ReplacingFile::commit(bool sync) {
  if (error_ < 0) return error_;
  int rc = 0;
  if (sync && ::fsync(fd_.get()) != 0) rc = -errno;
  if (::close(fd_.release()) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && ::renameat(dir_.get(), tmp_.c_str(), dir_.get(), name_.c_str()) != 0) rc = -errno;
  if (rc == 0) tmp_.clear();
  return rc;
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
