// The FUSE front-end: libfuse low-level operations that translate kernel requests into manifest lookups
// and Engine calls. Names and attributes come from the manifest (never from SOURCE), so metadata costs
// the parallel file system nothing after the scan. Every write-like request gets EROFS.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "clairfs/engine.hpp"
#include "clairfs/manifest.hpp"
#include "control/control.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

struct FrontendConfig {
  double entry_timeout = 86400.0;
  double attr_timeout = 86400.0;
  // Answer opens ENOSYS, so that the kernel opens files itself from then on (FUSE no-open mode): a file
  // whose pages it holds is read with no request at all. Reads come without handles
  // (Engine::read_unopened). Ignored, with a warning, by a kernel without no-open support.
  bool no_open = false;
  // default_permissions: the kernel also checks SOURCE's POSIX ACLs (FUSE_CAP_POSIX_ACL), which it asks
  // for with getxattr once per inode it holds.
  bool acls = false;
  // Listings always give full entries (READDIRPLUS for every part of a directory, not only its start
  // as the kernel chooses by itself): a job's listing (ImageFolder's) gives the kernel every file's inode.
  bool list_with_inodes = false;
  // Called with each file the kernel is given an inode for (a lookup's reply, a listing's full entry):
  // the page cache can take its pages from then on. May be empty.
  std::function<void(EntryId)> introduced;
};

class Frontend {
 public:
  // REQUIRES: manifest, engine and control outlive the Frontend. `root_fd` is SOURCE, for statfs.
  Frontend(const Manifest& manifest, Engine& engine, const ControlTree& control, int root_fd, FrontendConfig config);

  // The operation table; fuse_session_new() gets `this` as userdata.
  static const fuse_lowlevel_ops& ops();

  // A serving thread's own memory for the requests it serves: the bytes of a read and a control file's
  // text. Each serving thread makes one on its stack and serves while it lives; the read buffer is
  // allocated at once, as large as the largest read the kernel sends, so that no read served later
  // needs an allocation (one that can fail: an address-space limit set under a running daemon). Not a
  // thread_local with a destructor: such a variable's first use registers the destructor, an allocation
  // whose failure glibc ends the process over (CI's squeeze test at 1b15b26: a thread started under
  // the limit read the stats file). A thread without one (none serve so) allocates per request.
  class ThreadMemory {
   public:
    ThreadMemory();  // a failed allocation is left for the first read, which answers ENOMEM if it fails again
    ~ThreadMemory();
    ThreadMemory(const ThreadMemory&) = delete;
    ThreadMemory& operator=(const ThreadMemory&) = delete;

    char* read_bytes(size_t size);  // at least `size` of them; throws bad_alloc
    std::string& text() { return text_; }

   private:
    std::unique_ptr<char[]> read_bytes_;
    size_t read_size_ = 0;
    std::string text_;
  };

  // The inode number the kernel knows an entry by.
  static constexpr fuse_ino_t ino_of(EntryId id) { return static_cast<fuse_ino_t>(id) + 1; }

  // Requests answered with an error, by cause; for tests and stats.
  uint64_t erofs_replies() const { return erofs_.load(); }

  // The kernel's INIT was answered: opens_unasked() says how opens go from then on.
  bool initialised() const { return initialised_.load(); }
  // The kernel opens files itself, without asking the daemon (no-open mode, as config.no_open asked).
  bool opens_unasked() const { return no_open_.load(); }

 private:
  friend struct Handlers;
  template <auto>
  friend struct Guarded;
  const Manifest& manifest_;
  Engine& engine_;
  const ControlTree& control_;
  int root_fd_;
  FrontendConfig config_;
  std::atomic<uint64_t> erofs_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<bool> no_open_{false};      // opens are answered ENOSYS (set once the session is initialised)
  std::atomic<bool> acls_{false};         // the kernel enforces POSIX ACLs (set then too)
  std::atomic<bool> initialised_{false};  // after both
  // SOURCE's statfs, answered again for a second: the kernel asks it for each directory the watch marks
  // (fanotify checks the file system's id), 21,841 times at ImageNet-21k's size, and on a parallel file
  // system a statfs asks every storage target.
  Mutex statfs_mutex_;
  struct statvfs statfs_ GUARDED_BY(statfs_mutex_) {};
  std::chrono::steady_clock::time_point statfs_at_ GUARDED_BY(statfs_mutex_){};
};

}  // namespace clairfs
