#include "peer/peer_loop.hpp"

#include <algorithm>
#include <cerrno>
#include <new>

#include "peer/message.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {
const uint64_t kOne = 1;  // the body of goodbyes, pings and pongs
}  // namespace

PeerLoop::PeerLoop(Wire& wire, const Manifest& manifest, PeersConfig config, const LinkWatch* links)
    : wire_(wire),
      manifest_(manifest),
      links_(links),
      config_(config),
      node_(wire.node()),
      nodes_(wire.nodes()),
      gone_(static_cast<size_t>(nodes_)),
      liveness_(nodes_, {.probe_after = kProbeAfter,
                         .answer_within = std::min<std::chrono::milliseconds>(kAnswerWithin, config.timeout),
                         .unproven_within = config.timeout / 2,
                         .link_bytes_per_second = kSlowLink}),
      left_(static_cast<size_t>(nodes_), 0),
      silent_(static_cast<size_t>(nodes_), 0),
      per_peer_(static_cast<size_t>(nodes_), 0) {
  gone_[static_cast<size_t>(node_)] = true;  // never ask ourselves
  requests_.tag = kRequest, requests_.words = 3;
  goodbyes_.tag = kGoodbye, pings_.tag = kPing, pongs_.tag = kPong;
  for (Standing* st : {&requests_, &goodbyes_, &pings_, &pongs_})
    st->in = std::shared_ptr<uint64_t[]>(new uint64_t[st->words]());
}

bool PeerLoop::usable(int owner) const { return owner >= 0 && owner < nodes_ && !gone_[static_cast<size_t>(owner)]; }

void PeerLoop::fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, PeerTransport::Done done) {
  if (!usable(owner) || buf->size() > kMaxPeerFile || buf->empty()) {
    done(-EHOSTDOWN);
    return;
  }
  auto f = std::make_unique<Fetch>();
  f->owner = owner;
  f->id = id;
  f->buf = std::move(buf);
  f->done = std::move(done);
  {
    MutexLock lock(mutex_);
    if (stop_) {
      f->done(-ECANCELED);
      return;
    }
    queued_.push_back(std::move(f));
  }
  wake_.notify_one();
}

PeerTransport::Counters PeerLoop::counters() const {
  PeerTransport::Counters c;
  {
    MutexLock lock(mutex_);
    c = counters_;
  }
  c.links = links_ ? static_cast<uint64_t>(links_->made()) : 0;
  return c;
}

void PeerLoop::stop() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
}

bool PeerLoop::stopping() const {
  MutexLock lock(mutex_);
  return stop_;
}

void PeerLoop::begin(PeerTransport::Lookup lookup) {
  lookup_ = std::move(lookup);
  for (Standing* s : {&requests_, &goodbyes_, &pings_, &pongs_}) post(*s);
}

bool PeerLoop::turn(Clock::time_point now) {
  bool busy = serve_requests(now);
  busy |= take_goodbyes();
  busy |= answer_pings(now);
  busy |= take_pongs(now);
  busy |= start_queued(now);
  watch_liveness(now);
  busy |= poll_fetches(now);
  reap_sends();
  return busy;
}

void PeerLoop::nap() {
  MutexLock lock(mutex_);  // (a wake-up without news only turns the loop once more)
  if (!stop_ && (queued_.empty() || active_.size() >= config_.max_in_flight)) lock.wait_for(wake_, kIdleNap);
}

// ---- the standing receives -----------------------------------------------------------------------------

void PeerLoop::post(Standing& s) {
  s.op = wire_.receive(s.in.get(), s.words * sizeof(uint64_t), Wire::kAnyNode, s.tag);
}

bool PeerLoop::take(Standing& s, Wire::Test* got, uint64_t* words) {
  *got = wire_.test(s.op);
  if (!got->ended) return false;
  if (words) std::copy(s.in.get(), s.in.get() + s.words, words);
  // A receive from any node can be broken by one peer failing: it stands again for the others.
  post(s);
  if (got->broken) {
    failed_ = true;
    return false;
  }
  if (got->from < 0 || got->from >= nodes_) got->from = -1;
  return true;
}

void PeerLoop::send_small(const uint64_t* word, int to, int tag) {
  sends_.push_back({wire_.send(word, sizeof(uint64_t), to, tag), nullptr});
}

// ---- the phases ----------------------------------------------------------------------------------------

bool PeerLoop::serve_requests(Clock::time_point now) {
  Wire::Test got;
  uint64_t in[3] = {0, 0, 0};
  if (!take(requests_, &got, in)) return false;
  const int from = got.from;
  const auto request = decode_peer_request(in, got.bytes, manifest_, wire_.max_tag());
  const uint64_t asked_tag = in[1];
  if (from >= 0) heard_from(from, now);
  if (from < 0 || left_[static_cast<size_t>(from)] ||
      (!request && (asked_tag < kPeerFirstReplyTag || asked_tag > static_cast<uint64_t>(wire_.max_tag())))) {
    // It left (nobody waits for an answer), or the request is too broken to answer at all.
    if (!request) {
      MutexLock lock(mutex_);
      counters_.refused_to_peers++;
    }
    return true;
  }
  const int tag = static_cast<int>(asked_tag);
  // Its request came, and the answer goes back: messages go both ways with it (a later ping of it is
  // not held to the first contact's time).
  liveness_.answered(from);
  PeerBytes bytes = request ? lookup_(request->id) : nullptr;
  if (bytes && bytes->size() == request->size) {
    sends_.push_back({wire_.send(bytes->data(), bytes->size(), from, tag), bytes});
    MutexLock lock(mutex_);
    counters_.served++;
    counters_.served_bytes += bytes->size();
  } else {
    sends_.push_back({wire_.send(nullptr, 0, from, tag), nullptr});
    MutexLock lock(mutex_);
    counters_.refused_to_peers++;
  }
  return true;
}

bool PeerLoop::take_goodbyes() {
  Wire::Test got;
  if (!take(goodbyes_, &got)) return false;
  if (got.from >= 0) gone_[static_cast<size_t>(got.from)] = true, left_[static_cast<size_t>(got.from)] = 1;
  return true;
}

bool PeerLoop::answer_pings(Clock::time_point now) {
  // Answered by any node that has not left, whether or not it asks that one.
  Wire::Test got;
  if (!take(pings_, &got)) return false;
  if (got.from >= 0 && !left_[static_cast<size_t>(got.from)]) {
    heard_from(got.from, now);
    send_small(&kOne, got.from, kPong);
  }
  return true;
}

bool PeerLoop::take_pongs(Clock::time_point now) {
  Wire::Test got;
  if (!take(pongs_, &got)) return false;
  if (got.from >= 0) heard_from(got.from, now);
  return true;
}

int PeerLoop::next_reply_tag(int owner) {
  const uint64_t span = static_cast<uint64_t>(wire_.max_tag() - kPeerFirstReplyTag);
  int tag = 0;
  do {
    tag = kPeerFirstReplyTag + static_cast<int>(next_tag_++ % span);
  } while (awaited(owner, tag));
  return tag;
}

bool PeerLoop::start_queued(Clock::time_point now) {
  bool busy = false;
  std::vector<std::unique_ptr<Fetch>> refused;
  {
    MutexLock lock(mutex_);
    for (auto it = queued_.begin(); it != queued_.end() && active_.size() < config_.max_in_flight;) {
      Fetch& f = **it;
      if (gone_[static_cast<size_t>(f.owner)]) {
        refused.push_back(std::move(*it));
        it = queued_.erase(it);
        continue;
      }
      if (per_peer_[static_cast<size_t>(f.owner)] >= config_.max_per_peer) {
        ++it;
        continue;
      }
      f.tag = next_reply_tag(f.owner);
      encode_peer_request(PeerRequest{f.id, f.tag, f.buf->size()}, f.header);
      f.deadline = now + config_.timeout;
      // The receive goes first, straight into the file's buffer; then the request.
      f.recv = wire_.receive(f.buf->data(), f.buf->size(), f.owner, f.tag);
      f.send = wire_.send(f.header, sizeof f.header, f.owner, kRequest);
      ++per_peer_[static_cast<size_t>(f.owner)];
      liveness_.asked(f.owner, f.buf->size(), now);
      counters_.requests++;
      active_.push_back(std::move(*it));
      it = queued_.erase(it);
      busy = true;
    }
  }
  for (auto& f : refused) f->done(-EHOSTDOWN);
  return busy;
}

void PeerLoop::watch_liveness(Clock::time_point now) {
  // Peers whose link closed without a goodbye: their daemons are gone (a process's end closes its
  // sockets), whether this node waits on them or not. Given up for good (a daemon does not come back).
  if (links_ && links_->closures() != closures_seen_) {
    closures_seen_ = links_->closures();
    for (int peer = 0; peer < nodes_; ++peer)
      if (peer != node_ && !gone_[static_cast<size_t>(peer)] && links_->closed(peer)) {
        failed_ = true;  // the end must not wait on it
        fail_peer(peer, false, "closed its link without a goodbye (its daemon is gone)");
      }
  }
  // Peers silent while they owe answers: pinged, and given up when the ping is not answered in time
  // (their fetches then end in poll_fetches, as a gone peer's do).
  const PeerLiveness::Turn alive = liveness_.turn(now);
  for (int peer : alive.ping)
    if (!gone_[static_cast<size_t>(peer)]) send_small(&kOne, peer, kPing);
  for (int peer : alive.dead) {
    failed_ = true;  // the end must not wait on it
    using std::chrono::milliseconds;
    fail_peer(peer, true,
              "did not answer a ping in " +
                  std::to_string(std::chrono::duration_cast<milliseconds>(liveness_.ping_within(peer)).count()) +
                  " ms (silent for " +
                  std::to_string(std::chrono::duration_cast<milliseconds>(liveness_.silence(peer, now)).count()) +
                  " ms: dead or stopped?)");
  }
  take_late_answers(now);
}

bool PeerLoop::poll_fetches(Clock::time_point now) {
  bool busy = false;
  for (size_t i = 0; i < active_.size();) {
    Fetch& f = *active_[i];
    if (f.send != Wire::kNone && wire_.test(f.send).broken) {
      failed_ = true;
      fail_peer(f.owner, false, "failed");
    }
    const Wire::Test got = wire_.test(f.recv);
    if (got.broken) {
      failed_ = true;
      fail_peer(f.owner, false, "failed");
      // A request still on its way reads the fetch's header: kept until it has gone, as a given-up one.
      std::unique_ptr<Fetch> gave = finish(i, -EHOSTDOWN);
      if (gave->send != Wire::kNone) give_up(std::move(gave), false);
      busy = true;
      continue;
    }
    if (got.ended) {
      heard_from(f.owner, now);
      liveness_.answered(f.owner);
      // (The answer implies the request arrived: its send ends without waiting.)
      while (f.send != Wire::kNone) wire_.test(f.send);
      finish(i, got.bytes == f.buf->size() ? static_cast<int64_t>(got.bytes) : -ENOENT);
      busy = true;
      continue;
    }
    if (now >= f.deadline || gone_[static_cast<size_t>(f.owner)]) {
      // Given up. Its tag waits for the late answer: it is used again only after.
      const bool timed_out = now >= f.deadline;
      // A peer that stopped answering may be dead: the end must not wait on it.
      if (timed_out) failed_ = true;
      fail_peer(f.owner, timed_out, timed_out ? "did not answer in time" : "left");
      wire_.cancel(f.recv);
      const Wire::Test c = wire_.test(f.recv);  // (f.recv stays while the receive runs)
      // Not ended: data may be arriving into the buffer, which the receive keeps (the caller reads the
      // next store into a fresh one). Cancelled: the answer, if it comes, waits unmatched.
      const bool answer_due = !c.ended || c.cancelled;
      if (!c.ended) failed_ = true;
      std::unique_ptr<Fetch> gave = finish(i, timed_out ? -ETIMEDOUT : -EHOSTDOWN);
      if (answer_due || gave->send != Wire::kNone) give_up(std::move(gave), answer_due);
      busy = true;
      continue;
    }
    ++i;
  }
  return busy;
}

void PeerLoop::reap_sends() {
  for (size_t i = 0; i < sends_.size();) {
    const Wire::Test t = wire_.test(sends_[i].op);
    if (t.broken) failed_ = true;
    if (t.ended) {
      sends_[i] = std::move(sends_.back());
      sends_.pop_back();
    } else {
      ++i;
    }
  }
}

// ---- peers and fetches ---------------------------------------------------------------------------------

void PeerLoop::fail_peer(int peer, bool silence, const std::string& why) {
  if (peer < 0 || peer >= nodes_ || gone_[static_cast<size_t>(peer)].exchange(true)) return;
  silent_[static_cast<size_t>(peer)] = silence;
  log_warning("peer node " + std::to_string(peer) + " " + why + ": not asked any more" +
              (silence ? " unless it answers again" : "") + "; its files come from SOURCE");
}

void PeerLoop::heard_from(int peer, Clock::time_point now) {
  liveness_.heard(peer, now);
  if (!silent_[static_cast<size_t>(peer)] || left_[static_cast<size_t>(peer)]) return;
  if (links_ && links_->closed(peer)) return;  // a message it sent before it died, taken late
  silent_[static_cast<size_t>(peer)] = 0;
  gone_[static_cast<size_t>(peer)] = false;
  {
    MutexLock lock(mutex_);
    counters_.returned++;
  }
  log_notice("peer node " + std::to_string(peer) + " answers again: asked again");
}

std::unique_ptr<PeerLoop::Fetch> PeerLoop::finish(size_t i, int64_t result) {
  std::unique_ptr<Fetch> f = std::move(active_[i]);
  active_[i] = std::move(active_.back());
  active_.pop_back();
  --per_peer_[static_cast<size_t>(f->owner)];
  liveness_.ended(f->owner, f->buf->size());
  {
    MutexLock lock(mutex_);
    if (result >= 0)
      counters_.hits++;
    else if (result == -ENOENT)
      counters_.refused++;
    else if (result == -ETIMEDOUT)
      counters_.timeouts++;
    else
      counters_.failures++;
  }
  f->done(result);
  return f;
}

void PeerLoop::give_up(std::unique_ptr<Fetch> f, bool answer_due) {
  if (f->recv == Wire::kNone) f->buf.reset();  // no receive writes into it
  const uint64_t key = key_of(f->owner, f->tag);
  given_up_[key] = Given{std::move(f), answer_due};
}

void PeerLoop::take_late_answers(Clock::time_point now) {
  if (given_up_.empty() || now < next_look_) return;
  next_look_ = now + kLook;
  for (auto it = given_up_.begin(); it != given_up_.end();) {
    Given& g = it->second;
    Fetch& f = *g.fetch;
    if (f.send != Wire::kNone) wire_.test(f.send);
    if (g.answer_due && f.recv != Wire::kNone) {
      if (wire_.test(f.recv).ended) g.answer_due = false;
    } else if (g.answer_due) {
      // Looked for first, so that no memory is held for an answer that may never come; then received
      // into a buffer of its own without waiting (a large answer takes a while).
      size_t bytes = 0;
      bool broken = false;
      if (wire_.waiting(f.owner, f.tag, &bytes, &broken)) {
        try {
          f.buf = std::make_shared<Bytes>(bytes);
          f.recv = wire_.receive(f.buf->data(), bytes, f.owner, f.tag);
        } catch (const std::bad_alloc&) {  // taken at a later look
        }
      } else if (broken) {
        g.answer_due = false;  // the peer broke: nothing more comes from it
      }
    }
    if (!g.answer_due && f.send == Wire::kNone)
      it = given_up_.erase(it);
    else
      ++it;
  }
}

// ---- the end -------------------------------------------------------------------------------------------

bool PeerLoop::leave(Clock::time_point until, const std::function<void()>& nap) {
  static const uint64_t kBye = 1;
  std::vector<Wire::Op> byes;
  for (int peer = 0; peer < nodes_; ++peer)
    if (peer != node_ && !gone_[static_cast<size_t>(peer)])
      byes.push_back(wire_.send(&kBye, sizeof kBye, peer, kGoodbye));
  for (auto& f : active_) {
    wire_.cancel(f->recv);
    const bool ended = wire_.test(f->recv).ended;
    if (!ended) failed_ = true;
    f->done(-ECANCELED);
    // A receive not ended may still write into the fetch's buffer (its caller lets go of its own share
    // now), and a request still on its way is read from the fetch: kept to the end, as fetches given up.
    if (!ended || f->send != Wire::kNone) give_up(std::move(f), !ended);
  }
  active_.clear();
  {
    MutexLock lock(mutex_);
    stop_ = true;  // a fetch from now on ends at once
    for (auto& f : queued_) f->done(-ECANCELED);
    queued_.clear();
  }
  for (;;) {
    bool all = true;
    for (Wire::Op& op : byes) all &= wire_.test(op).ended;
    for (Send& s : sends_) all &= wire_.test(s.op).ended;
    if (all) break;
    if (Clock::now() >= until) {
      failed_ = true;  // someone is not taking our messages: do not wait on them at the end
      break;
    }
    nap();
  }
  // What still runs is cancelled; what cannot be is the wire's to keep (with the memory it touches).
  for (Wire::Op op : byes)
    if (op != Wire::kNone) wire_.strand(op, nullptr);
  for (Send& s : sends_)
    if (s.op != Wire::kNone) wire_.strand(s.op, std::move(s.bytes));
  sends_.clear();
  for (auto& [key, g] : given_up_) {
    Fetch& f = *g.fetch;
    if (f.recv != Wire::kNone) {
      wire_.cancel(f.recv);
      wire_.test(f.recv);
    }
    wire_.test(f.send);
    if (f.recv != Wire::kNone || f.send != Wire::kNone) {
      failed_ = true;
      const Wire::Op recv = f.recv, send = f.send;
      std::shared_ptr<Fetch> held(std::move(g.fetch));
      if (recv != Wire::kNone) wire_.strand(recv, held);
      if (send != Wire::kNone) wire_.strand(send, held);
    }
  }
  given_up_.clear();
  for (Standing* s : {&requests_, &goodbyes_, &pings_, &pongs_}) {
    wire_.cancel(s->op);
    if (!wire_.test(s->op).ended) wire_.strand(s->op, s->in);
  }
  return failed_;
}

// ---- WirePeers -----------------------------------------------------------------------------------------

WirePeers::WirePeers(Wire& wire, const Manifest& manifest, PeersConfig config, std::function<void(bool)> ended,
                     const LinkWatch* links)
    : loop_(wire, manifest, config, links), ended_(std::move(ended)) {}

WirePeers::~WirePeers() { stop(); }

void WirePeers::start(Lookup lookup) {
  thread_ = std::thread([this, lookup = std::move(lookup)]() mutable { run(std::move(lookup)); });
}

void WirePeers::fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, Done done) {
  loop_.fetch(owner, id, std::move(buf), std::move(done));
}

void WirePeers::stop() {
  loop_.stop();
  if (thread_.joinable()) thread_.join();
}

void WirePeers::run(Lookup lookup) {
  loop_.begin(std::move(lookup));
  while (!loop_.stopping())
    if (!loop_.turn(PeerLoop::Clock::now())) loop_.nap();
  const bool failed = loop_.leave(PeerLoop::Clock::now() + PeerLoop::kStopGrace,
                                  [] { std::this_thread::sleep_for(PeerLoop::kIdleNap); });
  if (ended_) ended_(failed);
}

}  // namespace clairfs
