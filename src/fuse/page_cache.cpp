#include "fuse/page_cache.hpp"

#include <algorithm>
#include <cerrno>

#include "fuse/frontend.hpp"

namespace clairfs {

void FusePageCache::attach(fuse_session* session) {
  WriterLock lock(mutex_);
  session_ = session;
}

void FusePageCache::detach() {
  {
    WriterLock lock(mutex_);
    session_ = nullptr;
  }
  // No reply comes any more: the files are taken as not held (staged as usual, if still needed).
  std::unordered_map<fuse_ino_t, Probe> waiting;
  {
    MutexLock lock(probes_mutex_);
    waiting.swap(probes_);
  }
  for (auto& [ino, probe] : waiting) probe.answer(0);
}

int FusePageCache::push(EntryId id, const char* data, size_t size) {
  ReaderLock lock(mutex_);
  if (!session_) return -ENODEV;
  if (int rc = store(id, data, size); rc < 0) return rc;
  // Stored again, to the same pages: the kernel marks a page it stores to as used (a new page as
  // referenced, a referenced one active), so the second store moves the pages to its active list here,
  // on this thread, and not on the reader's at its first read (a lock taken and a list move a page, a
  // tenth of the time a 100 KB file's first read took). Active pages are also the last memory pressure
  // takes: these are pages a reader asks for next. A failure now leaves the pages stored, unless the
  // kernel forgot the inode in between (and its pages with it).
  const int rc = store(id, data, size);
  return rc == -ENOENT ? rc : 0;
}

int FusePageCache::store(EntryId id, const char* data, size_t size) {
  // 1 MiB a message: the kernel copies each into pages as it reads it, and smaller messages keep one
  // push from holding /dev/fuse's write side for long.
  constexpr size_t kChunk = 1 << 20;
  for (size_t off = 0; off < size || off == 0; off += kChunk) {
    const size_t n = std::min(kChunk, size - off);
    fuse_bufvec bv{};
    bv.count = 1;
    bv.buf[0].size = n;
    bv.buf[0].fd = -1;
    bv.buf[0].mem = const_cast<char*>(data + off);
    if (int rc = fuse_lowlevel_notify_store(session_, Frontend::ino_of(id), static_cast<off_t>(off), &bv,
                                            static_cast<fuse_buf_copy_flags>(0));
        rc < 0) {
      if (rc == -ENOENT) forgot(id);
      return rc;
    }
    if (size == 0) break;
  }
  return 0;
}

int FusePageCache::drop(EntryId id) {
  ReaderLock lock(mutex_);
  if (!session_) return -ENODEV;
  return fuse_lowlevel_notify_inval_inode(session_, Frontend::ino_of(id), 0, 0);
}

int FusePageCache::probe(EntryId id, uint64_t size, std::function<void(int64_t)> answer) {
  ReaderLock lock(mutex_);
  if (!session_) return -ENODEV;
  const fuse_ino_t ino = Frontend::ino_of(id);
  const size_t want = static_cast<size_t>(std::min<uint64_t>(size, kProbeBytes));
  {
    MutexLock probes(probes_mutex_);
    if (!probes_.emplace(ino, Probe{want, std::move(answer)}).second) return -EBUSY;
  }
  if (int rc = fuse_lowlevel_notify_retrieve(session_, ino, want, 0, this); rc < 0) {
    MutexLock probes(probes_mutex_);
    probes_.erase(ino);
    return rc;
  }
  return 0;
}

void FusePageCache::track(size_t entries) {
  known_words_ = (entries + 63) / 64;
  known_ = std::make_unique<std::atomic<uint64_t>[]>(known_words_);
}

void FusePageCache::introduce(EntryId id) {
  if (id / 64 >= known_words_) return;
  const uint64_t bit = uint64_t{1} << (id % 64);
  if ((known_[id / 64].fetch_or(bit, std::memory_order_relaxed) & bit) == 0)
    introductions_.fetch_add(1, std::memory_order_relaxed);
}

void FusePageCache::forgot(EntryId id) {
  if (id / 64 < known_words_) known_[id / 64].fetch_and(~(uint64_t{1} << (id % 64)), std::memory_order_relaxed);
}

bool FusePageCache::knows(EntryId id) const {
  if (id / 64 >= known_words_) return true;
  return (known_[id / 64].load(std::memory_order_relaxed) >> (id % 64)) & 1;
}

void FusePageCache::retrieved(void* cookie, fuse_ino_t ino, size_t bytes) {
  static_cast<FusePageCache*>(cookie)->answer(ino, bytes);
}

void FusePageCache::answer(fuse_ino_t ino, size_t bytes) {
  Probe probe;
  {
    MutexLock lock(probes_mutex_);
    auto it = probes_.find(ino);
    if (it == probes_.end()) return;  // answered "not held" at detach() already
    probe = std::move(it->second);
    probes_.erase(it);
  }
  // The kernel sends the pages it holds from the start up to the first it does not: all of them asked
  // for, or the file is not held whole.
  probe.answer(bytes >= probe.bytes ? 1 : 0);
}

}  // namespace clairfs
