#include "peer/mpi.hpp"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "util/log.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

namespace {

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

// ---- the peers' wire ----------------------------------------------------------------------------------

namespace {

// Wire over a duplicate of MPI_COMM_WORLD whose errors are returned (a peer's failure breaks the
// operations with it, not the process). An operation is a slot holding its MPI request.
class MpiWire final : public Wire {
 public:
  MpiWire(int node, int nodes) : node_(node), nodes_(nodes) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "cannot set up the peer communicator");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    if (flag && ub) tag_ub_ = *ub;
  }
  // The communicator is left as it is: freeing it is collective, and a peer may be gone.

  int node() const override { return node_; }
  int nodes() const override { return nodes_; }
  int max_tag() const override { return tag_ub_; }

  Op receive(void* into, size_t len, int from, int tag) override {
    MPI_Request r = MPI_REQUEST_NULL;
    const bool ok = MPI_Irecv(into, static_cast<int>(len), MPI_BYTE, from == kAnyNode ? MPI_ANY_SOURCE : from, tag,
                              comm_, &r) == MPI_SUCCESS;
    return add(r, ok);
  }
  Op send(const void* data, size_t len, int to, int tag) override {
    MPI_Request r = MPI_REQUEST_NULL;
    const bool ok = MPI_Isend(data, static_cast<int>(len), MPI_BYTE, to, tag, comm_, &r) == MPI_SUCCESS;
    return add(r, ok);
  }
  Test test(Op& op) override {
    Test t;
    if (op == kNone) {
      t.ended = true;
      return t;
    }
    Slot& s = slots_[op - 1];
    int flag = 0;
    MPI_Status st;
    if (s.broken || MPI_Test(&s.request, &flag, &st) != MPI_SUCCESS) {
      if (s.request != MPI_REQUEST_NULL) {
        MPI_Cancel(&s.request);
        MPI_Request_free(&s.request);
      }
      t.ended = t.broken = true;
    } else if (flag) {
      t.ended = true;
      int cancelled = 0;
      MPI_Test_cancelled(&st, &cancelled);
      t.cancelled = cancelled != 0;
      if (!t.cancelled) {
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        t.from = st.MPI_SOURCE;
        t.bytes = static_cast<size_t>(std::max(count, 0));
      }
    }
    if (t.ended) {
      free_.push_back(op - 1);
      op = kNone;
    }
    return t;
  }
  void cancel(Op op) override {
    if (op != kNone && slots_[op - 1].request != MPI_REQUEST_NULL) MPI_Cancel(&slots_[op - 1].request);
  }
  bool waiting(int from, int tag, size_t* bytes, bool* broken) override {
    int flag = 0;
    MPI_Status st;
    *broken = MPI_Iprobe(from, tag, comm_, &flag, &st) != MPI_SUCCESS;
    if (*broken || !flag) return false;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    *bytes = static_cast<size_t>(std::max(count, 0));
    return true;
  }
  void strand(Op op, std::shared_ptr<const void> memory) override {
    // The slot stays taken, its request with it; the memory is held to the end of the process.
    (void)op;
    stranded_.push_back(std::move(memory));
  }

 private:
  struct Slot {
    MPI_Request request = MPI_REQUEST_NULL;
    bool broken = false;  // the call that would have made it failed
  };
  Op add(MPI_Request r, bool ok) {
    size_t i = slots_.size();
    if (free_.empty()) {
      slots_.emplace_back();
    } else {
      i = free_.back();
      free_.pop_back();
    }
    slots_[i] = Slot{r, !ok};
    return i + 1;
  }

  const int node_;
  const int nodes_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ub_ = 32767;
  std::vector<Slot> slots_;
  std::vector<size_t> free_;
  std::vector<std::shared_ptr<const void>> stranded_;
};

}  // namespace

Wire& MpiWorld::peer_wire() {
  if (!peer_wire_) peer_wire_ = std::make_unique<MpiWire>(rank_, size_);
  return *peer_wire_;
}

}  // namespace clairfs
