#include "peer/mpi.hpp"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "peer/liveness.hpp"
#include "peer/message.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

constexpr int kRequest = 1;
constexpr int kGoodbye = 2;
constexpr int kPing = 3;  // are you there? (PeerLiveness)
constexpr int kPong = 4;  // yes
// A file larger than this is never asked of a peer (MPI counts are ints): it is read from SOURCE.
constexpr uint64_t kMaxPeerFile = 1u << 30;
// How long stop() keeps trying to deliver goodbyes and finish sends to peers that may be gone.
constexpr auto kStopGrace = std::chrono::seconds(2);
// A peer owing answers and silent this long is pinged; one whose ping is not answered within
// kAnswerWithin (or peer_timeout, if shorter) is given up. A file sent to us on the way may hold the pong
// back: the time its bytes take at kSlowLink is added (peer/liveness.hpp).
constexpr auto kProbeAfter = std::chrono::milliseconds(250);
constexpr auto kAnswerWithin = std::chrono::milliseconds(600);
constexpr double kSlowLink = 100e6;
// The progress thread's nap when there is nothing to do: short enough for a fetch's latency, long
// enough not to take a core from the readers.
constexpr auto kIdleNap = std::chrono::microseconds(200);
// How often a start-up collective looks for a stop signal while it waits.
constexpr auto kCollectivePoll = std::chrono::milliseconds(1);
// How long MPI_Finalize may take once the mount is gone (a world of one), and how long a node waits for
// the others at the end (several): long enough for a clean goodbye over a slow network, short enough
// that a job's end is not held up.
constexpr auto kFinalizeGrace = std::chrono::seconds(10);
constexpr auto kLeaveGrace = std::chrono::seconds(5);

long env_long(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::strtol(v, nullptr, 10) : 0;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, static_cast<size_t>(len)));
}

}  // namespace

Launch detect_launch() {
  Launch l;
  // srun (any MPI plugin, or none) with several tasks. One task with no PMI (`srun clairfs ...`, or
  // `srun mount ...` through mount.fuse3, which waits for clairfs to detach) is a plain mount.
  if (std::getenv("SLURM_STEP_ID") && env_long("SLURM_STEP_NUM_TASKS") > 1) {
    l.launched = l.slurm = true;
    l.tasks = env_long("SLURM_STEP_NUM_TASKS");
    l.said_by = "SLURM_STEP_NUM_TASKS=" + std::to_string(l.tasks);
  }
  // Hydra (MPICH) and Slurm's pmi2 set PMI_SIZE; PMIx (Open MPI, Slurm's pmix); Open MPI's own. Any
  // size: `mpiexec -n 1` and a one-node job's `srun --mpi=pmi2` run in the foreground as a world of one.
  for (const char* name : {"PMI_SIZE", "PMIX_SIZE", "OMPI_COMM_WORLD_SIZE"})
    if (std::getenv(name)) {
      l.launched = true;
      if (env_long(name) > l.tasks || l.said_by.empty()) {
        l.tasks = env_long(name);
        l.said_by = std::string(name) + "=" + std::to_string(l.tasks);
      }
    }
  return l;
}

MpiWorld::MpiWorld(const sigset_t& stop_signals) : stop_signals_(stop_signals) {
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "cannot start MPI");
  if (provided < MPI_THREAD_MULTIPLE) throw std::runtime_error("MPI does not offer MPI_THREAD_MULTIPLE");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiWorld::~MpiWorld() {
  if (!unclean_) finalize_within(kFinalizeGrace);
}

void MpiWorld::finalize_within(std::chrono::seconds grace) {
  Mutex m;
  std::condition_variable cv;
  bool done = false;  // under m
  std::thread watchdog([&] {
    MutexLock lock(m);
    if (!lock.wait_for(cv, grace, [&] { return done; })) {
      log_warning("MPI_Finalize did not return within " + std::to_string(grace.count()) +
                  " s; leaving without it (the mount is already gone)");
      std::fflush(nullptr);
      std::_Exit(exit_status_);
    }
  });
  MPI_Finalize();
  {
    MutexLock lock(m);
    done = true;
  }
  cv.notify_one();
  watchdog.join();
}

void MpiWorld::leave(int status) {
  exit_status_ = status;
  if (size_ > 1) {
    // Every node waits here for the others (a barrier, bounded: a node may be dead or still serving),
    // then leaves without MPI_Finalize. MPICH 4.0.2's finalize over UCX's TCP transport deadlocks: a
    // node that has closed its endpoints waits for the others in a blocking PMI barrier and no longer
    // progresses UCX, while their endpoint flushes wait for it (4 of 6 runs over TCP; a barrier before
    // finalize did not help). Past the barrier nothing is in flight and no node needs another.
    if (!unclean_) {
      MPI_Request r = MPI_REQUEST_NULL;
      int flag = 0;
      if (MPI_Ibarrier(MPI_COMM_WORLD, &r) == MPI_SUCCESS) {
        const auto until = std::chrono::steady_clock::now() + kLeaveGrace;
        while (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
               std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(kCollectivePoll);
      }
      if (!flag) log_info("not every node reached the end within " + std::to_string(kLeaveGrace.count()) + " s; leaving");
    }
  } else if (!unclean_) {
    finalize_within(kFinalizeGrace);
  }
  std::fflush(nullptr);
  std::_Exit(status);
}

void MpiWorld::wait(void* request, const char* what) {
  auto* r = static_cast<MPI_Request*>(request);
  for (;;) {
    int flag = 0;
    check(MPI_Test(r, &flag, MPI_STATUS_IGNORE), what);
    if (flag) return;
    sigset_t pending;
    sigpending(&pending);
    for (int s : {SIGINT, SIGTERM, SIGHUP})
      if (sigismember(&stop_signals_, s) && sigismember(&pending, s)) {
        unclean_ = true;
        throw std::runtime_error(std::string("stopped by SIG") + sigabbrev_np(s) + " while waiting for the other nodes (" + what + ")");
      }
    std::this_thread::sleep_for(kCollectivePoll);
  }
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string line(text, static_cast<size_t>(std::max(length, 0)));
  if (const size_t nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  for (char& c : line)
    if (c == '\t') c = ' ';
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

void MpiWorld::broadcast_bytes(void* data, uint64_t len, int root) {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Ibcast(data, static_cast<int>(len), MPI_BYTE, root, MPI_COMM_WORLD, &r), "broadcast");
  wait(&r, "broadcast");
}

std::string MpiWorld::broadcast(const std::string& data, int root) {
  uint64_t size = data.size();
  broadcast_bytes(&size, sizeof size, root);
  std::string out = rank_ == root ? data : std::string(size, '\0');
  // In pieces: counts are ints.
  constexpr uint64_t kPiece = 1u << 30;
  for (uint64_t off = 0; off < size; off += kPiece) broadcast_bytes(out.data() + off, std::min(kPiece, size - off), root);
  return out;
}

void MpiWorld::send_pieces(uint64_t size, const std::function<void(const Write&)>& produce) {
  broadcast_bytes(&size, sizeof size, rank_);
  std::vector<char> piece;
  piece.reserve(static_cast<size_t>(std::min(size, kBroadcastPiece)));
  uint64_t sent = 0;  // bytes broadcast or in `piece`
  const Write write = [&](const char* data, size_t len) {
    if (len > size - sent) throw std::logic_error("send_pieces: more bytes than announced");
    while (len > 0) {
      const size_t n = std::min<size_t>(len, static_cast<size_t>(kBroadcastPiece) - piece.size());
      piece.insert(piece.end(), data, data + n);
      data += n;
      len -= n;
      sent += n;
      if (piece.size() == kBroadcastPiece || sent == size) {
        broadcast_bytes(piece.data(), piece.size(), rank_);
        piece.clear();
      }
    }
  };
  auto pad = [&] {  // the others expect `size` bytes whatever happened here
    const std::vector<char> zeros(static_cast<size_t>(std::min(size - sent, kBroadcastPiece)), '\0');
    while (sent < size) write(zeros.data(), static_cast<size_t>(std::min<uint64_t>(zeros.size(), size - sent)));
  };
  try {
    produce(write);
  } catch (...) {
    if (!unclean_) pad();  // a stop signal: the broadcast is abandoned
    throw;
  }
  pad();
}

void MpiWorld::receive_pieces(int root, const std::function<void(uint64_t size, const Read&)>& consume) {
  uint64_t size = 0;
  broadcast_bytes(&size, sizeof size, root);
  std::vector<char> piece;
  size_t at = 0;          // read from `piece` so far
  uint64_t received = 0;  // bytes received in all
  auto next = [&] {
    piece.resize(static_cast<size_t>(std::min(kBroadcastPiece, size - received)));
    broadcast_bytes(piece.data(), piece.size(), root);
    received += piece.size();
    at = 0;
  };
  const Read read = [&](char* to, size_t len) {
    while (len > 0) {
      if (at == piece.size()) {
        if (received == size) throw std::runtime_error("fewer bytes broadcast than read");
        next();
      }
      const size_t n = std::min(len, piece.size() - at);
      std::memcpy(to, piece.data() + at, n);
      to += n;
      len -= n;
      at += n;
    }
  };
  try {
    consume(size, read);
  } catch (...) {
    if (!unclean_)  // a stop signal: the broadcast is abandoned
      while (received < size) next();
    throw;
  }
  while (received < size) next();
}

std::vector<std::vector<uint64_t>> MpiWorld::allgather(const std::vector<uint64_t>& mine) {
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD, &r), "allgather");
  wait(&r, "allgather");
  int total = 0;
  for (int i = 0; i < size_; ++i) offsets[static_cast<size_t>(i)] = total, total += counts[static_cast<size_t>(i)];
  std::vector<uint64_t> all(static_cast<size_t>(total));
  check(MPI_Iallgatherv(mine.data(), count, MPI_UINT64_T, all.data(), counts.data(), offsets.data(), MPI_UINT64_T,
                        MPI_COMM_WORLD, &r),
        "allgather");
  wait(&r, "allgather");
  std::vector<std::vector<uint64_t>> out(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i)
    out[static_cast<size_t>(i)].assign(all.begin() + offsets[static_cast<size_t>(i)],
                                       all.begin() + offsets[static_cast<size_t>(i)] + counts[static_cast<size_t>(i)]);
  return out;
}

bool MpiWorld::all(bool ok) {
  int mine = ok ? 1 : 0, every = 0;
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r), "agreement");
  wait(&r, "agreement");
  return every == 1;
}

// ---- MpiPeers ----------------------------------------------------------------------------------------

struct MpiPeers::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  int tag_ub = 32767;
};

namespace {

// Tests a standing receive of one number from any node on `tag`: true when one came, *from then its
// sender (-1 if no node of the `nodes`). Either way the receive stands again after it; a receive broken
// by a peer's failure is posted again for the others, and *failed set.
bool take_standing(MPI_Request* recv, uint64_t* in, int tag, MPI_Comm comm, int nodes, int* from, bool* failed) {
  int flag = 0;
  MPI_Status st;
  if (MPI_Test(recv, &flag, &st) != MPI_SUCCESS) {
    *failed = true;
    MPI_Cancel(recv);
    MPI_Request_free(recv);
  } else if (!flag) {
    return false;
  }
  MPI_Irecv(in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, tag, comm, recv);
  if (!flag) return false;
  *from = st.MPI_SOURCE >= 0 && st.MPI_SOURCE < nodes ? st.MPI_SOURCE : -1;
  return true;
}

}  // namespace

struct MpiPeers::Fetch {
  int owner = 0;
  EntryId id = 0;
  std::shared_ptr<std::vector<char>> buf;
  Done done;
  int tag = 0;
  MPI_Request recv = MPI_REQUEST_NULL;
  MPI_Request send = MPI_REQUEST_NULL;
  uint64_t header[3] = {0, 0, 0};
  std::chrono::steady_clock::time_point deadline;
};

// Fetches given up on (timed out, or their peer given up) whose answer may still come, or whose request
// may still be on its way: each is kept until both have ended, and its reply tag is not used again for
// that peer until then, so that a late answer never lands in a later fetch's buffer.
// The progress thread's alone.
class MpiPeers::LateAnswers {
 public:
  // `answer_due`: the receive was cancelled (the answer, if it comes, waits unmatched: taken by probing)
  // or still runs (into the fetch's buffer, which it keeps).
  void expect(std::unique_ptr<Fetch> f, bool answer_due) {
    if (f->recv == MPI_REQUEST_NULL) f->buf.reset();  // no receive writes into it
    const uint64_t key = key_of(f->owner, f->tag);
    given_up_[key] = Given{std::move(f), answer_due};
  }
  // Whether a given-up fetch still holds `tag` for `owner` (its answer or its request still on the way).
  bool awaited(int owner, int tag) const { return given_up_.count(key_of(owner, tag)) != 0; }
  // Takes what came (at most every kLook), and lets go of fetches whose messages have all ended.
  void take(MPI_Comm comm, std::chrono::steady_clock::time_point now) {
    if (given_up_.empty() || now < next_look_) return;
    next_look_ = now + kLook;
    for (auto it = given_up_.begin(); it != given_up_.end();) {
      Given& g = it->second;
      Fetch& f = *g.fetch;
      int done = 0;
      if (f.send != MPI_REQUEST_NULL && (MPI_Test(&f.send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done))
        f.send = MPI_REQUEST_NULL;
      if (g.answer_due && f.recv != MPI_REQUEST_NULL) {
        if (MPI_Test(&f.recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) g.answer_due = false;
      } else if (g.answer_due) {
        // Probed first, so that no memory is held for an answer that may never come; then received
        // into a buffer of its own without waiting (a large answer takes a while).
        MPI_Status st;
        if (MPI_Iprobe(f.owner, f.tag, comm, &done, &st) != MPI_SUCCESS) {
          g.answer_due = false;  // the peer broke: nothing more comes from it
        } else if (done) {
          int count = 0;
          MPI_Get_count(&st, MPI_BYTE, &count);
          try {
            f.buf = std::make_shared<std::vector<char>>(static_cast<size_t>(std::max(count, 0)));
            MPI_Irecv(f.buf->data(), count, MPI_BYTE, f.owner, f.tag, comm, &f.recv);
          } catch (const std::bad_alloc&) {  // taken at a later look
          }
        }
      }
      if (!g.answer_due && f.send == MPI_REQUEST_NULL)
        it = given_up_.erase(it);
      else
        ++it;
    }
  }
  // At the end: what still runs is cancelled; what cannot be keeps its memory for good (the process is
  // leaving). True if nothing was left so.
  bool leave() {
    bool clean = true;
    for (auto& [key, g] : given_up_) {
      Fetch& f = *g.fetch;
      if (f.recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&f.recv);
        int done = 0;
        MPI_Test(&f.recv, &done, MPI_STATUS_IGNORE);
      }
      if (f.recv != MPI_REQUEST_NULL || f.send != MPI_REQUEST_NULL) {
        clean = false;
        (void)g.fetch.release();  // MPI may still write into its buffer or read its request
      }
    }
    given_up_.clear();
    return clean;
  }

 private:
  static uint64_t key_of(int owner, int tag) {
    return (static_cast<uint64_t>(owner) << 32) | static_cast<uint32_t>(tag);
  }
  static constexpr auto kLook = std::chrono::milliseconds(50);
  struct Given {
    std::unique_ptr<Fetch> fetch;
    bool answer_due;
  };
  std::unordered_map<uint64_t, Given> given_up_;
  std::chrono::steady_clock::time_point next_look_;
};

struct MpiPeers::Send {
  MPI_Request request = MPI_REQUEST_NULL;
  PeerBytes bytes;  // alive until the send completes
};

MpiPeers::MpiPeers(MpiWorld& world, const Manifest& manifest, MpiPeersConfig config)
    : world_(world), manifest_(manifest), config_(config), node_(world.rank()), nodes_(world.size()), comm_(std::make_unique<Comm>()),
      gone_(static_cast<size_t>(world.size())) {
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_->comm), "cannot set up the peer communicator");
  MPI_Comm_set_errhandler(comm_->comm, MPI_ERRORS_RETURN);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_->comm, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) comm_->tag_ub = *ub;
  gone_[static_cast<size_t>(node_)] = true;  // never ask ourselves
}

MpiPeers::~MpiPeers() { stop(); }

void MpiPeers::start(Lookup lookup) {
  lookup_ = std::move(lookup);
  thread_ = std::thread([this] { loop(); });
}

bool MpiPeers::usable(int owner) const {
  return owner >= 0 && owner < nodes_ && !gone_[static_cast<size_t>(owner)];
}

void MpiPeers::fetch(int owner, EntryId id, std::shared_ptr<std::vector<char>> buf, Done done) {
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

PeerTransport::Counters MpiPeers::counters() const {
  MutexLock lock(mutex_);
  return counters_;
}

void MpiPeers::stop() {
  {
    MutexLock lock(mutex_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  // The communicator is left as it is: freeing it is collective, and a peer may be gone.
}

void MpiPeers::loop() {
  MPI_Comm comm = comm_->comm;
  uint64_t request_in[3] = {0, 0, 0};
  uint64_t goodbye_in = 0;
  uint64_t ping_in = 0, pong_in = 0;
  static const uint64_t kOne = 1;  // the body of pings and pongs
  MPI_Request request_recv = MPI_REQUEST_NULL, goodbye_recv = MPI_REQUEST_NULL;
  MPI_Request ping_recv = MPI_REQUEST_NULL, pong_recv = MPI_REQUEST_NULL;
  MPI_Irecv(request_in, 3, MPI_UINT64_T, MPI_ANY_SOURCE, kRequest, comm, &request_recv);
  MPI_Irecv(&goodbye_in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kGoodbye, comm, &goodbye_recv);
  MPI_Irecv(&ping_in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kPing, comm, &ping_recv);
  MPI_Irecv(&pong_in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kPong, comm, &pong_recv);
  PeerLiveness liveness(nodes_, {.probe_after = kProbeAfter,
                                 .answer_within = std::min(kAnswerWithin, config_.timeout),
                                 .unproven_within = config_.timeout / 2,
                                 .link_bytes_per_second = kSlowLink});
  std::vector<char> left(static_cast<size_t>(nodes_), 0);  // said goodbye: not answered either
  // Given up for silence (a ping or a fetch not answered in time): asked again once heard from.
  std::vector<char> silent(static_cast<size_t>(nodes_), 0);
  // The reply tags of fetches given up, by peer: a late answer may still come to one, so none is used
  // again until that answer is taken (LateAnswers).
  LateAnswers late;
  std::vector<std::unique_ptr<Fetch>> active;
  std::vector<unsigned> per_peer(static_cast<size_t>(nodes_), 0);
  std::vector<Send> sends;
  uint64_t next_tag = 0;
  bool failed = false;  // a peer broke an operation: the end (MpiWorld::leave) must not wait on it

  auto fail_peer = [&](int peer, bool silence, const std::string& why) {
    if (peer < 0 || peer >= nodes_ || gone_[static_cast<size_t>(peer)].exchange(true)) return;
    silent[static_cast<size_t>(peer)] = silence;
    log_warning("peer node " + std::to_string(peer) + " " + why + ": not asked any more" +
                (silence ? " unless it answers again" : "") + "; its files come from SOURCE");
  };
  auto heard_from = [&](int peer, std::chrono::steady_clock::time_point now) {
    liveness.heard(peer, now);
    if (!silent[static_cast<size_t>(peer)] || left[static_cast<size_t>(peer)]) return;
    silent[static_cast<size_t>(peer)] = 0;
    gone_[static_cast<size_t>(peer)] = false;
    {
      MutexLock lock(mutex_);
      counters_.returned++;
    }
    log_notice("peer node " + std::to_string(peer) + " answers again: asked again");
  };
  auto finish = [&](size_t i, int64_t result) {  // returns the fetch, its `done` run
    std::unique_ptr<Fetch> f = std::move(active[i]);
    active[i] = std::move(active.back());
    active.pop_back();
    --per_peer[static_cast<size_t>(f->owner)];
    liveness.ended(f->owner, f->buf->size());
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
  };

  for (;;) {
    bool busy = false;
    bool stopping;
    {
      MutexLock lock(mutex_);
      stopping = stop_;
    }
    if (stopping) break;

    // A peer asks for a file.
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&request_recv, &flag, &st) != MPI_SUCCESS) {
      // A receive from any source can be broken by one peer failing: post it again for the others.
      failed = true;
      MPI_Cancel(&request_recv);
      MPI_Request_free(&request_recv);
      MPI_Irecv(request_in, 3, MPI_UINT64_T, MPI_ANY_SOURCE, kRequest, comm, &request_recv);
    } else if (flag) {
      busy = true;
      const int from = st.MPI_SOURCE;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      const auto request = decode_peer_request(request_in, static_cast<size_t>(count), manifest_, comm_->tag_ub);
      const uint64_t asked_tag = request_in[1];
      if (from >= 0 && from < nodes_) heard_from(from, std::chrono::steady_clock::now());
      if (from < 0 || from >= nodes_ || left[static_cast<size_t>(from)] ||
          (!request && (asked_tag < kPeerFirstReplyTag || asked_tag > static_cast<uint64_t>(comm_->tag_ub)))) {
        // It left (nobody waits for an answer), or the request is too broken to answer at all.
        if (!request) {
          MutexLock lock(mutex_);
          counters_.refused_to_peers++;
        }
        MPI_Irecv(request_in, 3, MPI_UINT64_T, MPI_ANY_SOURCE, kRequest, comm, &request_recv);
        continue;
      }
      const int tag = static_cast<int>(asked_tag);
      PeerBytes bytes = request ? lookup_(request->id) : nullptr;
      Send s;
      if (bytes && bytes->size() == request->size) {
        const uint64_t size = request->size;
        s.bytes = bytes;
        MPI_Isend(bytes->data(), static_cast<int>(size), MPI_BYTE, from, tag, comm, &s.request);
        MutexLock lock(mutex_);
        counters_.served++;
        counters_.served_bytes += size;
      } else {
        MPI_Isend(nullptr, 0, MPI_BYTE, from, tag, comm, &s.request);
        MutexLock lock(mutex_);
        counters_.refused_to_peers++;
      }
      sends.push_back(std::move(s));
      MPI_Irecv(request_in, 3, MPI_UINT64_T, MPI_ANY_SOURCE, kRequest, comm, &request_recv);
    }
    // A peer leaves.
    int from = -1;
    if (take_standing(&goodbye_recv, &goodbye_in, kGoodbye, comm, nodes_, &from, &failed)) {
      busy = true;
      if (from >= 0) gone_[static_cast<size_t>(from)] = true, left[static_cast<size_t>(from)] = 1;
    }
    // Are you there? Yes — answered by any node that has not left, whether or not it asks that one.
    if (take_standing(&ping_recv, &ping_in, kPing, comm, nodes_, &from, &failed)) {
      busy = true;
      if (from >= 0 && !left[static_cast<size_t>(from)]) {
        heard_from(from, std::chrono::steady_clock::now());
        sends.emplace_back();
        MPI_Isend(&kOne, 1, MPI_UINT64_T, from, kPong, comm, &sends.back().request);
      }
    }
    if (take_standing(&pong_recv, &pong_in, kPong, comm, nodes_, &from, &failed)) {
      busy = true;
      if (from >= 0) heard_from(from, std::chrono::steady_clock::now());
    }
    // New fetches, within the bounds.
    std::vector<std::unique_ptr<Fetch>> refused;
    {
      MutexLock lock(mutex_);
      for (auto it = queued_.begin(); it != queued_.end() && active.size() < config_.max_in_flight;) {
        Fetch& f = **it;
        if (gone_[static_cast<size_t>(f.owner)]) {
          refused.push_back(std::move(*it));
          it = queued_.erase(it);
          continue;
        }
        if (per_peer[static_cast<size_t>(f.owner)] >= config_.max_per_peer) {
          ++it;
          continue;
        }
        do {
          f.tag = kPeerFirstReplyTag +
                  static_cast<int>(next_tag++ % static_cast<uint64_t>(comm_->tag_ub - kPeerFirstReplyTag));
        } while (late.awaited(f.owner, f.tag));
        encode_peer_request(PeerRequest{f.id, f.tag, f.buf->size()}, f.header);
        const auto asked = std::chrono::steady_clock::now();
        f.deadline = asked + config_.timeout;
        // The receive goes first, straight into the file's buffer; then the request.
        MPI_Irecv(f.buf->data(), static_cast<int>(f.buf->size()), MPI_BYTE, f.owner, f.tag, comm, &f.recv);
        MPI_Isend(f.header, 3, MPI_UINT64_T, f.owner, kRequest, comm, &f.send);
        ++per_peer[static_cast<size_t>(f.owner)];
        liveness.asked(f.owner, f.buf->size(), asked);
        counters_.requests++;
        active.push_back(std::move(*it));
        it = queued_.erase(it);
        busy = true;
      }
    }
    for (auto& f : refused) f->done(-EHOSTDOWN);
    // Peers silent while they owe answers: pinged, and given up when the ping is not answered in time
    // (their fetches then end below, as a gone peer's do).
    const auto now = std::chrono::steady_clock::now();
    const PeerLiveness::Turn alive = liveness.turn(now);
    for (int peer : alive.ping) {
      if (gone_[static_cast<size_t>(peer)]) continue;
      sends.emplace_back();
      MPI_Isend(&kOne, 1, MPI_UINT64_T, peer, kPing, comm, &sends.back().request);
    }
    for (int peer : alive.dead) {
      failed = true;  // the end must not wait on it
      fail_peer(peer, true,
                "did not answer a ping within " + std::to_string(kProbeAfter.count() + kAnswerWithin.count()) +
                    " ms of silence (dead or stopped?)");
    }
    late.take(comm, now);
    // Answers, and requests that waited too long.
    for (size_t i = 0; i < active.size();) {
      Fetch& f = *active[i];
      if (f.send != MPI_REQUEST_NULL) {
        int sent = 0;
        if (MPI_Test(&f.send, &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          failed = true;
          fail_peer(f.owner, false, "failed");
        }
      }
      int got = 0;
      MPI_Status rs;
      const int rc = MPI_Test(&f.recv, &got, &rs);
      if (rc != MPI_SUCCESS) {
        failed = true;
        fail_peer(f.owner, false, "failed");
        finish(i, -EHOSTDOWN);
        busy = true;
        continue;
      }
      if (got) {
        heard_from(f.owner, now);
        liveness.answered(f.owner, now - (f.deadline - config_.timeout));
        int count = 0;
        MPI_Get_count(&rs, MPI_BYTE, &count);
        if (f.send != MPI_REQUEST_NULL) MPI_Wait(&f.send, MPI_STATUS_IGNORE);  // the answer implies it arrived
        finish(i, static_cast<uint64_t>(count) == f.buf->size() ? static_cast<int64_t>(count) : -ENOENT);
        busy = true;
        continue;
      }
      if (now >= f.deadline || gone_[static_cast<size_t>(f.owner)]) {
        // Give up on it. Its tag waits for the late answer (LateAnswers): it is used again only after.
        const bool timed_out = now >= f.deadline;
        // A peer that stopped answering may be dead: the end must not wait on it.
        if (timed_out) failed = true;
        fail_peer(f.owner, timed_out, timed_out ? "did not answer in time" : "left");
        MPI_Cancel(&f.recv);
        int ended = 0, cancelled = 0;
        MPI_Status cs;
        MPI_Test(&f.recv, &ended, &cs);
        if (ended) MPI_Test_cancelled(&cs, &cancelled);
        // Not ended: data may be arriving into the buffer, which the receive keeps (the caller reads the
        // next store into a fresh one). Cancelled: the answer, if it comes, waits unmatched.
        const bool answer_due = !ended || cancelled;
        if (!ended) failed = true;
        std::unique_ptr<Fetch> given_up = finish(i, timed_out ? -ETIMEDOUT : -EHOSTDOWN);
        if (answer_due || given_up->send != MPI_REQUEST_NULL) late.expect(std::move(given_up), answer_due);
        busy = true;
        continue;
      }
      ++i;
    }
    // Our answers to peers.
    for (size_t i = 0; i < sends.size();) {
      int done = 0;
      if (MPI_Test(&sends[i].request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1, failed = true;
      if (done) {
        sends[i] = std::move(sends.back());
        sends.pop_back();
      } else {
        ++i;
      }
    }
    if (!busy) {
      MutexLock lock(mutex_);  // (a wake-up without news only turns the loop once more)
      if (!stop_ && (queued_.empty() || active.size() >= config_.max_in_flight)) lock.wait_for(wake_, kIdleNap);
    }
  }

  // Leaving: say goodbye, end what is outstanding, for a bounded time.
  std::vector<MPI_Request> byes;
  uint64_t bye = 1;
  for (int peer = 0; peer < nodes_; ++peer)
    if (peer != node_ && !gone_[static_cast<size_t>(peer)]) {
      byes.push_back(MPI_REQUEST_NULL);
      MPI_Isend(&bye, 1, MPI_UINT64_T, peer, kGoodbye, comm, &byes.back());
    }
  for (auto& f : active) {
    MPI_Cancel(&f->recv);
    int ended = 0;
    MPI_Test(&f->recv, &ended, MPI_STATUS_IGNORE);
    if (!ended) failed = true;
    f->done(-ECANCELED);
    // A receive not ended may still write into the fetch's buffer (its caller lets go of its own share
    // now), and a request still on its way is read from the fetch: kept to the end, as fetches given up.
    if (!ended || f->send != MPI_REQUEST_NULL) late.expect(std::move(f), !ended);
  }
  active.clear();
  {
    MutexLock lock(mutex_);
    for (auto& f : queued_) f->done(-ECANCELED);
    queued_.clear();
  }
  const auto until = std::chrono::steady_clock::now() + kStopGrace;
  for (;;) {
    bool all = true;
    for (auto& r : byes) {
      int done = 0;
      if (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) all = false;
    }
    for (auto& s : sends) {
      int done = 0;
      if (s.request != MPI_REQUEST_NULL && MPI_Test(&s.request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
        all = false;
    }
    if (all) break;
    if (std::chrono::steady_clock::now() >= until) {
      failed = true;  // someone is not taking our messages: do not wait on them at the end
      break;
    }
    std::this_thread::sleep_for(kIdleNap);
  }
  if (!late.leave()) failed = true;
  for (MPI_Request* r : {&request_recv, &goodbye_recv, &ping_recv, &pong_recv}) {
    MPI_Cancel(r);
    int done = 0;
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
  }
  if (failed) world_.mark_unclean();
}

}  // namespace clairfs
