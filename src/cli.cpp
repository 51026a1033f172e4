// Start-up: parse, build the daemon's parts (daemon.cpp: the manifest, the engine), mount, serve. Start-up
// errors are exceptions caught here and printed as one line; nothing below this file prints usage errors
// itself.
//
// Without -f the command forks before doing any work. The child scans SOURCE, mounts, and only then
// tells the parent through a pipe; the parent confirms with a stat of the mount point and exits 0, or
// prints the child's one-line error and exits with its code. A job script can therefore run
// `clairfs SRC MNT -o ... && python train.py` with no sleep.
#include "cli.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
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
#include "commands.hpp"
#include "control/control.hpp"
#include "control/metrics.hpp"
#include "daemon.hpp"
#include "fuse/frontend.hpp"
#include "fuse/mount.hpp"
#include "fuse/open_watch.hpp"
#include "fuse/page_cache.hpp"
#include "peer/mpi.hpp"
#include "util/clock.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/memory.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"
#include "version.hpp"

namespace clairfs {

namespace {

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

// Step 5: mount, on every node or none (the job's mount helper waits for node 0's line), then serve until
// unmounted or signalled. Returns the exit code.
int mount_and_serve(const Options& o, MpiWorld* world, Daemon& d, StartupReport& report, const sigset_t& ending) {
  const Entry& root = d.manifest->entry(0);
  const ControlTree* control_files = nullptr;  // the tree below, once made
  auto counters = [&d, &control_files]() {
    nlohmann::json j = to_json(d.serving->stats());
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
      return xattr_beneath(d.source->root_fd(), d.manifest->components(id), "system.posix_acl_access", &acl) > 28;
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
  Frontend frontend(*d.manifest, *d.serving, control, d.source->root_fd(), frontend_config);
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
  // The attributes' fill ends first (stopped if still at it): its thread, below the others in priority,
  // may not have said it was done yet, and the daemon's last words are these.
  d.fill.reset();
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
