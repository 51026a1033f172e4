#include "fuse/introducer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <future>
#include <string>
#include <unordered_map>
#include <utility>

#include "fuse/own_mount.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

// Files waiting to be looked up, at most: about the files a push budget of small files holds ahead of
// the readers; asks beyond are refused, and made again as the stager walks on.
constexpr size_t kQueued = 8192;
// Files looked up through one copy of the mount: the copy (a read of mountinfo and an open_tree) is made
// per batch, so that the user's unmount is never held up for longer than a batch's lookups take.
constexpr size_t kBatch = 1024;

}  // namespace

bool Introducer::possible() { return ::geteuid() == 0; }

Introducer::Introducer(std::string mountpoint_abs, const Manifest& manifest, std::function<void(EntryId, bool)> tried)
    : mountpoint_(std::move(mountpoint_abs)), manifest_(manifest), tried_(std::move(tried)) {
  std::promise<pid_t> started;
  std::future<pid_t> tid = started.get_future();
  // (The promise moved into the thread: it lives on there while this constructor returns.)
  thread_ = std::thread([this, started = std::move(started)]() mutable {
    started.set_value(::gettid());
    run();
  });
  thread_id_ = tid.get();
}

Introducer::~Introducer() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  asked_.notify_one();
  thread_.join();
}

bool Introducer::ask(EntryId id) {
  {
    MutexLock lock(mutex_);
    if (stopping_ || queue_.size() >= kQueued) return false;
    queue_.push_back(id);
  }
  asked_.notify_one();
  return true;
}

void Introducer::run() {
  // Lookups are requests to this very daemon: made from a table without /dev/fuse, so that a daemon
  // killed meanwhile ends them (fuse/own_mount.hpp).
  const bool alone = empty_descriptor_table();
  if (!alone) log_warning("the daemon cannot look files up ahead of their readers (no descriptor table of its own)");
  // (No logging from here on: the log's descriptor is not in this thread's table.)
  for (;;) {
    std::vector<EntryId> batch;
    {
      MutexLock lock(mutex_);
      lock.wait(asked_, [this]() REQUIRES(mutex_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      const size_t n = std::min(queue_.size(), kBatch);
      batch.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    const std::vector<bool> held = alone ? look_up(batch) : std::vector<bool>(batch.size(), false);
    for (size_t k = 0; k < batch.size(); ++k) tried_(batch[k], held[k]);
  }
}

std::vector<bool> Introducer::look_up(const std::vector<EntryId>& ids) {
  std::vector<bool> held(ids.size(), false);
  const UniqueFd root = clone_of_own_mount(mountpoint_);
  if (!root) return held;  // unmounted (the daemon ends soon), or not ours any more
  std::unordered_map<EntryId, UniqueFd> dirs;
  for (size_t k = 0; k < ids.size(); ++k) {
    const EntryId id = ids[k];
    const EntryId parent = manifest_.entry(id).parent;
    auto it = dirs.find(parent);
    if (it == dirs.end()) {
      // Beneath the copy, no symlink followed: the mount's own directories, as the manifest names them.
      const int fd = open_beneath(root.get(), manifest_.components(parent), O_PATH | O_DIRECTORY | O_NOFOLLOW);
      it = dirs.emplace(parent, UniqueFd(fd)).first;  // (none: its files fail)
    }
    struct stat st {};
    const std::string name(manifest_.name(id));
    held[k] = it->second && ::fstatat(it->second.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (held[k]) looked_up_++;
  }
  return held;
}

}  // namespace clairfs
