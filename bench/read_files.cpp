// Benchmark reader: reads every regular file under ROOT once, whole, in a seeded random order, with
// T threads, the way DataLoader workers read samples. Prints one JSON line: files, bytes, seconds.
//   read_files ROOT [--threads T] [--seed S] [--list FILE] [--in-order]
// --list names the files (relative paths, one a line) so the walk is not timed.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: read_files ROOT [--threads T] [--seed S] [--list FILE] [--in-order]\n");
    return 2;
  }
  const std::string root = argv[1];
  int threads = 1;
  unsigned seed = 1;
  std::string list;
  bool in_order = false;
  for (int i = 2; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--in-order") {  // the list's own order (a predicted one), not shuffled
      in_order = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) break;
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--seed") seed = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--list") list = argv[i + 1];
  }
  std::vector<std::string> files;
  if (!list.empty()) {
    std::ifstream in(list);
    for (std::string line; std::getline(in, line);) files.push_back(root + "/" + line);
  } else {
    for (auto& e : std::filesystem::recursive_directory_iterator(root))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  }
  if (!in_order) std::shuffle(files.begin(), files.end(), std::mt19937(seed));

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      std::vector<char> buf(1 << 20);
      for (size_t i; (i = next++) < files.size();) {
        int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
          errors++;
          continue;
        }
        for (;;) {
          ssize_t n = ::read(fd, buf.data(), buf.size());
          if (n <= 0) {
            if (n < 0) errors++;
            break;
          }
          bytes += static_cast<uint64_t>(n);
        }
        ::close(fd);
      }
    });
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"files\": %zu, \"bytes\": %llu, \"seconds\": %.6f, \"errors\": %d, \"files_per_s\": %.1f}\n",
              files.size(), static_cast<unsigned long long>(bytes.load()), s, errors.load(), files.size() / s);
  return errors ? 1 : 0;
}
