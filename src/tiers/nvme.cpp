#include "tiers/nvme.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "util/log.hpp"
#include "util/mounts.hpp"

namespace clairfs {

NvmeTier::NvmeTier(const std::string& dir, uint64_t capacity) {
  // A daemon that died (SIGKILL, a node's OOM killer) leaves its folder behind: the next mount on the
  // node removes it, and says so.
  for (const std::string& line : remove_stale_caches(dir)) log_warning(line);
  std::string tmpl = dir + "/" + cache_folder_prefix() + std::to_string(::getpid()) + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data()))
    throw NvmeError("nvme='" + dir + "': cannot create a cache directory there: " + std::strerror(errno));
  path_ = buf.data();
  dir_ = UniqueFd(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_) {
    const int e = errno;
    ::rmdir(path_.c_str());
    throw NvmeError("nvme='" + dir + "': cannot open " + path_ + ": " + std::strerror(e));
  }
  // Held for the daemon's life (the descriptor is close-on-exec): this is how another daemon on the
  // node tells that the folder is in use, whatever PID namespace it runs in.
  (void)::flock(dir_.get(), LOCK_EX | LOCK_NB);
  if (capacity == 0) {
    struct statvfs sv {};
    if (::fstatvfs(dir_.get(), &sv) == 0)
      capacity = static_cast<uint64_t>(static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) * 0.9);
  }
  capacity_ = capacity;
}

NvmeTier::~NvmeTier() {
  // Only our own directory (it holds only the files we made, named by entry id).
  (void)remove_cache_folder(path_);
}

uint64_t NvmeTier::checksum(const char* data, size_t size) { return XXH3_64bits(data, size); }

std::string NvmeTier::name(EntryId id) {
  char s[16];
  std::snprintf(s, sizeof s, "%08x", id);
  return s;
}

std::optional<NvmeTier::Held> NvmeTier::find(EntryId id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(id);
  return it == held_.end() ? std::nullopt : std::optional<Held>(it->second);
}

bool NvmeTier::admitting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return admitting_;
}

bool NvmeTier::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!admitting_ || held_bytes_ + reserved_ + bytes > capacity_) return false;
  reserved_ += bytes;
  return true;
}

void NvmeTier::unreserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= bytes;
}

int NvmeTier::create(EntryId id) {
  const int fd = ::openat(dir_.get(), name(id).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  return fd < 0 ? -errno : fd;
}

void NvmeTier::commit(EntryId id, uint64_t size, uint64_t sum) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= size;
  auto [it, fresh] = held_.try_emplace(id, Held{size, sum});
  if (!fresh) {
    held_bytes_ -= it->second.size;
    it->second = Held{size, sum};
  }
  held_bytes_ += size;
}

bool NvmeTier::abandon(EntryId id, uint64_t size, int error) {
  ::unlinkat(dir_.get(), name(id).c_str(), 0);
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= size;
  // Full, or not writable any more (remounted read-only, permissions taken away): either way further
  // writes would fail too.
  const bool full = error == 0 || error == -ENOSPC || error == -EDQUOT || error == -EFBIG || error == -EROFS ||
                    error == -EACCES || error == -EPERM;
  const bool stopped = full && admitting_;
  if (full) admitting_ = false;
  return stopped;
}

uint64_t NvmeTier::erase(EntryId id) {
  uint64_t freed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = held_.find(id);
    if (it == held_.end()) return 0;
    freed = it->second.size;
    held_bytes_ -= freed;
    held_.erase(it);
  }
  ::unlinkat(dir_.get(), name(id).c_str(), 0);
  return freed;
}

uint64_t NvmeTier::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_bytes_ + reserved_;
}

uint64_t NvmeTier::files() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.size();
}

}  // namespace clairfs
