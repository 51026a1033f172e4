#include "tiers/chain.hpp"

#include <cerrno>
#include <new>

namespace clairfs {

StoreChain::StoreChain(std::vector<Store*> stores) {
  for (Store* s : stores)
    if (s) stores_.push_back(s);
}

Store* StoreChain::store(Origin origin) const {
  for (Store* s : stores_)
    if (s->origin() == origin) return s;
  return nullptr;
}

int StoreChain::fetch(EntryId id, const Buffer& buf, Origin* from) {
  int rc = -ENOENT;
  for (Store* s : stores_) {
    if (!s->may_hold(id)) continue;
    *from = s->origin();
    if ((rc = s->fetch(id, buf)) == 0) return 0;
  }
  return rc;
}

void StoreChain::start_fetch(IoLoop& io, EntryId id, Buffer buf, Origin first, Done done, bool only_first) {
  size_t index = 0;
  while (index + 1 < stores_.size() && stores_[index]->origin() != first) ++index;
  try_from(io, id, index, std::move(buf), std::move(done), only_first && stores_[index]->may_hold(id));
}

void StoreChain::try_from(IoLoop& io, EntryId id, size_t index, Buffer buf, Done done, bool only_this) {
  while (index + 1 < stores_.size() && !stores_[index]->may_hold(id)) ++index;
  Store* s = stores_[index];
  const auto since = Clock::now();
  s->start_fetch(io, id, buf, [this, &io, id, index, buf, done, s, since, only_this](int rc) {
    if (rc == 0 || only_this || index + 1 >= stores_.size()) return done(Result{rc, s->origin(), since, buf});
    // A peer may yet write into the buffer it was given: the next store reads into a fresh one.
    Buffer fresh;
    try {
      fresh = std::make_shared<std::vector<char>>(buf->size());
    } catch (const std::bad_alloc&) {  // the process may allocate no more: this try fails like a read
      return done(Result{-ENOMEM, s->origin(), since, buf});
    }
    try_from(io, id, index + 1, std::move(fresh), done, false);
  });
}

}  // namespace clairfs
