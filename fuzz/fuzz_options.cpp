// libFuzzer target: the mount command's option string (what `-o` and fstab lines carry). Any input ends
// in parsed options or a UsageError with one line; never a crash. Options that parse keep the engine's
// arithmetic on them within 64 bits (open_tolerance, and what the planner and the page-cache window
// multiply it by: the ranks of a node): an overflow traps.
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <string>

#include <stdlib.h>
#include <unistd.h>

#include "clairfs/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string opts(reinterpret_cast<const char*>(data), size);
  // trace=FILE creates FILE: not something to do with random names.
  if (opts.find("trace") != std::string::npos) return 0;
  // An empty directory to mount on (a non-empty one is refused before the checks that follow parsing).
  static const std::string mountpoint = [] {
    static char dir[] = "/tmp/fuzz-options-XXXXXX";
    if (!::mkdtemp(dir)) return std::string("/tmp");
    std::atexit([] { ::rmdir(dir); });  // nothing left behind
    return std::string(dir);
  }();
  const char* argv[] = {"clairfs", "/", mountpoint.c_str(), "-o", opts.c_str()};
  try {
    const clairfs::Options o = clairfs::parse_mount_command(5, argv);
    // open_tolerance's products, then the planner's 2 × tolerance × ranks + 64.
    uint64_t t = 0;
    if (__builtin_mul_overflow(uint64_t{2} * o.prefetch_factor, o.workers < 8 ? 8 : o.workers, &t) ||
        __builtin_mul_overflow(t, o.batch_size, &t) || t + 64 != clairfs::open_tolerance(o) ||
        __builtin_mul_overflow(2 * clairfs::open_tolerance(o), o.ranks.size() + 1, &t) || t + 64 < t)
      __builtin_trap();
  } catch (const clairfs::UsageError& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();  // one line, always
  } catch (const clairfs::HelpRequested&) {
  }
  return 0;
}
