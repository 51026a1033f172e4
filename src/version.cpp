#include "version.hpp"

#include <fuse_lowlevel.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include "clairfs_version.hpp"
#include "io/uring.hpp"
#include "peer/mpi.hpp"

#ifndef CLAIRFS_VERSION
#define CLAIRFS_VERSION "unknown"
#endif

namespace clairfs {

std::string version_text() {
  const unsigned xxh = XXH_versionNumber();
  return std::string("clairfs ") + CLAIRFS_VERSION + " (commit " + CLAIRFS_COMMIT + ")\n" +
         "libfuse " + fuse_pkgversion() + "\n" +
         "liburing " + liburing_version() + "\n" +
         "MPI: " + mpi_library_version() + "\n" +
         "xxHash " + std::to_string(xxh / 10000) + "." + std::to_string(xxh / 100 % 100) + "." + std::to_string(xxh % 100) +
         "\n" + "nlohmann/json " + std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
         std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH) + "\n";
}

}  // namespace clairfs
