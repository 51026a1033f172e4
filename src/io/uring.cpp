#include "io/uring.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "util/fs.hpp"

namespace clairfs {

std::string liburing_version() {
#if defined(IO_URING_VERSION_MAJOR)
  return std::to_string(io_uring_major_version()) + "." + std::to_string(io_uring_minor_version());
#elif defined(CLAIRFS_LIBURING_VERSION)
  return CLAIRFS_LIBURING_VERSION " (built against)";
#else
  return "unknown";
#endif
}

namespace {

// One read or write asks for at most this much (an sqe's length has 32 bits); a longer transfer goes on
// in pieces like a short one.
constexpr size_t kMaxPiece = size_t{1} << 30;

unsigned piece(size_t left) { return static_cast<unsigned>(std::min(left, kMaxPiece)); }

}  // namespace

// (Not in the anonymous namespace: Ring::Impl, which holds them, is not in it either.)
namespace uring_requests {

struct Request {
  int fd = -1;
  char* buf = nullptr;
  size_t len = 0;
  size_t done = 0;
  uint64_t offset = 0;  // in the file, of buf[0]
  unsigned tries = 0;  // opens
  uint64_t tag = 0;
  enum class Op { kRead, kWrite, kOpen } op = Op::kRead;
  std::string path;  // opens: kept alive until the kernel has read it
  open_how how{};
};

}  // namespace uring_requests

using uring_requests::Request;

struct Ring::Impl {
  io_uring ring{};
  std::unordered_map<uint64_t, Request> requests;  // by an internal id, the sqe's user data
  uint64_t next_id = 1;

  // Files a new request under a fresh id (node-based map: a path stays put) and returns the id.
  uint64_t add(Request r) {
    const uint64_t id = next_id++;
    requests.emplace(id, std::move(r));
    return id;
  }

  void queue(uint64_t id, Request& r) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (r.op == Request::Op::kOpen)
      io_uring_prep_openat2(sqe, r.fd, r.path.c_str(), &r.how);
    else if (r.op == Request::Op::kWrite)
      io_uring_prep_write(sqe, r.fd, r.buf + r.done, piece(r.len - r.done), r.offset + r.done);
    else
      io_uring_prep_read(sqe, r.fd, r.buf + r.done, piece(r.len - r.done), r.offset + r.done);
    io_uring_sqe_set_data64(sqe, id);
    // Straight to the kernel's workers: tried inline first, an open or read of a FUSE or network file
    // that then blocks would hold up the submitting thread, and with it every other request.
    io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
  }
};

Ring::Ring(unsigned depth) : impl_(std::make_unique<Impl>()), depth_(depth) {
  const int rc = io_uring_queue_init(depth, &impl_->ring, 0);
  if (rc < 0) throw std::runtime_error(std::string("cannot set up io_uring: ") + std::strerror(-rc));
  // Reads of regular files count as "bounded" work, which the kernel runs on as many io-wq workers as
  // there are CPUs: two here, so a source that answers each open or read after milliseconds (a parallel
  // file system) would see two requests at a time. Let every slot of the ring be in service at once.
  unsigned workers[2] = {depth, depth};
  (void)io_uring_register_iowq_max_workers(&impl_->ring, workers);
}

Ring::~Ring() {
  // Wait out reads still in flight: their buffers belong to the caller.
  while (in_flight_ > 0) reap(true);
  io_uring_queue_exit(&impl_->ring);
}

void Ring::start(uint64_t id) {
  impl_->queue(id, impl_->requests.at(id));
  io_uring_submit(&impl_->ring);
  ++in_flight_;
}

void Ring::submit(int fd, char* buf, size_t len, uint64_t tag, uint64_t offset) {
  Request r;
  r.fd = fd;
  r.buf = buf;
  r.len = len;
  r.offset = offset;
  r.tag = tag;
  start(impl_->add(std::move(r)));
}

void Ring::submit_write(int fd, const char* buf, size_t len, uint64_t tag, uint64_t offset) {
  Request r;
  r.fd = fd;
  r.buf = const_cast<char*>(buf);  // only ever written from
  r.len = len;
  r.offset = offset;
  r.tag = tag;
  r.op = Request::Op::kWrite;
  start(impl_->add(std::move(r)));
}

void Ring::submit_open(int dir_fd, std::string path, uint64_t tag) {
  Request r;
  r.fd = dir_fd;
  r.tag = tag;
  r.op = Request::Op::kOpen;
  r.path = std::move(path);
  // O_NONBLOCK: a FIFO in a file's place would hold an io-wq worker, and the ring's teardown with it.
  r.how.flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  r.how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  start(impl_->add(std::move(r)));
}

std::vector<Ring::Completion> Ring::reap_for(std::chrono::milliseconds timeout) {
  if (in_flight_ == 0 || timeout.count() <= 0) return reap(false);
  io_uring_cqe* cqe = nullptr;
  __kernel_timespec ts{};
  ts.tv_sec = timeout.count() / 1000;
  ts.tv_nsec = (timeout.count() % 1000) * 1000000;
  (void)io_uring_wait_cqe_timeout(&impl_->ring, &cqe, &ts);  // the completion stays queued for reap()
  return reap(false);
}

std::vector<Ring::Completion> Ring::reap(bool wait) {
  std::vector<Completion> done;
  if (in_flight_ == 0) return done;
  io_uring_cqe* cqe = nullptr;
  int rc = wait ? io_uring_wait_cqe(&impl_->ring, &cqe) : io_uring_peek_cqe(&impl_->ring, &cqe);
  bool resubmitted = false;
  while (rc == 0 && cqe) {
    const uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&impl_->ring, cqe);
    auto it = impl_->requests.find(id);
    if (it != impl_->requests.end()) {
      Request& r = it->second;
      const bool is_open = r.op == Request::Op::kOpen;  // done in one go
      if (is_open && res != -EINTR && (res != -EAGAIN || ++r.tries >= kOpenEagainTries)) {
        done.push_back({r.tag, res});
        impl_->requests.erase(it);
        --in_flight_;
      } else if (is_open) {
        impl_->queue(id, r);
        resubmitted = true;
      } else if (res < 0 && res != -EINTR && res != -EAGAIN) {
        done.push_back({r.tag, res});
        impl_->requests.erase(it);
        --in_flight_;
      } else {
        if (res > 0) r.done += static_cast<size_t>(res);
        if (res == 0 || r.done == r.len) {
          done.push_back({r.tag, static_cast<int64_t>(r.done)});
          impl_->requests.erase(it);
          --in_flight_;
        } else {
          impl_->queue(id, r);  // short read or write (or interrupted): continue where it stopped
          resubmitted = true;
        }
      }
    }
    rc = io_uring_peek_cqe(&impl_->ring, &cqe);
  }
  if (resubmitted) io_uring_submit(&impl_->ring);
  return done;
}

}  // namespace clairfs
