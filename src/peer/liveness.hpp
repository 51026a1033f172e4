// Whether the peers this node waits on are alive, found out within a second rather than a request's
// whole timeout (peer_timeout, 5 s: a node killed mid-transfer stalled every reader that long).
//
// No MPI here: the progress thread tells it what it asked of each peer and what it heard from it, and
// asks each turn whom to ping and whom to give up. A peer is pinged once it has been silent for
// `probe_after` while this node waits on it (any message from it — an answer, a request of its own, a
// pong — counts as heard); it is dead when that ping is not answered within `answer_within`, or 4 × the
// slowest ping answer it gave lately if longer (a busy node, a sanitized build: its progress thread
// answers late), plus the time the answers it still owes take at `link_bytes_per_second` (a pong may
// queue behind them on the connection); `unproven_within` while it has answered nothing yet (its first
// answers come over connections still being made) — unless this node answered a request of its own: then
// messages went both ways (once in CI a survivor's read waited 2.58 s on a node killed mid-epoch, about
// this rule's wait; which rule held it was not logged then). How long its answers to requests took does not
// count: a keeper answers a file once it has it, and a wait for that is no measure of a pong's (4 × one
// slow answer once let a killed node stall readers 2.6 s in CI). A peer this node waits on for nothing
// is not pinged: its death costs nothing until asked.
//
// Silence is not proof of death: a node stalled longer than that (a swap storm, a stopped process, a
// compile beside it) answers again later. A peer given up for silence that is heard from again is
// alive again (heard() says so), and its pings are given twice as long each time that happens, up to
// `longest_within`, so that a peer slow by nature is not given up and taken back over and over.
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
    std::chrono::milliseconds longest_within{5000};  // a ping's wait, however often the peer came back
  };
  PeerLiveness(int nodes, Config config) : config_(config), peers_(static_cast<size_t>(nodes)) {}

  // A fetch of `bytes` asked of `peer`, and its end (answered, refused, failed or given up).
  void asked(int peer, uint64_t bytes, Clock::time_point now);
  void ended(int peer, uint64_t bytes);
  // Any message from `peer`. True if it had been given up for silence: it is alive again.
  bool heard(int peer, Clock::time_point now);
  // A request and its answer went between `peer` and this node, either way: it is proven (the
  // connections are made; a ping of it is not given the first contact's time).
  void answered(int peer);

  struct Turn {
    std::vector<int> ping;  // silent while owing answers: ask whether it is there
    std::vector<int> dead;  // its ping not answered in time: give it up (reported once)
  };
  Turn turn(Clock::time_point now);
  // How long `peer` has been silent at `now` (for the log).
  Clock::duration silence(int peer, Clock::time_point now) const {
    return now - peers_[static_cast<size_t>(peer)].heard;
  }
  // How long a ping of `peer` is given before it is taken for dead (for the log).
  Clock::duration ping_within(int peer) const { return within(peers_[static_cast<size_t>(peer)]); }

 private:
  struct Peer {
    unsigned owed = 0;  // fetches outstanding
    uint64_t owed_bytes = 0;
    Clock::time_point heard;                  // the latest message, or when it began to owe
    std::optional<Clock::time_point> pinged;  // an unanswered ping, sent then
    Clock::duration slow_pong{0};             // its slowest ping answer lately (an eighth forgotten per answer)
    bool proven = false;                      // it answered a request or a ping
    unsigned returns = 0;                     // times it was heard from again after being given up
    bool dead = false;
  };
  Clock::duration within(const Peer& p) const;

  const Config config_;
  std::vector<Peer> peers_;
};

}  // namespace clairfs
