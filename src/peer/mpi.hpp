// MPI, for a job with one clairfs daemon per node (this pair of files is the only place that includes
// mpi.h).
//
// MpiWorld is the start-up side: whether a launcher started us, MPI_Init_thread and its end, and the
// few collectives start-up needs (the index broadcast from node 0, every node's training ranks, agreeing
// that every mount is live). MpiPeers is the data side: a PeerTransport over its own communicator,
// driven by one progress thread that alone makes MPI calls after start-up:
//   request  requester -> owner, tag kRequest: {file id, reply tag, size}
//   reply    owner -> requester, the reply tag: the file's bytes, or an empty message (refused)
//   goodbye  tag kGoodbye: the sender leaves; nothing more is asked of it or sent to it
// The requester posts its receive straight into the buffer the file will live in (no copy) before it
// sends the request. Requests in flight are bounded (per peer and in all); an answer that does not come
// within the timeout fails the fetch (the caller reads SOURCE instead) and that peer is asked nothing
// more — so a late answer can never land in another request's buffer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/peer.hpp"

namespace clairfs {

// True if an MPI launcher (mpiexec/mpirun, srun) started this process as one of several.
bool launched_by_mpi();

class MpiWorld {
 public:
  // MPI_Init_thread with MPI_THREAD_MULTIPLE. Throws std::runtime_error with one line if MPI cannot start.
  MpiWorld();
  // MPI_Finalize, unless a peer failed (then finalizing could wait on it forever): the process then
  // leaves without it.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Node `root`'s `data` on every node (others pass anything).
  std::string broadcast(const std::string& data, int root) const;
  // Every node's list, by node.
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& mine) const;
  // True on every node if `ok` is true on every node.
  bool all(bool ok) const;

  void mark_unclean() { unclean_ = true; }

 private:
  int rank_ = 0;
  int size_ = 1;
  bool unclean_ = false;
};

struct MpiPeersConfig {
  std::chrono::milliseconds timeout{5000};  // an answer later than this fails the fetch
  unsigned max_in_flight = 32;             // fetches outstanding in all
  unsigned max_per_peer = 8;               // and to one peer
};

class MpiPeers final : public PeerTransport {
 public:
  // REQUIRES: manifest outlives the transport (requests are checked against it).
  MpiPeers(MpiWorld& world, const Manifest& manifest, MpiPeersConfig config);
  ~MpiPeers() override;

  int node() const override { return node_; }
  int nodes() const override { return nodes_; }
  void start(Lookup lookup) override;
  void fetch(int owner, EntryId id, std::shared_ptr<std::vector<char>> buf, Done done) override;
  bool usable(int owner) const override;
  Counters counters() const override;
  void stop() override;

 private:
  struct Fetch;
  struct Send;
  void loop();

  MpiWorld& world_;
  const Manifest& manifest_;
  const MpiPeersConfig config_;
  int node_;
  int nodes_;
  struct Comm;  // the MPI communicator, kept out of this header so callers need no mpi.h
  std::unique_ptr<Comm> comm_;
  Lookup lookup_;

  mutable std::mutex mutex_;        // guards queued_, stop_, counters_ (the thread owns everything else)
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Fetch>> queued_;
  bool stop_ = false;
  Counters counters_;
  std::vector<std::atomic<bool>> gone_;  // per node: left, failed or timed out
  std::thread thread_;
};

}  // namespace clairfs
