// Files the kernel holds no inode for, looked up by the daemon itself ahead of their readers, so that
// their pages can be pushed before they are read.
//
// The kernel takes a push only into an inode it holds, and it makes one only when a lookup or a listing
// with full entries names the file. A listing made before the mount had read a file's attributes (they
// are read in the background after the mount, Manifest::fill_attributes) gives its name and type alone,
// and a job that never lists gives nothing: such a file's first lookup is its reader's, just before its
// first read, too late for a push. The stager asks for the staged files it would push next
// (PageCache::want_known); this thread stats each by name through root's own copy of the mount
// (fuse/own_mount.hpp) — a LOOKUP the daemon answers as any other, after which the kernel holds the
// inode, and its reader's own lookup later finds the entry cached: the request comes ahead of the
// reader, not in addition to it.
//
// Root's only: a user's daemon could go through the user's mount alone, whose unmount would fail while a
// lookup was on its way; a user's files wait for their readers' lookups, as before.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/manifest.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class Introducer {
 public:
  // Whether this daemon can introduce files (it runs as root).
  static bool possible();
  // Starts the thread, which looks files up through a copy of the clairfs mount at `mountpoint_abs` and
  // calls `tried` with each file once its lookup is done, and whether it worked (the kernel then holds the
  // inode). REQUIRES: the manifest outlives it; the session is answering, and is destroyed (its
  // descriptor of /dev/fuse closed, which ends a lookup on its way) before the introducer is.
  Introducer(std::string mountpoint_abs, const Manifest& manifest, std::function<void(EntryId, bool)> tried);
  ~Introducer();
  Introducer(const Introducer&) = delete;
  Introducer& operator=(const Introducer&) = delete;

  // Queues a staged file (its attributes known) to be looked up: false if the queue is full (asked again
  // later, when the stager meets the file again). Never blocks on the kernel.
  bool ask(EntryId id) EXCLUDES(mutex_);
  // Files looked up so far (not those whose lookup failed: the file gone, the mount gone).
  uint64_t looked_up() const { return looked_up_.load(std::memory_order_relaxed); }
  // The thread that makes the lookups (the caller FUSE's requests name).
  pid_t thread_id() const { return thread_id_; }

 private:
  void run() EXCLUDES(mutex_);
  // Stats `ids` by name beneath a fresh copy of the mount, each directory opened once: whether each worked.
  std::vector<bool> look_up(const std::vector<EntryId>& ids);

  const std::string mountpoint_;
  const Manifest& manifest_;
  const std::function<void(EntryId, bool)> tried_;
  pid_t thread_id_ = 0;  // set before the constructor returns
  std::atomic<uint64_t> looked_up_{0};
  Mutex mutex_;  // guards the queue and stopping_
  std::condition_variable asked_;
  std::vector<EntryId> queue_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace clairfs
