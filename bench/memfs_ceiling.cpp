// Benchmark-only: the smallest FUSE server that can serve a tree, holding every byte in RAM. It
// shares no code with clairfs on purpose: it measures what any libfuse low-level server can reach on
// this machine (the front-end's ceiling), so clairfs's figure can be put beside it. Same kernel caching
// settings as clairfs (long timeouts, keep_cache) and the same 16-thread loop.
//   memfs_ceiling SOURCE MOUNTPOINT [-s]     (foreground; -s: single-threaded loop)
#include <cstring>

#include "tree_server.hpp"

namespace {

using tree_server::g_nodes;

void op_open(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const std::string& d = g_nodes[ino - 1].data;
  if (static_cast<size_t>(off) >= d.size()) return (void)fuse_reply_buf(req, nullptr, 0);
  fuse_reply_buf(req, d.data() + off, std::min(size, d.size() - static_cast<size_t>(off)));
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: memfs_ceiling SOURCE MOUNTPOINT [-s]\n");
    return 2;
  }
  const bool single = argc > 3 && std::strcmp(argv[3], "-s") == 0;
  tree_server::load(argv[1], /*with_data=*/true);
  fuse_lowlevel_ops ops = tree_server::metadata_ops();
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  return tree_server::serve("memfs_ceiling", argv[2], ops, single ? 0 : 16);
}
