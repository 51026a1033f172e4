// MpiWorld's broadcast in pieces under mpiexec (tests/mount/test_peers.py runs it with 3 processes):
//   1. 10 MiB + 7 bytes, written in uneven pieces, arrive whole on every other node;
//   2. a receiver that gives up after 5 bytes does not leave the sender waiting;
//   3. a sender that fails half-way sends zeros for the rest, so that no receiver waits;
// after each, a plain broadcast still agrees (every node took part in every piece). Prints "ok" per
// node and exits 0, or names what differed and exits 1 (on every node).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer/mpi.hpp"

namespace {

char byte_at(uint64_t i) { return static_cast<char>((i * 131 + (i >> 12)) & 0xff); }

// The three cases; 0 on every node when all went as they should.
int run(clairfs::MpiWorld& world) {
  std::string failed;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok && failed.empty()) failed = what;
  };
  auto in_step = [&](const std::string& after) {
    expect(world.broadcast(world.rank() == 0 ? "step" : "", 0) == "step", "the plain broadcast after " + after);
  };
  const uint64_t size = 10 * (uint64_t{1} << 20) + 7;

  // 1. whole
  if (world.rank() == 0) {
    world.send_pieces(size, [&](const clairfs::MpiWorld::Write& write) {
      std::vector<char> chunk;
      for (uint64_t at = 0, n = 1; at < size; at += n, n = n * 3 + 1) {
        n = std::min(n, size - at);
        chunk.resize(n);
        for (uint64_t k = 0; k < n; ++k) chunk[k] = byte_at(at + k);
        write(chunk.data(), chunk.size());
      }
    });
  } else {
    world.receive_pieces(0, [&](uint64_t got_size, const clairfs::MpiWorld::Read& read) {
      expect(got_size == size, "the size");
      std::vector<char> chunk(1 << 20);
      uint64_t wrong = 0;
      for (uint64_t at = 0; at < got_size; at += chunk.size()) {
        const uint64_t n = std::min<uint64_t>(chunk.size(), got_size - at);
        read(chunk.data(), n);
        for (uint64_t k = 0; k < n; ++k) wrong += chunk[k] != byte_at(at + k);
      }
      expect(wrong == 0, std::to_string(wrong) + " bytes wrong");
      char past;
      bool threw = false;
      try {
        read(&past, 1);
      } catch (const std::runtime_error&) {
        threw = true;
      }
      expect(threw, "a read past the end did not throw");
    });
  }
  in_step("a whole broadcast");

  // 2. a receiver gives up
  if (world.rank() == 0) {
    world.send_pieces(size, [&](const clairfs::MpiWorld::Write& write) {
      const std::vector<char> zeros(size, '\0');
      write(zeros.data(), zeros.size());
    });
  } else {
    bool threw = false;
    try {
      world.receive_pieces(0, [&](uint64_t, const clairfs::MpiWorld::Read& read) {
        char five[5];
        read(five, sizeof five);
        throw std::runtime_error("given up");
      });
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "given up";
    }
    expect(threw, "the receiver's own error did not come back to it");
  }
  in_step("a receiver gave up");

  // 3. the sender fails half-way
  if (world.rank() == 0) {
    bool threw = false;
    try {
      world.send_pieces(size, [&](const clairfs::MpiWorld::Write& write) {
        const std::vector<char> ones(size / 2, '\1');
        write(ones.data(), ones.size());
        throw std::runtime_error("failed");
      });
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "failed";
    }
    expect(threw, "the sender's own error did not come back to it");
  } else {
    world.receive_pieces(0, [&](uint64_t got_size, const clairfs::MpiWorld::Read& read) {
      std::vector<char> all(got_size);
      read(all.data(), all.size());
      uint64_t ones = 0, zeros = 0;
      for (char c : all) {
        ones += c == '\1';
        zeros += c == '\0';
      }
      expect(ones == size / 2 && zeros == size - size / 2, "not the half sent and zeros for the rest");
    });
  }
  in_step("the sender failed");

  std::printf("node %d: %s\n", world.rank(), failed.empty() ? "ok" : failed.c_str());
  std::fflush(stdout);
  return world.all(failed.empty()) ? 0 : 1;
}

}  // namespace

int main() {
  sigset_t none;
  sigemptyset(&none);
  int rc = 1;
  {
    clairfs::MpiWorld world(none);
    rc = run(world);
  }  // MPI_Finalize, on every process: hydra kills the others when one leaves without it
  // Not through the exit handlers: under AddressSanitizer, LeakSanitizer once found MPICH's allocations
  // still held after MPI_Finalize, and its abort failed test_peers.
  std::fflush(stdout);
  std::_Exit(rc);
}
