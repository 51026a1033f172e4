// libFuzzer target: the manifest loader (an index file, or the bytes node 0 broadcasts). Any input ends
// in a manifest whose entries are all reachable, or a runtime_error naming the defect; never a crash.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const clairfs::Manifest m = clairfs::Manifest::deserialize(std::string(reinterpret_cast<const char*>(data), size),
                                                               clairfs::default_extensions(), "/nonexistent");
    for (clairfs::EntryId id = 0; id < m.size(); ++id) (void)m.path(id);
    for (clairfs::EntryId id : m.samples()) (void)m.entry(id);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
