// Benchmark-only: a stand-in for a loaded parallel file system (Lustre, GPFS) in front of a local
// directory. It serves SOURCE read-only with
//   - a fixed latency on every open (default 2 ms): the metadata server round trip a PFS charges per file;
//   - one bandwidth cap shared by all readers (default 100 MB/s): the node's share of the storage
//     servers, so eight readers get an eighth each, not eight times as much;
//   - at most --max-inflight opens and reads in service at once (default 16): the client's RPC slots;
//   - no page cache in the mount (direct_io), so a file read twice is paid twice, as from a PFS whose
//     client cache is too small for the data set.
// Names and attributes are answered from memory (scanned at start): the stand-in charges data and opens,
// which is what a training job's reads cost. It counts opens and bytes served and writes them as JSON to
// --stats FILE when unmounted, so a run can report how much came from SOURCE.
//
//   slowfs SOURCE MOUNTPOINT [--open-latency-ms 2] [--bandwidth-mbps 100] [--max-inflight 16] [--stats FILE]
// Runs in the foreground; prints "ready" once mounted.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tree_server.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  double open_latency_s = 0.002;
  double bandwidth = 100e6;  // bytes/s
  int max_inflight = 16;
  std::string stats;
};

using tree_server::g_nodes;
Config g_config;
std::atomic<uint64_t> g_opens{0}, g_bytes{0}, g_reads{0}, g_statfs{0};
std::string g_source;  // the tree served, for statfs

// Counting semaphore for requests in service.
std::mutex g_slot_mutex;
std::condition_variable g_slot_cv;
int g_slots_used = 0;

struct Slot {
  Slot() {
    std::unique_lock<std::mutex> lock(g_slot_mutex);
    g_slot_cv.wait(lock, [] { return g_slots_used < g_config.max_inflight; });
    ++g_slots_used;
  }
  ~Slot() {
    {
      std::lock_guard<std::mutex> lock(g_slot_mutex);
      --g_slots_used;
    }
    g_slot_cv.notify_one();
  }
};

// The shared pipe: transfers are serialised at the configured bandwidth.
std::mutex g_pipe_mutex;
Clock::time_point g_pipe_free = Clock::now();

void transfer(size_t bytes) {
  Clock::time_point done;
  {
    std::lock_guard<std::mutex> lock(g_pipe_mutex);
    const auto start = std::max(Clock::now(), g_pipe_free);
    done = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bytes / g_config.bandwidth));
    g_pipe_free = done;
  }
  std::this_thread::sleep_until(done);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  char buf[4096];
  const ssize_t n = readlink(g_nodes[ino - 1].path.c_str(), buf, sizeof(buf) - 1);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf[n] = 0;
  fuse_reply_readlink(req, buf);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  {
    Slot slot;
    std::this_thread::sleep_for(std::chrono::duration<double>(g_config.open_latency_s));
  }
  const int fd = open(g_nodes[ino - 1].path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  g_opens++;
  fi->fh = static_cast<uint64_t>(fd);
  fi->direct_io = 1;  // no page cache in this mount: every read is paid
  fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  thread_local std::vector<char> buf;
  if (buf.size() < size) buf.resize(size);
  const ssize_t n = pread(static_cast<int>(fi->fh), buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  {
    Slot slot;
    transfer(static_cast<size_t>(n));
  }
  g_reads++;
  g_bytes += static_cast<uint64_t>(n);
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

// A parallel file system's statfs asks every storage target: counted, so that a test sees how often the
// mount in front asks.
void op_statfs(fuse_req_t req, fuse_ino_t) {
  g_statfs++;
  struct statvfs sv {};
  if (::statvfs(g_source.c_str(), &sv) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &sv);
}

void write_stats() {
  if (g_config.stats.empty()) return;
  FILE* f = std::fopen(g_config.stats.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "{\"opens\": %llu, \"reads\": %llu, \"bytes\": %llu, \"statfs\": %llu}\n",
               static_cast<unsigned long long>(g_opens.load()), static_cast<unsigned long long>(g_reads.load()),
               static_cast<unsigned long long>(g_bytes.load()), static_cast<unsigned long long>(g_statfs.load()));
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: slowfs SOURCE MOUNTPOINT [--open-latency-ms 2] [--bandwidth-mbps 100] "
                         "[--max-inflight 16] [--stats FILE]\n");
    return 2;
  }
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--open-latency-ms") g_config.open_latency_s = std::stod(argv[i + 1]) / 1000;
    else if (a == "--bandwidth-mbps") g_config.bandwidth = std::stod(argv[i + 1]) * 1e6;
    else if (a == "--max-inflight") g_config.max_inflight = std::stoi(argv[i + 1]);
    else if (a == "--stats") g_config.stats = argv[i + 1];
    else {
      std::fprintf(stderr, "slowfs: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  tree_server::g_timeout = 3600;
  tree_server::load(argv[1], /*with_data=*/false);
  fuse_lowlevel_ops ops = tree_server::metadata_ops();
  ops.readlink = op_readlink;
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  ops.statfs = op_statfs;
  g_source = argv[1];
  // Enough threads that requests waiting on latency or bandwidth never block the others.
  const int rc = tree_server::serve("slowfs", argv[2], ops, 128);
  write_stats();
  return rc;
}
