#pragma once

namespace clairfs {

// `clairfs status MOUNTPOINT [--watch [SECONDS]]`. Returns the exit code.
int run_status(int argc, char** argv);

}  // namespace clairfs
