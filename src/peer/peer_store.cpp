#include "peer/peer_store.hpp"

#include <cerrno>
#include <condition_variable>
#include <memory>

#include "io/io_loop.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

PeerStore::PeerStore(PeerTransport& transport, std::vector<uint16_t> owner, std::chrono::milliseconds wait)
    : transport_(transport), owner_(std::move(owner)), node_(transport.node()), wait_(wait) {}

bool PeerStore::may_hold(EntryId id) const {
  const int keeper = owner_[id];
  return keeper != node_ && transport_.usable(keeper);
}

int PeerStore::fetch(EntryId id, const Buffer& buf) {
  if (buf->empty() || !may_hold(id)) return -ENOENT;
  struct Answer {
    Mutex mutex;
    std::condition_variable cv;
    bool done GUARDED_BY(mutex) = false;
    int64_t result GUARDED_BY(mutex) = 0;
  };
  auto answer = std::make_shared<Answer>();  // outlives a wait given up on
  transport_.fetch(owner_[id], id, buf, [answer](int64_t result) {
    MutexLock lock(answer->mutex);
    answer->result = result;
    answer->done = true;
    answer->cv.notify_all();
  });
  // The transport answers within its timeout; the bound here only guards against it hanging.
  MutexLock lock(answer->mutex);
  const auto until = std::chrono::steady_clock::now() + wait_;
  while (!answer->done) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return -ETIMEDOUT;
    lock.wait_for(answer->cv, until - now);
  }
  return answer->result == static_cast<int64_t>(buf->size()) ? 0 : -EIO;
}

void PeerStore::start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) {
  if (buf->empty() || !may_hold(id)) return done(-ENOENT);
  ++in_flight_;
  transport_.fetch(owner_[id], id, buf, io.external([this, buf, done](int64_t result) {
    --in_flight_;
    // Refused, timed out, or the peer left: the next store it is.
    done(result == static_cast<int64_t>(buf->size()) ? 0 : -EIO);
  }));
}

}  // namespace clairfs
