// Benchmark: a training loop's data side in C++, as PyTorch's DataLoader runs it, counting stalls.
//
// It reads rank R's files in the order the oracle predicts for DistributedSampler(seed) (the same order
// an unmodified PyTorch job reads), with W worker threads: batch k is loaded by worker k mod W, and at
// most prefetch_factor x W batches are loaded ahead of the one being computed on. The "model" spends
// --compute-ms per batch. For each batch it records how long the step waited for its data: the stall.
//
//   train_loop --root DIR [--order-root DIR] [--seed 0] [--world-size 1] [--rank 0] [--batch-size 32]
//              [--workers 4] [--prefetch-factor 2] [--epochs 3] [--compute-ms 10] [--stalls FILE]
//              [--drop-pages 1]
// --order-root is where the sample list is taken from (default --root). Prints one JSON line per epoch;
// --stalls writes "epoch batch start_s stall_s" per batch. --drop-pages 1 drops each file's pages from the
// kernel's page cache once it is read (POSIX_FADV_DONTNEED), as on a node whose memory the job takes:
// a file read again must come from the file system's own caches.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool g_drop_pages = false;

uint64_t read_whole(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      std::perror(path.c_str());
      std::exit(1);
    }
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
  }
  if (g_drop_pages) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, order_root, stalls_file;
  clairfs::Schedule s;
  uint64_t rank = 0, epochs = 3, start_epoch = 0;
  double compute_s = 0.010;
  s.workers = 4;
  s.batch_size = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--root") root = v;
    else if (a == "--order-root") order_root = v;
    else if (a == "--seed") s.seed = std::stoll(v);
    else if (a == "--world-size") s.world_size = std::stoull(v);
    else if (a == "--rank") rank = std::stoull(v);
    else if (a == "--batch-size") s.batch_size = std::stoull(v);
    else if (a == "--workers") s.workers = std::stoull(v);
    else if (a == "--prefetch-factor") s.prefetch_factor = std::stoull(v);
    else if (a == "--epochs") epochs = std::stoull(v);
    else if (a == "--start-epoch") start_epoch = std::stoull(v);
    else if (a == "--compute-ms") compute_s = std::stod(v) / 1000;
    else if (a == "--stalls") stalls_file = v;
    else if (a == "--drop-pages")
      g_drop_pages = v != "0";
    else {
      std::fprintf(stderr, "train_loop: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (root.empty()) {
    std::fprintf(stderr, "usage: train_loop --root DIR [...]\n");
    return 2;
  }
  if (order_root.empty()) order_root = root;
  const clairfs::Manifest manifest = clairfs::Manifest::scan(order_root, clairfs::default_extensions());
  std::vector<std::string> paths;
  for (clairfs::EntryId id : manifest.samples()) paths.push_back(root + "/" + manifest.path(id));
  const clairfs::Oracle oracle(paths.size(), s);
  FILE* stalls = stalls_file.empty() ? nullptr : std::fopen(stalls_file.c_str(), "w");
  const uint64_t workers = std::max<uint64_t>(1, s.workers);
  const uint64_t window = s.prefetch_factor * workers;
  const auto run_start = Clock::now();

  for (uint64_t epoch = start_epoch; epoch < epochs; ++epoch) {
    const clairfs::EpochOrder order = oracle.epoch(epoch);
    const uint64_t items = order.loaded(rank);
    const uint64_t batches = (items + s.batch_size - 1) / s.batch_size;

    // Shared state, guarded by mutex: which batches are requested (<= requested) and which are ready.
    std::mutex mutex;
    std::condition_variable cv;
    uint64_t requested = std::min(window, batches);
    std::vector<char> ready(batches, 0);
    uint64_t bytes = 0;

    std::vector<std::thread> pool;
    for (uint64_t w = 0; w < workers; ++w)
      pool.emplace_back([&, w] {
        std::vector<char> buf(1 << 20);
        for (uint64_t b = w; b < batches; b += workers) {
          {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [&] { return b < requested; });
          }
          uint64_t got = 0;
          for (uint64_t k = b * s.batch_size; k < std::min(items, (b + 1) * s.batch_size); ++k)
            got += read_whole(paths[order.at(rank, k)], buf);
          std::lock_guard<std::mutex> lock(mutex);
          ready[b] = 1;
          bytes += got;
          cv.notify_all();
        }
      });

    const auto t0 = Clock::now();
    double stall_total = 0;
    for (uint64_t b = 0; b < batches; ++b) {
      const auto wait_start = Clock::now();
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return ready[b] != 0; });
        requested = std::min(batches, b + 1 + window);  // the slot of batch b frees up: ask for the next
        cv.notify_all();
      }
      const double stall = since(wait_start);
      stall_total += stall;
      if (stalls)
        std::fprintf(stalls, "%llu %llu %.6f %.6f\n", static_cast<unsigned long long>(epoch),
                     static_cast<unsigned long long>(b), std::chrono::duration<double>(wait_start - run_start).count(),
                     stall);
      std::this_thread::sleep_for(std::chrono::duration<double>(compute_s));  // the model's step
    }
    for (auto& t : pool) t.join();
    std::printf("{\"epoch\": %llu, \"wall_s\": %.4f, \"stall_s\": %.4f, \"files\": %llu, \"bytes\": %llu, "
                "\"batches\": %llu}\n",
                static_cast<unsigned long long>(epoch), since(t0), stall_total, static_cast<unsigned long long>(items),
                static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(batches));
    std::fflush(stdout);
  }
  if (stalls) std::fclose(stalls);
  return 0;
}
