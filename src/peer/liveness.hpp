// Whether the peers this node waits on are alive, found out within a second rather than a request's
// whole timeout (peer_timeout, 5 s: a node killed mid-transfer stalled every reader that long).
//
// No MPI here: the progress thread tells it what it asked of each peer and what it heard from it, and
// asks each turn whom to ping and whom to give up. A peer is pinged once it has been silent for
// `probe_after` while this node waits on it (any message from it — an answer, a request of its own, a
// pong — counts as heard); it is dead when that ping is not answered within `answer_within` (or 4 × the
// slowest answer it gave, if longer; `unproven_within` before its first answer), plus the time the
// answers it still owes take at
// `link_bytes_per_second` (a pong may queue behind them on the connection). A peer this node waits on for nothing is
// not pinged: its death costs nothing until asked.
//
// Thread-compatible: the progress thread's alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace clairfs {

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  struct Config {
    std::chrono::milliseconds probe_after{250};
    std::chrono::milliseconds answer_within{600};
    std::chrono::milliseconds unproven_within{2500};  // for a peer that has not answered a request yet
    double link_bytes_per_second = 100e6;
  };
  PeerLiveness(int nodes, Config config) : config_(config), peers_(static_cast<size_t>(nodes)) {}

  // A fetch of `bytes` asked of `peer`, and its end (answered, refused, failed or given up).
  void asked(int peer, uint64_t bytes, Clock::time_point now);
  void ended(int peer, uint64_t bytes);
  // Any message from `peer`.
  void heard(int peer, Clock::time_point now);
  // An answer from `peer` came `took` after its request: a peer slow to answer (a busy node, a sanitized
  // build) gets a ping as long to answer, 4 × its slowest answer if that is longer than answer_within.
  void answered(int peer, Clock::duration took);

  struct Turn {
    std::vector<int> ping;  // silent while owing answers: ask whether it is there
    std::vector<int> dead;  // its ping not answered in time: give it up (reported once)
  };
  Turn turn(Clock::time_point now);

 private:
  struct Peer {
    unsigned owed = 0;  // fetches outstanding
    uint64_t owed_bytes = 0;
    Clock::time_point heard;                  // the latest message, or when it began to owe
    std::optional<Clock::time_point> pinged;  // an unanswered ping, sent then
    Clock::duration slowest{0};               // its slowest answer to a request
    bool dead = false;
  };
  const Config config_;
  std::vector<Peer> peers_;
};

}  // namespace clairfs
