// PageCache over a FUSE session: usable once attach()ed to a live session, a no-op (-ENODEV) before
// and after. detach() waits for pushes in progress, so the session can then be destroyed.
#pragma once

#include <fuse_lowlevel.h>

#include <shared_mutex>

#include "tiers/page_cache.hpp"

namespace clairfs {

class FusePageCache final : public PageCache {
 public:
  void attach(fuse_session* session);
  void detach();
  int push(EntryId id, const char* data, size_t size) override;
  int drop(EntryId id) override;

 private:
  std::shared_mutex mutex_;  // shared by pushes and drops, exclusive to attach/detach; guards session_
  fuse_session* session_ = nullptr;
};

}  // namespace clairfs
