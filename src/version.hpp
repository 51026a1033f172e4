// What `clairfs --version` prints: clairfs's version and commit, and the versions of the libraries it
// runs with (libfuse and liburing as loaded, MPI's library, xxHash), one per line.
#pragma once

#include <string>

namespace clairfs {

std::string version_text();

}  // namespace clairfs
