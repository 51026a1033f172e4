#include "util/mounts.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdlib>
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

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

}  // namespace

std::optional<MountEntry> mount_at(const std::string& abs_path) {
  std::ifstream in("/proc/self/mountinfo");
  std::optional<MountEntry> found;
  std::string line;
  while (std::getline(in, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    fields >> id >> parent >> dev >> root >> point;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos || unescape(point) != abs_path) continue;
    std::istringstream tail(line.substr(dash + 3));
    MountEntry e;
    e.mountpoint = abs_path;
    tail >> e.fstype >> e.source;
    e.source = unescape(e.source);
    found = e;  // later lines are mounted on top of earlier ones
  }
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

bool is_dead_fuse_mount(const std::string& abs_path) {
  // statfs, not stat: the kernel answers stat of the root from attributes it still holds, while
  // statfs always asks the daemon.
  struct statfs sf {};
  return ::statfs(abs_path.c_str(), &sf) != 0 && errno == ENOTCONN;
}

bool detach_mount(const std::string& abs_path) {
  if (::umount2(abs_path.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) return true;
  const int first = errno;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDERR_FILENO);
    ::execlp("fusermount3", "fusermount3", "-u", "-z", "--", abs_path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    errno = first;
    return false;
  }
  return true;
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
    if (!folder) continue;
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
  if (DIR* d = ::fdopendir(::dup(folder.get()))) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ::unlinkat(folder.get(), e->d_name, 0);
    ::closedir(d);
  }
  return ::rmdir(path.c_str()) == 0 || errno == ENOENT;
}

}  // namespace clairfs
