#include "fuse/page_cache.hpp"

#include <cerrno>
#include <mutex>

#include "fuse/frontend.hpp"

namespace clairfs {

void FusePageCache::attach(fuse_session* session) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  session_ = session;
}

void FusePageCache::detach() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  session_ = nullptr;
}

int FusePageCache::push(EntryId id, const char* data, size_t size) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!session_) return -ENODEV;
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
        rc < 0)
      return rc;
    if (size == 0) break;
  }
  return 0;
}

int FusePageCache::drop(EntryId id) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!session_) return -ENODEV;
  return fuse_lowlevel_notify_inval_inode(session_, Frontend::ino_of(id), 0, 0);
}

}  // namespace clairfs
