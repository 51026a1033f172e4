// Start-up: parse, build the manifest, mount, serve. Start-up errors are exceptions caught here and
// printed as one line; nothing below this file prints usage errors itself.
//
// Without -f the command forks before doing any work. The child scans SOURCE, mounts, and only then
// tells the parent through a pipe; the parent confirms with a stat of the mount point and exits 0, or
// prints the child's one-line error and exits with its code. A job script can therefore run
// `clairfs SRC MNT -o ... && python train.py` with no sleep.
#include "cli.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"
#include "commands.hpp"
#include "control/control.hpp"
#include "control/metrics.hpp"
#include "engine/clairvoyant.hpp"
#include "engine/learning.hpp"
#include "engine/owners.hpp"
#include "engine/source_reader.hpp"
#include "engine/trace.hpp"
#include "fuse/frontend.hpp"
#include "fuse/mount.hpp"
#include "fuse/open_watch.hpp"
#include "fuse/page_cache.hpp"
#include "oracle/schedule.hpp"
#include "peer/mpi.hpp"
#include "peer/peer_loop.hpp"
#include "tiers/nvme.hpp"
#include "util/clock.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/memory.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"
#include "version.hpp"

namespace clairfs {

namespace {

// Files compared with SOURCE when mounting from a manifest: enough to catch a stale manifest of another
// data set version, few enough to cost well under a second on a loaded parallel file system.
constexpr size_t kManifestSpotChecks = 64;
// How often metrics_file= is rewritten (node_exporter reads it on each scrape, commonly every 15-60 s).
constexpr auto kMetricsEvery = std::chrono::seconds(5);

// The child's side of the start-up pipe: one status byte ('0' live, or the exit code) and a message.
class StartupReport {
 public:
  explicit StartupReport(int fd) : fd_(fd) {}
  ~StartupReport() { close(); }
  bool detached() const { return fd_ >= 0; }

  int fail(int code, const std::string& raw) {
    const std::string message = one_line(raw);  // a path in it may hold a newline
    if (fd_ < 0) {
      log_error(message);
    } else {
      std::string out = std::to_string(code) + message;
      (void)!::write(fd_, out.data(), out.size());
      close();
    }
    return code;
  }

  // Returns false if nobody is waiting any more (the command was interrupted while we scanned): then the
  // mount must not outlive the command that asked for it. With `more`, the command goes on waiting until
  // done() (for the watch on the mount to start). REQUIRES: SIGPIPE ignored (libfuse does it).
  bool live(bool more = false) {
    if (fd_ < 0) return true;
    const bool heard = ::write(fd_, "0", 1) == 1;
    if (!more) close();
    return heard;
  }
  // The command returns now. Any thread, once live(true) has returned.
  void done() { close(); }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

// The parent's side: waits for the child's report, then confirms the mount answers.
int wait_for_daemon(int fd, pid_t child, const Options& o) {
  std::string report;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    report.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (report.empty()) {
    int status = 0;
    ::waitpid(child, &status, 0);
    std::fprintf(stderr, "clairfs: the daemon exited before the mount was live (%s)\n",
                 WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "no report");
    return kExitFailure;
  }
  if (report[0] != '0') {
    ::waitpid(child, nullptr, 0);
    std::fprintf(stderr, "clairfs: %s\n", report.substr(1).c_str());
    return report[0] - '0';
  }
  struct stat st {};
  if (::stat(o.mountpoint_abs.c_str(), &st) != 0) {
    std::fprintf(stderr, "clairfs: mounted, but '%s' does not answer: %s\n", o.mountpoint.c_str(), std::strerror(errno));
    return kExitFailure;
  }
  return 0;
}

// keep_stderr: log=stderr, the lines go where the command's stderr went.
void detach_from_terminal(bool keep_stderr) {
  int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    if (!keep_stderr) ::dup2(null, STDERR_FILENO);
    if (null > STDERR_FILENO) ::close(null);
  }
  (void)!::chdir("/");
  log_detached();
}

// The signals that end a mount. Every thread blocks them, from before any thread starts (MPI's, the
// stager's, the peers', the serving threads inherit the mask): the serving loop reads them (signalfd),
// one that came before it started included.
sigset_t ending_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM}) sigaddset(&set, s);
  return set;
}

// The ending signals and SIGHUP, which every thread blocks from the same points on: SIGHUP never ends a
// mount (a logrotate step sends it), it reopens the log (LogReopener reads it).
sigset_t held_signals() {
  sigset_t set = ending_signals();
  sigaddset(&set, SIGHUP);
  return set;
}

// A launcher that started several tasks whose MPI world is one: srun without a PMI plugin (Slurm's
// default MpiDefault=none), or an MPI library other than the one clairfs was built with. Each task would
// think it is the only node, read SOURCE alone and, on one host, mount on top of the others.
std::string singleton_message(const Launch& launch) {
  if (launch.slurm)
    return "srun started " + std::to_string(launch.tasks) + " tasks (" + launch.said_by +
           ") but MPI sees this one alone: srun gave MPI no PMI; launch the daemons with 'srun --mpi=pmi2' "
           "(srun --mpi=list shows what this site offers)";
  return "the launcher started " + std::to_string(launch.tasks) + " tasks (" + launch.said_by +
         ") but MPI sees this one alone: start clairfs with the mpiexec of the MPICH it was built with";
}

// The files' attributes, read in the background after a scan that left them for later (one node, no
// manifest=): the mount is up once the names are listed, as `find` lists them.
class BackgroundFill {
 public:
  explicit BackgroundFill(const Manifest& m) : thread_([this, &m] { run(m); }) {}
  ~BackgroundFill() {
    stop_ = true;
    thread_.join();
  }
  BackgroundFill(const BackgroundFill&) = delete;
  BackgroundFill& operator=(const BackgroundFill&) = delete;

 private:
  void run(const Manifest& m) {
    // Below the threads that serve reads; the fill's own threads inherit it.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t files = m.attributes_pending();
    m.fill_attributes(stop_);
    if (stop_) return;
    log_info("read the attributes of " + std::to_string(files) + " files in " +
             std::to_string(seconds_since(t0)).substr(0, 5) + " s");
    if (const uint64_t gone = m.gone_at_fill())
      log_warning(std::to_string(gone) + " files listed at mount were gone from SOURCE (or replaced) when their "
                  "attributes were read; reads of them fail (EIO)");
  }

  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once stop_ is set up
};

// What a running mount is made of, in the order it is built; it goes in the reverse order, after the
// peer layer has completed every fetch while the engine still exists.
struct Daemon {
  std::optional<Manifest> manifest;
  std::optional<SourceReader> reader;
  std::optional<BackgroundFill> fill;  // after a scan that left files' attributes for later
  std::optional<Oracle> oracle;
  FusePageCache page_cache;       // before the engine that pushes into it
  std::optional<WirePeers> peers;  // before the engine: the engine calls it
  std::optional<ClairvoyantEngine> staged;
  std::optional<LearningEngine> learning;  // seed=auto: builds the engine once it knows the seed
  std::optional<TraceEngine> trace;
  Engine* serving = nullptr;  // what the front-end calls: the engine, or SOURCE directly; maybe traced

  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() {
    if (peers) peers->stop();
  }
};

// Two daemons on one host with one mount point would mount on top of each other (srun -n 2 on one node,
// mpiexec without -ppn 1): every node sees the same list, so every node refuses alike. Returns the
// message this node logs ("" when it has none to log), or nullopt when every mount point is its own.
std::optional<std::string> shared_mountpoint(const Options& o, MpiWorld& world) {
  const std::string host = host_name();
  const uint64_t mine = std::hash<std::string>{}(host + '\0' + o.mountpoint_abs);
  const auto all = world.allgather({mine});
  for (int a = 0; a < world.size(); ++a)
    for (int b = a + 1; b < world.size(); ++b)
      if (all[static_cast<size_t>(a)] == all[static_cast<size_t>(b)])
        return world.rank() != a ? std::string()
                                 : "nodes " + std::to_string(a) + " and " + std::to_string(b) + " would both mount " +
                                       o.mountpoint_abs + " on " + host +
                                       ": start one daemon per node (srun -N NODES -n NODES, mpiexec -ppn 1)";
  return std::nullopt;
}

// Under a launcher, ranks_per_node= means this node's ranks, not node 0's. Returns why this node cannot
// serve ("" when it can): a node with nothing to serve would stage nothing and divide by its rank count;
// it is refused on every node at once rather than leaving the others waiting for it.
std::string ranks_of_this_node(Options& o, const MpiWorld& world) {
  if (o.ranks_per_node == 0 || o.ranks_given) return "";
  const uint64_t first = static_cast<uint64_t>(world.rank()) * o.ranks_per_node;
  o.ranks.clear();
  for (uint64_t r = first; r < first + o.ranks_per_node; ++r)
    if (r < o.world_size) o.ranks.push_back(r);
  if (!o.ranks.empty()) return "";
  return "node " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
         " has no training rank: ranks_per_node=" + std::to_string(o.ranks_per_node) + " puts ranks " +
         std::to_string(first) + "-" + std::to_string(first + o.ranks_per_node - 1) + " on it, past world_size=" +
         std::to_string(o.world_size) + "; start one daemon per node that runs training ranks";
}

// Whether /etc/fuse.conf (fusermount3's, fixed when it is built) has the line `user_allow_other`, without
// which fusermount3 refuses allow_other to users other than root.
bool fuse_conf_allows_other() {
  std::ifstream conf("/etc/fuse.conf");
  std::string line;
  while (std::getline(conf, line)) {
    line = line.substr(0, line.find('#'));
    const size_t from = line.find_first_not_of(" \t");
    if (from != std::string::npos && line.compare(from, 16, "user_allow_other") == 0 &&
        line.find_first_not_of(" \t", from + 16) == std::string::npos)
      return true;
  }
  return false;
}

// Where the daemon's lines will go (log=, log_level=); "" or why it cannot log there (said here).
std::string settle_logging(const Options& o) {
  set_log_level(o.log_level == "debug"     ? LogLevel::kDebug
                : o.log_level == "warning" ? LogLevel::kWarning
                : o.log_level == "error"   ? LogLevel::kError
                                           : LogLevel::kInfo);  // notices and errors go at every level
  if (o.foreground && !o.log_given) return "";  // stderr throughout
  std::string why = set_log_target(o.log, o.mountpoint_abs);
  if (!why.empty()) log_error(why);
  return why;
}

// Step 1: the options, agreed by every node. Returns the exit code when the command ends here (help, a
// bad option on any node, two nodes on one mount point), nullopt to go on.
std::optional<int> settle_options(int argc, char** argv, MpiWorld* world, Options& o) {
  std::string bad;
  try {
    o = parse_mount_command(argc, argv);
  } catch (const HelpRequested& h) {
    std::fputs(h.version ? version_text().c_str() : h.what(), stdout);
    if (!world) return 0;
    bad = "help";
  } catch (const UsageError& e) {
    bad = e.what();
    log_error(bad);
  }
  if (bad.empty() && o.allow_other && ::geteuid() != 0 && !fuse_conf_allows_other()) {
    bad =
        "allow_other: /etc/fuse.conf has no line 'user_allow_other', without which only root may let other "
        "users read a mount (an administrator adds it)";
    log_error(bad);
  }
  if (bad.empty() && world) {
    o.foreground = true;
    // A launcher that dies takes its daemons with it (hydra's proxies kill what they run; one packet of
    // garbage to mpiexec's control port ends it): fusermount3, in a session of its own, then unmounts
    // each node's mount rather than leaving it dead.
    o.auto_unmount = true;
    bad = ranks_of_this_node(o, *world);
    if (!bad.empty()) log_error(bad);
  }
  if (bad.empty()) bad = settle_logging(o);
  if (!world) return bad.empty() ? std::nullopt : std::optional<int>(kExitUsage);
  if (!world->all(bad.empty())) {
    if (bad.empty()) log_error("another node's options are wrong (see its message)");
    return bad == "help" ? 0 : kExitUsage;
  }
  if (world->size() > 1 && (o.seed_auto || o.world_size_auto)) {
    if (world->rank() == 0)
      log_error(std::string(o.seed_auto ? "seed" : "world_size") + "=auto learns on one node; with " +
                std::to_string(world->size()) + " nodes give " + (o.seed_auto ? "seed=" : "world_size="));
    return kExitUsage;
  }
  if (world->size() > 1)
    if (const auto shared = shared_mountpoint(o, *world)) {
      if (!shared->empty()) log_error(*shared);
      return kExitUsage;
    }
  return std::nullopt;
}

// Step 2: without -f, fork. The parent waits for the child's report and returns the command's exit code;
// the child goes on (nullopt) with `report_fd` set to its end of the pipe.
std::optional<int> fork_daemon(const Options& o, int& report_fd) {
  report_fd = -1;
  if (o.foreground) return std::nullopt;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "clairfs: cannot create a pipe: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "clairfs: cannot fork: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  if (pid > 0) {
    ::close(fds[1]);
    return wait_for_daemon(fds[0], pid, o);
  }
  ::close(fds[0]);
  ::setsid();
  report_fd = fds[1];
  return std::nullopt;
}

// The users seed=auto learns from (empty: anyone): learn_from= as given, or the daemon's user and the
// job's where the launch says who that is.
std::vector<uid_t> learn_from(const Options& o) {
  if (o.learn_from_any) return {};
  if (!o.learn_from.empty()) return o.learn_from;
  std::vector<uid_t> uids{::getuid()};
  for (const char* name : {"SLURM_JOB_UID", "SUDO_UID"}) {
    const char* v = std::getenv(name);
    char* end = nullptr;
    const unsigned long id = v ? std::strtoul(v, &end, 10) : 0;
    if (v && *v && *end == '\0' && id < 0xffffffffUL) uids.push_back(static_cast<uid_t>(id));
  }
  return uids;
}

// samples=FILE read into the manifest. Run as root, no symlink on the way is followed (a user who can write
// a folder of the path could send root's read elsewhere); a FIFO in its place is refused, not waited on.
void use_sample_list(const Options& o, Manifest& manifest) {
  int fd = ::geteuid() == 0 ? open_resolved(AT_FDCWD, o.samples.c_str(), O_RDONLY | O_NONBLOCK, RESOLVE_NO_SYMLINKS)
                            : ::open(o.samples.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (::geteuid() != 0 && fd < 0) fd = -errno;
  if (fd < 0) throw std::runtime_error("samples '" + o.samples + "': " + why_not_written(fd));
  UniqueFd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || make_blocking(fd) < 0)
    throw std::runtime_error("samples '" + o.samples + "' is not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(::fdopen(owned.release(), "r"), &std::fclose);
  if (!in) throw std::runtime_error("samples '" + o.samples + "': " + std::strerror(errno));
  std::vector<std::string> roots = {o.mountpoint_abs, o.source_abs};
  for (const std::string* given : {&o.mountpoint, &o.source})
    if (!given->empty() && given->front() == '/' && *given != o.mountpoint_abs && *given != o.source_abs)
      roots.push_back(*given);  // as the job may name it, through a symlink the real path resolves
  manifest.use_samples(in.get(), o.samples, roots);
  log_info("samples: " + std::to_string(manifest.samples().size()) + " files, in the order samples='" + o.samples +
           "' lists them");
}

// Step 3: the index of SOURCE, its reader and the oracle. Node 0 alone reads SOURCE's metadata; the others
// get the index from it. Returns why this node cannot go on ("" when it can).
std::string load_index(const Options& o, MpiWorld* world, Daemon& d) {
  std::string failure;
  try {
    if (!world || world->rank() == 0) {
      try {
        // On one node, files' attributes are read after the mount is up (the index sent to other
        // nodes carries them, so a scan for several reads them first).
        const bool later = !world || world->size() == 1;
        d.manifest = o.manifest.empty() ? Manifest::scan(o.source_abs, o.extensions, 0,
                                                         later ? Manifest::Attributes::kLater : Manifest::Attributes::kNow)
                                        : Manifest::load(o.manifest, o.extensions, o.source_abs);
        for (const auto& w : d.manifest->warnings()) log_warning(w);
        d.reader.emplace(*d.manifest, o.source_abs);
        if (!o.manifest.empty())
          if (std::string why = d.reader->spot_check(kManifestSpotChecks); !why.empty())
            failure = "manifest '" + o.manifest + "' does not match SOURCE: " + why + "; write it again with 'clairfs index'";
      } catch (const std::exception& e) {
        failure = *e.what() ? e.what() : "cannot make the index";  // never empty: empty says "no failure"
      }
      // The failure (empty: none), then the index in pieces, written as it is sent and read as it
      // arrives: at 14.2 M entries it is 1.1 GB, which no node holds whole beside the manifest.
      if (world) {
        (void)world->broadcast(failure, 0);
        if (failure.empty() && world->size() > 1)
          world->send_pieces(d.manifest->serialized_size(), [&](const MpiWorld::Write& write) { d.manifest->serialize_to(write); });
      }
    } else {
      if (std::string failed = world->broadcast("", 0); !failed.empty()) return "node 0: " + failed;
      world->receive_pieces(0, [&](uint64_t size, const MpiWorld::Read& read) {
        d.manifest = Manifest::read_from(read, size, o.extensions, o.source_abs);
      });
      d.reader.emplace(*d.manifest, o.source_abs);
    }
    // The data set's folder (every node, on the same tree: samples are made where the index is).
    if (failure.empty() && (!o.root.empty() || !o.samples.empty())) {
      try {
        if (!o.root.empty())
          d.manifest->use_root(o.root, o.extensions);
        else
          use_sample_list(o, *d.manifest);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    if (failure.empty()) d.oracle.emplace(d.manifest->samples().size(), schedule_from_options(o, *d.manifest));
    // Few enough files: their attributes now, before the mount (as a scan of them all would).
    if (failure.empty() && d.manifest->attributes_pending() != 0) {
      if (d.manifest->attributes_pending() <= o.stat_later) {
        const std::atomic<bool> never_stopped{false};
        d.manifest->fill_attributes(never_stopped);
        if (const uint64_t gone = d.manifest->gone_at_fill())
          log_warning(std::to_string(gone) + " files listed were gone from SOURCE (or replaced) when stat-ed; "
                      "reads of them fail (EIO)");
      } else {
        // (The default at every size: said in a debug line; a line above that for each mount is noise.)
        log_debug("mounting once SOURCE's names are listed (" + std::to_string(d.manifest->attributes_pending()) +
                  " files, stat_later=" + std::to_string(o.stat_later) +
                  "); their attributes are read after, those of the files staged first first");
        d.fill.emplace(*d.manifest);
      }
    }
  } catch (const std::exception& e) {
    if (failure.empty()) failure = e.what();
  }
  return failure;
}

// The engine's configuration from the options (without the peers).
EngineConfig engine_config(const Options& o, FusePageCache& page_cache) {
  EngineConfig c;
  c.ram = o.ram;
  c.ranks = o.ranks;
  c.start_epoch = o.start_epoch;
  c.start_item = o.start_batch * o.batch_size;
  // Not told where in its epoch the job starts, the mount stages only each rank's first batch per worker
  // before the job opens anything: a job resumed mid-epoch skips what it did, and its first open says
  // where it is. (Not with world_size=auto: its first plan stands in for whatever world the job shows,
  // staged as far as RAM allows — a node alone reads every file whatever its ranks.)
  c.start_window = o.start_batch_given || o.world_size_auto ? 0 : std::max<uint64_t>(o.workers, 1) * o.batch_size;
  c.epochs = o.epochs;
  c.depth = static_cast<unsigned>(o.io_depth);
  c.tolerance = open_tolerance(o);
  c.horizon = plan_horizon(o.world_size, o.ranks.size());
  c.loader_window = o.prefetch_factor * std::max<uint64_t>(o.workers, 1) * o.batch_size;
  c.nvme = o.nvme;
  c.nvme_size = o.nvme_size;
  c.pagecache = o.pagecache;
  c.page_cache = &page_cache;
  c.no_open = !o.progress_from_opens;
  c.idle = std::chrono::milliseconds(static_cast<int64_t>(o.idle * 1000));
  return c;
}

// nvme= as the engine will use it: a directory it can make its cache folder in (NvmeError if not).
void check_nvme_dir(const std::string& dir) {
  std::string probe = dir + "/.clairfs-probe.XXXXXX";
  if (!::mkdtemp(probe.data()))
    throw NvmeError("nvme='" + dir + "': cannot create a cache directory there: " + std::strerror(errno));
  ::rmdir(probe.c_str());
}

// An NVMe budget above what the disk has free: said once (admission stops when the disk fills).
void warn_of_nvme_beyond_the_disk(const Options& o) {
  struct statvfs fs {};
  if (o.nvme.empty() || o.nvme_size == 0 || ::statvfs(o.nvme.c_str(), &fs) != 0) return;
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (o.nvme_size > free)
    log_warning("nvme_size=" + human_bytes(static_cast<double>(o.nvme_size)) + " is more than '" + o.nvme + "' has free (" +
                human_bytes(static_cast<double>(free)) + "): the NVMe tier stops taking files when the disk fills");
}

// The bytes of files this node's RAM and NVMe hold for the others (keeper_room); 0 when not known here:
// staging off, or the files' sizes still being read.
uint64_t keeper_room_of(const Options& o, const Manifest& manifest) {
  if (o.ram == 0 || manifest.attributes_pending() != 0) return 0;
  if (o.nvme.empty()) return keeper_room(manifest, o.ram, 0);
  struct statvfs fs {};
  const NvmeSpace nvme = nvme_space(::statvfs(o.nvme.c_str(), &fs) == 0 ? &fs : nullptr, o.nvme_size);
  return keeper_room(manifest, o.ram, nvme.capacity, nvme.block);
}

// SOURCE mounted by clairfs elsewhere on this node too: each mount stages it for itself (RAM twice, SOURCE
// read twice), where one mount serves every job that reads it. Not under a launcher of several daemons
// (on one host they play several nodes).
void warn_of_another_mount(const Options& o, const MpiWorld* world) {
  if (world && world->size() > 1) return;
  for (const std::string& other : clairfs_mounts_of(o.fsname)) {
    if (other == o.mountpoint_abs) continue;
    log_warning(o.fsname + " is mounted by clairfs at " + other + " too: each mount stages it for itself (its RAM " +
                "and SOURCE's reads twice); one mount serves every job on the node that reads it");
    return;
  }
}

// Step 4: the peers (under a launcher with several nodes), the engine (staging on) and the trace.
// Throws NvmeError for a bad nvme= (the mount stops); any other engine failure leaves staging off.
void start_engine(const Options& o, MpiWorld* world, Daemon& d) {
  // Which files the kernel has inodes for, sized before any stager can ask (it is not resized after).
  d.page_cache.track(d.manifest->size());
  Keepers keepers;
  if (world && world->size() > 1) {
    // Each file past its first reader's room goes to a node with room left (every node's room known to
    // all; none if one is not known).
    std::vector<uint64_t> room;
    for (const auto& r : world->allgather({keeper_room_of(o, *d.manifest)})) room.push_back(r.empty() ? 0 : r[0]);
    if (std::find(room.begin(), room.end(), 0) != room.end()) room.clear();
    keepers = plan_owners(*d.manifest, *d.oracle, o.start_epoch, world->allgather(o.ranks), world->size(), room);
    PeersConfig pc;
    pc.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout * 1000));
    d.peers.emplace(world->peer_wire(), *d.manifest, pc, [world](bool failed) {
      if (failed) world->mark_unclean();  // the end must not wait on a peer that broke
    });
  }
  if (world)
    log_info("node " + std::to_string(world->rank()) + " of " + std::to_string(world->size()) + ", serving " +
             std::to_string(o.ranks.size()) + " training rank(s)");
  warn_of_nvme_beyond_the_disk(o);
  // The engine starts once the files' attributes are read (a scan that left them for later); the
  // options it would refuse are checked now, so that the mount does.
  const bool later = d.manifest->attributes_pending() != 0 && o.ram > 0;
  if (later && !o.nvme.empty()) check_nvme_dir(o.nvme);
  // Alone on its node with DistributedSampler's order, the mount plans again when the job reads as
  // another world size (with peers, every node's plan would have to change at once).
  // (Not with batches of one and several workers: each worker's opens lie workers × W apart, and a job
  // with another workers= than the mount's would read as another world size.)
  const Schedule& s = d.oracle->schedule();
  const Replanning replanning{!d.peers && o.ram > 0 && s.order == Order::kTorch && (s.batch_size > 1 || s.workers <= 1),
                              o.world_size_auto || o.ranks.size() == o.world_size, o.world_size_auto};
  if (o.seed_auto || later || replanning.on) {
    LearnQuestion q{o.world_size,
                    o.ranks,
                    o.start_epoch,
                    engine_config(o, d.page_cache).tolerance,
                    d.oracle->schedule().torch_shuffle,
                    o.order == Order::kTorch,
                    true};
    try {
      d.learning.emplace(*d.manifest, *d.reader, d.oracle->schedule(), std::move(q), engine_config(o, d.page_cache),
                         o.seed_auto ? nullptr : &*d.oracle, o.seed_auto ? learn_from(o) : std::vector<uid_t>{},
                         replanning);
    } catch (const NvmeError&) {
      throw;
    } catch (const std::runtime_error& e) {
      log_warning(std::string(e.what()) + "; staging is off, every read goes to SOURCE");
    }
  } else if (o.ram > 0) {
    try {
      EngineConfig c = engine_config(o, d.page_cache);
      if (d.peers) {
        c.peers = &*d.peers;
        for (EntryId id : keepers.handed)
          if (static_cast<int>(keepers.owner[id]) == world->rank()) c.handed.push_back(id);
        if (!c.handed.empty())
          log_info("keeping " + std::to_string(c.handed.size()) + " files for the other nodes that another node " +
                   "reads first (it has no room left for them): read from SOURCE at the start");
        c.owner = std::move(keepers.owner);
        c.peer_wait = std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout * 1000) + 2000);
      }
      d.staged.emplace(*d.manifest, *d.oracle, *d.reader, std::move(c));
    } catch (const NvmeError&) {
      throw;
    } catch (const std::runtime_error& e) {
      log_warning(std::string(e.what()) + "; staging is off, every read goes to SOURCE");
    }
  }
  if (d.peers)
    d.peers->start(d.staged ? d.staged->peer_lookup() : PeerTransport::Lookup([](EntryId) { return PeerBytes(); }));
  d.serving = d.staged ? static_cast<Engine*>(&*d.staged) : d.learning ? static_cast<Engine*>(&*d.learning) : &*d.reader;
  if (!o.trace.empty()) d.serving = &d.trace.emplace(*d.serving, *d.manifest, o.trace);
  if (d.manifest->lookup(0, ControlTree::kName) != kNoEntry)
    log_warning(std::string("SOURCE has its own '") + ControlTree::kName + "'; the mount shows clairfs's in its place");
}

// Step 5: mount, on every node or none (the job's mount helper waits for node 0's line), then serve until
// unmounted or signalled. Returns the exit code.
int mount_and_serve(const Options& o, MpiWorld* world, Daemon& d, StartupReport& report, const sigset_t& ending) {
  const Entry& root = d.manifest->entry(0);
  const ControlTree* control_files = nullptr;  // the tree below, once made
  auto counters = [&d, &control_files]() {
    nlohmann::json j = d.serving->stats();
    j["log"] = log_destination();
    j["attributes_pending"] = d.manifest->attributes_pending();  // files whose sizes are still to be read
    if (control_files)  // the live control files' renderings held (each reader's, until the kernel lets go)
      j["memory"]["control_renderings"] = {{"files", control_files->renderings()},
                                           {"bytes", control_files->rendering_bytes()}};
    return j;
  };
  auto stats = [counters]() { return counters().dump(2) + "\n"; };
  auto metrics = [counters, mountpoint = o.mountpoint_abs]() { return metrics_text(counters(), mountpoint); };
  ControlConfig cc{o.start_epoch, o.epochs, o.ranks, root.uid, root.gid, stats, metrics, {}, {}};
  if (d.learning && o.seed_auto) cc.learned = [&d]() { return d.learning->oracle(); };
  if (o.default_permissions) {
    // An access ACL longer than its three base entries (user, group, other: 4 + 3 × 8 bytes) names users
    // or groups. One getxattr a directory, once, at mount (a data set has a directory in hundreds of files).
    cc.extended_acl = [&d](EntryId id) {
      std::string acl;
      return xattr_beneath(d.reader->root_fd(), d.manifest->components(id), "system.posix_acl_access", &acl) > 28;
    };
  }
  ControlTree control(*d.manifest, *d.oracle, std::move(cc));
  control_files = &control;
  // Made after the tree, whose renderings its counters tell, and ended before it.
  std::optional<MetricsFile> metrics_file;
  if (!o.metrics_file.empty()) metrics_file.emplace(o.metrics_file, metrics, kMetricsEvery);
  // Pushes go only to files the kernel has inodes for (others would be refused, and tried again); with
  // staging, a listing makes them all, up to kListWithInodes entries (about 1 KiB of the kernel's memory
  // each, which the first epoch's lookups would take anyway; a larger tree is listed by names, as the
  // kernel chooses, and a file's inode comes with its reader's lookup).
  constexpr size_t kListWithInodes = size_t{1} << 20;
  const bool staging = d.staged || d.learning;
  const FrontendConfig frontend_config{o.entry_timeout,
                                       o.attr_timeout,
                                       staging && !o.progress_from_opens,
                                       o.default_permissions,
                                       staging && o.pagecache > 0 && d.manifest->size() <= kListWithInodes,
                                       [&pc = d.page_cache](EntryId id) { pc.introduce(id); }};
  Frontend frontend(*d.manifest, *d.serving, control, d.reader->root_fd(), frontend_config);
  // Declared before the session, which goes first: the watch's mark may wait for the session to answer.
  std::optional<OpenWatch> watch;
  std::optional<MountedSession> session;
  std::string failure;
  try {
    session.emplace(o, frontend, &d.page_cache);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (world) {
    if (!world->all(failure.empty())) {
      session.reset();
      return report.fail(kExitFailure, failure.empty() ? "another node could not mount; unmounted" : failure);
    }
    if (world->rank() == 0) log_notice("all " + std::to_string(world->size()) + " nodes mounted");  // the job helper waits for it
  }
  if (!failure.empty()) return report.fail(kExitFailure, failure);
  // In no-open mode every open and close is still seen, by a watch on the mount (fuse/open_watch.hpp): the
  // mount command returns once it has started (or could not), so that a job started then is seen whole.
  const bool watching = frontend_config.no_open && o.progress_watch;
  if (report.detached()) {
    if (!report.live(watching)) return kExitFailure;  // unmounts on the way out
    detach_from_terminal(o.log == "stderr");
  } else if (o.log_given) {
    log_detached();  // -f or a launcher, with log= given: its target from here on
  }
  log_serving();
  log_notice("mounted " + o.source_abs + " at " + o.mountpoint_abs + " (" + std::to_string(d.manifest->samples().size()) +
           " samples)");
  warn_of_another_mount(o, world);
  if (watching) watch.emplace(o.mountpoint_abs, *d.manifest, *d.serving, frontend, [&report] { report.done(); });
  const LogReopener reopener;  // SIGHUP, for log rotation; never an end
  const int rc = session->serve(ending, [&d] { d.serving->low_on_memory(); });
  log_notice(rc == 0 ? "the mount ended; the daemon exits" : "the mount ended in an error; the daemon exits with status 1");
  // The cleanup below (unmount, the cache folder, goodbyes to peers) is not cut short by a second signal:
  // it stays pending, and the process ends by itself.
  return rc == 0 ? 0 : kExitFailure;
}

// The steps, in order, for one node. Under a launcher a failing step stops every node: before the mount
// through a collective each node takes part in, after it where every node checks that all mounts are live.
int start_and_serve(int argc, char** argv, MpiWorld* world, const sigset_t& ending) {
  Options o;
  if (const auto rc = settle_options(argc, argv, world, o)) return *rc;
  raise_fd_limit();
  int report_fd = -1;
  if (const auto rc = fork_daemon(o, report_fd)) return *rc;
  StartupReport report(report_fd);
  const sigset_t held = held_signals();
  pthread_sigmask(SIG_BLOCK, &held, nullptr);  // the daemon (or -f) from here on; see ending_signals()

  const auto t0 = std::chrono::steady_clock::now();
  Daemon d;
  const std::string failure = load_index(o, world, d);
  if (world && !world->all(failure.empty()))
    return report.fail(kExitUsage, failure.empty() ? "another node could not start (see its message)" : failure);
  if (!failure.empty()) return report.fail(kExitUsage, failure);
  try {
    start_engine(o, world, d);
  } catch (const std::exception& e) {
    if (world) (void)world->all(false);
    return report.fail(kExitUsage, e.what());
  }
  if (o.foreground)
    log_info(std::string(o.manifest.empty() ? "scanned" : "loaded") + " " + std::to_string(d.manifest->size()) +
             " entries, " + std::to_string(d.manifest->samples().size()) + " samples " +
             (o.samples.empty() ? "in " + std::to_string(d.manifest->classes().size()) + " classes" : "listed") + " (" +
             std::to_string(seconds_since(t0)).substr(0, 5) + " s)");
  return mount_and_serve(o, world, d, report, ending);
}

// The launch: under a launcher (mpiexec, srun), MPI first, then the start-up steps on every node.
int run_mount(int argc, char** argv) {
  return_large_buffers();
  const sigset_t ending = ending_signals();
  // Under a launcher (mpiexec, srun): one daemon per node, in the foreground (no fork once MPI runs).
  // MPI starts before the options are checked, so a node with a bad option stops every node at once
  // rather than leaving them waiting for it.
  const Launch launch = detect_launch();
  std::optional<MpiWorld> world;
  if (launch.launched) {
    const sigset_t held = held_signals();
    pthread_sigmask(SIG_BLOCK, &held, nullptr);
    // UCX's cross-memory-attach transport (cma: process_vm_readv between processes on one host) ends
    // the process with a fatal error when the peer it copies from has died: one daemon SIGKILLed in the
    // middle of a transfer took another on its host with it (test_peers, about once in fifteen runs).
    // Daemons of one job share a host only in tests and small setups, where cma buys nothing; shared
    // memory and TCP outlive a dead peer (its requests time out, peer_timeout). A site's own UCX_TLS is
    // kept. Only the daemon: the daemons leave without MPI_Finalize (MpiWorld::leave), which the TCP
    // lanes UCX then opens on one host would deadlock in.
    ::setenv("UCX_TLS", "^cma", 0);
    try {
      world.emplace(ending);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "clairfs: %s\n", e.what());
      return kExitFailure;
    }
    set_log_origin("node " + std::to_string(world->rank()) + " on " + host_name());
    if (launch.tasks > 1 && world->size() == 1) {
      log_error(singleton_message(launch));
      world->leave(kExitUsage);
    }
  }
  // A daemon's last words are in its log, whatever ends it short of a signal that kills it outright.
  std::set_terminate([] {
    std::string why = "ended by an unexpected failure";
    if (const std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        why += ": " + std::string(x.what());
      } catch (...) {
      }
    }
    log_error(why);
    log_flush();
    std::abort();
  });
  int rc = kExitFailure;
  try {
    rc = start_and_serve(argc, argv, world ? &*world : nullptr, ending);
  } catch (const std::exception& e) {  // a start-up collective, stopped by a signal or a failed peer
    log_error(e.what());
  }
  log_flush();
  if (world) world->leave(rc);  // everything but MPI is gone by now
  return rc;
}

}  // namespace

int run_cli(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "index") == 0) return run_index(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "status") == 0) return run_status(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "cleanup") == 0) return run_cleanup(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], kUnmountKeeperCommand) == 0) return run_unmount_keeper(argc, argv);
  return run_mount(argc, argv);
}

}  // namespace clairfs
