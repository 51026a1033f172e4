// Benchmark-only: a synthetic SOURCE for scale runs. It serves N files in C class folders, as ImageNet
// lays them out (n00000000/n00000000_0.JPEG, ...), with names, sizes and bytes computed from the file's
// number and a seed: it holds no bytes and no table per file, so 14.2 million files (ImageNet-21k) cost
// it nothing but the kernel's inodes for what is looked up. Class c holds files [c*N/C, (c+1)*N/C).
//
//   synthfs MOUNTPOINT --files N [--classes C] [--min-size B] [--max-size B] [--seed S]
//           [--meta-latency-us U] [--threads T] [--no-readdirplus]
//     mounts read-only, prints "ready", serves until unmounted. --meta-latency-us charges every lookup,
//     getattr and directory read that long (a parallel file system's metadata round trip);
//     --no-readdirplus lists names only, so every file's attributes take a lookup of their own (as on
//     a file system whose listings carry no attributes).
//   synthfs --check DIR --files N [--classes C] [--min-size B] [--max-size B] [--seed S] [--sample K]
//     reads K files spread over the set (all if K >= N) under DIR — a mount of synthfs, or of clairfs
//     over one — and compares their sizes and bytes with what they must be, computed here; prints
//     "checked K files, W wrong" and exits 1 if any is wrong.
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct Shape {
  uint64_t files = 0;
  uint64_t classes = 1000;
  uint64_t min_size = 64, max_size = 200;
  uint64_t seed = 1;
};

Shape g_shape;
unsigned g_meta_latency_us = 0;
bool g_readdirplus = true;
// Every file's owner, asked once: a system call per entry listed cost the 14.2 M run ~8% of the CPU it
// shares with the client, which a real SOURCE's server does not take.
uid_t g_uid;
gid_t g_gid;
constexpr double kTimeout = 86400.0;
constexpr time_t kMtime = 1700000000;
constexpr fuse_ino_t kRoot = 1;

uint64_t first_of(uint64_t c) { return c * g_shape.files / g_shape.classes; }
uint64_t class_of(uint64_t i) {
  // The c with first_of(c) <= i < first_of(c + 1).
  uint64_t c = (i * g_shape.classes + g_shape.classes - 1) / g_shape.files;
  while (c > 0 && first_of(c) > i) --c;
  while (c + 1 < g_shape.classes && first_of(c + 1) <= i) ++c;
  return c;
}
fuse_ino_t dir_ino(uint64_t c) { return 2 + c; }
fuse_ino_t file_ino(uint64_t i) { return 2 + g_shape.classes + i; }
bool is_dir(fuse_ino_t ino) { return ino >= 2 && ino < 2 + g_shape.classes; }
bool is_file(fuse_ino_t ino) { return ino >= 2 + g_shape.classes && ino < 2 + g_shape.classes + g_shape.files; }

std::string dir_name(uint64_t c) {
  char b[32];
  std::snprintf(b, sizeof b, "n%08" PRIu64, c);
  return b;
}
std::string file_name(uint64_t i) {
  char b[48];
  std::snprintf(b, sizeof b, "n%08" PRIu64 "_%" PRIu64 ".JPEG", class_of(i), i);
  return b;
}

uint64_t mix(uint64_t a, uint64_t b) {
  const uint64_t in[2] = {a, b};
  return XXH64(in, sizeof in, g_shape.seed);
}
uint64_t file_size(uint64_t i) { return g_shape.min_size + mix(i, ~0ULL) % (g_shape.max_size - g_shape.min_size + 1); }
// The file's bytes [off, off + n): 8 bytes per block, each block a hash of (file, block).
void fill(uint64_t i, uint64_t off, char* out, size_t n) {
  for (size_t k = 0; k < n;) {
    const uint64_t at = off + k, block = at / 8;
    const uint64_t v = mix(i, block);
    const size_t from = at % 8, take = std::min<size_t>(8 - from, n - k);
    std::memcpy(out + k, reinterpret_cast<const char*>(&v) + from, take);
    k += take;
  }
}

// Parses "<prefix><decimal>" with nothing after, into *v.
bool number(std::string_view s, std::string_view prefix, uint64_t* v) {
  if (s.substr(0, prefix.size()) != prefix || s.size() == prefix.size() || s.size() > prefix.size() + 19) return false;
  uint64_t x = 0;
  for (char ch : s.substr(prefix.size())) {
    if (ch < '0' || ch > '9') return false;
    x = x * 10 + static_cast<uint64_t>(ch - '0');
  }
  *v = x;
  return true;
}

struct stat attr_of(fuse_ino_t ino) {
  struct stat st {};
  st.st_ino = ino;
  st.st_mtime = st.st_ctime = st.st_atime = kMtime;
  st.st_uid = g_uid;
  st.st_gid = g_gid;
  if (ino == kRoot || is_dir(ino)) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = ino == kRoot ? 2 + g_shape.classes : 2;
  } else {
    st.st_mode = S_IFREG | 0444;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(file_size(ino - 2 - g_shape.classes));
    st.st_blocks = (st.st_size + 511) / 512;
  }
  return st;
}

void charge() {
  if (g_meta_latency_us) std::this_thread::sleep_for(std::chrono::microseconds(g_meta_latency_us));
}

void reply_entry(fuse_req_t req, fuse_ino_t ino) {
  fuse_entry_param e{};
  e.ino = ino;
  e.attr = attr_of(ino);
  e.attr_timeout = e.entry_timeout = kTimeout;
  fuse_reply_entry(req, &e);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  charge();
  uint64_t c = 0, i = 0;
  const std::string_view n(name);
  if (parent == kRoot && number(n, "n", &c) && c < g_shape.classes && n == dir_name(c)) return reply_entry(req, dir_ino(c));
  if (is_dir(parent) && n.size() > 5 && n.substr(n.size() - 5) == ".JPEG") {
    c = parent - 2;
    const std::string prefix = dir_name(c) + "_";
    if (number(n.substr(0, n.size() - 5), prefix, &i) && i < g_shape.files && class_of(i) == c && n == file_name(i))
      return reply_entry(req, file_ino(i));
  }
  fuse_reply_err(req, ENOENT);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  charge();
  if (ino != kRoot && !is_dir(ino) && !is_file(ino)) return (void)fuse_reply_err(req, ENOENT);
  const struct stat st = attr_of(ino);
  fuse_reply_attr(req, &st, kTimeout);
}

void readdir_any(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  charge();
  uint64_t begin = 0, end = 0;
  if (ino == kRoot) {
    end = g_shape.classes;
  } else if (is_dir(ino)) {
    begin = first_of(ino - 2);
    end = first_of(ino - 1);
  } else {
    return (void)fuse_reply_err(req, ENOTDIR);
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (uint64_t k = static_cast<uint64_t>(off); begin + k < end; ++k) {
    const uint64_t x = begin + k;
    const fuse_ino_t child = ino == kRoot ? dir_ino(x) : file_ino(x);
    const std::string name = ino == kRoot ? dir_name(x) : file_name(x);
    size_t need;
    if (plus) {
      fuse_entry_param e{};
      e.ino = child;
      e.attr = attr_of(child);
      e.attr_timeout = e.entry_timeout = kTimeout;
      need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &e, static_cast<off_t>(k + 1));
    } else {
      const struct stat st = attr_of(child);
      need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, static_cast<off_t>(k + 1));
    }
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_any(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_any(req, ino, size, off, true);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (!is_file(ino)) return (void)fuse_reply_err(req, is_dir(ino) || ino == kRoot ? EISDIR : ENOENT);
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EROFS);
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const uint64_t i = ino - 2 - g_shape.classes, total = file_size(i);
  const uint64_t at = std::min<uint64_t>(static_cast<uint64_t>(off), total);
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, total - at));
  std::vector<char> buf(n);
  fill(i, at, buf.data(), n);
  fuse_reply_buf(req, buf.data(), n);
}

// Lookups in one directory may run at once (the kernel serializes them otherwise), as a parallel file
// system serves them.
void op_init(void*, fuse_conn_info* conn) {
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
}

int serve(const char* mountpoint, unsigned threads) {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.readdir = op_readdir;
  if (g_readdirplus) ops.readdirplus = op_readdirplus;
  ops.open = op_open;
  ops.read = op_read;
  std::string arg0 = "synthfs", o = "-o", opts = "ro,fsname=synthfs";
  char* args_v[] = {arg0.data(), o.data(), opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, args_v);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, mountpoint) != 0) {
    std::fprintf(stderr, "synthfs: cannot mount at %s\n", mountpoint);
    fuse_opt_free_args(&args);
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, threads);
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  return rc == 0 ? 0 : 1;
}

int check(const std::string& dir, uint64_t sample) {
  const uint64_t k = std::max<uint64_t>(1, std::min(sample, g_shape.files));
  uint64_t wrong = 0;
  std::vector<char> got, want;
  for (uint64_t s = 0; s < k; ++s) {
    const uint64_t i = s * g_shape.files / k;
    const std::string path = dir + "/" + dir_name(class_of(i)) + "/" + file_name(i);
    const uint64_t size = file_size(i);
    want.resize(size);
    fill(i, 0, want.data(), size);
    got.assign(size + 1, 0);
    const int fd = ::open(path.c_str(), O_RDONLY);
    ssize_t n = -1;
    if (fd >= 0) {
      size_t have = 0;
      for (ssize_t r; have < got.size() && (r = ::read(fd, got.data() + have, got.size() - have)) > 0;) have += static_cast<size_t>(r);
      n = static_cast<ssize_t>(have);
      ::close(fd);
    }
    if (n != static_cast<ssize_t>(size) || std::memcmp(got.data(), want.data(), size) != 0) {
      if (wrong++ < 5) std::fprintf(stderr, "synthfs: %s: wrong (%zd of %" PRIu64 " bytes read)\n", path.c_str(), n, size);
    }
  }
  std::printf("checked %" PRIu64 " files, %" PRIu64 " wrong\n", k, wrong);
  return wrong ? 1 : 0;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "synthfs: %s\nusage: synthfs MOUNTPOINT --files N [--classes C] [--min-size B] [--max-size B] [--seed S]\n"
               "               [--meta-latency-us U] [--threads T] [--no-readdirplus]\n"
               "       synthfs --check DIR --files N [same shape options] [--sample K]\n",
               why);
  std::exit(2);
}

uint64_t value(int argc, char** argv, int* k) {
  if (*k + 1 >= argc) usage((std::string(argv[*k]) + " needs a value").c_str());
  char* end = nullptr;
  const char* s = argv[++*k];
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end || *s == '-') usage((std::string("not a number: ") + s).c_str());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  g_uid = getuid();
  g_gid = getgid();
  std::string where, check_dir;
  uint64_t sample = 1000, threads = 8;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    if (a == "--files") g_shape.files = value(argc, argv, &k);
    else if (a == "--classes") g_shape.classes = value(argc, argv, &k);
    else if (a == "--min-size") g_shape.min_size = value(argc, argv, &k);
    else if (a == "--max-size") g_shape.max_size = value(argc, argv, &k);
    else if (a == "--seed") g_shape.seed = value(argc, argv, &k);
    else if (a == "--meta-latency-us") g_meta_latency_us = static_cast<unsigned>(value(argc, argv, &k));
    else if (a == "--threads") threads = value(argc, argv, &k);
    else if (a == "--no-readdirplus") g_readdirplus = false;
    else if (a == "--sample") sample = value(argc, argv, &k);
    else if (a == "--check" && k + 1 < argc) check_dir = argv[++k];
    else if (!a.empty() && a[0] != '-' && where.empty()) where = a;
    else usage(("unknown argument: " + a).c_str());
  }
  if (g_shape.files == 0) usage("--files must be at least 1");
  if (g_shape.classes == 0 || g_shape.classes > g_shape.files) usage("--classes must be 1 to --files");
  if (g_shape.min_size > g_shape.max_size) usage("--min-size is above --max-size");
  if (threads == 0 || threads > 256) usage("--threads must be 1 to 256");
  if (!check_dir.empty()) return check(check_dir, sample);
  if (where.empty()) usage("no mount point");
  return serve(where.c_str(), static_cast<unsigned>(threads));
}
