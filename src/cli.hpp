// The clairfs command: `clairfs SOURCE MOUNTPOINT ...` mounts; `clairfs index SOURCE FILE` writes a
// manifest. main() only calls run_cli.
#pragma once

namespace clairfs {

// Returns the process exit code: 0 success, 1 a failure at run time, 2 a bad option or path.
int run_cli(int argc, char** argv);

}  // namespace clairfs
