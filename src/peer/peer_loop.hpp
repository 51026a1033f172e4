// The peers' progress: what one node's daemon says to the others and hears from them, over a Wire
// (peer/wire.hpp), turned by one progress thread (WirePeers, below) that alone calls the wire:
//   request  requester -> owner, tag kRequest: {file id, reply tag, size} (peer/message.hpp)
//   reply    owner -> requester, the reply tag: the file's bytes, or an empty message (refused)
//   goodbye  tag kGoodbye: the sender leaves; nothing more is asked of it or sent to it
//   ping     tag kPing, to a peer that owes answers and has been silent (PeerLiveness); pong, kPong, back
// The requester posts its receive straight into the buffer the file will live in (no copy) before it
// sends the request. Requests in flight are bounded (per peer and in all); an answer that does not come
// within the timeout, or a ping unanswered (peer/liveness.hpp), fails the fetch (the caller reads SOURCE
// instead) and that peer is asked nothing more until heard from again — and its reply tag is not used
// again until the late answer is taken, so that it can never land in another request's buffer.
//
// A turn is made of phases, each a method the unit tests call alone (tests/unit/peer_loop_test.cpp):
// serve requests, take goodbyes, answer pings, take pongs, start queued fetches, watch liveness, poll
// fetches, reap sends; leave() is the drain at the end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/peer.hpp"
#include "peer/links.hpp"
#include "peer/liveness.hpp"
#include "peer/wire.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

struct PeersConfig {
  std::chrono::milliseconds timeout{5000};  // an answer later than this fails the fetch
  unsigned max_in_flight = 32;              // fetches outstanding in all
  unsigned max_per_peer = 8;                // and to one peer
};

class PeerLoop {
 public:
  using Clock = std::chrono::steady_clock;
  // The tags of the loop's own messages (replies carry tags from kPeerFirstReplyTag up).
  static constexpr int kRequest = 1;
  static constexpr int kGoodbye = 2;
  static constexpr int kPing = 3;  // are you there? (PeerLiveness)
  static constexpr int kPong = 4;  // yes
  // A file larger than this is never asked of a peer (MPI counts are ints): it is read from SOURCE.
  static constexpr uint64_t kMaxPeerFile = 1u << 30;
  // A peer owing answers and silent this long is pinged; one whose ping is not answered within
  // kAnswerWithin (or the timeout, if shorter) is given up. A file sent to us on the way may hold the
  // pong back: the time its bytes take at kSlowLink is added (peer/liveness.hpp).
  static constexpr auto kProbeAfter = std::chrono::milliseconds(250);
  static constexpr auto kAnswerWithin = std::chrono::milliseconds(600);
  static constexpr double kSlowLink = 100e6;
  // How long leave() keeps trying to deliver goodbyes and finish sends to peers that may be gone.
  static constexpr auto kStopGrace = std::chrono::seconds(2);
  // The progress thread's nap when there is nothing to do: short enough for a fetch's latency, long
  // enough not to take a core from the readers.
  static constexpr auto kIdleNap = std::chrono::microseconds(200);

  // REQUIRES: the wire, the manifest and `links` outlive the loop (requests are checked against the
  // manifest). `links`, if given, says at once which peers' daemons are gone (peer/links.hpp): those are
  // given up without waiting for the pings.
  PeerLoop(Wire& wire, const Manifest& manifest, PeersConfig config, const LinkWatch* links = nullptr);
  PeerLoop(const PeerLoop&) = delete;
  PeerLoop& operator=(const PeerLoop&) = delete;

  // Any thread: PeerTransport's calls.
  int node() const { return node_; }
  int nodes() const { return nodes_; }
  void fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, PeerTransport::Done done) EXCLUDES(mutex_);
  bool usable(int owner) const;
  PeerTransport::Counters counters() const EXCLUDES(mutex_);
  // The next turn is the last (stopping() says so); a nap ends.
  void stop() EXCLUDES(mutex_);
  bool stopping() const EXCLUDES(mutex_);

  // The progress thread's. begin() posts the standing receives; turn() runs every phase once and says
  // whether any had something to do; nap() waits (at most kIdleNap) for a fetch or stop() when none had.
  void begin(PeerTransport::Lookup lookup);
  bool turn(Clock::time_point now);
  void nap() EXCLUDES(mutex_);
  // The end: goodbye to every peer still there, every fetch ended (-ECANCELED), sends given until
  // `until` to finish (sleeping `nap` between looks), what cannot end handed to the wire. True if a peer
  // broke an operation over the loop's life (the process's end must not wait on it).
  bool leave(Clock::time_point until, const std::function<void()>& nap) EXCLUDES(mutex_);

  // The phases, in the order a turn runs them; each returns whether it had something to do.
  bool serve_requests(Clock::time_point now) EXCLUDES(mutex_);  // a peer asks for a file
  bool take_goodbyes();                                         // a peer leaves
  bool answer_pings(Clock::time_point now);                     // are you there? yes
  bool take_pongs(Clock::time_point now);
  bool start_queued(Clock::time_point now) EXCLUDES(mutex_);  // fetches asked for, within the bounds
  void watch_liveness(Clock::time_point now);                 // closed links, pings to send, peers to give up
  bool poll_fetches(Clock::time_point now) EXCLUDES(mutex_);  // answers, and fetches waited on too long
  void reap_sends();                                          // our messages that have gone

  // What the phases left, for the unit tests.
  size_t active() const { return active_.size(); }
  size_t sending() const { return sends_.size(); }
  size_t given_up() const { return given_up_.size(); }
  bool left(int peer) const { return left_[static_cast<size_t>(peer)] != 0; }
  bool failed() const { return failed_; }

 private:
  struct Fetch {
    int owner = 0;
    EntryId id = 0;
    std::shared_ptr<Bytes> buf;
    PeerTransport::Done done;
    int tag = 0;
    Wire::Op recv = Wire::kNone;
    Wire::Op send = Wire::kNone;
    uint64_t header[3] = {0, 0, 0};
    Clock::time_point deadline;
  };
  // A standing receive of one small message from any node on a tag, posted again each time one comes.
  // (Its words are on the heap: a receive that cannot be taken back at the end is handed to the wire
  // with them.)
  struct Standing {
    int tag = 0;
    size_t words = 1;
    std::shared_ptr<uint64_t[]> in;
    Wire::Op op = Wire::kNone;
  };
  // A fetch given up (timed out, or its peer given up) whose answer may still come, or whose request may
  // still be on its way: kept until both have ended, its reply tag not used again for that peer until
  // then.
  struct Given {
    std::unique_ptr<Fetch> fetch;
    bool answer_due;
  };
  static constexpr auto kLook = std::chrono::milliseconds(50);  // how often given-up fetches are looked at
  static uint64_t key_of(int owner, int tag) {
    return (static_cast<uint64_t>(owner) << 32) | static_cast<uint32_t>(tag);
  }

  void post(Standing& s);
  // Whether the standing receive took a message: got->from its sender (-1 if none of the nodes), its
  // words copied to `words` (s.words of them) if given. It stands again after (a receive broken by one
  // peer's failure, for the others).
  bool take(Standing& s, Wire::Test* got, uint64_t* words = nullptr);
  void send_small(const uint64_t* word, int to, int tag);
  void fail_peer(int peer, bool silence, const std::string& why);
  void heard_from(int peer, Clock::time_point now) EXCLUDES(mutex_);
  // Ends active_[i], its `done` run with `result` and counted; returns it.
  std::unique_ptr<Fetch> finish(size_t i, int64_t result) EXCLUDES(mutex_);
  void give_up(std::unique_ptr<Fetch> f, bool answer_due);
  bool awaited(int owner, int tag) const { return given_up_.count(key_of(owner, tag)) != 0; }
  // Takes late answers that came (at most every kLook), and lets go of fetches whose messages ended.
  void take_late_answers(Clock::time_point now);
  int next_reply_tag(int owner);

  Wire& wire_;
  const Manifest& manifest_;
  const LinkWatch* const links_;
  uint64_t closures_seen_ = 0;
  const PeersConfig config_;
  const int node_;
  const int nodes_;
  PeerTransport::Lookup lookup_;

  mutable Mutex mutex_;  // the queue, the stop and the counters; the progress thread owns the rest
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Fetch>> queued_ GUARDED_BY(mutex_);
  bool stop_ GUARDED_BY(mutex_) = false;
  PeerTransport::Counters counters_ GUARDED_BY(mutex_);
  std::vector<std::atomic<bool>> gone_;  // per node: left, failed, or silent (until heard from again)

  Standing requests_, goodbyes_, pings_, pongs_;
  PeerLiveness liveness_;
  std::vector<char> left_;    // said goodbye: not answered either
  std::vector<char> silent_;  // given up for silence: asked again once heard from
  std::vector<std::unique_ptr<Fetch>> active_;
  std::vector<unsigned> per_peer_;
  struct Send {
    Wire::Op op = Wire::kNone;
    PeerBytes bytes;  // a file served: alive until its send ends
  };
  std::vector<Send> sends_;  // answers, pings and pongs on their way
  std::unordered_map<uint64_t, Given> given_up_;
  Clock::time_point next_look_;
  uint64_t next_tag_ = 0;
  bool failed_ = false;
};

// The PeerTransport over a wire: a PeerLoop and the progress thread that turns it.
class WirePeers final : public PeerTransport {
 public:
  // `ended` is told, on the progress thread as it ends, whether a peer broke an operation (MpiWorld
  // then leaves without waiting on it).
  WirePeers(Wire& wire, const Manifest& manifest, PeersConfig config, std::function<void(bool failed)> ended,
            const LinkWatch* links = nullptr);
  ~WirePeers() override;

  int node() const override { return loop_.node(); }
  int nodes() const override { return loop_.nodes(); }
  void start(Lookup lookup) override;
  void fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, Done done) override;
  bool usable(int owner) const override { return loop_.usable(owner); }
  Counters counters() const override { return loop_.counters(); }
  void stop() override;

 private:
  void run(Lookup lookup);

  PeerLoop loop_;
  std::function<void(bool)> ended_;
  std::thread thread_;
};

}  // namespace clairfs
