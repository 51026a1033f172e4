#include "fuse/own_mount.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "util/mounts.hpp"

namespace clairfs {

UniqueFd clone_of_own_mount(const std::string& mountpoint_abs) {
  if (::geteuid() != 0) return UniqueFd();
  const int root = open_own_clairfs_mount(mountpoint_abs);
  if (root < 0) return UniqueFd();
  const UniqueFd held(root);
  return UniqueFd(::open_tree(root, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
}

bool own_descriptor_table() {
  if (::unshare(CLONE_FILES) != 0) return false;
  DIR* fds = ::opendir("/proc/thread-self/fd");
  if (!fds) return false;
  std::vector<int> fuse;
  char target[32];
  while (const dirent* d = ::readdir(fds)) {
    const int fd = std::atoi(d->d_name);
    if (d->d_name[0] == '.' || fd == ::dirfd(fds)) continue;
    const std::string link = "/proc/thread-self/fd/" + std::string(d->d_name);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::string_view(target, static_cast<size_t>(n)) == "/dev/fuse") fuse.push_back(fd);
  }
  ::closedir(fds);
  // Closed in this table only; through the system call itself, since ThreadSanitizer (which knows one
  // table per process) takes close() here for a race with the session's reads of the same number.
  for (int fd : fuse) ::syscall(SYS_close, fd);
  return true;
}

bool empty_descriptor_table() {
  if (::unshare(CLONE_FILES) != 0) return false;
  // (Through the system call itself: see above.)
  return ::syscall(SYS_close_range, 0u, ~0u, 0u) == 0;
}

}  // namespace clairfs
