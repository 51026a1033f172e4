// libFuzzer target: the manifest loader (an index file, or the bytes node 0 broadcasts). Any input ends
// in a manifest whose entries are all reachable, or a runtime_error naming the defect; never a crash.
//
// Inputs whose first byte is odd are taken as they are (the header checks). The others are made into a
// manifest whose header agrees with its size and whose checksum is right (Manifest::reseal), so that
// they reach the structure checks behind the checksum: entries, names, parents, children.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"

namespace {

constexpr size_t kHeader = 64;
constexpr size_t kEntry = sizeof(clairfs::Entry);

// The header's layout (manifest.cpp): magic, version, byte order, entry size, root length, entry
// count, names size, hash.
std::string sealed(const uint8_t* data, size_t size) {
  std::string bytes(kHeader, '\0');
  bytes.append(reinterpret_cast<const char*>(data), size);
  const uint64_t body = bytes.size() - kHeader;
  // Counts from the input's first bytes, cut to what the body holds.
  uint64_t want_entries = 0, want_names = 0;
  std::memcpy(&want_entries, data, std::min<size_t>(size, 2));
  if (size > 2) std::memcpy(&want_names, data + 2, std::min<size_t>(size - 2, 2));
  const uint64_t entries = std::min<uint64_t>(want_entries, body / kEntry);
  const uint64_t names = std::min<uint64_t>(want_names, body - entries * kEntry);
  const uint32_t root = static_cast<uint32_t>(body - entries * kEntry - names);
  const uint32_t version = 1, order = 0x01020304, entry_size = kEntry;
  std::memcpy(bytes.data(), "CLAIRFSM", 8);
  std::memcpy(bytes.data() + 8, &version, 4);
  std::memcpy(bytes.data() + 12, &order, 4);
  std::memcpy(bytes.data() + 16, &entry_size, 4);
  std::memcpy(bytes.data() + 20, &root, 4);
  std::memcpy(bytes.data() + 24, &entries, 8);
  std::memcpy(bytes.data() + 32, &names, 8);
  clairfs::Manifest::reseal(&bytes);
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool raw = size == 0 || (data[0] & 1);
  std::string bytes = raw ? std::string(reinterpret_cast<const char*>(data), size) : sealed(data + 1, size - 1);
  try {
    const clairfs::Manifest m = clairfs::Manifest::deserialize(std::move(bytes), clairfs::default_extensions(), "/nonexistent");
    for (clairfs::EntryId id = 0; id < m.size(); ++id) (void)m.path(id);
    for (clairfs::EntryId id : m.samples()) (void)m.entry(id);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
