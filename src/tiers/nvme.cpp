#include "tiers/nvme.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
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

namespace {

// Whether holes can be punched in files of the directory: a two-block file has its first punched.
bool can_punch(int dir, uint64_t block) {
  const char* name = "probe";
  UniqueFd fd(::openat(dir, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return false;
  const std::vector<char> zeros(2 * block, 0);
  const bool ok = ::pwrite(fd.get(), zeros.data(), zeros.size(), 0) == static_cast<ssize_t>(zeros.size()) &&
                  ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(block)) == 0;
  ::unlinkat(dir, name, 0);
  return ok;
}

}  // namespace

bool nvme_packs(const std::string& dir) {
  // Named as the tier's folder is, so that one left behind (the daemon killed here) is a stale cache.
  std::string tmpl = dir + "/" + cache_folder_prefix() + std::to_string(::getpid()) + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) return false;
  bool packs = false;
  if (UniqueFd fd(::open(buf.data(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)); fd) {
    struct statvfs sv {};
    packs = can_punch(fd.get(), nvme_space(::fstatvfs(fd.get(), &sv) == 0 ? &sv : nullptr, 0).block);
  }
  ::rmdir(buf.data());
  return packs;
}

NvmeTier::NvmeTier(const Manifest& manifest, const std::string& dir, uint64_t capacity, Packing packing,
                   uint64_t slab_bytes)
    : manifest_(manifest), slab_bytes_(slab_bytes) {
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
  packs_ = packing == Packing::kWhereItCan && can_punch(dir_.get(), block_);
  if (!packs_ && packing == Packing::kWhereItCan)
    log_info("NVMe directory " + path_ +
             ": its file system cannot punch holes; a file a copy (each takes whole blocks)");
  MutexLock lock(mutex_);
  capacity_ = space.capacity;
}

uint64_t NvmeTier::capacity() const {
  MutexLock lock(mutex_);
  return capacity_;
}

NvmeTier::~NvmeTier() {
  // Only our own directory (it holds only the slabs we made).
  (void)remove_cache_folder(path_);
}

uint64_t NvmeTier::checksum(const char* data, size_t size) { return XXH3_64bits(data, size); }

std::string NvmeTier::slab_name(uint32_t number) {
  char s[24];
  std::snprintf(s, sizeof s, "slab.%08x", number);
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

uint64_t NvmeTier::append(Slab& slab, uint64_t size) {
  // Right after the last extent when it is still there and ends inside a block (that block is counted
  // already); else at the next block: a block whose extent was let go may have been punched, and the
  // reservation (whole blocks) holds only if a copy shares no block but with a neighbour still there.
  uint64_t offset = slab.tail;
  const bool shares = offset % block_ != 0 && !slab.extents.empty() &&
                      slab.extents.rbegin()->first + slab.extents.rbegin()->second == offset;
  if (!shares) offset = (offset + block_ - 1) / block_ * block_;
  const uint64_t blocks = (offset + size + block_ - 1) / block_ - offset / block_ - (shares ? 1 : 0);
  slab.extents.emplace(offset, size);
  slab.tail = offset + size;
  slab.blocks += blocks;
  held_bytes_ += blocks * block_;
  return offset;
}

int NvmeTier::place(uint64_t size, Place* out) {
  *out = Place{};
  if (size == 0) return 0;
  bool fresh = false;
  uint32_t emptied = kNoSlab;
  {
    MutexLock lock(mutex_);
    auto it = slabs_.find(current_);
    if (!packs_ || it == slabs_.end() || it->second.tail >= slab_bytes_) {
      // The slab before is removed once nothing is in it; being current no longer keeps it.
      if (it != slabs_.end() && it->second.extents.empty()) {
        emptied = current_;
        slabs_.erase(it);
      }
      current_ = next_slab_++;
      fresh = true;
    }
    out->slab = current_;
    out->offset = append(slabs_[current_], size);
  }
  if (emptied != kNoSlab) ::unlinkat(dir_.get(), slab_name(emptied).c_str(), 0);
  // Opened for each write, as a file a copy was: a descriptor held open for writing would keep the
  // file system from being remounted read-only while the mount runs.
  const int flags = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | (fresh ? O_CREAT | O_EXCL : 0);
  out->fd = std::make_shared<UniqueFd>(::openat(dir_.get(), slab_name(out->slab).c_str(), flags, 0600));
  if (*out->fd) return 0;
  const int error = -errno;
  // Its place let go, and a slab that cannot be opened no longer taken for current: the next copy starts one.
  uint64_t first = 0, end = 0;
  bool removed = false;
  {
    MutexLock lock(mutex_);
    if (current_ == out->slab) current_ = kNoSlab;
    removed = release(out->slab, out->offset, &first, &end);
  }
  give_back(out->slab, removed, first, end);
  *out = Place{};
  return error;
}

void NvmeTier::commit(EntryId id, const Place& at, uint64_t size, uint64_t sum) {
  uint32_t old_slab = kNoSlab;
  uint64_t old_offset = 0, first = 0, end = 0;
  bool removed = false;
  {
    MutexLock lock(mutex_);
    reserved_ -= on_disk(size);
    auto [it, fresh] = held_.try_emplace(id, Held{size, sum, at.slab, at.offset});
    if (!fresh) {
      old_slab = it->second.slab;
      old_offset = it->second.offset;
      if (old_slab != kNoSlab) removed = release(old_slab, old_offset, &first, &end);
      it->second = Held{size, sum, at.slab, at.offset};
    }
  }
  if (old_slab != kNoSlab) give_back(old_slab, removed, first, end);
}

bool NvmeTier::release(uint32_t number, uint64_t offset, uint64_t* first, uint64_t* end) {
  *first = *end = 0;
  auto s = slabs_.find(number);
  if (s == slabs_.end()) return false;
  Slab& slab = s->second;
  auto it = slab.extents.find(offset);
  if (it == slab.extents.end()) return false;
  uint64_t lo = it->first / block_, hi = (it->first + it->second + block_ - 1) / block_;
  if (it != slab.extents.begin()) {
    const auto prev = std::prev(it);
    if ((prev->first + prev->second + block_ - 1) / block_ > lo) ++lo;  // its first block is the one before's last
  }
  if (const auto next = std::next(it); next != slab.extents.end() && next->first / block_ < hi) --hi;
  const uint64_t freed = hi > lo ? hi - lo : 0;
  slab.extents.erase(it);
  slab.blocks -= freed;
  held_bytes_ -= freed * block_;
  *first = lo;
  *end = lo + freed;
  if (!slab.extents.empty() || (number == current_ && packs_)) return false;
  slabs_.erase(s);
  return true;
}

void NvmeTier::give_back(uint32_t number, bool removed, uint64_t first, uint64_t end) {
  if (removed) {
    std::shared_ptr<UniqueFd> reader;  // closed outside the lock (a read in flight may still hold it)
    {
      MutexLock lock(mutex_);
      if (auto it = readers_.find(number); it != readers_.end()) {
        reader = std::move(it->second);
        readers_.erase(it);
      }
    }
    ::unlinkat(dir_.get(), slab_name(number).c_str(), 0);
    return;
  }
  if (end <= first || !packs_) return;
  UniqueFd fd(::openat(dir_.get(), slab_name(number).c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd)
    (void)::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first * block_),
                      static_cast<off_t>((end - first) * block_));
}

NvmeTier::Abandoned NvmeTier::abandon(const Place& at, uint64_t size, int error) {
  uint64_t first = 0, end = 0;
  bool removed = false;
  Abandoned what = Abandoned::kRetried;
  {
    MutexLock lock(mutex_);
    if (at.slab != kNoSlab) removed = release(at.slab, at.offset, &first, &end);
    reserved_ -= on_disk(size);
    if (error == -EROFS || error == -EACCES || error == -EPERM) {
      // Not writable any more (remounted read-only, permissions taken away): further writes would fail too.
      what = admitting_ ? Abandoned::kStopped : Abandoned::kRetried;
      admitting_ = false;
    } else if (error == 0 || error == -ENOSPC || error == -EDQUOT || error == -EFBIG) {
      // Full: the disk holds less than the capacity said (or others filled it). What is held fits.
      capacity_ = std::min(capacity_, held_bytes_ + reserved_);
      what = Abandoned::kLowered;
    }
  }
  if (at.slab != kNoSlab) give_back(at.slab, removed, first, end);
  return what;
}

uint64_t NvmeTier::erase(EntryId id) {
  Held held{};
  uint64_t first = 0, end = 0, before = 0;
  bool removed = false;
  {
    MutexLock lock(mutex_);
    auto it = held_.find(id);
    if (it == held_.end()) return 0;
    held = it->second;
    held_.erase(it);
    before = held_bytes_;
    if (held.slab != kNoSlab) removed = release(held.slab, held.offset, &first, &end);
    before -= held_bytes_;
  }
  if (held.slab != kNoSlab) give_back(held.slab, removed, first, end);
  return before;
}

std::shared_ptr<UniqueFd> NvmeTier::reader(uint32_t number) {
  std::shared_ptr<UniqueFd> fd;
  {
    MutexLock lock(mutex_);
    auto it = readers_.find(number);
    if (it == readers_.end()) return nullptr;
    fd = it->second;
  }
  // Removed from the disk by someone else (a node's cleanup, the folder deleted): not read through the
  // descriptor, which would keep its blocks, but opened again, which fails as before the cache.
  struct stat st {};
  if (::fstat(fd->get(), &st) == 0 && st.st_nlink > 0) return fd;
  MutexLock lock(mutex_);
  if (auto it = readers_.find(number); it != readers_.end() && it->second == fd) readers_.erase(it);
  return nullptr;  // (the descriptor closed as `fd` goes, outside the lock)
}

void NvmeTier::keep_reader(uint32_t number, const std::shared_ptr<UniqueFd>& fd) {
  if (!packs_) return;
  MutexLock lock(mutex_);
  if (readers_.size() < kReaders && slabs_.count(number)) readers_.emplace(number, fd);
}

void NvmeTier::damaged(EntryId id, const Held& read, const char* instead) {
  const auto now = copy_of(id);
  if (!now || now->slab != read.slab || now->offset != read.offset) return;  // let go under the read: only gone
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

int NvmeTier::copy_to_read(EntryId id, const Buffer& buf, const char* instead, Held* held) {
  const auto copy = copy_of(id);
  if (!copy) return -ENOENT;
  if (copy->size != buf->size()) {
    damaged(id, *copy, instead);
    return -EIO;
  }
  *held = *copy;
  return copy->size == 0 ? 0 : 1;
}

int NvmeTier::fetch(EntryId id, const Buffer& buf) {
  Held held;
  if (const int rc = copy_to_read(id, buf, "not served, SOURCE is read instead", &held); rc <= 0) return rc;
  std::shared_ptr<UniqueFd> fd = reader(held.slab);
  if (!fd) {
    fd = std::make_shared<UniqueFd>(
        ::openat(dir_.get(), slab_name(held.slab).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!*fd) {
      unreadable(id, -errno, "not served, read elsewhere");
      return -EIO;
    }
    keep_reader(held.slab, fd);
  }
  if (pread_full(fd->get(), buf->data(), buf->size(), static_cast<off_t>(held.offset)) !=
          static_cast<ssize_t>(buf->size()) ||
      checksum(buf->data(), buf->size()) != held.checksum) {
    damaged(id, held, "not served, SOURCE is read instead");
    return -EIO;
  }
  return 0;
}

void NvmeTier::start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) {
  Held copy;
  if (const int rc = copy_to_read(id, buf, "staged from SOURCE instead", &copy); rc <= 0) return done(rc);
  auto read = [this, &io, id, copy, buf, done](std::shared_ptr<UniqueFd> fd) {
    io.read(
        fd->get(), buf->data(), buf->size(),
        [this, id, copy, buf, fd, done](int64_t result) {
          if (result != static_cast<int64_t>(buf->size()) || checksum(buf->data(), buf->size()) != copy.checksum) {
            damaged(id, copy, "staged from SOURCE instead");
            return done(-EIO);
          }
          done(0);
        },
        copy.offset);
  };
  if (auto fd = reader(copy.slab)) return read(std::move(fd));
  io.open(dir_.get(), slab_name(copy.slab), [this, id, copy, done, read](int64_t opened) {
    if (opened < 0) {
      unreadable(id, static_cast<int>(opened), "staged from elsewhere");
      return done(-EIO);
    }
    auto fd = std::make_shared<UniqueFd>(static_cast<int>(opened));
    keep_reader(copy.slab, fd);
    read(std::move(fd));
  });
}

void NvmeTier::write_failed(const Place& at, uint64_t size, int error) {
  write_failures_++;
  const std::string why = error ? std::string(std::strerror(-error)) : std::string("short write");
  switch (abandon(at, size, error)) {
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
  Place at;
  if (const int placed = place(size, &at); placed < 0) {
    write_failed(at, size, placed);
    return done(placed);
  }
  const uint64_t sum = checksum(bytes->data(), size);
  if (size == 0) {
    commit(id, at, size, sum);
    writes_++;
    return done(0);
  }
  io.write(
      at.fd->get(), bytes->data(), size,
      [this, id, bytes, at, sum, done](int64_t result) {
        if (result != static_cast<int64_t>(bytes->size())) {
          const int error = result < 0 ? static_cast<int>(result) : 0;
          write_failed(at, bytes->size(), error);
          return done(error ? error : -ENOSPC);
        }
        commit(id, at, bytes->size(), sum);
        writes_++;
        done(0);
      },
      at.offset);
}

uint64_t NvmeTier::used() const {
  MutexLock lock(mutex_);
  return held_bytes_ + reserved_;
}

uint64_t NvmeTier::files() const {
  MutexLock lock(mutex_);
  return held_.size();
}

uint64_t NvmeTier::slabs() const {
  MutexLock lock(mutex_);
  return slabs_.size();
}

}  // namespace clairfs
