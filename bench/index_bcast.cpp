// Benchmark: the index sent once to every node, as a mount with peers does it (cli.cpp's load_index):
// node 0 loads a manifest written by `clairfs index` and sends it in pieces as it serializes them
// (MpiWorld::send_pieces, Manifest::serialize_to), every other node reads the pieces into its manifest
// as they arrive (receive_pieces, Manifest::read_from). Prints, per node, the seconds of each step, its
// peak memory (VmHWM) and the bytes sent. Run under mpiexec:
//
//   mpiexec -n 4 build/bench/index_bcast INDEX
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "peer/mpi.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

long peak_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpiexec -n N index_bcast INDEX\n");
    return 2;
  }
  sigset_t none;
  sigemptyset(&none);
  clairfs::MpiWorld world(none);
  double load_s = 0, bcast_s = 0;
  size_t bytes = 0, entries = 0;
  auto t0 = std::chrono::steady_clock::now();
  if (world.rank() == 0) {
    const clairfs::Manifest m = clairfs::Manifest::load(argv[1], clairfs::default_extensions());
    load_s = seconds_since(t0);
    bytes = m.serialized_size();
    entries = m.size();
    world.all(true);  // every node at the start line
    t0 = std::chrono::steady_clock::now();
    world.send_pieces(bytes, [&](const clairfs::MpiWorld::Write& write) { m.serialize_to(write); });
    bcast_s = seconds_since(t0);
  } else {
    world.all(true);
    t0 = std::chrono::steady_clock::now();
    world.receive_pieces(0, [&](uint64_t size, const clairfs::MpiWorld::Read& read) {
      const clairfs::Manifest m = clairfs::Manifest::read_from(read, size, clairfs::default_extensions());
      bytes = size;
      entries = m.size();
    });
    bcast_s = seconds_since(t0);
  }
  world.all(true);
  std::printf("node %d of %d: %zu entries, %zu bytes; load %.2f s, broadcast (serialized and read as it goes) %.2f s; "
              "peak %.1f MiB\n",
              world.rank(), world.size(), entries, bytes, load_s, bcast_s,
              static_cast<double>(peak_kib()) / 1024);
  std::fflush(stdout);
  return 0;  // MpiWorld's destructor finalizes (leave() would end without it, and mpiexec then kills the rest)
}
