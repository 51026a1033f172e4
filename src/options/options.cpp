// The mount command line, parsed with libfuse's option parser (fuse_opt_parse).
//
// Each option has one template in kTemplates below and a key; the processing callback converts the value
// and stores it in Options. libfuse's parser is C, so the callback never throws through it: it records the
// first error and returns -1, and parse_mount_command rethrows it as a UsageError. Cross-option checks
// (a rank below world_size, order_file with order=list, ...) and path checks run after the parse.
#include <fcntl.h>
#include <fuse_opt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

#include "clairfs/options.hpp"
#include "options/parse.hpp"
#include "util/mounts.hpp"

namespace clairfs {

std::string one_line(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

namespace {

enum Key : int {
  kForeground = 1,
  kDebug,
  kHelp,
  kVersion,
  kSeed,
  kBatchSize,
  kWorldSize,
  kRanks,
  kRanksPerNode,
  kEpochs,
  kStartEpoch,
  kDropLast,
  kDropLastValue,
  kLoaderDropLast,
  kLoaderDropLastValue,
  kWorkers,
  kPrefetchFactor,
  kOrder,
  kOrderFile,
  kExtensions,
  kRam,
  kNvme,
  kNvmeSize,
  kPageCache,
  kPeerTimeout,
  kIoDepth,
  kProgress,
  kManifest,
  kTorchVersion,
  kSharedGenerator,
  kSharedGeneratorValue,
  kPersistentWorkers,
  kPersistentWorkersValue,
  kTrace,
  kEntryTimeout,
  kAttrTimeout,
  kTimeout,
  kAllowOther,
  kDefaultPermissions,
  kAutoUnmount,
  kFsname,
  kMountFlag,  // forwarded to the kernel mount
  kIgnored,    // accepted for mount(8) and fstab compatibility, no effect
};

// Kernel mount flags libfuse understands; forwarded unchanged.
const char* const kMountFlags[] = {"dev",     "nodev",     "suid",       "nosuid",     "exec",
                                   "noexec",  "atime",     "noatime",    "relatime",   "norelatime",
                                   "diratime", "nodiratime", "strictatime", "lazytime", "async",
                                   "sync",    "dirsync"};
// What mount(8), mount.fuse3 and fstab may hand us that means nothing here. "rw" is accepted because
// mount(8) adds it by default; the mount stays read-only regardless.
const char* const kIgnoredFlags[] = {"ro", "rw", "defaults", "_netdev", "nofail", "auto", "noauto",
                                     "user", "users", "nouser", "owner", "group", "nosymfollow"};

#define CLAIRFS_OPT(templ, key) FUSE_OPT_KEY(templ, key)
const fuse_opt kTemplates[] = {
    CLAIRFS_OPT("-f", kForeground),
    CLAIRFS_OPT("-d", kDebug),
    CLAIRFS_OPT("debug", kDebug),
    CLAIRFS_OPT("-h", kHelp),
    CLAIRFS_OPT("--help", kHelp),
    CLAIRFS_OPT("-V", kVersion),
    CLAIRFS_OPT("--version", kVersion),
    CLAIRFS_OPT("seed=", kSeed),
    CLAIRFS_OPT("batch_size=", kBatchSize),
    CLAIRFS_OPT("world_size=", kWorldSize),
    CLAIRFS_OPT("ranks=", kRanks),
    CLAIRFS_OPT("ranks_per_node=", kRanksPerNode),
    CLAIRFS_OPT("epochs=", kEpochs),
    CLAIRFS_OPT("start_epoch=", kStartEpoch),
    CLAIRFS_OPT("drop_last", kDropLast),
    CLAIRFS_OPT("drop_last=", kDropLastValue),
    CLAIRFS_OPT("loader_drop_last", kLoaderDropLast),
    CLAIRFS_OPT("loader_drop_last=", kLoaderDropLastValue),
    CLAIRFS_OPT("workers=", kWorkers),
    CLAIRFS_OPT("prefetch_factor=", kPrefetchFactor),
    CLAIRFS_OPT("order=", kOrder),
    CLAIRFS_OPT("order_file=", kOrderFile),
    CLAIRFS_OPT("extensions=", kExtensions),
    CLAIRFS_OPT("ram=", kRam),
    CLAIRFS_OPT("nvme=", kNvme),
    CLAIRFS_OPT("pagecache=", kPageCache),
    CLAIRFS_OPT("peer_timeout=", kPeerTimeout),
    CLAIRFS_OPT("io_depth=", kIoDepth),
    CLAIRFS_OPT("progress=", kProgress),
    CLAIRFS_OPT("nvme_size=", kNvmeSize),
    CLAIRFS_OPT("manifest=", kManifest),
    CLAIRFS_OPT("torch_version=", kTorchVersion),
    CLAIRFS_OPT("shared_generator", kSharedGenerator),
    CLAIRFS_OPT("shared_generator=", kSharedGeneratorValue),
    CLAIRFS_OPT("persistent_workers", kPersistentWorkers),
    CLAIRFS_OPT("persistent_workers=", kPersistentWorkersValue),
    CLAIRFS_OPT("trace=", kTrace),
    CLAIRFS_OPT("entry_timeout=", kEntryTimeout),
    CLAIRFS_OPT("attr_timeout=", kAttrTimeout),
    CLAIRFS_OPT("timeout=", kTimeout),
    CLAIRFS_OPT("allow_other", kAllowOther),
    CLAIRFS_OPT("default_permissions", kDefaultPermissions),
    CLAIRFS_OPT("auto_unmount", kAutoUnmount),
    CLAIRFS_OPT("fsname=", kFsname),
    FUSE_OPT_END,
};

struct ParseState {
  Options* options;
  std::vector<std::string> positional;
  std::string error;  // first error seen; the parse stops there
  bool help = false;
  bool version = false;
  std::set<std::string> seen;  // option keys given, for conflict checks
};

std::string value_of(const char* arg) {
  const char* eq = std::strchr(arg, '=');
  return eq ? std::string(eq + 1) : std::string();
}

std::string key_of(const char* arg) {
  const char* eq = std::strchr(arg, '=');
  return eq ? std::string(arg, eq) : std::string(arg);
}

Order parse_order(const std::string& value) {
  if (value == "torch") return Order::kTorch;
  if (value == "torch-random" || value == "torch_random") return Order::kTorchRandom;
  if (value == "sequential") return Order::kSequential;
  if (value == "list") return Order::kList;
  if (value == "clairfs") return Order::kClairfs;
  bad_value("order", value, "use torch, torch-random, sequential, list or clairfs");
}

}  // namespace

std::vector<std::string> parse_extensions(const std::string& value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t stop = value.find_first_of(":,", start);
    if (stop == std::string::npos) stop = value.size();
    std::string item = value.substr(start, stop - start);
    if (item.empty() || item == "." || item.find('/') != std::string::npos)
      bad_value("extensions", value, "each extension must be like .jpg or png, separated by ':'");
    for (auto& c : item) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (item.front() != '.') item.insert(item.begin(), '.');
    out.push_back(item);
    start = stop + 1;
  }
  return out;
}

namespace {

void handle(ParseState& st, int key, const char* arg) {
  Options& o = *st.options;
  const std::string v = value_of(arg);
  const std::string k = key_of(arg);
  st.seen.insert(k);
  switch (key) {
    case kForeground: o.foreground = true; break;
    case kDebug: o.debug = true; o.foreground = true; break;
    case kHelp: st.help = true; break;
    case kVersion: st.version = true; break;
    case kSeed: o.seed = parse_seed(k, v); break;
    case kBatchSize:
      o.batch_size = parse_u64(k, v);
      if (o.batch_size == 0) bad_value(k, v, "must be at least 1");
      break;
    case kWorldSize:
      o.world_size = parse_u64(k, v);
      if (o.world_size == 0) bad_value(k, v, "must be at least 1");
      break;
    case kRanks: o.ranks = parse_rank_list(k, v); o.ranks_given = true; break;
    case kRanksPerNode:
      o.ranks_per_node = parse_u64(k, v);
      if (o.ranks_per_node == 0) bad_value(k, v, "must be at least 1");
      break;
    case kEpochs:
      o.epochs = parse_u64(k, v);
      if (*o.epochs == 0) bad_value(k, v, "must be at least 1");
      break;
    case kStartEpoch: o.start_epoch = parse_u64(k, v); break;
    case kDropLast: o.drop_last = true; break;
    case kDropLastValue: o.drop_last = parse_bool(k, v); break;
    case kLoaderDropLast: o.loader_drop_last = true; break;
    case kLoaderDropLastValue: o.loader_drop_last = parse_bool(k, v); break;
    case kWorkers: o.workers = parse_u64(k, v); break;
    case kPrefetchFactor:
      o.prefetch_factor = parse_u64(k, v);
      if (o.prefetch_factor == 0) bad_value(k, v, "must be at least 1");
      break;
    case kOrder: o.order = parse_order(v); break;
    case kOrderFile:
      if (v.empty()) bad_value(k, v, "empty path");
      o.order_file = v;
      break;
    case kExtensions: o.extensions = parse_extensions(v); break;
    case kRam:
      o.ram = parse_size(k, v);
      o.ram_given = true;
      break;
    case kIoDepth:
      o.io_depth = parse_u64(k, v);
      if (o.io_depth < 1 || o.io_depth > 4096) bad_value(k, v, "use 1 to 4096");
      break;
    case kProgress:
      if (v != "reads" && v != "opens") bad_value(k, v, "use reads or opens");
      o.progress_from_opens = v == "opens";
      o.progress_given = true;
      break;
    case kPeerTimeout:
      o.peer_timeout = parse_seconds(k, v);
      if (o.peer_timeout <= 0) bad_value(k, v, "must be above 0");
      break;
    case kPageCache:
      o.pagecache = parse_size(k, v);
      o.pagecache_given = true;
      break;
    case kNvme:
      if (v.empty()) bad_value(k, v, "empty path");
      o.nvme = v;
      break;
    case kNvmeSize: o.nvme_size = parse_size(k, v); break;
    case kTorchVersion:
      o.torch_version = parse_u64(k, v);
      if (o.torch_version != 1 && o.torch_version != 2) bad_value(k, v, "use 1 (torch 1.x) or 2 (torch 2.x)");
      break;
    case kSharedGenerator: o.shared_generator = true; break;
    case kSharedGeneratorValue: o.shared_generator = parse_bool(k, v); break;
    case kPersistentWorkers: o.persistent_workers = true; break;
    case kPersistentWorkersValue: o.persistent_workers = parse_bool(k, v); break;
    case kTrace:
      if (v.empty()) bad_value(k, v, "empty path");
      o.trace = v;
      break;
    case kManifest:
      if (v.empty()) bad_value(k, v, "empty path");
      o.manifest = v;
      break;
    case kEntryTimeout: o.entry_timeout = parse_seconds(k, v); break;
    case kAttrTimeout: o.attr_timeout = parse_seconds(k, v); break;
    case kTimeout: o.entry_timeout = o.attr_timeout = parse_seconds(k, v); break;
    case kAllowOther: o.allow_other = true; break;
    case kDefaultPermissions: o.default_permissions = true; break;
    case kAutoUnmount: o.auto_unmount = true; break;
    case kFsname:
      if (v.empty()) bad_value(k, v, "empty name");
      o.fsname = v;
      break;
    default: break;
  }
}

int process(void* data, const char* arg, int key, fuse_args* /*outargs*/) {
  auto& st = *static_cast<ParseState*>(data);
  if (!st.error.empty()) return -1;
  try {
    if (key == FUSE_OPT_KEY_NONOPT) {
      st.positional.emplace_back(arg);
      if (st.positional.size() > 2)
        throw UsageError("unexpected argument '" + std::string(arg) + "' (usage: clairfs SOURCE MOUNTPOINT [-f] [-o OPTIONS])");
      return 0;
    }
    if (key == FUSE_OPT_KEY_OPT) {
      const std::string k = key_of(arg);
      const bool has_value = std::strchr(arg, '=') != nullptr;
      for (const char* flag : kMountFlags)
        if (!has_value && k == flag) { st.options->mount_flags.push_back(k); return 0; }
      for (const char* flag : kIgnoredFlags)
        if (!has_value && k == flag) return 0;
      if (k.rfind("x-", 0) == 0 || k.rfind("comment=", 0) == 0) return 0;  // for other tools
      if (arg[0] == '-') throw UsageError("unknown flag '" + std::string(arg) + "' (see clairfs --help)");
      throw UsageError("unknown option '" + std::string(arg) + "' (see clairfs --help)");
    }
    handle(st, key, arg);
    return 0;
  } catch (const UsageError& e) {
    st.error = e.what();
    return -1;
  }
}

// Throws unless `path` exists, is of file type `type` (S_IFDIR, S_IFREG) and allows `mode` (0: no check).
void require_path(const std::string& what, const std::string& path, mode_t type, int mode) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UsageError(what + " '" + path + "': " + std::strerror(errno));
  if ((st.st_mode & S_IFMT) != type)
    throw UsageError(what + " '" + path + "' is not a " + (type == S_IFDIR ? "directory" : "regular file"));
  if (mode != 0 && ::access(path.c_str(), mode) != 0)
    throw UsageError(what + " '" + path + "' is not " + ((mode & W_OK) ? "writable" : "readable") + ": " +
                     std::strerror(errno));
}

// Two daemons never share a mount point: one mounted on top of a live clairfs mount hides it from the
// job halfway through, and one on top of a dead mount leaves the dead one behind when it ends.
void refuse_clairfs_mountpoint(const std::string& mountpoint) {
  const std::string abs = absolute_parent_resolved(mountpoint);
  const auto m = mount_at(abs);
  if (!m || m->fstype != "fuse.clairfs") return;
  if (is_dead_fuse_mount(abs))
    throw UsageError("MOUNTPOINT '" + mountpoint + "' is a dead clairfs mount (its daemon is gone); clear it with 'fusermount3 -u -z " +
                     abs + "' (or 'clairfs cleanup " + abs + "'), then mount again");
  throw UsageError("MOUNTPOINT '" + mountpoint + "' is already a clairfs mount (of " + m->source +
                   "); unmount it first with 'fusermount3 -u " + abs + "'");
}

std::string absolute(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (!resolved) return path;
  std::string out(resolved);
  std::free(resolved);
  return out;
}

// A quarter of the node's memory: room for a good part of a data set ahead of the readers, while the
// job keeps the rest.
uint64_t default_ram_budget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
}

void check_paths(Options& o) {
  require_path("SOURCE", o.source, S_IFDIR, R_OK | X_OK);
  refuse_clairfs_mountpoint(o.mountpoint);
  require_path("MOUNTPOINT", o.mountpoint, S_IFDIR, 0);
  o.source_abs = absolute(o.source);
  o.mountpoint_abs = absolute(o.mountpoint);
  if (!o.manifest.empty()) require_path("manifest", o.manifest, S_IFREG, R_OK);
  if (!o.order_file.empty()) require_path("order_file", o.order_file, S_IFREG, R_OK);
  if (!o.nvme.empty()) require_path("nvme", o.nvme, S_IFDIR, R_OK | W_OK | X_OK);
  if (!o.trace.empty()) {
    const int fd = ::open(o.trace.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw UsageError("trace '" + o.trace + "': " + std::strerror(errno));
    ::close(fd);
    o.trace = absolute(o.trace);  // the daemon changes directory to /
  }
}

void check_combinations(ParseState& st) {
  Options& o = *st.options;
  if (st.seen.count("ranks") && st.seen.count("ranks_per_node"))
    throw UsageError("give ranks= or ranks_per_node=, not both");
  if (o.ranks_per_node > o.world_size)
    throw UsageError("ranks_per_node=" + std::to_string(o.ranks_per_node) + " exceeds world_size=" +
                     std::to_string(o.world_size));
  if (o.ranks_given) {
    for (uint64_t r : o.ranks)
      if (r >= o.world_size)
        throw UsageError("rank " + std::to_string(r) + " in ranks= is not below world_size=" +
                         std::to_string(o.world_size));
  } else if (o.ranks_per_node > 0) {
    // Without a launcher this daemon is node 0; the peer layer recomputes this per node.
    for (uint64_t r = 0; r < o.ranks_per_node; ++r) o.ranks.push_back(r);
  } else if (o.world_size == 1) {
    o.ranks = {0};
  } else {
    throw UsageError("world_size=" + std::to_string(o.world_size) +
                     " needs ranks= (the training ranks this mount serves) or ranks_per_node=");
  }
  if (o.epochs && o.start_epoch >= *o.epochs)
    throw UsageError("start_epoch=" + std::to_string(o.start_epoch) + " is not below epochs=" +
                     std::to_string(*o.epochs));
  if (o.order == Order::kList && o.order_file.empty())
    throw UsageError("order=list needs order_file=FILE");
  if (o.order != Order::kList && !o.order_file.empty())
    throw UsageError("order_file= is only used with order=list");
  if (o.allow_other && !o.default_permissions)
    throw UsageError("allow_other needs default_permissions too (else every user could read every file)");
  if (o.nvme_size > 0 && o.nvme.empty()) throw UsageError("nvme_size= needs nvme=DIR");
  if (!o.ram_given) o.ram = default_ram_budget();
  if (!o.nvme.empty() && o.ram == 0) throw UsageError("nvme= needs staging on (ram= above 0)");
  if (o.pagecache_given && o.pagecache > 0 && o.ram == 0) throw UsageError("pagecache= needs staging on (ram= above 0)");
  if (!o.pagecache_given) o.pagecache = std::min<uint64_t>(o.ram / 4, uint64_t{1} << 30);
  if (o.pagecache > o.ram) throw UsageError("pagecache= cannot exceed ram= (it holds copies of staged files)");
  if (o.progress_given && !o.progress_from_opens && o.ram == 0)
    throw UsageError("progress=reads needs staging on (ram= above 0)");
  if (o.progress_given && !o.progress_from_opens && !o.trace.empty())
    throw UsageError("progress=reads cannot go with trace= (the kernel would not send the opens it records)");
  if (!o.progress_given) o.progress_from_opens = o.ram == 0 || !o.trace.empty();
  if (o.extensions.empty()) o.extensions = default_extensions();
  if (o.fsname.empty()) o.fsname = o.source_abs.empty() ? o.source : o.source_abs;
}

}  // namespace

bool is_known_flag(const std::string& key) {
  for (const fuse_opt* t = kTemplates; t->templ; ++t)
    if (key == t->templ) return true;
  for (const char* flag : kMountFlags)
    if (key == flag) return true;
  for (const char* flag : kIgnoredFlags)
    if (key == flag) return true;
  return key.rfind("x-", 0) == 0;
}

const char* order_name(Order order) {
  switch (order) {
    case Order::kTorch: return "torch";
    case Order::kTorchRandom: return "torch-random";
    case Order::kSequential: return "sequential";
    case Order::kList: return "list";
    case Order::kClairfs: return "clairfs";
  }
  return "?";
}

const std::vector<std::string>& default_extensions() {
  static const std::vector<std::string> kImg = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                                ".pgm", ".tif",  ".tiff", ".webp"};
  return kImg;
}

Options parse_mount_command(int argc, const char* const* argv) {
  // Re-split every -o group ourselves so that '-'/'_' spellings and comma-separated list values are
  // normalised before libfuse matches the templates; commas inside values are re-escaped for it.
  std::vector<std::string> normalised = {argc > 0 ? argv[0] : "clairfs"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string group;
    if (a == "-o") {
      if (i + 1 >= argc) throw UsageError("-o needs a value");
      group = argv[++i];
    } else if (a.rfind("-o", 0) == 0 && a.size() > 2) {
      group = a.substr(2);
    } else {
      normalised.push_back(a);
      continue;
    }
    for (const auto& opt : split_option_string(group)) {
      std::string escaped;
      for (char c : opt) {
        if (c == ',' || c == '\\') escaped += '\\';
        escaped += c;
      }
      normalised.push_back("-o");
      normalised.push_back(escaped);
    }
  }

  std::vector<char*> cargv;
  for (auto& s : normalised) cargv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(cargv.size()), cargv.data());
  Options options;
  ParseState st{&options, {}, {}, false, false, {}};
  const int rc = fuse_opt_parse(&args, &st, kTemplates, process);
  fuse_opt_free_args(&args);
  if (!st.error.empty()) throw UsageError(st.error);
  if (rc != 0) throw UsageError("cannot parse the command line");
  if (st.help) throw HelpRequested(usage_text());
  if (st.version) throw HelpRequested(std::string("clairfs ") + CLAIRFS_VERSION + "\n");
  if (st.positional.size() < 2)
    throw UsageError("missing " + std::string(st.positional.empty() ? "SOURCE and MOUNTPOINT" : "MOUNTPOINT") +
                     " (usage: clairfs SOURCE MOUNTPOINT [-f] [-o OPTIONS])");
  options.source = st.positional[0];
  options.mountpoint = st.positional[1];
  check_paths(options);
  check_combinations(st);
  return options;
}

std::string usage_text() {
  return R"(usage: clairfs SOURCE MOUNTPOINT [-f] [-d] [-o OPTION[,OPTION...]]
       clairfs index SOURCE FILE [-o extensions=...]
       clairfs status MOUNTPOINT [--watch [SECONDS]]
       clairfs cleanup [--stop] [-o nvme=DIR] [MOUNTPOINT...]
       clairfs --help | --version

Shows the directory SOURCE read-only at MOUNTPOINT, byte for byte, and stages files ahead of a training
job that reads them in an order it can predict from the seed. Without -f, returns once the mount is live
(exit 0) or has failed (exit 1; exit 2 for a bad option or path). See docs/options.md for details.

'-' and '_' in option names are the same; sizes take K, M, G, T (powers of 1024).

Training schedule (what the job's sampler and DataLoader use):
  seed=N               sampler seed (DistributedSampler seed / generator seed); default 0
  batch_size=N         DataLoader batch size per rank; default 1
  world_size=N         training ranks in the job; default 1
  ranks=LIST           training ranks this mount serves: 3, 0-3, 0,2,5 or 0:2:5; default all if world_size=1
  ranks_per_node=N     serve N consecutive ranks per node instead of ranks=
  epochs=N             the job runs epochs start_epoch .. N-1; default unbounded
  start_epoch=N        first epoch (after a restart); default 0
  drop_last[=BOOL]     the sampler's drop_last; default off
  loader_drop_last[=BOOL]  the DataLoader's drop_last; default off
  workers=N            DataLoader num_workers; default 0
  prefetch_factor=N    DataLoader prefetch_factor; default 2
  order=NAME           torch (default), torch-random, sequential, list, clairfs
  order_file=FILE      the order for order=list
  torch_version=N      1 or 2: the torch.randperm the job's torch uses (differs from 214,748,364 samples); default 2
  shared_generator[=BOOL]    torch-random: the DataLoader gets the sampler's generator too; default on
  persistent_workers[=BOOL]  torch-random: DataLoader(persistent_workers=True); default off
  extensions=LIST      file extensions that are samples, ':'-separated; default ImageFolder's

Caches:
  ram=SIZE             RAM budget for staged files (a hard limit); default 1/4 of memory; 0: no staging
  pagecache=SIZE       staged files pushed into the kernel's page cache ahead of the readers, at most;
                       default 1/4 of ram=, up to 1G; 0: no pushes
  nvme=DIR             local directory for the NVMe tier (clairfs makes and removes its own folder in it)
  nvme_size=SIZE       NVMe tier budget; default 90% of the free space in DIR; needs nvme=
  io_depth=N           opens, reads and writes the stager keeps in flight; default 32
  progress=reads|opens how the engine follows the readers: reads (the kernel opens files without asking,
                       so pushed files cost no request; default) or opens (every open goes to the daemon)
  peer_timeout=SECS    under mpiexec/srun: a peer that has not answered in this long is not asked again
                       (its files come from SOURCE); default 5
  manifest=FILE        mount from an index written by 'clairfs index' instead of scanning SOURCE
  trace=FILE           append one line per file opened ("PID PATH") to FILE

Kernel and FUSE:
  entry_timeout=SECS   how long the kernel caches names; default 86400
  attr_timeout=SECS    how long the kernel caches attributes; default 86400
  timeout=SECS         both of the above
  allow_other          let other users read the mount
  default_permissions  let the kernel check permissions against the mirrored modes
  auto_unmount         unmount when the daemon exits
  fsname=NAME          the name shown in /proc/mounts; default SOURCE
  dev, nodev, suid, nosuid, exec, noexec, noatime, ...   mount flags, passed to the kernel
  ro, rw, defaults, _netdev, nofail, x-*               accepted from fstab/mount(8); the mount is always read-only

Flags:
  -f                   stay in the foreground
  -d                   foreground with FUSE debug output
  -h, --help           this text
  -V, --version        the version
)";
}

}  // namespace clairfs
