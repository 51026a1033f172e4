// libFuzzer target: the lists a user hands the mount — the order file (order=list) and the sample list
// (samples=FILE) — picked by the input's first byte. Any input ends in a list or an error naming where it
// went wrong; never a crash. Order files name samples s0 .. s9; sample lists, files of a small tree
// (c/a.jpg, c/b.jpg, d/a.jpg, a symlink d/l.jpg to ../c/a.jpg).
#include <stdio.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"

namespace {

clairfs::Manifest& tree() {
  static clairfs::Manifest m = [] {
    char dir[] = "/tmp/clairfs-fuzz-XXXXXX";
    const std::string root = ::mkdtemp(dir);
    std::filesystem::create_directories(root + "/c");
    std::filesystem::create_directories(root + "/d");
    for (const char* f : {"/c/a.jpg", "/c/b.jpg", "/d/a.jpg"}) std::ofstream(root + f) << "x";
    std::filesystem::create_symlink("../c/a.jpg", root + "/d/l.jpg");
    clairfs::Manifest scanned = clairfs::Manifest::scan(root, clairfs::default_extensions());
    std::filesystem::remove_all(root);
    return scanned;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    FILE* in = ::fmemopen(const_cast<char*>(text.data()), text.size(), "r");
    if (!in) return 0;
    try {
      tree().use_samples(in, "fuzz", {"/mnt", "/src"});
      for (size_t i = 0; i < tree().samples().size(); ++i) (void)tree().sample_path(i);
    } catch (const std::runtime_error&) {
    }
    ::fclose(in);
    return 0;
  }
  std::istringstream in(text);
  auto resolve = [](const std::string& path) -> int64_t {
    return path.size() == 2 && path[0] == 's' && path[1] >= '0' && path[1] <= '9' ? path[1] - '0' : -1;
  };
  try {
    const clairfs::OrderList list = clairfs::parse_order_stream(in, "fuzz", 10, 3, resolve);
    for (const auto& section : list.sections) (void)section.first_epoch;
  } catch (const clairfs::UsageError&) {
  }
  return 0;
}
