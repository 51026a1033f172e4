// The mount command line, parsed with libfuse's option parser (fuse_opt_parse).
//
// The templates, and the code that checks and stores each value, come from the option table (table.cpp);
// the processing callback here dispatches to it. libfuse's parser is C, so the callback never throws
// through it: it records the first error and returns -1, and parse_mount_command rethrows it as a
// UsageError. Cross-option checks
// (a rank below world_size, order_file with order=list, ...) and path checks run after the parse.
#include "clairfs/options.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_opt.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "options/parse.hpp"
#include "options/table.hpp"
#include "util/fs.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"

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

// libfuse's templates, made from the option table: an option's key is kOptionKey + its row, a flag's
// kFlagKey + its row. `name=` matches name=VALUE, `name` the bare word.
constexpr int kOptionKey = 1000, kFlagKey = 2000;

struct Templates {
  std::vector<std::string> words;  // what templ points into
  std::vector<fuse_opt> opts;
  Templates() {
    const auto& table = option_table();
    std::vector<std::pair<std::string, int>> all;
    for (size_t i = 0; i < table.size(); ++i) {
      const int key = kOptionKey + static_cast<int>(i);
      if (table[i].takes != Takes::kNothing) all.emplace_back(std::string(table[i].name) + "=", key);
      if (table[i].takes != Takes::kValue) all.emplace_back(table[i].name, key);
    }
    const auto& flags = flag_table();
    for (size_t i = 0; i < flags.size(); ++i)
      for (const char* s : flags[i].spellings) all.emplace_back(s, kFlagKey + static_cast<int>(i));
    words.reserve(all.size());
    for (auto& [word, key] : all) {
      words.push_back(word);
      opts.push_back(fuse_opt FUSE_OPT_KEY(nullptr, key));
      opts.back().templ = words.back().c_str();
    }
    opts.push_back(fuse_opt FUSE_OPT_END);
  }
};

const fuse_opt* templates() {
  static const Templates t;
  return t.opts.data();
}

bool is_one_of(const std::vector<const char*>& words, const std::string& key) {
  for (const char* w : words)
    if (key == w) return true;
  return false;
}

struct ParseState {
  Options* options;
  std::vector<std::string> positional;
  std::string error;  // first error seen; the parse stops there
  bool help = false;
  bool version = false;
  std::set<std::string> seen;  // option keys given, for conflict checks
};

}  // namespace

uint64_t open_tolerance(const Options& o) {
  return 2 * o.prefetch_factor * std::max<uint64_t>(o.workers, 8) * o.batch_size + 64;
}

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
  if (key >= kFlagKey) {
    switch (flag_table()[static_cast<size_t>(key - kFlagKey)].action) {
      case FlagAction::kForeground: st.options->foreground = true; break;
      case FlagAction::kDebug: st.options->debug = st.options->foreground = true; break;
      case FlagAction::kHelp: st.help = true; break;
      case FlagAction::kVersion: st.version = true; break;
    }
    return;
  }
  const char* eq = std::strchr(arg, '=');
  GivenOption given{eq ? std::string(arg, eq) : std::string(arg), eq ? std::string(eq + 1) : std::string(), eq != nullptr};
  st.seen.insert(given.key);
  option_table()[static_cast<size_t>(key - kOptionKey)].store(*st.options, given);
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
      const char* eq = std::strchr(arg, '=');
      const std::string k = eq ? std::string(arg, eq) : std::string(arg);
      if (!eq && is_one_of(kernel_mount_flags(), k)) {
        st.options->mount_flags.push_back(k);
        return 0;
      }
      if (!eq && is_one_of(ignored_mount_words(), k)) return 0;
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

// Entries in a directory, "." and ".." aside (0 if it cannot be read: the mount then says why).
size_t entries_in(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  size_t n = 0;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  ::closedir(d);
  return n;
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

// The memory this process may use: the node's, or less where its cgroup (v2) or one above it says so
// (a Slurm job's --mem). UINT64_MAX when neither is known.
uint64_t memory_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t limit = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    for (std::string path = line.substr(3); !path.empty() && path != "/"; path = path.substr(0, path.rfind('/'))) {
      std::ifstream max("/sys/fs/cgroup" + path + "/memory.max");
      std::string v;
      if (max >> v && v != "max" && !v.empty() && std::isdigit(static_cast<unsigned char>(v[0])))
        limit = std::min<uint64_t>(limit, std::strtoull(v.c_str(), nullptr, 10));
    }
  }
  return limit;
}

// Address space the daemon needs besides its RAM budget: code, libraries, thread stacks, libfuse's and
// MPI's buffers.
constexpr uint64_t kAddressSpaceBesidesRam = uint64_t{512} << 20;

// The address space this process may map (ulimit -v), UINT64_MAX when unlimited.
uint64_t address_space_limit() {
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return static_cast<uint64_t>(as.rlim_cur);
}

// The most ram= may be under an address-space limit: what the limit leaves besides the daemon's own.
uint64_t ram_within_address_space() {
  const uint64_t as = address_space_limit();
  return as == UINT64_MAX ? UINT64_MAX : (as > kAddressSpaceBesidesRam ? as - kAddressSpaceBesidesRam : 0);
}

// A quarter of the memory this process may use: room for a good part of a data set ahead of the
// readers, while the job keeps the rest.
uint64_t default_ram_budget() {
  const uint64_t limit = memory_limit();
  return std::min(limit == UINT64_MAX ? uint64_t{1} << 30 : limit / 4, ram_within_address_space() / 2);
}

// A RAM budget the node cannot hold is refused at mount, rather than a daemon the OOM killer ends
// mid-job. (An NVMe budget above the disk's free space is only warned of, at start-up: a full disk
// stops admission and nothing else, and space may come free.)
void refuse_budgets_beyond_the_node(const Options& o) {
  const uint64_t memory = memory_limit();
  if (o.ram > 0 && memory != UINT64_MAX && o.ram + o.pagecache > memory)
    throw UsageError("ram=" + human_bytes(static_cast<double>(o.ram)) +
                     (o.pagecache ? " (with pagecache=" + human_bytes(static_cast<double>(o.pagecache)) + ")" : "") +
                     " is more than the " + human_bytes(static_cast<double>(memory)) +
                     " of memory this node (or this job's cgroup) has; give less (the default is a quarter of it)");
  const uint64_t room = ram_within_address_space();
  if (o.ram > room)
    throw UsageError("ram=" + human_bytes(static_cast<double>(o.ram)) + " is more than this process's address-space limit (ulimit -v, " +
                     human_bytes(static_cast<double>(address_space_limit())) + ") leaves for it: " +
                     human_bytes(static_cast<double>(room)) + " at most");
}

void check_paths(Options& o) {
  require_path("SOURCE", o.source, S_IFDIR, R_OK | X_OK);
  refuse_clairfs_mountpoint(o.mountpoint);
  require_path("MOUNTPOINT", o.mountpoint, S_IFDIR, 0);
  if (!o.nonempty)
    if (const size_t n = entries_in(o.mountpoint))
      throw UsageError("MOUNTPOINT '" + o.mountpoint + "' is not empty: the mount would hide its " + std::to_string(n) +
                       (n == 1 ? " entry" : " entries") + "; mount on an empty directory, or give -o nonempty");
  o.source_abs = absolute(o.source);
  o.mountpoint_abs = absolute(o.mountpoint);
  if (!o.manifest.empty()) require_path("manifest", o.manifest, S_IFREG, R_OK);
  if (!o.order_file.empty()) require_path("order_file", o.order_file, S_IFREG, R_OK);
  if (!o.samples.empty()) {
    require_path("samples", o.samples, S_IFREG, R_OK);
    // Made absolute by the words alone: run as root, the daemon will not follow a symlink on its way.
    if (o.samples.front() != '/') o.samples = std::filesystem::current_path().string() + "/" + o.samples;
  }
  if (!o.nvme.empty()) require_path("nvme", o.nvme, S_IFDIR, R_OK | W_OK | X_OK);
  if (!o.metrics_file.empty()) {
    const std::string dir = o.metrics_file.substr(0, std::max<size_t>(1, o.metrics_file.rfind('/')));
    require_path("metrics_file's folder", dir, S_IFDIR, W_OK | X_OK);
  }
  if (!o.trace.empty()) {
    const int fd = open_for_append(o.trace, 0600);
    if (fd < 0) throw UsageError("trace '" + o.trace + "': " + why_not_written(fd));
    ::close(fd);
    o.trace = absolute(o.trace);  // the daemon changes directory to /
  }
}

void check_combinations(ParseState& st) {
  Options& o = *st.options;
  if (st.seen.count("ranks") && st.seen.count("ranks_per_node"))
    throw UsageError("give ranks= or ranks_per_node=, not both");
  if (o.world_size_auto && (st.seen.count("ranks") || st.seen.count("ranks_per_node")))
    throw UsageError("world_size=auto serves every rank the job has; give world_size=N with ranks= or ranks_per_node=");
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
  if (!o.samples.empty() && !o.root.empty())
    throw UsageError("give samples= or root=, not both (the list names the data set's files itself)");
  if (o.allow_other && !o.default_permissions)
    throw UsageError("allow_other needs default_permissions too (else every user could read every file)");
  if (o.nvme_size > 0 && o.nvme.empty()) throw UsageError("nvme_size= needs nvme=DIR");
  if (!o.ram_given) o.ram = default_ram_budget();
  if (!o.nvme.empty() && o.ram == 0) throw UsageError("nvme= needs staging on (ram= above 0)");
  if (o.pagecache_given && o.pagecache > 0 && o.ram == 0) throw UsageError("pagecache= needs staging on (ram= above 0)");
  if (!o.pagecache_given) o.pagecache = std::min<uint64_t>(o.ram / 4, uint64_t{1} << 30);
  if (o.pagecache > o.ram) throw UsageError("pagecache= cannot exceed ram= (it holds copies of staged files)");
  const std::string progress = o.progress_watch ? "progress=watch" : "progress=reads";
  if (o.progress_given && !o.progress_from_opens && o.ram == 0)
    throw UsageError(progress + " needs staging on (ram= above 0)");
  if (o.progress_given && !o.progress_from_opens && !o.trace.empty())
    throw UsageError(progress + " cannot go with trace= (the kernel would not send the opens it records)");
  if (!o.progress_given) {
    o.progress_from_opens = o.ram == 0 || !o.trace.empty();
    o.progress_watch = !o.progress_from_opens;
  }
  if (o.seed_auto && o.order != Order::kTorch && o.order != Order::kTorchGlobal)
    throw UsageError(std::string("seed=auto learns DistributedSampler's shuffle (order=torch) or RandomSampler's "
                                 "without a generator (order=torch-global), not order=") +
                     order_name(o.order) + "; give seed=");
  if (o.world_size_auto && o.order != Order::kTorch)
    throw UsageError(std::string("world_size=auto learns how DistributedSampler splits its shuffle (order=torch), not "
                                 "order=") +
                     order_name(o.order) + "; give world_size=");
  if (o.world_size_auto && o.ram == 0) throw UsageError("world_size=auto needs staging on (ram= above 0)");
  if (o.world_size_auto && o.batch_size == 1 && o.workers > 1)
    throw UsageError("world_size=auto cannot tell ranks from workers with batch_size=1 and workers=" +
                     std::to_string(o.workers) + ": give world_size=");
  if (o.seed_auto && o.ram == 0) throw UsageError("seed=auto needs staging on (ram= above 0): it learns the order to stage by");
  refuse_budgets_beyond_the_node(o);
  if (o.extensions.empty()) o.extensions = default_extensions();
  if (o.fsname.empty()) o.fsname = o.source_abs.empty() ? o.source : o.source_abs;
}

}  // namespace

bool is_known_flag(const std::string& key) {
  if (const OptionSpec* o = find_option(key)) return o->takes != Takes::kValue;
  for (const auto& f : flag_table())
    for (const char* s : f.spellings)
      if (key == s) return true;
  return is_one_of(kernel_mount_flags(), key) || is_one_of(ignored_mount_words(), key) || key.rfind("x-", 0) == 0;
}

std::string seed_text(SeedInt seed) {
  const bool negative = seed < 0;
  SeedUint v = negative ? -static_cast<SeedUint>(seed) : static_cast<SeedUint>(seed);
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return negative ? "-" + digits : digits;
}

const char* order_name(Order order) {
  switch (order) {
    case Order::kTorch: return "torch";
    case Order::kTorchRandom: return "torch-random";
    case Order::kTorchGlobal: return "torch-global";
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
  const int rc = fuse_opt_parse(&args, &st, templates(), process);
  fuse_opt_free_args(&args);
  if (!st.error.empty()) throw UsageError(st.error);
  if (rc != 0) throw UsageError("cannot parse the command line");
  if (st.help) throw HelpRequested(usage_text());
  if (st.version) throw HelpRequested("", true);
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
(exit 0) or has failed (exit 1; exit 2 for a bad option or path). See man clairfs for details.

'-' and '_' in option names are the same; sizes are bytes or take K, M, G, T or P (powers of 1024;
KB and KiB alike; 1.5G works).

)" + options_help();
}

}  // namespace clairfs
