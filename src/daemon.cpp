// The daemon's parts (daemon.hpp): the index of SOURCE and the engine, built from the options.
#include "daemon.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "control/control.hpp"
#include "engine/owners.hpp"
#include "oracle/schedule.hpp"
#include "tiers/nvme.hpp"
#include "util/clock.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

// Files compared with SOURCE when mounting from a manifest: enough to catch a stale manifest of another
// data set version, few enough to cost well under a second on a loaded parallel file system.
constexpr size_t kManifestSpotChecks = 64;

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
    log_warning("nvme_size=" + human_bytes(static_cast<double>(o.nvme_size)) + " is more than '" + o.nvme +
                "' has free (" + human_bytes(static_cast<double>(free)) +
                "): the NVMe tier stops taking files when the disk fills");
}

// The bytes of files this node's RAM and NVMe hold for the others (keeper_room); 0 when not known here:
// staging off, or the files' sizes still being read.
uint64_t keeper_room_of(const Options& o, const Manifest& manifest) {
  if (o.ram == 0 || manifest.attributes_pending() != 0) return 0;
  if (o.nvme.empty()) return keeper_room(manifest, o.ram, 0);
  struct statvfs fs {};
  const NvmeSpace nvme = nvme_space(::statvfs(o.nvme.c_str(), &fs) == 0 ? &fs : nullptr, o.nvme_size);
  return keeper_room(manifest, o.ram, nvme.capacity, nvme_packs(o.nvme) ? 1 : nvme.block);
}

}  // namespace

void BackgroundFill::run(const Manifest& m) {
  // Below the threads that serve reads; the fill's own threads inherit it.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t files = m.attributes_pending();
  m.fill_attributes(stop_);
  if (stop_) return;
  log_info("read the attributes of " + std::to_string(files) + " files in " +
           std::to_string(seconds_since(t0)).substr(0, 5) + " s");
  if (const uint64_t gone = m.gone_at_fill())
    log_warning(std::to_string(gone) +
                " files listed at mount were gone from SOURCE (or replaced by no regular file) when "
                "their attributes were read: a lookup of one finds no such file (ENOENT)");
}

std::string load_index(const Options& o, MpiWorld* world, Daemon& d) {
  std::string failure;
  try {
    if (!world || world->rank() == 0) {
      try {
        // On one node, files' attributes are read after the mount is up (the index sent to other
        // nodes carries them, so a scan for several reads them first).
        const bool later = !world || world->size() == 1;
        d.manifest = o.manifest.empty()
                         ? Manifest::scan(o.source_abs, o.extensions, 0,
                                          later ? Manifest::Attributes::kLater : Manifest::Attributes::kNow)
                         : Manifest::load(o.manifest, o.extensions, o.source_abs);
        for (const auto& w : d.manifest->warnings()) log_warning(w);
        d.source.emplace(*d.manifest, o.source_abs);
        if (!o.manifest.empty())
          if (std::string why = d.source->spot_check(kManifestSpotChecks); !why.empty())
            failure =
                "manifest '" + o.manifest + "' does not match SOURCE: " + why + "; write it again with 'clairfs index'";
      } catch (const std::exception& e) {
        failure = *e.what() ? e.what() : "cannot make the index";  // never empty: empty says "no failure"
      }
      // The failure (empty: none), then the index in pieces, written as it is sent and read as it
      // arrives: at 14.2 M entries it is 1.1 GB, which no node holds whole beside the manifest.
      if (world) {
        (void)world->broadcast(failure, 0);
        if (failure.empty() && world->size() > 1)
          world->send_pieces(d.manifest->serialized_size(),
                             [&](const MpiWorld::Write& write) { d.manifest->serialize_to(write); });
      }
    } else {
      if (std::string failed = world->broadcast("", 0); !failed.empty()) return "node 0: " + failed;
      world->receive_pieces(0, [&](uint64_t size, const MpiWorld::Read& read) {
        d.manifest = Manifest::read_from(read, size, o.extensions, o.source_abs);
      });
      d.source.emplace(*d.manifest, o.source_abs);
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
          log_warning(std::to_string(gone) +
                      " files listed were gone from SOURCE (or replaced by no regular file) when stat-ed: "
                      "a lookup of one finds no such file (ENOENT)");
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

void warn_of_another_mount(const Options& o, const MpiWorld* world) {
  if (world && world->size() > 1) return;
  for (const std::string& other : clairfs_mounts_of(o.fsname)) {
    if (other == o.mountpoint_abs) continue;
    log_warning(o.fsname + " is mounted by clairfs at " + other + " too: each mount stages it for itself (its RAM " +
                "and SOURCE's reads twice); one mount serves every job on the node that reads it");
    return;
  }
}

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
    // Links beside MPI that say at once when a peer's daemon is gone (peer/links.hpp); every node takes
    // part in the exchange of their cards, with one or without.
    try {
      d.links.emplace(world->rank(), world->size());
    } catch (const std::runtime_error& e) {
      log_warning(std::string(e.what()) + ": a dead peer is found by pings alone");
    }
    const auto cards = world->allgather(d.links ? d.links->card() : std::vector<uint64_t>{});
    if (d.links) d.links->start(cards);
    PeersConfig pc;
    pc.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout * 1000));
    d.peers.emplace(
        world->peer_wire(), *d.manifest, pc,
        [world](bool failed) {
          if (failed) world->mark_unclean();  // the end must not wait on a peer that broke
        },
        d.links ? &*d.links : nullptr);
  }
  if (world)
    log_info("node " + std::to_string(world->rank()) + " of " + std::to_string(world->size()) + ", serving " +
             std::to_string(o.ranks.size()) + " training rank(s)");
  warn_of_nvme_beyond_the_disk(o);
  // A daemon that died (SIGKILL, a node's OOM killer) leaves its cache folder behind: this mount removes
  // it, and says so — now, before the mount is up (the engine, which makes its own folder, may start
  // later: below).
  if (!o.nvme.empty())
    for (const std::string& line : remove_stale_caches(o.nvme)) log_warning(line);
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
      d.learning.emplace(*d.manifest, *d.source, d.oracle->schedule(), std::move(q), engine_config(o, d.page_cache),
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
        if (keepers.unkept != 0)
          log_warning(std::to_string(keepers.unkept) + " files (" +
                      human_bytes(static_cast<double>(keepers.unkept_bytes)) +
                      ") are past every node's room (ram= and nvme_size= together hold less than the data set): no "
                      "node keeps them, their readers read them from SOURCE in each epoch");
        c.unkept = keepers.unkept;
        c.owner = std::move(keepers.owner);
        c.peer_wait = std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout * 1000) + 2000);
      }
      d.staged.emplace(*d.manifest, *d.oracle, *d.source, std::move(c));
    } catch (const NvmeError&) {
      throw;
    } catch (const std::runtime_error& e) {
      log_warning(std::string(e.what()) + "; staging is off, every read goes to SOURCE");
    }
  }
  if (d.peers)
    d.peers->start(d.staged ? d.staged->peer_lookup() : PeerTransport::Lookup([](EntryId) { return PeerBytes(); }));
  d.serving = d.staged     ? static_cast<Engine*>(&*d.staged)
              : d.learning ? static_cast<Engine*>(&*d.learning)
                           : &d.direct.emplace(*d.source);
  if (!o.trace.empty()) d.serving = &d.trace.emplace(*d.serving, *d.manifest, o.trace);
  if (d.manifest->lookup(0, ControlTree::kName) != kNoEntry)
    log_warning(std::string("SOURCE has its own '") + ControlTree::kName + "'; the mount shows clairfs's in its place");
}

}  // namespace clairfs
