// `clairfs cleanup`: what daemons that died left on this node, removed.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "clairfs/options.hpp"
#include "commands.hpp"
#include "util/mounts.hpp"

namespace clairfs {

// clairfs cleanup [--stop] [-o nvme=DIR] [MOUNTPOINT...]: what a daemon that died left on this node — a
// dead mount, a cache folder — removed; a clairfs mount still served at MOUNTPOINT is unmounted (its
// daemon then ends by itself, cleanly, and removes its own folder). One line per thing found, naming
// the host; with --stop, live mounts are what is expected and not named (the way to stop every node's
// daemon without a launcher that passes signals on). Exit 0 when nothing of it stays, 1 when something
// does, 2 for a bad command line.
int run_cleanup(int argc, char** argv) {
  const std::string usage = "usage: clairfs cleanup [--stop] [-o nvme=DIR] [MOUNTPOINT...]";
  bool stop = false;
  std::vector<std::string> mountpoints, nvmes;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::printf(
            "%s\nRemoves what clairfs daemons that died left on this node: a dead mount at MOUNTPOINT, cache\n"
            "folders in DIR. Unmounts MOUNTPOINT if a daemon still serves it (--stop: quietly, to stop it).\n"
            "Exit 0 when this node is clean.\n",
            usage.c_str());
        return 0;
      }
      if (a == "--stop") {
        stop = true;
      } else if (const auto group = option_group(i, argc, argv)) {
        // The mount's own option string may be passed whole: only nvme= matters here.
        for (const auto& opt : split_option_string(*group))
          if (opt.rfind("nvme=", 0) == 0) nvmes.push_back(opt.substr(5));
      } else if (!a.empty() && a[0] == '-') {
        throw UsageError("unknown flag '" + a + "' for clairfs cleanup");
      } else {
        mountpoints.push_back(a);
      }
    }
    if (mountpoints.empty() && nvmes.empty()) throw UsageError(usage);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "clairfs: %s\n", e.what());
    return kExitUsage;
  }
  const std::string host = host_name();
  auto say = [&](const std::string& line) { std::printf("clairfs cleanup on %s: %s\n", host.c_str(), line.c_str()); };
  bool stayed = false;
  for (const auto& given : mountpoints) {
    const std::string mnt = lexically_absolute(given);
    switch (detach_clairfs_mount(mnt)) {
      case Detached::kNotClairfs: break;
      case Detached::kSymlink:
        say(mnt + " not looked at: a symlink in its path (give the path with none)");
        stayed = true;
        break;
      case Detached::kFailed:
        say("clairfs mount at " + mnt + " stays: cannot unmount it: " + std::strerror(errno));
        stayed = true;
        break;
      case Detached::kDead: say("removed the dead clairfs mount at " + mnt + " (its daemon had died)"); break;
      case Detached::kLive:
        if (!stop) say("unmounted " + mnt + ", still served by a live daemon (it ends by itself now)");
        break;
    }
  }
  for (const auto& nvme : nvmes)
    for (const std::string& line : remove_stale_caches(nvme, &stayed)) say(line);
  std::fflush(stdout);
  return stayed ? kExitFailure : 0;
}

}  // namespace clairfs
