// Benchmark-only: how fast files on a local disk can be read through FUSE on this kernel, three ways,
// to weigh FUSE passthrough (Linux 6.9+) for clairfs's NVMe copies before building it into the daemon.
// Like memfs_ceiling it shares no code with clairfs: it measures what any libfuse server reaches here.
//   passthrough_ceiling SOURCE MOUNTPOINT MODE [-s]     (foreground; -s: single-threaded loop)
// MODE:
//   passthrough  each open is answered with SOURCE's file as its backing file: the kernel reads that file
//                itself, no READ reaches the server (one OPEN and one RELEASE a file do)
//   daemon       each open is answered with the page cache kept; READs are served by pread from SOURCE
//   no-open      opens are answered ENOSYS, so the kernel opens files itself (as clairfs's default);
//                READs are served by pread
// libfuse 3.14 has no passthrough API: the INIT answer is amended on its way to the kernel (FUSE_PASSTHROUGH
// in flags2, a stack depth of 1), the backing file registered with the FUSE_DEV_IOC_BACKING_OPEN ioctl,
// and the OPEN answer written whole with its backing id. A kernel or a user that cannot (no
// CONFIG_FUSE_PASSTHROUGH, no CAP_SYS_ADMIN) fails every open with EIO and says so once on stderr.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "tree_server.hpp"

namespace {

using tree_server::g_nodes;

// The kernel's passthrough interface (linux/fuse.h 7.40), absent from this system's headers.
struct BackingMap {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kBackingClose = _IOW(229, 2, uint32_t);
constexpr uint32_t kInitExt = 1u << 30;                              // fuse_init_out.flags: flags2 is read
constexpr uint32_t kPassthroughFlag2 = 1u << 5;                      // FUSE_PASSTHROUGH (bit 37) in flags2
constexpr uint32_t kOpenPassthrough = 1u << 7;                       // FOPEN_PASSTHROUGH
constexpr size_t kFlagsAt = 12, kFlags2At = 32, kStackDepthAt = 36;  // offsets in fuse_init_out
constexpr uint64_t kBackingHandle = 1ull << 63;  // a handle that names a backing id, not a descriptor

enum class Mode { kPassthrough, kDaemon, kNoOpen };
Mode g_mode = Mode::kDaemon;
fuse_session* g_session = nullptr;
std::atomic<bool> g_init_answered{false};
std::atomic<bool> g_refused_said{false};
std::unique_ptr<std::atomic<int>[]> g_fds;  // no-open mode: a descriptor per inode, opened at its first read

void amend(uint32_t add, size_t at, char* out) {
  uint32_t v;
  std::memcpy(&v, out + at, sizeof v);
  v |= add;
  std::memcpy(out + at, &v, sizeof v);
}

// The first answer written is INIT's: FUSE_PASSTHROUGH is asked for there.
ssize_t write_answer(int fd, struct iovec* iov, int count, void*) {
  if (g_mode == Mode::kPassthrough && !g_init_answered.exchange(true) && count >= 2 && iov[1].iov_len >= 40) {
    char* out = static_cast<char*>(iov[1].iov_base);
    amend(kInitExt, kFlagsAt, out);
    amend(kPassthroughFlag2, kFlags2At, out);
    const uint32_t depth = 1;
    std::memcpy(out + kStackDepthAt, &depth, sizeof depth);
  }
  return writev(fd, iov, count);
}
ssize_t read_request(int fd, void* buf, size_t size, void*) { return read(fd, buf, size); }

void ask_for_passthrough(fuse_session* se) {
  g_session = se;
  fuse_custom_io io{};
  io.writev = write_answer;
  io.read = read_request;
  fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (g_mode == Mode::kNoOpen) return (void)fuse_reply_err(req, ENOSYS);
  const int fd = ::open(g_nodes[ino - 1].path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  if (g_mode == Mode::kDaemon) {
    fi->fh = static_cast<uint64_t>(fd);
    fi->keep_cache = 1;
    fi->noflush = 1;
    if (fuse_reply_open(req, fi) != 0) ::close(fd);
    return;
  }
  BackingMap map{fd, 0, 0};
  const int id = ioctl(fuse_session_fd(g_session), kBackingOpen, &map);
  const int err = errno;
  ::close(fd);  // the backing id holds the file
  if (id < 0) {
    if (!g_refused_said.exchange(true)) std::fprintf(stderr, "passthrough refused: %s\n", std::strerror(err));
    return (void)fuse_reply_err(req, EIO);
  }
  // Registered until the file's RELEASE: the kernel looks the id up after reading this answer.
  struct {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
  } out{kBackingHandle | static_cast<uint32_t>(id), kOpenPassthrough, id};
  if (fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out) != 0) {
    uint32_t gone = static_cast<uint32_t>(id);
    ioctl(fuse_session_fd(g_session), kBackingClose, &gone);
  }
}

int fd_of(fuse_ino_t ino, const fuse_file_info* fi) {
  if (fi && fi->fh != 0) return static_cast<int>(fi->fh);
  std::atomic<int>& slot = g_fds[ino - 1];
  int fd = slot.load();
  if (fd >= 0) return fd;
  fd = ::open(g_nodes[ino - 1].path.c_str(), O_RDONLY | O_CLOEXEC);
  int none = -1;
  if (fd >= 0 && !slot.compare_exchange_strong(none, fd)) ::close(fd), fd = none;
  return fd;
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  thread_local std::unique_ptr<char[]> buf;
  thread_local size_t buf_size = 0;
  if (buf_size < size) buf.reset(new char[size]), buf_size = size;
  const int fd = fd_of(ino, fi);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  const ssize_t n = pread(fd, buf.get(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_buf(req, buf.get(), static_cast<size_t>(n));
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (fi->fh & kBackingHandle) {
    uint32_t id = static_cast<uint32_t>(fi->fh);
    ioctl(fuse_session_fd(g_session), kBackingClose, &id);
  } else if (fi->fh != 0) {
    ::close(static_cast<int>(fi->fh));
  }
  fuse_reply_err(req, 0);
}

void op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, ENOSYS); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: passthrough_ceiling SOURCE MOUNTPOINT passthrough|daemon|no-open [-s]\n");
    return 2;
  }
  const std::string mode = argv[3];
  if (mode == "passthrough")
    g_mode = Mode::kPassthrough;
  else if (mode == "daemon")
    g_mode = Mode::kDaemon;
  else if (mode == "no-open")
    g_mode = Mode::kNoOpen;
  else
    return std::fprintf(stderr, "passthrough_ceiling: unknown mode '%s'\n", argv[3]), 2;
  const bool single = argc > 4 && std::strcmp(argv[4], "-s") == 0;
  tree_server::load(argv[1], /*with_data=*/false);
  g_fds.reset(new std::atomic<int>[g_nodes.size()]);
  for (size_t i = 0; i < g_nodes.size(); ++i) g_fds[i] = -1;
  fuse_lowlevel_ops ops = tree_server::metadata_ops();
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  ops.flush = op_flush;
  return tree_server::serve("passthrough_ceiling", argv[2], ops, single ? 0 : 16,
                            g_mode == Mode::kPassthrough ? ask_for_passthrough : nullptr);
}
