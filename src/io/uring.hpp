// The only door to io_uring (this pair of files is the only place that includes liburing).
//
// A Ring belongs to one thread. It opens files and reads them whole into caller-owned buffers with many
// requests in flight, and writes whole buffers out: submit_open(), submit() and submit_write() queue, reap()
// returns what finished. A short read or write is continued internally until the requested length, end of
// file, or an error, so a completion covers the whole transfer.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace clairfs {

// liburing's version, as loaded when it can say (2.4 on), else as built against (--version).
std::string liburing_version();

class Ring {
 public:
  struct Completion {
    uint64_t tag;    // as given to submit() or submit_open()
    int64_t result;  // a read or write: total bytes (less than asked only at end of file / device full); an open: the fd; or -errno
  };

  // Throws std::runtime_error if io_uring cannot be set up (kernel without it, or disabled).
  explicit Ring(unsigned depth);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Queues a read of `len` bytes at `offset` of `fd` into `buf`. REQUIRES: in_flight() < depth();
  // fd and buf stay valid until the completion is reaped.
  void submit(int fd, char* buf, size_t len, uint64_t tag, uint64_t offset = 0);
  // Queues a write of `len` bytes from `buf` at `offset` of `fd`; the completion's result is the bytes
  // written (less than asked only if the device took no more) or -errno (-ENOSPC: full). REQUIRES: as submit.
  void submit_write(int fd, const char* buf, size_t len, uint64_t tag, uint64_t offset = 0);
  // Queues an open of `path` (relative, < PATH_MAX) beneath `dir_fd` for reading, following no symlink
  // and never leaving dir_fd (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS). REQUIRES: room as above.
  void submit_open(int dir_fd, std::string path, uint64_t tag);
  // Waits for at least one completion if `wait` and any are in flight; returns all that are ready.
  std::vector<Completion> reap(bool wait);
  // Waits up to `timeout` for at least one completion if any are in flight; returns all that are ready.
  std::vector<Completion> reap_for(std::chrono::milliseconds timeout);

  unsigned depth() const { return depth_; }
  unsigned in_flight() const { return in_flight_; }

 private:
  void start(uint64_t id);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  unsigned depth_;
  unsigned in_flight_ = 0;
};

}  // namespace clairfs
