// Test tool: prints the samples of SOURCE (or of a manifest) in order, one "class_index<TAB>path" a
// line, so scripts can compare clairfs's order with torchvision's own ImageFolder.
//   list_samples SOURCE [MANIFEST]
#include <cstdio>
#include <exception>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: list_samples SOURCE [MANIFEST]\n");
    return 2;
  }
  try {
    using clairfs::Manifest;
    Manifest m = argc == 3 ? Manifest::load(argv[2], clairfs::default_extensions(), argv[1])
                           : Manifest::scan(argv[1], clairfs::default_extensions());
    const auto& classes = m.classes();
    size_t c = 0;
    for (size_t i = 0; i < m.samples().size(); ++i) {
      while (c + 1 < classes.size() && classes[c + 1].first_sample <= i) ++c;
      std::printf("%zu\t%s\n", c, m.sample_path(i).c_str());
    }
    for (const auto& w : m.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "list_samples: %s\n", e.what());
    return 1;
  }
  return 0;
}
