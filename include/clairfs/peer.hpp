// The seam to the other nodes' daemons.
//
// One daemon runs per node; together they act as one cache. A daemon that needs a file another node
// keeps asks that node for it; the answer is the bytes or a refusal, never a guess. The MPI transport
// (src/peer/) is the real one; tests of one module may use a loopback.
//
// fetch() and serve() never throw and never block on the network: fetch's completion arrives later on
// the transport's own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "clairfs/bytes.hpp"
#include "clairfs/types.hpp"

namespace clairfs {

using PeerBytes = std::shared_ptr<const Bytes>;

class PeerTransport {
 public:
  virtual ~PeerTransport() = default;

  virtual int node() const = 0;   // this daemon's index, 0 .. nodes()-1
  virtual int nodes() const = 0;

  // Called on the transport's thread when a peer asks for a file: the whole file, or nullptr to refuse
  // (not held). Must not block for long. Set once, before start().
  using Lookup = std::function<PeerBytes(EntryId)>;
  // Starts serving peers and fetching. REQUIRES: called once.
  virtual void start(Lookup lookup) = 0;

  // Asks node `owner` for file `id` into `buf` (sized to the file). `done` runs once, on the transport's
  // thread: with buf->size() when the bytes arrived, or -errno: -ENOENT (the peer does not hold it),
  // -ETIMEDOUT (no answer in time; that peer is then asked nothing more until it is heard from again), -EHOSTDOWN (the
  // peer left or is not asked any more), -ECANCELED (shutting down).
  using Done = std::function<void(int64_t)>;
  virtual void fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, Done done) = 0;

  // True if `owner` may be asked (it has not left or failed, and is not silent: given up for a ping or
  // a fetch not answered in time, until it is heard from again).
  virtual bool usable(int owner) const = 0;

  // Counters for .clairfs/stats.
  struct Counters {
    uint64_t requests = 0, hits = 0, refused = 0, timeouts = 0, failures = 0;
    uint64_t served = 0, served_bytes = 0, refused_to_peers = 0;
    uint64_t returned = 0;  // peers given up for silence that answered again
    uint64_t links = 0;     // peers linked to now (peer/links.hpp): their deaths are seen at once
  };
  virtual Counters counters() const = 0;

  // Says goodbye to every peer and stops; outstanding fetches complete with -ECANCELED. Idempotent.
  virtual void stop() = 0;
};

}  // namespace clairfs
