// Links between the nodes' daemons that say at once when one's process is gone.
//
// MPICH does not tell a daemon that a peer died (its UCX layer leaves UCX's error handling off), so the
// peers found a dead one by silence: 250 ms without a word while it owed answers, then a ping not
// answered in 600 ms — 0.85 s of a reader's wait, more on a loaded machine (1.24 s beside a CPU hog).
// Beside MPI each pair of daemons holds one TCP connection that carries nothing: when a daemon's process
// ends, however (SIGKILL, a crash, the OOM killer), its kernel closes the connection, and the other
// side's kernel says so within a round trip. A daemon that leaves on purpose writes one byte first
// (goodbye), so a close after it is no failure. A host that dies whole, or a network that parts, closes
// nothing: the pings remain for those.
//
// Each node listens on a port the kernel picks, on every address, and tells the others (over MPI, its
// card: port, addresses, and a random token) at start-up; the lower node of each pair connects to the
// higher and sends the higher one's token, which nobody outside the job has: a connection without it
// within a second is closed, one with it is answered (an ack), and only then is the link made on either
// side — a close before that (a busy node shedding connections) is no death. A pair that cannot connect (a firewall, no
// common address) is said in the log once, and its deaths are found by the pings alone.
//
// Thread-safe: one thread of its own makes and watches the connections; closed() and left() are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "util/fs.hpp"

namespace clairfs {

// Whether a peer's daemon is known gone because its link closed without a goodbye (peer_loop.hpp).
class LinkWatch {
 public:
  virtual ~LinkWatch() = default;
  virtual bool closed(int node) const = 0;
  // How many links have closed so far: a change says to look at closed() again.
  virtual uint64_t closures() const = 0;
  virtual int made() const = 0;  // links standing: made, and not closed since
};

class PeerLinks final : public LinkWatch {
 public:
  // How long a connection may take to be made, and an incoming one to show its token.
  static constexpr int kConnectMs = 2000;
  static constexpr int kHandshakeMs = 1000;
  // Incoming connections not yet shown to be a peer's, at most (more are closed at once).
  static constexpr size_t kMaxPending = 1024;

  // Listens. Throws std::runtime_error with one line if it cannot (no socket, no port).
  PeerLinks(int node, int nodes);
  // Says goodbye on every link, closes them, stops the thread.
  ~PeerLinks() override;
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // What this node tells the others (MpiWorld::allgather), and the start once every node's is known:
  // links to the higher nodes are made, those from the lower ones taken, in the background. Cards that
  // cannot be read (another version) leave that node to the pings.
  std::vector<uint64_t> card() const;
  void start(const std::vector<std::vector<uint64_t>>& cards);

  bool closed(int node) const override;  // its link closed without a goodbye: its daemon is gone
  uint64_t closures() const override;
  bool left(int node) const;                 // it said goodbye on its link
  int made() const override { return made_.load(); }  // (made either way, and not closed since)

 private:
  struct Shared;
  void run();

  const int node_;
  const int nodes_;
  std::unique_ptr<Shared> shared_;  // what the thread and the callers share (the thread joins first)
  std::atomic<int> made_{0};
  std::thread thread_;
};

}  // namespace clairfs
