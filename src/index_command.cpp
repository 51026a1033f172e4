// `clairfs index SOURCE FILE`: SOURCE scanned once, its index written for manifest= mounts.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "commands.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace clairfs {

int run_index(int argc, char** argv) {
  // clairfs index SOURCE FILE [-o extensions=LIST,mode=OCTAL]
  const char* usage = "usage: clairfs index SOURCE FILE [-o extensions=LIST,mode=OCTAL]";
  std::vector<std::string> positional;
  std::vector<std::string> extensions = default_extensions();
  // 0600: the index names every file of SOURCE; mode= widens it for daemons that run as other users.
  mode_t mode = 0600;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::printf(
            "%s\nScans SOURCE once and writes its index to FILE, for 'clairfs SOURCE MOUNTPOINT -o manifest=FILE'.\n"
            "FILE is made 0600 (it names every file of SOURCE); mode=0640 or 0644 lets other users' daemons read it.\n",
            usage);
        return 0;
      }
      if (const auto group = option_group(i, argc, argv)) {
        for (const auto& opt : split_option_string(*group)) {
          if (opt.rfind("extensions=", 0) == 0) {
            extensions = parse_extensions(opt.substr(11));
          } else if (opt.rfind("mode=", 0) == 0) {
            const std::string v = opt.substr(5);
            if (v.empty() || v.size() > 4 || v.find_first_not_of("01234567") != std::string::npos ||
                (std::stoul(v, nullptr, 8) & ~0666UL) != 0)
              throw UsageError("mode=" + v + ": give an octal mode of read and write bits only, such as 0600 or 0644");
            mode = static_cast<mode_t>(std::stoul(v, nullptr, 8));
          } else {
            throw UsageError("unknown option '" + opt + "' for clairfs index (extensions= or mode=)");
          }
        }
      } else if (!a.empty() && a[0] == '-') {
        throw UsageError("unknown flag '" + a + "' for clairfs index");
      } else {
        positional.push_back(a);
      }
    }
    if (positional.size() != 2) throw UsageError(usage);
    struct stat st {};
    if (::stat(positional[0].c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw UsageError("SOURCE '" + positional[0] + "' is not a directory");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "clairfs: %s\n", e.what());
    return kExitUsage;
  }
  raise_fd_limit();
  try {
    char* abs = ::realpath(positional[0].c_str(), nullptr);
    std::string source = abs ? abs : positional[0];
    std::free(abs);
    const auto t0 = std::chrono::steady_clock::now();
    Manifest m = Manifest::scan(source, extensions);
    const double scan_s = seconds_since(t0);
    for (const auto& w : m.warnings()) log_warning(w);
    m.save(positional[1], mode);
    std::printf("clairfs: indexed %zu entries (%zu samples in %zu classes) of %s in %.2f s into %s\n", m.size(),
                m.samples().size(), m.classes().size(), source.c_str(), scan_s, positional[1].c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clairfs: %s\n", e.what());
    return kExitUsage;
  }
}

}  // namespace clairfs
