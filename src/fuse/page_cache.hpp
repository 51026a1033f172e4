// PageCache over a FUSE session: usable once attach()ed to a live session, a no-op (-ENODEV) before
// and after. detach() waits for pushes in progress and answers the probes still waiting "not held", so
// the session can then be destroyed.
#pragma once

#include <fuse_lowlevel.h>

#include <functional>
#include <shared_mutex>
#include <unordered_map>

#include "tiers/page_cache.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class FusePageCache final : public PageCache {
 public:
  void attach(fuse_session* session);
  void detach();
  int push(EntryId id, const char* data, size_t size) override;
  int drop(EntryId id) override;
  // Sends the kernel a retrieve of the file's first kProbeBytes (at most); its reply comes back as a
  // request, which the front-end hands to retrieved() with the cookie given (this cache).
  int probe(EntryId id, uint64_t size, std::function<void(int64_t)> answer) override;
  // The kernel's reply to a probe of `ino`: the `bytes` it holds from the file's start.
  static void retrieved(void* cookie, fuse_ino_t ino, size_t bytes);

 private:
  // 32 pages, what the kernel retrieves at most by default (max_pages): larger files are judged by them.
  static constexpr uint64_t kProbeBytes = 128 << 10;
  struct Probe {
    size_t bytes = 0;  // asked for
    std::function<void(int64_t)> answer;
  };
  void answer(fuse_ino_t ino, size_t bytes);

  std::shared_mutex mutex_;  // shared by pushes and drops, exclusive to attach/detach; guards session_
  fuse_session* session_ = nullptr;
  Mutex probes_mutex_;
  std::unordered_map<fuse_ino_t, Probe> probes_ GUARDED_BY(probes_mutex_);  // waiting for the kernel
};

}  // namespace clairfs
