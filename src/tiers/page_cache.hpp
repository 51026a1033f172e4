// The kernel's page cache as a tier: the engine pushes staged files into it before their readers open
// them (a read then never waits on the daemon) and drops them once they are passed or evicted. The FUSE
// implementation (fuse/page_cache.cpp) uses fuse_lowlevel_notify_store and notify_inval_inode; the kernel
// may refuse a push (it has not looked the inode up yet) or drop pages on its own under memory pressure,
// so the engine always keeps its RAM copy to serve reads that still reach it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "clairfs/types.hpp"

namespace clairfs {

class PageCache {
 public:
  virtual ~PageCache() = default;
  // Puts a whole file's bytes into the kernel's cache: 0, or -errno (-ENOENT: the kernel does not know
  // the inode yet; -ENODEV: not mounted). May be called from any thread, never from a request handler.
  virtual int push(EntryId id, const char* data, size_t size) = 0;
  // Drops a file's cached pages. Same threading rule.
  virtual int drop(EntryId id) = 0;
  // Asks whether the kernel still holds a file of `size` bytes whole (by its first 128 KiB, for a larger
  // file: the pages the kernel sends back to a retrieve): `answer` runs once, on another thread, with 1
  // if it does and 0 if not. Returns 0, or -errno when the question could not be asked (-ENOENT: the
  // kernel has forgotten the inode, so it holds none of its pages); `answer` is not called then. One
  // question per file at a time. Same threading rule.
  virtual int probe(EntryId id, uint64_t size, std::function<void(int64_t)> answer) = 0;
  // Whether the kernel has been given the file's inode (by a lookup or a listing): a push before that
  // is refused (-ENOENT). True when not known either way.
  virtual bool knows(EntryId /*id*/) const { return true; }
  // How many files the kernel has been given the inodes of so far: a change says that files skipped as
  // unknown may take their pushes now.
  virtual uint64_t introductions() const { return 0; }
};

}  // namespace clairfs
