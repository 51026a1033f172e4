// PageCache over a FUSE session: usable once attach()ed to a live session, a no-op (-ENODEV) before
// and after. detach() waits for pushes in progress and answers the probes still waiting "not held", so
// the session can then be destroyed.
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <functional>
#include <memory>
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

  // Which files the kernel knows the inodes of: sized for the manifest's `entries` once, before any
  // thread calls knows() (until then, every file is taken as known). introduce(): the front-end gave the kernel an
  // entry with a lookup count (a lookup's reply, a listing's full entry). A push refused with ENOENT
  // says the kernel forgot it.
  void track(size_t entries);
  void introduce(EntryId id);
  bool knows(EntryId id) const override;
  uint64_t introductions() const override { return introductions_.load(std::memory_order_relaxed); }

 private:
  // 32 pages, what the kernel retrieves at most by default (max_pages): larger files are judged by them.
  static constexpr uint64_t kProbeBytes = 128 << 10;
  struct Probe {
    size_t bytes = 0;  // asked for
    std::function<void(int64_t)> answer;
  };
  void answer(fuse_ino_t ino, size_t bytes);

  // The file's bytes into the kernel's pages of it, in messages of at most 1 MiB.
  int store(EntryId id, const char* data, size_t size) REQUIRES_SHARED(mutex_);
  void forgot(EntryId id);

  std::unique_ptr<std::atomic<uint64_t>[]> known_;  // a bit per entry; set once before the session starts
  size_t known_words_ = 0;
  std::atomic<uint64_t> introductions_{0};
  SharedMutex mutex_;  // shared by pushes, drops and probes, exclusive to attach/detach
  fuse_session* session_ GUARDED_BY(mutex_) = nullptr;
  Mutex probes_mutex_ ACQUIRED_AFTER(mutex_);
  std::unordered_map<fuse_ino_t, Probe> probes_ GUARDED_BY(probes_mutex_);  // waiting for the kernel
};

}  // namespace clairfs
