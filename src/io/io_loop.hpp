// IoLoop: one thread's asynchronous I/O — its io_uring Ring, and completions that arrive from other
// threads (a peer's answer on the transport's thread) — run as callbacks on that thread.
//
// The stores start their work here (an open, then a read, then a check) by chaining callbacks: each
// runs on the loop's thread when its operation ends, and owns what the operation needs (the buffer, the
// path) until then. Operations finished elsewhere are started with external(), whose wrapper may be
// called from any thread, even after the loop is gone (the answer is then dropped).
//
// Thread-compatible, but for external()'s wrappers: one thread (the stager) makes and runs the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/uring.hpp"

namespace clairfs {

class IoLoop {
 public:
  using Done = std::function<void(int64_t result)>;

  // Throws std::runtime_error if io_uring cannot be set up.
  explicit IoLoop(unsigned depth);
  // Waits out the ring's operations (their buffers are held by their callbacks), without running them.
  ~IoLoop();

  // Ring operations, as Ring's (results the same). REQUIRES: ring_room() > 0, or accept the kernel
  // queueing beyond the ring's depth (see Ring).
  void open(int dir_fd, std::string path, Done done);
  void read(int fd, char* buf, size_t len, Done done, uint64_t offset = 0);
  void write(int fd, const char* buf, size_t len, Done done, uint64_t offset = 0);

  // An operation another thread completes: the returned function, called once from any thread with the
  // result, has `done` run on the loop's thread at its next turn.
  Done external(Done done);

  // Runs what finished: waits up to `wait` for something to (0: does not wait). Returns how many ran.
  size_t run(std::chrono::milliseconds wait);
  // Runs what finished, waiting for at least one ring operation if any is in flight.
  size_t run_waiting();

  unsigned depth() const { return ring_.depth(); }
  unsigned ring_in_flight() const { return ring_.in_flight(); }
  unsigned ring_room() const { return ring_.depth() > ring_.in_flight() ? ring_.depth() - ring_.in_flight() : 0; }
  unsigned external_in_flight() const { return external_in_flight_; }
  bool idle() const { return ring_.in_flight() == 0 && external_in_flight_ == 0; }

 private:
  struct Mailbox;  // answers from other threads; shared with the wrappers external() hands out
  size_t dispatch(const std::vector<Ring::Completion>& done);

  Ring ring_;
  uint64_t next_tag_ = 1;
  std::unordered_map<uint64_t, Done> waiting_;  // ring operations by tag
  std::shared_ptr<Mailbox> mailbox_;
  unsigned external_in_flight_ = 0;
};

}  // namespace clairfs
