// MPI, for a job with one clairfs daemon per node (this pair of files is the only place that includes
// mpi.h).
//
// MpiWorld is the start-up side: whether a launcher started us, MPI_Init_thread and its end, and the
// few collectives start-up needs (the index broadcast from node 0, every node's training ranks, agreeing
// that every mount is live). It also holds the data side's wire (peer/wire.hpp) over a communicator of
// its own, which the peers' progress thread (peer/peer_loop.hpp) alone uses after start-up.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "peer/wire.hpp"

namespace clairfs {

// How this process was started, read from the launcher's environment.
struct Launch {
  bool launched = false;  // by mpiexec/mpirun or srun: one daemon per node, MPI starts
  long tasks = 1;         // how many tasks the launcher started, as far as its environment says
  std::string said_by;    // the variable that says so, e.g. "SLURM_STEP_NUM_TASKS=2"
  bool slurm = false;     // the launcher is srun
};
Launch detect_launch();

// The MPI library's version line ("MPICH Version: 4.0.2"); callable before MPI starts (--version).
std::string mpi_library_version();

class MpiWorld {
 public:
  // MPI_Init_thread with MPI_THREAD_MULTIPLE. Throws std::runtime_error with one line if MPI cannot start.
  // A signal of `stop_signals` that is pending (blocked) while a collective waits ends the wait: the
  // collective throws, so that SIGTERM stops a node whose peers never arrive.
  explicit MpiWorld(const sigset_t& stop_signals);
  // MPI_Finalize, within kFinalizeGrace (past it the process exits with status 1); skipped if a peer
  // failed, since it could wait on it forever. Only reached when leave() was not called.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Node `root`'s `data` on every node (others pass anything).
  std::string broadcast(const std::string& data, int root);
  // A broadcast from this node of `size` bytes in pieces of kBroadcastPiece, so that no node holds them
  // whole: `produce` writes them through the Write it is given. Bytes it did not write (it threw) are
  // sent as zeros, so that the others are never left waiting; writing more than `size` throws.
  using Write = std::function<void(const char* data, size_t len)>;
  void send_pieces(uint64_t size, const std::function<void(const Write&)>& produce);
  // The other end, on every node but `root`: `consume` is told the size and reads the bytes through the
  // Read it is given, which fills exactly `len` bytes or throws (past the end). What `consume` leaves
  // unread (it threw, say) is received and dropped: every node takes part in every piece.
  using Read = std::function<void(char* to, size_t len)>;
  void receive_pieces(int root, const std::function<void(uint64_t size, const Read&)>& consume);
  static constexpr uint64_t kBroadcastPiece = uint64_t{4} << 20;
  // Every node's list, by node.
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& mine);
  // True on every node if `ok` is true on every node.
  bool all(bool ok);

  void mark_unclean() { unclean_ = true; }

  // The point-to-point wire between the nodes' daemons, made on the first call (a communicator of its
  // own). It lives as long as the world: what a peer never answered stays with it until the process
  // leaves (Wire::strand).
  Wire& peer_wire();

  // Ends the process with `status`. With several nodes: once every node has called it (waiting at most
  // kLeaveGrace for them), without MPI_Finalize (see mpi.cpp for why); a world of one finalizes within
  // kFinalizeGrace. REQUIRES: everything else is cleaned up (the mount gone, peers stopped); stdio is
  // flushed, no destructor or atexit handler runs after it.
  [[noreturn]] void leave(int status);

 private:
  void finalize_within(std::chrono::seconds grace);

  // Waits for a nonblocking collective; throws if a stop signal is pending (and marks the world unclean:
  // the collective is still outstanding).
  void wait(void* request, const char* what);
  // MPI_Ibcast of `len` bytes (at most INT_MAX) from `root`, waited for.
  void broadcast_bytes(void* data, uint64_t len, int root);

  sigset_t stop_signals_;
  int rank_ = 0;
  int size_ = 1;
  bool unclean_ = false;
  int exit_status_ = 1;  // what a bounded MPI_Finalize exits with when it runs out of time
  std::unique_ptr<Wire> peer_wire_;
};

}  // namespace clairfs
