#include "util/mounts.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/fs.hpp"

namespace clairfs {

namespace {

// mountinfo writes space, tab, newline and backslash as \ooo octal.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s.find_first_not_of("01234567", i + 1) >= i + 4) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A cache folder as a daemon of this user makes it (mkdtemp: 0700, owned by the user): one planted by
// someone else in a shared DIR is left alone, whatever its name says.
bool made_by_us(int folder) {
  struct stat st {};
  return ::fstat(folder, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0700;
}

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// Each mount in /proc/self/mountinfo, in order, with its id, until `fn` returns false.
template <typename Fn>
void each_mount(Fn fn) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    std::istringstream fields(line);
    long id = -1;
    std::string parent, dev, root, point;
    fields >> id >> parent >> dev >> root >> point;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    MountEntry e;
    e.id = id;
    e.device = dev;
    e.mountpoint = unescape(point);
    tail >> e.fstype >> e.source >> e.super_options;
    e.source = unescape(e.source);
    if (!fn(id, e)) return;
  }
}

// The mount id of the file `fd` is open on (from /proc/thread-self/fdinfo: no request to the file system, which
// a dead FUSE mount would refuse), or -1.
long mount_id_of(int fd) {
  std::ifstream in("/proc/thread-self/fdinfo/" + std::to_string(fd));  // (this thread's table: see OpenWatch)
  std::string key;
  long id = -1;
  while (in >> key) {
    if (key == "mnt_id:") {
      in >> id;
      break;
    }
  }
  return id;
}

// The mount with id `id` in /proc/self/mountinfo.
std::optional<MountEntry> mount_with_id(long id) {
  std::optional<MountEntry> found;
  each_mount([&](long mid, const MountEntry& e) {
    if (mid == id) found = e;
    return !found;
  });
  return found;
}

bool fusermount_detach(const std::string& abs_path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDERR_FILENO);
    ::execlp("fusermount3", "fusermount3", "-u", "-z", "--", abs_path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::vector<std::string> clairfs_mounts_of(const std::string& fsname) {
  std::vector<std::string> points;
  each_mount([&](long, const MountEntry& e) {
    if (e.fstype == "fuse.clairfs" && e.source == fsname) points.push_back(e.mountpoint);
    return true;
  });
  return points;
}

std::optional<MountEntry> mount_at(const std::string& abs_path) {
  std::optional<MountEntry> found;
  each_mount([&](long, const MountEntry& e) {
    if (e.mountpoint == abs_path) found = e;  // later lines are mounted on top of earlier ones
    return true;
  });
  return found;
}

std::string absolute_parent_resolved(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  const std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  char* resolved = ::realpath(parent.c_str(), nullptr);
  if (!resolved) return path;
  std::string out(resolved);
  std::free(resolved);
  if (name == "." || name.empty()) return out;
  if (name == "..") {
    const size_t up = out.rfind('/');
    return up == 0 || up == std::string::npos ? "/" : out.substr(0, up);
  }
  return out == "/" ? "/" + name : out + "/" + name;
}

std::string lexically_absolute(const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_relative()) {
    std::error_code ec;
    p = std::filesystem::current_path(ec) / p;
  }
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool is_dead_fuse_mount(const std::string& abs_path) {
  // statfs, not stat: the kernel answers stat of the root from attributes it still holds, while
  // statfs always asks the daemon.
  struct statfs sf {};
  return ::statfs(abs_path.c_str(), &sf) != 0 && errno == ENOTCONN;
}

// The clairfs mount at `abs_path`, resolved once with no symlink on the way: an O_PATH descriptor of
// it and its mountinfo entry, or -ELOOP (a symlink on the way), -ENOENT (not a fuse.clairfs mount at
// exactly that path) or another -errno.
int open_clairfs_mount(const std::string& abs_path, MountEntry* entry) {
  const int opened =
      open_resolved(AT_FDCWD, abs_path.c_str(), O_PATH | O_NOFOLLOW, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  if (opened < 0) return opened;
  UniqueFd fd(opened);
  const auto m = mount_with_id(mount_id_of(fd.get()));
  if (!m || m->fstype != "fuse.clairfs" || m->mountpoint != abs_path) return -ENOENT;
  *entry = *m;
  return fd.release();
}

int open_own_clairfs_mount(const std::string& abs_path) {
  MountEntry m;
  const int opened = open_clairfs_mount(abs_path, &m);
  if (opened < 0) return opened;
  UniqueFd fd(opened);
  const std::string mine = "user_id=" + std::to_string(::geteuid());
  std::istringstream options(m.super_options);
  std::string option;
  bool ours = false;
  while (std::getline(options, option, ',')) ours = ours || option == mine;
  return ours ? fd.release() : -ENOENT;
}

// Detaches the mount `fd` (an O_PATH descriptor of its root) is open on: umount2 through the descriptor
// as root — its /proc link leads to the mount it holds, not to whatever the path names by now — else
// `fusermount3 -u -z`, which checks that the mount at `abs_path` is the caller's own. Sets errno.
bool detach_held(int fd, const std::string& abs_path) {
  const std::string held = "/proc/self/fd/" + std::to_string(fd);
  if (::umount2(held.c_str(), MNT_DETACH) == 0) return true;
  const int first = errno;
  if (::geteuid() != 0 && fusermount_detach(abs_path)) return true;
  errno = first;
  return false;
}

Detached detach_clairfs_mount(const std::string& abs_path) {
  MountEntry m;
  const int opened = open_clairfs_mount(abs_path, &m);
  if (opened < 0) return opened == -ELOOP ? Detached::kSymlink : Detached::kNotClairfs;
  UniqueFd fd(opened);
  struct statfs sf {};
  const bool dead = ::fstatfs(fd.get(), &sf) != 0 && errno == ENOTCONN;
  if (!detach_held(fd.get(), abs_path)) return Detached::kFailed;
  return dead ? Detached::kDead : Detached::kLive;
}

bool detach_mount_by_id(const std::string& abs_path, long id) {
  const int opened =
      open_resolved(AT_FDCWD, abs_path.c_str(), O_PATH | O_NOFOLLOW, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  if (opened < 0) return false;
  UniqueFd fd(opened);
  return id >= 0 && mount_id_of(fd.get()) == id && detach_held(fd.get(), abs_path);
}

std::string host_name() {
  char host[256] = "?";
  (void)::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return host;
}

std::string cache_folder_prefix() { return "clairfs-cache." + host_name() + "."; }

std::vector<StaleCache> stale_caches(const std::string& dir) {
  std::vector<StaleCache> out;
  const std::string prefix = cache_folder_prefix();
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd) return out;
  DIR* d = ::fdopendir(::dup(dfd.get()));
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    // PID.XXXXXX after the prefix
    const std::string rest = name.substr(prefix.size());
    char* end = nullptr;
    const long pid = std::strtol(rest.c_str(), &end, 10);
    if (end == rest.c_str() || *end != '.' || pid_alive(pid)) continue;
    UniqueFd folder(::openat(dfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!folder || !made_by_us(folder.get())) continue;
    // A live daemon holds its folder's lock for as long as it runs (PIDs are per namespace; locks are not).
    if (::flock(folder.get(), LOCK_EX | LOCK_NB) != 0) continue;
    StaleCache c{dir + "/" + name, pid, 0};
    if (DIR* f = ::fdopendir(::dup(folder.get()))) {
      while (dirent* fe = ::readdir(f)) {
        struct stat st {};
        if (fe->d_name[0] != '.' && ::fstatat(folder.get(), fe->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
          c.bytes += static_cast<unsigned long long>(st.st_blocks) * 512;
      }
      ::closedir(f);
    }
    out.push_back(c);
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> remove_stale_caches(const std::string& dir, bool* stayed) {
  std::vector<std::string> lines;
  for (const StaleCache& c : stale_caches(dir)) {
    const std::string whose = ", left by clairfs daemon " + std::to_string(c.pid) + " that is gone";
    if (remove_cache_folder(c.path)) {
      lines.push_back("removed " + c.path + " (" + std::to_string((c.bytes + 1023) >> 10) + " KiB)" + whose);
    } else {
      lines.push_back("cannot remove " + c.path + whose + ": " + std::strerror(errno));
      if (stayed) *stayed = true;
    }
  }
  return lines;
}

bool remove_cache_folder(const std::string& path) {
  UniqueFd folder(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!folder) return errno == ENOENT;
  if (!made_by_us(folder.get())) {
    errno = EPERM;
    return false;
  }
  // Flat, regular files are all a daemon puts there: anything else is left, and the folder with it.
  if (DIR* d = ::fdopendir(::dup(folder.get()))) {
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_REG || e->d_type == DT_UNKNOWN) ::unlinkat(folder.get(), e->d_name, 0);
    ::closedir(d);
  }
  return ::rmdir(path.c_str()) == 0 || errno == ENOENT;
}

}  // namespace clairfs
