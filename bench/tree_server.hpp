// Benchmark-only: what the two stand-in FUSE servers (memfs_ceiling, slowfs) share — the tree of SOURCE
// held in memory, the metadata handlers (lookup, getattr, readdir, readdirplus) and the mount-and-serve
// loop. They share no code with clairfs on purpose: they measure what libfuse itself reaches here.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace tree_server {

struct Node {
  struct stat st {};
  std::string path;
  std::map<std::string, fuse_ino_t> children;
  std::vector<std::string> names;  // children in map order, for readdir offsets
  std::string data;                // the file's bytes, when loaded with `with_data`
};

inline std::vector<Node> g_nodes;  // index = inode - 1
inline double g_timeout = 86400.0;

// Loads the tree under `p` (inode 1 is its root); with_data also reads every regular file into RAM.
inline fuse_ino_t load(const std::filesystem::path& p, bool with_data) {
  g_nodes.emplace_back();
  const fuse_ino_t ino = g_nodes.size();
  struct stat st {};
  lstat(p.c_str(), &st);
  st.st_ino = ino;
  g_nodes[ino - 1].st = st;
  g_nodes[ino - 1].path = p;
  if (S_ISDIR(st.st_mode)) {
    for (auto& e : std::filesystem::directory_iterator(p)) {
      const fuse_ino_t child = load(e.path(), with_data);
      g_nodes[ino - 1].children[e.path().filename()] = child;
    }
    for (auto& [name, _] : g_nodes[ino - 1].children) g_nodes[ino - 1].names.push_back(name);
  } else if (S_ISREG(st.st_mode) && with_data) {
    std::ifstream in(p, std::ios::binary);
    g_nodes[ino - 1].data.assign(std::istreambuf_iterator<char>(in), {});
  }
  return ino;
}

inline void entry_for(fuse_ino_t ino, fuse_entry_param* e) {
  std::memset(e, 0, sizeof(*e));
  e->ino = ino;
  e->attr = g_nodes[ino - 1].st;
  e->attr_timeout = e->entry_timeout = g_timeout;
}

inline void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& kids = g_nodes[parent - 1].children;
  auto it = kids.find(name);
  if (it == kids.end()) return (void)fuse_reply_err(req, ENOENT);
  fuse_entry_param e;
  entry_for(it->second, &e);
  fuse_reply_entry(req, &e);
}

inline void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  fuse_reply_attr(req, &g_nodes[ino - 1].st, g_timeout);
}

inline void readdir_any(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  const Node& n = g_nodes[ino - 1];
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < n.names.size(); ++i) {
    const fuse_ino_t child = n.children.at(n.names[i]);
    size_t need;
    if (plus) {
      fuse_entry_param e;
      entry_for(child, &e);
      need = fuse_add_direntry_plus(req, buf.data() + used, size - used, n.names[i].c_str(), &e,
                                    static_cast<off_t>(i + 1));
    } else {
      need = fuse_add_direntry(req, buf.data() + used, size - used, n.names[i].c_str(), &g_nodes[child - 1].st,
                               static_cast<off_t>(i + 1));
    }
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

inline void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_any(req, ino, size, off, false);
}
inline void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_any(req, ino, size, off, true);
}

// The metadata handlers filled in; callers add open, read, release.
inline fuse_lowlevel_ops metadata_ops() {
  fuse_lowlevel_ops ops{};
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.readdir = op_readdir;
  ops.readdirplus = op_readdirplus;
  return ops;
}

// Mounts read-only at `mountpoint`, prints "ready", serves until unmounted. threads 0: single-threaded.
// `mounted`, if given, is called with the session once mounted, before the kernel's INIT is read.
inline int serve(const char* name, const char* mountpoint, const fuse_lowlevel_ops& ops, unsigned threads,
                 void (*mounted)(fuse_session*) = nullptr) {
  std::string arg0 = name, o = "-o", opts = std::string("ro,fsname=") + name;
  char* args_v[] = {arg0.data(), o.data(), opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, args_v);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, mountpoint) != 0) return 1;
  if (mounted) mounted(se);
  std::printf("ready\n");
  std::fflush(stdout);
  int rc;
  if (threads == 0) {
    rc = fuse_session_loop(se);
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, threads);
    rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc;
}

}  // namespace tree_server
