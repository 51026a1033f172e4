#include "engine/unopened.hpp"

#include <algorithm>

namespace clairfs {

int RecentLoads::get(EntryId id, const Load& load, FileBytes* bytes, Origin* from) {
  {
    MutexLock lock(mutex_);
    for (;;) {
      auto it = slots_.find(id);
      if (it == slots_.end()) break;
      if (!it->second.loading) {
        *bytes = it->second.bytes;
        *from = it->second.from;
        return 0;
      }
      lock.wait(loaded_);  // another reader's load: it ends with a held slot, or none (then we try)
    }
    slots_[id];  // loading
  }
  FileBytes got;
  Origin got_from = Origin::kSource;
  const int rc = load(&got, &got_from);
  {
    MutexLock lock(mutex_);
    slots_.erase(id);
    if (rc == 0 && got) hold(id, got, got_from);
  }
  loaded_.notify_all();
  if (rc < 0) return rc;
  *bytes = std::move(got);
  *from = got_from;
  return 0;
}

void RecentLoads::put(EntryId id, FileBytes bytes, Origin from) {
  MutexLock lock(mutex_);
  if (slots_.count(id)) return;  // held already, or being loaded
  hold(id, std::move(bytes), from);
}

void RecentLoads::forget(EntryId id) {
  MutexLock lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end() || it->second.loading) return;
  held_bytes_ -= it->second.bytes->size();
  slots_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
}

void RecentLoads::hold(EntryId id, FileBytes bytes, Origin from) {
  if (bytes->size() > max_bytes_) return;
  held_bytes_ += bytes->size();
  Slot& s = slots_[id];
  s.bytes = std::move(bytes);
  s.from = from;
  s.loading = false;
  order_.push_back(id);
  while (order_.size() > max_files_ || held_bytes_ > max_bytes_) {
    auto old = slots_.find(order_.front());
    held_bytes_ -= old->second.bytes->size();
    slots_.erase(old);
    order_.pop_front();
  }
}

bool SourceHandles::holds(EntryId id) {
  MutexLock lock(mutex_);
  return open_.count(id) != 0;
}

struct SourceHandles::Open {
  Open(SourceStore& s, uint64_t h) : source(s), handle(h) {}
  ~Open() { source.release(handle); }
  SourceStore& source;
  const uint64_t handle;
  std::atomic<int64_t> last_read_ns{0};  // steady_clock, since its epoch
};

bool SourceHandles::read_since(EntryId id, std::chrono::steady_clock::time_point since) {
  MutexLock lock(mutex_);
  auto it = open_.find(id);
  return it != open_.end() &&
         it->second->last_read_ns.load(std::memory_order_relaxed) >=
             std::chrono::duration_cast<std::chrono::nanoseconds>(since.time_since_epoch()).count();
}

ssize_t SourceHandles::read(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, bool* opened) {
  *opened = false;
  std::shared_ptr<Open> file;
  {
    MutexLock lock(mutex_);
    if (auto it = open_.find(id); it != open_.end()) file = it->second;
  }
  if (!file) {
    uint64_t handle = 0;
    if (const int rc = source_.open(id, pid, &handle); rc < 0) return rc;
    *opened = true;
    file = std::make_shared<Open>(source_, handle);
    MutexLock lock(mutex_);
    if (open_.emplace(id, file).second) {
      order_.push_back(id);
      while (order_.size() > max_open_) {  // a reader still using one keeps it open until it is done
        open_.erase(order_.front());
        order_.pop_front();
      }
    }
  }
  file->last_read_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(),
      std::memory_order_relaxed);
  return source_.read(file->handle, buf, size, offset);
}

}  // namespace clairfs
