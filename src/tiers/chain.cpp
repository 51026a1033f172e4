#include "tiers/chain.hpp"

#include <algorithm>
#include <cerrno>
#include <new>
#include <utility>

namespace clairfs {

StoreChain::StoreChain(std::vector<Store*> above, SourceStore& source, Admission* admission) : admission_(admission) {
  for (Store* s : above)
    if (s) stores_.push_back(s);
  stores_.push_back(&source);
  keeper_ = part(Origin::kNvme);
}

Store* StoreChain::part(Origin origin) {
  for (Store* s : stores_)
    if (s->origin() == origin) return s;
  return nullptr;
}

int StoreChain::fetch(EntryId id, const Buffer& buf) {
  Origin from = Origin::kSource;
  return find(id, buf, &from);
}

int StoreChain::find(EntryId id, const Buffer& buf, Origin* from) {
  int rc = -ENOENT;
  for (Store* s : stores_) {
    if (!s->may_hold(id)) continue;
    *from = s->origin();
    if ((rc = s->fetch(id, buf)) == 0) return 0;
  }
  return rc;
}

void StoreChain::start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) {
  try_from(
      io, id, 0, std::move(buf),
      [done = std::move(done)](const Found& f) {
        done(f.rc);
        return Keep{};
      },
      false);
}

void StoreChain::start_find(IoLoop& io, EntryId id, Buffer buf, Route route, FoundDone done) {
  size_t index = 0;
  while (index + 1 < stores_.size() && stores_[index]->origin() != route.first) ++index;
  try_from(io, id, index, std::move(buf), std::move(done), route.only_first && stores_[index]->may_hold(id));
}

void StoreChain::try_from(IoLoop& io, EntryId id, size_t index, Buffer buf, FoundDone done, bool only_this) {
  while (index + 1 < stores_.size() && !stores_[index]->may_hold(id)) ++index;
  Store* s = stores_[index];
  const auto since = Clock::now();
  s->start_fetch(io, id, buf, [this, &io, id, index, buf, done, s, since, only_this](int rc) {
    if (rc == 0 || only_this || index + 1 >= stores_.size()) {
      const Found found{rc, s->origin(), since, buf};
      if (const Keep keep = done(found); keep && rc == 0) copy_up(io, id, buf, *keep);
      return;
    }
    // A peer may yet write into the buffer it was given: the next store reads into a fresh one.
    Buffer fresh;
    try {
      fresh = std::make_shared<Bytes>(buf->size());
    } catch (const std::bad_alloc&) {  // the process may allocate no more: this try fails like a read
      done(Found{-ENOMEM, s->origin(), since, buf});
      return;
    }
    try_from(io, id, index + 1, std::move(fresh), done, false);
  });
}

// ---- copy-up -------------------------------------------------------------------------------------------

void StoreChain::copy_up(IoLoop& io, EntryId id, FileBytes bytes, uint64_t key) {
  if (!keeper_ || !admission_ || writing_.count(id) || keeper_->may_hold(id)) return;
  if (admission_->admit(id, bytes->size(), key)) write(io, id, std::move(bytes), key);
}

void StoreChain::hold_copy(EntryId id, FileBytes bytes) {
  if (!keeper_ || !admission_ || waiting_.size() >= kMaxWaiting || writing_.count(id) || keeper_->may_hold(id))
    return;
  waiting_.push_back(Admission::Copy{id, std::move(bytes)});
}

unsigned StoreChain::write_held(IoLoop& io, unsigned room) {
  if (room == 0 || waiting_.empty()) return 0;
  // (Written or being written since they were queued: nothing to do.)
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [&](const Admission::Copy& c) { return writing_.count(c.id) || keeper_->may_hold(c.id); }),
                 waiting_.end());
  unsigned started = 0;
  for (Admission::Copy& c : admission_->admit_waiting(waiting_, room)) {
    write(io, c.id, std::move(c.bytes), c.key);
    ++started;
  }
  return started;
}

bool StoreChain::copies_held() {
  if (!waiting_.empty() && !(keeper_ && keeper_->keeps_copies())) waiting_.clear();
  return !waiting_.empty();
}

void StoreChain::write(IoLoop& io, EntryId id, FileBytes bytes, uint64_t key) {
  writing_.insert(id);
  keeper_->start_offer(io, id, std::move(bytes), [this, id, key](int rc) {
    writing_.erase(id);
    if (rc == 0) admission_->kept(id, key);  // (a failure is counted, a full disk logged, by the store)
  });
}

}  // namespace clairfs
