// The clairfs command's subcommands, each in its own file, and what they share; run_cli (cli.cpp) picks
// one by argv[1], and a mount when it names none.
#pragma once

#include <optional>
#include <string>

namespace clairfs {

// Exit codes besides 0: a failure at run time, a bad option or path.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// `clairfs index SOURCE FILE [-o ...]` (index_command.cpp).
int run_index(int argc, char** argv);
// `clairfs cleanup [--stop] [-o nvme=DIR] [MOUNTPOINT...]` (cleanup_command.cpp).
int run_cleanup(int argc, char** argv);
// `clairfs status MOUNTPOINT [--watch [SECONDS]]` (status.cpp).
int run_status(int argc, char** argv);

// The subcommands' "-o GROUP" or "-oGROUP" at argv[i]: the group (i moves past it), or nullopt if
// argv[i] is something else. Throws UsageError when -o ends the command line.
std::optional<std::string> option_group(int& i, int argc, char** argv);
// The scan holds one descriptor per directory level and the daemon one per open file: use the hard limit.
void raise_fd_limit();

}  // namespace clairfs
