// libFuzzer target: the peer request decoder. Whatever bytes arrive as a request, the answer is a request
// naming a regular file of the manifest with its exact size and a tag in range, or a refusal.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "peer/message.hpp"

namespace {

const clairfs::Manifest& manifest() {
  // A class directory with three files of different sizes, a directory and a symlink, scanned once.
  static const clairfs::Manifest m = [] {
    char tmpl[] = "/tmp/clairfs-fuzz-XXXXXX";
    const std::string root = ::mkdtemp(tmpl);
    ::mkdir((root + "/c").c_str(), 0755);
    ::mkdir((root + "/c/d").c_str(), 0755);
    for (int i = 1; i <= 3; ++i) {
      FILE* f = std::fopen((root + "/c/f" + std::to_string(i) + ".jpg").c_str(), "w");
      for (int k = 0; k < 100 * i; ++k) std::fputc('x', f);
      std::fclose(f);
    }
    (void)::symlink("f1.jpg", (root + "/c/l.jpg").c_str());
    clairfs::Manifest scanned = clairfs::Manifest::scan(root, clairfs::default_extensions());
    std::filesystem::remove_all(root);
    return scanned;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const clairfs::Manifest& m = manifest();
  const auto r = clairfs::decode_peer_request(data, size, m, 32767);
  if (r && (r->id >= m.size() || !S_ISREG(m.entry(r->id).mode) || r->size != m.entry(r->id).size ||
            r->tag < clairfs::kPeerFirstReplyTag || r->tag > 32767))
    __builtin_trap();
  return 0;
}
