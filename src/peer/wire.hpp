// The point-to-point messages between daemons that the peer loop (peer/peer_loop.hpp) is made of, as MPI
// gives them: nonblocking sends and receives matched by (node, tag), each tested without waiting. The
// real one is MPI's (MpiWorld::peer_wire, peer/mpi.cpp); tests put a loopback in its place
// (tests/fakes/loopback_wire.hpp), so that the loop is tested without a launcher.
//
// Every call is made by one thread, the progress thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace clairfs {

class Wire {
 public:
  // An operation under way (a send or a receive); kNone once it has ended.
  using Op = uint64_t;
  static constexpr Op kNone = 0;
  static constexpr int kAnyNode = -1;

  struct Test {
    bool ended = false;      // it completed, was cancelled, or broke: `op` is kNone now
    bool broken = false;     // it failed (its peer failed): no bytes came or went
    bool cancelled = false;  // cancel() took it before it matched
    int from = -1;           // a receive's sender
    size_t bytes = 0;        // the length of what a receive took
  };

  virtual ~Wire() = default;
  virtual int node() const = 0;
  virtual int nodes() const = 0;
  // The largest tag a message may carry.
  virtual int max_tag() const = 0;

  // A receive of at most `len` bytes from node `from` (or kAnyNode) with `tag`, into `into`; a send of
  // `len` bytes to node `to`. REQUIRES: the memory stays valid until the operation ends (test() says so)
  // or is handed to strand().
  virtual Op receive(void* into, size_t len, int from, int tag) = 0;
  virtual Op send(const void* data, size_t len, int to, int tag) = 0;
  // Whether `op` has ended; once it has, `op` is set to kNone (testing kNone says ended).
  virtual Test test(Op& op) = 0;
  // Asks for a receive to be taken back; test() then tells whether it was (cancelled) or had matched.
  virtual void cancel(Op op) = 0;
  // Whether a message from `from` with `tag` waits with no receive for it (*bytes its length). False with
  // *broken set when that peer failed: nothing more comes from it.
  virtual bool waiting(int from, int tag, size_t* bytes, bool* broken) = 0;
  // The end of an operation that may still read or write `memory` (a peer that never answered): the
  // wire keeps both for as long as it lives, which for MPI's is until the process leaves. Nothing is
  // told of it again.
  virtual void strand(Op op, std::shared_ptr<const void> memory) = 0;
};

}  // namespace clairfs
