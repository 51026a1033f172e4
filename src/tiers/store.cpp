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

}  // namespace clairfs
