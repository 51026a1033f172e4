// Benchmark: scan time, save time, load time and memory of the manifest for a given SOURCE.
//   manifest_bench SOURCE FILE    -> one JSON line
#include <sys/stat.h>

#include <chrono>
#include <cstdio>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: manifest_bench SOURCE FILE\n");
    return 2;
  }
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  auto t0 = clock::now();
  clairfs::Manifest scanned = clairfs::Manifest::scan(argv[1], clairfs::default_extensions());
  const double scan_s = secs(t0);
  t0 = clock::now();
  scanned.save(argv[2]);
  const double save_s = secs(t0);
  t0 = clock::now();
  clairfs::Manifest loaded = clairfs::Manifest::load(argv[2], clairfs::default_extensions(), argv[1]);
  const double load_s = secs(t0);
  size_t name_bytes = 0;
  for (clairfs::EntryId i = 1; i < loaded.size(); ++i) name_bytes += loaded.name(i).size() + loaded.link_target(i).size();
  struct stat st {};
  stat(argv[2], &st);
  const double per_entry = static_cast<double>(loaded.memory_bytes() - name_bytes) / static_cast<double>(loaded.size());
  std::printf("{\"entries\": %zu, \"samples\": %zu, \"scan_s\": %.3f, \"save_s\": %.3f, \"load_s\": %.3f, "
              "\"memory_bytes\": %zu, \"name_bytes\": %zu, \"bytes_per_entry_besides_names\": %.1f, \"file_bytes\": %lld}\n",
              loaded.size(), loaded.samples().size(), scan_s, save_s, load_s, loaded.memory_bytes(), name_bytes, per_entry,
              static_cast<long long>(st.st_size));
  return 0;
}
