#include "clairfs/store.hpp"

#include <cerrno>

namespace clairfs {

const char* origin_name(Origin origin) {
  switch (origin) {
    case Origin::kPageCache: return "pagecache";
    case Origin::kRam: return "ram";
    case Origin::kNvme: return "nvme";
    case Origin::kPeer: return "peer";
    case Origin::kSource: return "source";
  }
  return "?";
}

void Store::start_offer(IoLoop&, EntryId, FileBytes, Done done) { done(-ENOTSUP); }

int Store::find(EntryId id, const Buffer& buf, Origin* from) {
  *from = origin();
  return fetch(id, buf);
}

void Store::start_find(IoLoop& io, EntryId id, Buffer buf, Route, FoundDone done) {
  const auto since = std::chrono::steady_clock::now();
  start_fetch(io, id, buf, [this, since, buf, done = std::move(done)](int rc) {
    done(Found{rc, origin(), since, buf});
  });
}

}  // namespace clairfs
