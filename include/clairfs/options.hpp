// Mount options: what the user asked for, validated once at start-up.
//
// `parse_mount_command` turns `clairfs SOURCE MOUNTPOINT [-f] [-o OPTS]` into an Options value. The -o
// string is split and normalised here (`-` and `_` spell the same key; list values such as `ranks=0,2,5`
// may run across commas), then matched by libfuse's option parser against one template per option.
// Every bad input throws UsageError whose message is one line naming the culprit; main() prints it and
// exits 2 without mounting. Options that later parts of the engine consume are validated here already,
// so a job script fails at mount time, not hours into a run.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace clairfs {

// `text` on one line: control characters (a newline in a path or an option value) written as \n, \xHH.
std::string one_line(const std::string& text);

// A bad command line, option or path given by the user. what() is one line naming the culprit, even
// when the culprit itself holds a newline.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(one_line(what)) {}
};

// --help or --version: what() is the text to print on stdout (for --version, `version` is set and the
// caller prints the versions); exit 0.
class HelpRequested : public std::runtime_error {
 public:
  explicit HelpRequested(const std::string& text, bool version = false) : std::runtime_error(text), version(version) {}
  bool version;
};

// Seeds are Python ints; torch accepts [-2^63, 2^64) and the oracle adds the epoch, so 128 bits.
__extension__ typedef __int128 SeedInt;
__extension__ typedef unsigned __int128 SeedUint;

enum class Order { kTorch, kTorchRandom, kTorchGlobal, kSequential, kList, kClairfs };

const char* order_name(Order order);
// A seed as Python prints it.
std::string seed_text(SeedInt seed);

struct Options {
  std::string source;      // as given; absolute path in source_abs
  std::string source_abs;  // realpath of SOURCE
  std::string mountpoint;  // as given
  std::string mountpoint_abs;

  bool foreground = false;
  bool debug = false;

  // Training schedule (consumed by the oracle).
  SeedInt seed = 0;  // Python int semantics; torch accepts [-2^63, 2^64).
  bool seed_auto = false;  // seed=auto: learned from the job's first reads
  // seed=auto learns from the reads of these users only (learn_from=; empty: auto, the daemon's user
  // and the job's), or from anyone's (learn_from=any).
  std::vector<uid_t> learn_from;
  bool learn_from_any = false;
  uint64_t batch_size = 1;
  uint64_t world_size = 1;
  bool world_size_auto = false;  // world_size=auto: learned from the job's readers (planned as 1 until then)
  std::vector<uint64_t> ranks;  // training ranks this mount serves, sorted, unique
  bool ranks_given = false;
  uint64_t ranks_per_node = 0;  // 0: not given
  std::optional<uint64_t> epochs;  // empty: unbounded
  uint64_t start_epoch = 0;
  uint64_t start_batch = 0;  // the job resumes start_epoch at this batch (a mid-epoch checkpoint)
  bool start_batch_given = false;  // told where in start_epoch the job starts (start_batch=, 0 too)
  bool drop_last = false;
  bool loader_drop_last = false;
  uint64_t workers = 0;
  uint64_t prefetch_factor = 2;
  Order order = Order::kTorch;
  std::string order_file;
  std::vector<std::string> extensions;  // lower case, with leading '.'
  std::string root;                     // the data set's folder inside SOURCE ("" : SOURCE itself)
  std::string samples;                  // the job's sample list, in place of ImageFolder's ("": none)
  uint64_t torch_version = 2;           // which torch.randperm: 1 (torch 1.x) or 2 (torch 2.x)
  bool shared_generator = true;         // torch-random: DataLoader(generator=g) with the sampler's g
  bool persistent_workers = false;      // torch-random, torch-global: DataLoader(persistent_workers=True)
  uint64_t draws = 0;                   // torch-global: 32-bit outputs the script drew before its loader's
  std::string trace;                    // append "PID PATH" per open to this file

  // Caches (consumed by the engine).
  uint64_t ram = 0;  // bytes; 0: no staging (a plain mount)
  bool ram_given = false;
  uint64_t pagecache = 0;  // bytes of staged files pushed into the kernel ahead of readers
  bool pagecache_given = false;
  double peer_timeout = 5.0;  // seconds
  double idle = 1800;         // seconds without a read before RAM is given back; 0: never
  uint64_t io_depth = 32;     // the stager's requests in flight
  // How the engine learns where the readers are: from every open the kernel sends to the daemon
  // (progress_from_opens), or, with the kernel opening files itself (FUSE no-open mode: pushed files cost
  // no request), from a watch on the mount that sees every open and close (progress_watch; from reads
  // where the watch cannot start) or from reads alone. Default: watch when staging, opens with trace=
  // (which records opens) or without staging.
  bool progress_from_opens = false;
  bool progress_watch = false;
  bool progress_given = false;
  std::string nvme;
  uint64_t nvme_size = 0;  // bytes; 0: whatever the directory's file system has free
  std::string manifest;
  // A scan of more files than this brings the mount up once the names are listed; their attributes
  // are read after it (staging starts at once). 0: every scan.
  uint64_t stat_later = 0;

  // Logs and metrics.
  std::string log;                // syslog, stderr or an absolute path; "": syslog if there is one, else a file
  bool log_given = false;
  std::string log_level = "info";  // debug, info, warning or error
  std::string metrics_file;       // OpenMetrics text written here every few seconds (node_exporter's textfile)

  // Kernel caching of names and attributes. The data set is immutable during training, so long.
  double entry_timeout = 86400.0;
  double attr_timeout = 86400.0;

  // FUSE's own, passed to libfuse.
  bool allow_other = false;
  bool default_permissions = false;
  bool auto_unmount = false;
  bool nonempty = false;  // mount on a directory that has entries (they are hidden while mounted)
  std::string fsname;  // default: SOURCE
  std::vector<std::string> mount_flags;  // dev, nosuid, noatime, ...: handed to the kernel's mount
};

// The extensions torchvision's ImageFolder accepts (IMG_EXTENSIONS).
const std::vector<std::string>& default_extensions();

// Parses a size with an optional binary suffix: 4096, 64K, 1.5G, 2TiB, 512MB. Throws UsageError
// naming `what` on anything else.
uint64_t parse_size(const std::string& what, const std::string& text);

// Parses a rank list: "3", "0-3", "0,2,5", "0-3:8" (':' and ',' both separate). Sorted, unique.
std::vector<uint64_t> parse_rank_list(const std::string& what, const std::string& text);

// Parses an extension list: "jpg:png" or ".JPG,.png". Lower case, with leading '.'.
std::vector<std::string> parse_extensions(const std::string& text);

// Splits a -o string at unescaped commas and normalises keys; list-valued options absorb the bare
// tokens that follow them ("ranks=0,2,5" stays one option). Exposed for tests.
std::vector<std::string> split_option_string(const std::string& text);

// Parses the whole command line (argv[0] included). Does not touch the file system except to check
// that SOURCE, MOUNTPOINT and other named paths exist and have the right kind.
Options parse_mount_command(int argc, const char* const* argv);

// How far an open may stray from its rank's place in the plan, in samples: the batches a DataLoader
// keeps in flight (prefetch_factor × workers), twice, counting at least 8 workers (not every job says
// how many it runs), and a margin. The options' bounds keep it below 2^46.
uint64_t open_tolerance(const Options& o);

// The text `clairfs --help` prints.
std::string usage_text();

}  // namespace clairfs
