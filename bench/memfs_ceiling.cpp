// Benchmark-only: the smallest FUSE server that can serve a tree, holding every byte in RAM. It
// shares no code with clairfs on purpose: it measures what any libfuse low-level server can reach on
// this machine (the front-end's ceiling), so clairfs's figure can be put beside it.
//   memfs_ceiling SOURCE MOUNTPOINT [-s]     (foreground; -s: single-threaded loop)
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

struct Node {
  struct stat st {};
  std::map<std::string, fuse_ino_t> children;
  std::vector<std::string> names;  // children in map order, for readdir offsets
  std::string data;
};

std::vector<Node> g_nodes;  // index = inode - 1
constexpr double kTimeout = 86400.0;

fuse_ino_t load(const std::filesystem::path& p, fuse_ino_t parent) {
  g_nodes.emplace_back();
  const fuse_ino_t ino = g_nodes.size();
  struct stat st {};
  lstat(p.c_str(), &st);
  st.st_ino = ino;
  g_nodes[ino - 1].st = st;
  if (S_ISDIR(st.st_mode)) {
    for (auto& e : std::filesystem::directory_iterator(p)) {
      fuse_ino_t child = load(e.path(), ino);
      g_nodes[ino - 1].children[e.path().filename()] = child;
    }
    for (auto& [name, _] : g_nodes[ino - 1].children) g_nodes[ino - 1].names.push_back(name);
  } else if (S_ISREG(st.st_mode)) {
    std::ifstream in(p, std::ios::binary);
    g_nodes[ino - 1].data.assign(std::istreambuf_iterator<char>(in), {});
  }
  (void)parent;
  return ino;
}

void entry_for(fuse_ino_t ino, fuse_entry_param* e) {
  std::memset(e, 0, sizeof(*e));
  e->ino = ino;
  e->attr = g_nodes[ino - 1].st;
  e->attr_timeout = e->entry_timeout = kTimeout;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& kids = g_nodes[parent - 1].children;
  auto it = kids.find(name);
  if (it == kids.end()) return (void)fuse_reply_err(req, ENOENT);
  fuse_entry_param e;
  entry_for(it->second, &e);
  fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  fuse_reply_attr(req, &g_nodes[ino - 1].st, kTimeout);
}

void op_readdir_any(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  const Node& n = g_nodes[ino - 1];
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < n.names.size(); ++i) {
    fuse_ino_t child = n.children.at(n.names[i]);
    size_t need;
    if (plus) {
      fuse_entry_param e;
      entry_for(child, &e);
      need = fuse_add_direntry_plus(req, buf.data() + used, size - used, n.names[i].c_str(), &e, static_cast<off_t>(i + 1));
    } else {
      need = fuse_add_direntry(req, buf.data() + used, size - used, n.names[i].c_str(), &g_nodes[child - 1].st,
                               static_cast<off_t>(i + 1));
    }
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  op_readdir_any(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  op_readdir_any(req, ino, size, off, true);
}

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
  load(argv[1], 1);
  fuse_lowlevel_ops ops{};
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.readdir = op_readdir;
  ops.readdirplus = op_readdirplus;
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  char arg0[] = "memfs_ceiling", o[] = "-o", opts[] = "ro,fsname=memfs_ceiling";
  char* args_v[] = {arg0, o, opts};
  fuse_args args = FUSE_ARGS_INIT(3, args_v);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[2]) != 0) return 1;
  std::fprintf(stdout, "ready\n");
  std::fflush(stdout);
  int rc;
  if (single) {
    rc = fuse_session_loop(se);
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, 16);
    rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc;
}
