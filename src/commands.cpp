#include "commands.hpp"

#include <sys/resource.h>

#include "clairfs/options.hpp"

namespace clairfs {

std::optional<std::string> option_group(int& i, int argc, char** argv) {
  const std::string a = argv[i];
  if (a.rfind("-o", 0) != 0) return std::nullopt;
  if (a.size() > 2) return a.substr(2);
  if (i + 1 >= argc) throw UsageError("-o needs a value");
  return std::string(argv[++i]);
}

void raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace clairfs
