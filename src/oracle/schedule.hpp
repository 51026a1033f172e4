#pragma once

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"

namespace clairfs {

// The oracle's view of the mount options. Throws UsageError for a bad order file.
Schedule schedule_from_options(const Options& options, const Manifest& manifest);

}  // namespace clairfs
