// libFuzzer target: the mount command's option string (what `-o` and fstab lines carry). Any input ends
// in parsed options or a UsageError with one line; never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "clairfs/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string opts(reinterpret_cast<const char*>(data), size);
  // trace=FILE creates FILE: not something to do with random names.
  if (opts.find("trace") != std::string::npos) return 0;
  const char* argv[] = {"clairfs", "/", "/tmp", "-o", opts.c_str()};
  try {
    (void)clairfs::parse_mount_command(5, argv);
  } catch (const clairfs::UsageError& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();  // one line, always
  } catch (const clairfs::HelpRequested&) {
  }
  return 0;
}
