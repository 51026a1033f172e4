#include "tiers/nvme.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "io/io_loop.hpp"
#include "util/log.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"

namespace clairfs {

NvmeSpace nvme_space(const struct statvfs* fs, uint64_t capacity) {
  NvmeSpace s;
  s.capacity = capacity;
  if (!fs) return s;
  if (fs->f_bsize > 0) s.block = fs->f_bsize;
  if (capacity == 0)
    s.capacity = static_cast<uint64_t>(static_cast<double>(fs->f_bavail) * static_cast<double>(fs->f_frsize) * 0.9);
  return s;
}

NvmeTier::NvmeTier(const Manifest& manifest, const std::string& dir, uint64_t capacity) : manifest_(manifest) {
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
  struct statvfs sv {};
  const NvmeSpace space = nvme_space(::fstatvfs(dir_.get(), &sv) == 0 ? &sv : nullptr, capacity);
  block_ = space.block;
  MutexLock lock(mutex_);
  capacity_ = space.capacity;
}

uint64_t NvmeTier::capacity() const {
  MutexLock lock(mutex_);
  return capacity_;
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

std::optional<NvmeTier::Held> NvmeTier::copy_of(EntryId id) const {
  MutexLock lock(mutex_);
  auto it = held_.find(id);
  return it == held_.end() ? std::nullopt : std::optional<Held>(it->second);
}

bool NvmeTier::admitting() const {
  MutexLock lock(mutex_);
  return admitting_;
}

bool NvmeTier::reserve(uint64_t bytes) {
  MutexLock lock(mutex_);
  if (!admitting_ || held_bytes_ + reserved_ + on_disk(bytes) > capacity_) return false;
  reserved_ += on_disk(bytes);
  return true;
}

void NvmeTier::unreserve(uint64_t bytes) {
  MutexLock lock(mutex_);
  reserved_ -= on_disk(bytes);
}

int NvmeTier::create(EntryId id) {
  const int fd = ::openat(dir_.get(), name(id).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  return fd < 0 ? -errno : fd;
}

void NvmeTier::commit(EntryId id, uint64_t size, uint64_t sum) {
  MutexLock lock(mutex_);
  reserved_ -= on_disk(size);
  auto [it, fresh] = held_.try_emplace(id, Held{size, sum});
  if (!fresh) {
    held_bytes_ -= on_disk(it->second.size);
    it->second = Held{size, sum};
  }
  held_bytes_ += on_disk(size);
}

NvmeTier::Abandoned NvmeTier::abandon(EntryId id, uint64_t size, int error) {
  ::unlinkat(dir_.get(), name(id).c_str(), 0);
  MutexLock lock(mutex_);
  reserved_ -= on_disk(size);
  // Not writable any more (remounted read-only, permissions taken away): further writes would fail too.
  if (error == -EROFS || error == -EACCES || error == -EPERM) {
    const bool now = admitting_;
    admitting_ = false;
    return now ? Abandoned::kStopped : Abandoned::kRetried;
  }
  // Full: the disk holds less than the capacity said (or others filled it). What is held fits.
  if (error == 0 || error == -ENOSPC || error == -EDQUOT || error == -EFBIG) {
    capacity_ = std::min(capacity_, held_bytes_ + reserved_);
    return Abandoned::kLowered;
  }
  return Abandoned::kRetried;
}

uint64_t NvmeTier::erase(EntryId id) {
  uint64_t freed = 0;
  {
    MutexLock lock(mutex_);
    auto it = held_.find(id);
    if (it == held_.end()) return 0;
    freed = on_disk(it->second.size);
    held_bytes_ -= freed;
    held_.erase(it);
  }
  ::unlinkat(dir_.get(), name(id).c_str(), 0);
  return freed;
}

void NvmeTier::damaged(EntryId id, const char* instead) {
  checksum_failures_++;
  log_warning("NVMe copy of '" + manifest_.path(id) + "' is damaged; " + instead);
  erase(id);
}

void NvmeTier::unreadable(EntryId id, int error, const char* instead) {
  if (!copy_of(id)) return;  // evicted between the lookup and the open: not a failure
  read_failures_++;
  if (!unreadable_logged_.exchange(true))
    log_warning("NVMe copy of '" + manifest_.path(id) + "' cannot be read (" + std::strerror(-error) + "); " + instead +
                " (more such copies are counted in the stats, nvme.read_failures)");
  erase(id);
}

int NvmeTier::fetch(EntryId id, const Buffer& buf) {
  const auto held = copy_of(id);
  if (!held) return -ENOENT;
  UniqueFd fd(::openat(dir_.get(), name(id).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    unreadable(id, -errno, "not served, read elsewhere");
    return -EIO;
  }
  if (held->size != buf->size() || pread_full(fd.get(), buf->data(), buf->size(), 0) != static_cast<ssize_t>(buf->size()) ||
      checksum(buf->data(), buf->size()) != held->checksum) {
    damaged(id, "not served, SOURCE is read instead");
    return -EIO;
  }
  return 0;
}

void NvmeTier::start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) {
  if (!copy_of(id)) return done(-ENOENT);
  io.open(dir_.get(), name(id), [this, &io, id, buf, done](int64_t opened) {
    if (opened < 0) {
      unreadable(id, static_cast<int>(opened), "staged from elsewhere");
      return done(-EIO);
    }
    auto fd = std::make_shared<UniqueFd>(static_cast<int>(opened));
    io.read(fd->get(), buf->data(), buf->size(), [this, id, buf, fd, done](int64_t result) {
      const auto held = copy_of(id);
      if (result != static_cast<int64_t>(buf->size()) || !held || held->size != buf->size() ||
          checksum(buf->data(), buf->size()) != held->checksum) {
        damaged(id, "staged from SOURCE instead");
        return done(-EIO);
      }
      done(0);
    });
  });
}

void NvmeTier::write_failed(EntryId id, uint64_t size, int error) {
  write_failures_++;
  const std::string why = error ? std::string(std::strerror(-error)) : std::string("short write");
  switch (abandon(id, size, error)) {
    case Abandoned::kStopped:
      log_warning("NVMe directory " + path_ + ": " + why + "; no more files admitted, the rest keeps working");
      break;
    case Abandoned::kLowered:
      log_warning("NVMe directory " + path_ + ": " + why + "; its capacity is now " +
                  human_bytes(static_cast<double>(capacity())) + ", what its files take");
      break;
    case Abandoned::kRetried:
      break;
  }
}

void NvmeTier::start_offer(IoLoop& io, EntryId id, FileBytes bytes, Done done) {
  const uint64_t size = bytes->size();
  const int created = create(id);
  if (created < 0) {
    write_failed(id, size, created);
    return done(created);
  }
  auto fd = std::make_shared<UniqueFd>(created);
  const uint64_t sum = checksum(bytes->data(), size);
  io.write(fd->get(), bytes->data(), size, [this, id, bytes, fd, sum, done](int64_t result) {
    *fd = UniqueFd();
    if (result != static_cast<int64_t>(bytes->size())) {
      const int error = result < 0 ? static_cast<int>(result) : 0;
      write_failed(id, bytes->size(), error);
      return done(error ? error : -ENOSPC);
    }
    commit(id, bytes->size(), sum);
    writes_++;
    done(0);
  });
}

uint64_t NvmeTier::used() const {
  MutexLock lock(mutex_);
  return held_bytes_ + reserved_;
}

uint64_t NvmeTier::files() const {
  MutexLock lock(mutex_);
  return held_.size();
}

}  // namespace clairfs
