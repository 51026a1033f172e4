// The option table and what is made from it: --help's lines and docs/options.md's tables.
#include "options/table.hpp"

#include <cctype>
#include <filesystem>

#include "options/parse.hpp"

namespace clairfs {

namespace {

using S = OptionSection;

Order parse_order(const GivenOption& g) {
  const std::string& v = g.value;
  if (v == "torch") return Order::kTorch;
  if (v == "torch-random" || v == "torch_random") return Order::kTorchRandom;
  if (v == "torch-global" || v == "torch_global") return Order::kTorchGlobal;
  if (v == "sequential") return Order::kSequential;
  if (v == "list") return Order::kList;
  if (v == "clairfs") return Order::kClairfs;
  bad_value(g.key, v, "use torch, torch-random, torch-global, sequential, list or clairfs");
}

// Bounds on the schedule's numbers: far beyond any job (16.7 M ranks or samples in a batch, 1,024
// loader workers; kMaxNodeRanks on one node), and small enough that the engine's arithmetic on them
// (tolerances, plan keys: epochs × samples) cannot overflow 64 bits.
constexpr uint64_t kMaxCount = uint64_t{1} << 24;
constexpr uint64_t kMaxLoader = 1024;

uint64_t between(const GivenOption& g, uint64_t lo, uint64_t hi) {
  const uint64_t n = parse_u64(g.key, g.value);
  if (n < lo || n > hi) bad_value(g.key, g.value, "use " + std::to_string(lo) + " to " + std::to_string(hi));
  return n;
}

uint64_t at_least_one(const GivenOption& g) { return between(g, 1, kMaxCount); }

std::string path(const GivenOption& g) {
  if (g.value.empty()) bad_value(g.key, g.value, "empty path");
  return g.value;
}

bool flag(const GivenOption& g) { return !g.has_value || parse_bool(g.key, g.value); }

const std::vector<OptionSpec> kTable = {
    // The training schedule.
    {"seed", Takes::kValue, "N|auto", S::kSchedule, "0", false,
     "sampler seed (DistributedSampler seed / generator seed), or auto",
     "The sampler seed: `DistributedSampler(seed=N)`, or the seed of the generator given to `RandomSampler`. "
     "Any integer in torch's range [-2^63, 2^64). `auto` (with `order=torch`, on one node): the mount learns "
     "it from the job's first reads, trying the likely seeds (0-100 and the ones people type) at `start_epoch` "
     "and the three epochs after; until then, and for good if none fits the first 65,536 opens, reads go to "
     "SOURCE as on a plain mount. `.clairfs/stats` (`learned`) and `clairfs status` say what it found.",
     [](Options& o, const GivenOption& g) {
       o.seed_auto = g.value == "auto";
       if (!o.seed_auto) o.seed = parse_seed(g.key, g.value);
     }},
    {"learn_from", Takes::kValue, "auto|any|UID[:UID...]", S::kSchedule, "auto", false,
     "whose reads seed=auto learns from",
     "The users whose reads `seed=auto` learns the seed from; other users' reads never set it. `auto`: the "
     "user the daemon runs as, and the job's user where the launch names one (`SLURM_JOB_UID`, `SUDO_UID`); "
     "`any`: every user (anyone who can read the mount can then choose the seed it stages by); or user ids "
     "joined by `:`.",
     [](Options& o, const GivenOption& g) {
       o.learn_from.clear();
       o.learn_from_any = g.value == "any";
       if (g.value == "auto" || g.value == "any") return;
       for (size_t at = 0; at <= g.value.size();) {
         const size_t end = std::min(g.value.find(':', at), g.value.size());
         const std::string id = g.value.substr(at, end - at);
         if (id.empty() || id.size() > 10 || id.find_first_not_of("0123456789") != std::string::npos ||
             std::stoull(id) >= 0xffffffffull)
           bad_value(g.key, g.value, "give auto, any, or user ids joined by ':'");
         o.learn_from.push_back(static_cast<uid_t>(std::stoul(id)));
         at = end + 1;
       }
     }},
    {"batch_size", Takes::kValue, "N", S::kSchedule, "1", false, "DataLoader batch size per rank",
     "DataLoader batch size per rank (1 to 16,777,216).",
     [](Options& o, const GivenOption& g) { o.batch_size = at_least_one(g); }},
    {"world_size", Takes::kValue, "N|auto", S::kSchedule, "1", false, "training ranks in the job, or auto",
     "Training ranks in the whole job (1 to 16,777,216). `auto` (with `order=torch`, on one node that runs every "
     "rank, batches of two or more or a single worker): planned as 1 until the job's first batch shows how many ranks "
     "split the shuffle, then planned for "
     "that many, every rank served. Any mount alone on its node with `order=torch` plans again the same way when "
     "a restarted job reads with another world size; `clairfs status` and the log say so.",
     [](Options& o, const GivenOption& g) {
       o.world_size_auto = g.value == "auto";
       o.world_size = o.world_size_auto ? 1 : at_least_one(g);
     }},
    {"ranks", Takes::kValue, "LIST", S::kSchedule, "all, if world_size=1", true,
     "training ranks this mount serves: 3, 0-3, 0,2,5 or 0-3,8 (0 to 3, and 8)",
     "The training ranks this mount serves: `3`, `0-3`, `0,2,5`, `0-3,8` (ranks 0 to 3, and 8; `:` separates "
     "items too). Each must be below world_size; at most 4,096 on one node. "
     "With world_size > 1, give `ranks=` or `ranks_per_node=`.",
     [](Options& o, const GivenOption& g) {
       o.ranks = parse_rank_list(g.key, g.value);
       o.ranks_given = true;
     }},
    {"ranks_per_node", Takes::kValue, "N", S::kSchedule, "", false,
     "serve N consecutive ranks per node instead of ranks=",
     "Serve N consecutive ranks per node (1 to 4,096): node k serves ranks kN … kN+N-1. Without a launcher this daemon "
     "is "
     "node 0. Not together with `ranks=`.",
     [](Options& o, const GivenOption& g) { o.ranks_per_node = between(g, 1, kMaxNodeRanks); }},
    {"epochs", Takes::kValue, "N", S::kSchedule, "unbounded", false, "the job runs epochs start_epoch .. N-1",
     "The job runs epochs `start_epoch` … N-1 (as `for epoch in range(start_epoch, N)`); N up to 16,777,216.",
     [](Options& o, const GivenOption& g) { o.epochs = at_least_one(g); }},
    {"start_epoch", Takes::kValue, "N", S::kSchedule, "0", false, "first epoch (after a restart)",
     "The first epoch, e.g. after a restart from a checkpoint (below 16,777,216). Must be below `epochs`.",
     [](Options& o, const GivenOption& g) { o.start_epoch = between(g, 0, kMaxCount - 1); }},
    {"start_batch", Takes::kValue, "N", S::kSchedule, "0", false, "first batch of start_epoch (a mid-epoch resume)",
     "The job resumes `start_epoch` at its batch N, as a checkpoint taken mid-epoch is resumed by skipping the "
     "batches done (below 16,777,216): the plan starts there, and the batches skipped are neither staged nor "
     "waited for. Given (0 too), staging runs ahead before the job's first open as far as RAM allows; not given "
     "(and `world_size` not `auto`), one batch per worker of each rank is staged until the job's opens show where "
     "it starts.",
     [](Options& o, const GivenOption& g) {
       o.start_batch = between(g, 0, kMaxCount - 1);
       o.start_batch_given = true;
     }},
    {"drop_last", Takes::kMaybeBool, "BOOL", S::kSchedule, "off", false, "the sampler's drop_last",
     "The sampler's `drop_last`. BOOL is 1/0, true/false, yes/no, on/off.",
     [](Options& o, const GivenOption& g) { o.drop_last = flag(g); }},
    {"loader_drop_last", Takes::kMaybeBool, "BOOL", S::kSchedule, "off", false, "the DataLoader's drop_last",
     "The DataLoader's `drop_last` (drops the last short batch).",
     [](Options& o, const GivenOption& g) { o.loader_drop_last = flag(g); }},
    {"workers", Takes::kValue, "N", S::kSchedule, "0", false, "DataLoader num_workers",
     "DataLoader `num_workers` (0 to 1,024).",
     [](Options& o, const GivenOption& g) { o.workers = between(g, 0, kMaxLoader); }},
    {"prefetch_factor", Takes::kValue, "N", S::kSchedule, "2", false, "DataLoader prefetch_factor",
     "DataLoader `prefetch_factor` (1 to 1,024).",
     [](Options& o, const GivenOption& g) { o.prefetch_factor = between(g, 1, kMaxLoader); }},
    {"order", Takes::kValue, "NAME", S::kSchedule, "torch", false,
     "torch, torch-random, torch-global, sequential, list or clairfs",
     "`torch`: DistributedSampler with shuffle. `torch-random`: RandomSampler with a seeded generator. "
     "`torch-global`: RandomSampler without one (`DataLoader(shuffle=True)`), seeded by `torch.manual_seed(seed)`. "
     "`sequential`: no shuffle. `list`: the order in `order_file`. `clairfs`: clairfs's own portable shuffle, "
     "for loaders that take their order from the mount.",
     [](Options& o, const GivenOption& g) { o.order = parse_order(g); }},
    {"order_file", Takes::kValue, "FILE", S::kSchedule, "", false, "the order for order=list",
     "The order for `order=list`; required with it, refused without it. Format in [order.md](order.md).",
     [](Options& o, const GivenOption& g) { o.order_file = path(g); }},
    {"torch_version", Takes::kValue, "N", S::kSchedule, "2", false,
     "1 or 2: the torch.randperm the job's torch uses (differs from 214,748,364 samples)",
     "Which `torch.randperm` the job's torch runs: `1` (torch 1.x: the classic shuffle for every N) or `2` "
     "(torch 2.x: another shuffle from 214,748,364 samples up). Only matters for data sets that large.",
     [](Options& o, const GivenOption& g) {
       o.torch_version = parse_u64(g.key, g.value);
       if (o.torch_version != 1 && o.torch_version != 2)
         bad_value(g.key, g.value, "use 1 (torch 1.x) or 2 (torch 2.x)");
     }},
    {"shared_generator", Takes::kMaybeBool, "BOOL", S::kSchedule, "on", false,
     "torch-random: the DataLoader gets the sampler's generator too",
     "`order=torch-random`: the DataLoader has the sampler's generator too "
     "(`DataLoader(shuffle=True, generator=g)`), so it draws its base seed from it each epoch.",
     [](Options& o, const GivenOption& g) { o.shared_generator = flag(g); }},
    {"persistent_workers", Takes::kMaybeBool, "BOOL", S::kSchedule, "off", false,
     "torch-random, torch-global: DataLoader(persistent_workers=True)",
     "`order=torch-random` or `torch-global`: `DataLoader(persistent_workers=True)`, which draws that base seed "
     "only once.",
     [](Options& o, const GivenOption& g) { o.persistent_workers = flag(g); }},
    {"draws", Takes::kValue, "N", S::kSchedule, "0", false,
     "torch-global: 32-bit outputs the script drew from torch's generator before its first epoch",
     "`order=torch-global`: how many 32-bit outputs the script took from torch's global generator between "
     "`torch.manual_seed` and its first epoch's loader (`torch.rand(k)` and `torch.randint(0, 10, (k,))` take "
     "k). A model built on the CPU takes millions: give the loader a generator instead (docs/order.md).",
     [](Options& o, const GivenOption& g) { o.draws = parse_u64(g.key, g.value); }},
    {"extensions", Takes::kValue, "LIST", S::kSchedule, "ImageFolder's", true,
     "file extensions that are samples, ':'-separated",
     "Which files are samples, `:`-separated (`jpg:png` or `.JPG:.png`; commas work too). Matched "
     "case-insensitively at the end of the name. Default: `.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp`.",
     [](Options& o, const GivenOption& g) { o.extensions = parse_extensions(g.value); }},
    {"root", Takes::kValue, "DIR", S::kSchedule, "SOURCE itself", false,
     "the data set's folder inside SOURCE (ImageFolder(MOUNTPOINT/DIR))",
     "The data set's folder inside SOURCE, relative to it, when the job reads a part of the mount: "
     "`ImageFolder(MOUNTPOINT/train)` on a SOURCE that holds `train/` and `val/` is `root=train`. The samples "
     "(and so the order) are ImageFolder's of that folder; the mount still shows all of SOURCE.",
     [](Options& o, const GivenOption& g) {
       if (g.value.empty() || g.value[0] == '/')
         bad_value(g.key, g.value, "give a folder inside SOURCE, relative to it (train, not /data/train)");
       std::string clean;
       for (const std::filesystem::path& part : std::filesystem::path(g.value)) {
         if (part.empty() || part == ".") continue;
         if (part == "..") bad_value(g.key, g.value, "give a folder inside SOURCE, without '..'");
         clean += (clean.empty() ? "" : "/") + part.string();
       }
       o.root = clean;
     }},
    {"samples", Takes::kValue, "FILE", S::kSchedule, "ImageFolder's", false,
     "the job's sample list (JSON or a path a line), when its Dataset is no ImageFolder",
     "The job's samples in its Dataset's order, when that is not ImageFolder's walk of the mount (a sorted "
     "glob, ImageFolder with `is_valid_file`, a list of its own): a JSON list of paths or of [path, label] "
     "pairs (`json.dump(ds.samples, f)`), or one path a line; each absolute under the mount point or SOURCE, "
     "or relative to the mount's root. The shuffle is the job's sampler's, over these samples. Not with "
     "`root=`. See [order.md](order.md#the-jobs-own-sample-list-samplesfile).",
     [](Options& o, const GivenOption& g) { o.samples = path(g); }},

    // Caches.
    {"ram", Takes::kValue, "SIZE", S::kCaches, "1/4 of memory", false,
     "RAM budget for staged files (a hard limit); 0: no staging",
     "The RAM budget for staged files, a hard limit. The engine stages each rank's upcoming files ahead of the "
     "readers and keeps what is needed again soonest (see [engine.md](engine.md)). `ram=0` turns staging off: "
     "a plain mount where every read goes to SOURCE.",
     [](Options& o, const GivenOption& g) {
       o.ram = parse_size(g.key, g.value);
       o.ram_given = true;
     }},
    {"pagecache", Takes::kValue, "SIZE", S::kCaches, "1/4 of ram, at most 1G", false,
     "staged files pushed into the kernel's page cache ahead of the readers, at most; 0: no pushes",
     "How much of what is staged just ahead of the readers is also pushed into the kernel's page cache, so "
     "those reads never reach the daemon. Pushed pages not yet read are copies of RAM-tier files (memory use up "
     "to `ram` + `pagecache`); once read they are the kernel's, kept or reclaimed as any file's pages (with "
     "`progress=reads`, dropped before a file's next read if that read is a beacon). `0`: no pushes. Cannot "
     "exceed `ram`.",
     [](Options& o, const GivenOption& g) {
       o.pagecache = parse_size(g.key, g.value);
       o.pagecache_given = true;
     }},
    {"nvme", Takes::kValue, "DIR", S::kCaches, "", false,
     "local directory for the NVMe tier (clairfs makes and removes its own folder in it)",
     "The NVMe tier: a local directory (must exist and be writable) where files read from SOURCE are kept, "
     "with a checksum each, for later epochs. clairfs makes its own folder in DIR "
     "(`clairfs-cache.HOST.PID.XXXXXX`), touches nothing else there, and removes its folder when the mount "
     "ends. A full disk stops admission and nothing else. Needs staging on.",
     [](Options& o, const GivenOption& g) { o.nvme = path(g); }},
    {"nvme_size", Takes::kValue, "SIZE", S::kCaches, "90% of DIR's free space", false,
     "NVMe tier budget; needs nvme=", "Hard limit on the NVMe tier, above 0; needs `nvme=`.",
     [](Options& o, const GivenOption& g) {
       // (0 inside means the default: written by hand it is most likely meant as no tier, and would give the disk)
       o.nvme_size = parse_size(g.key, g.value);
       if (o.nvme_size == 0) bad_value(g.key, g.value, "no room; leave out nvme= for no NVMe tier, nvme_size= for the default");
     }},
    {"progress", Takes::kValue, "watch|reads|opens", S::kCaches, "watch (opens without staging or with trace=)", false,
     "how the engine follows the readers: watch (the kernel opens files without asking, so pushed files cost "
     "no request, and a watch on the mount sees every open), reads (the same without the watch: from reads) "
     "or opens (every open goes to the daemon)",
     "How the engine follows the readers. `watch`: the kernel opens files without asking the daemon (FUSE "
     "no-open mode), so files pushed into the page cache are read with no request at all, at page-cache "
     "speed, and a fanotify watch on the mount's directories tells the engine of every open and close (with "
     "the reader's process when the daemon runs as root); where the watch cannot start (Linux before 6.8, "
     "more directories than `fs.fanotify.max_user_marks` lets a user mark) the log says why and the engine "
     "follows reads. `reads`: no-open mode without the watch; the engine learns where readers are from reads "
     "of files it left unpushed on purpose (see [engine.md](engine.md)). `opens`: every open and close goes "
     "to the daemon (a round trip each). Staging must be on for `watch` and `reads`; `trace=` needs `opens` "
     "(and implies it).",
     [](Options& o, const GivenOption& g) {
       if (g.value != "watch" && g.value != "reads" && g.value != "opens")
         bad_value(g.key, g.value, "use reads, watch or opens");
       o.progress_from_opens = g.value == "opens";
       o.progress_watch = g.value == "watch";
       o.progress_given = true;
     }},
    {"io_depth", Takes::kValue, "N", S::kCaches, "32", false, "opens, reads and writes the stager keeps in flight",
     "Opens, reads and writes the stager keeps in flight through io_uring (1–4096). More helps a file system "
     "with high latency per request; each costs a kernel worker while it waits.",
     [](Options& o, const GivenOption& g) {
       o.io_depth = parse_u64(g.key, g.value);
       if (o.io_depth < 1 || o.io_depth > 4096) bad_value(g.key, g.value, "use 1 to 4096");
     }},
    {"idle", Takes::kValue, "SECS", S::kCaches, "1800", false,
     "after this long without a read, give RAM and pushed pages back (0: never)",
     "After this long without a read (an open, a read reaching the daemon, a peer's request), the files held "
     "in RAM and the pages pushed into the kernel are given back, said in the log and in `clairfs status`; "
     "the next read starts staging again, from where the readers are. For a forgotten mount, which would "
     "otherwise hold its `ram=` for good. Half an hour by default: a job's validation pass or checkpoint "
     "pauses its reads for minutes, and what is given back is read from SOURCE again. `0`: never.",
     [](Options& o, const GivenOption& g) {
       o.idle = parse_seconds(g.key, g.value);
       if (o.idle > 0 && o.idle < 1) bad_value(g.key, g.value, "give 0 (never) or 1 second or more");
     }},
    {"peer_timeout", Takes::kValue, "SECS", S::kCaches, "5", false,
     "under mpiexec/srun: a peer that has not answered in this long is not asked again",
     "Under `mpiexec` or `srun` (one daemon per node, see [peers.md](peers.md)): a peer that has not answered "
     "a request in this long is asked nothing more; its files come from SOURCE.",
     [](Options& o, const GivenOption& g) {
       o.peer_timeout = parse_seconds(g.key, g.value);
       if (o.peer_timeout <= 0) bad_value(g.key, g.value, "must be above 0");
     }},
    {"manifest", Takes::kValue, "FILE", S::kCaches, "", false,
     "mount from an index written by 'clairfs index' instead of scanning SOURCE",
     "Mount from an index written by `clairfs index` instead of scanning SOURCE. See "
     "[manifest.md](manifest.md).",
     [](Options& o, const GivenOption& g) { o.manifest = path(g); }},
    {"stat_later", Takes::kValue, "FILES", S::kCaches, "0", false,
     "mount once SOURCE's names are listed, with more files than this; read sizes after",
     "Scanning SOURCE (on one node, without `manifest=`): with more files than this, the mount comes up "
     "once the names are listed, as `find` lists them, and the files' sizes, times and modes are read in "
     "the background after it, those of the files the job reads first first (a file is stat-ed at once "
     "if asked for first); staging starts at once. With this many files or fewer they are all stat-ed "
     "before the mount. See [manifest.md](manifest.md).",
     [](Options& o, const GivenOption& g) { o.stat_later = parse_u64(g.key, g.value); }},
    {"trace", Takes::kValue, "FILE", S::kCaches, "", false, "append one line per file opened (\"PID PATH\") to FILE",
     "Append `PID PATH` to FILE for every file opened through the mount (names with `\\` or a newline "
     "escaped), to see what the job really read. Needs the kernel to send every open, so it implies "
     "`progress=opens`. See [order.md](order.md).",
     [](Options& o, const GivenOption& g) { o.trace = path(g); }},

    // Logs and metrics.
    {"log", Takes::kValue, "syslog|stderr|FILE", S::kLogs, "syslog, or a file without it", false,
     "where the daemon's lines go once it runs in the background",
     "Where the daemon's lines go once it runs in the background (in the foreground, `-f`, and under a "
     "launcher they go to stderr unless `log=` is given): `syslog`, `stderr`, or an absolute FILE (appended, "
     "timestamped). Without it: syslog when the node has one, else `MOUNTPOINT.log` in a folder of the user's own "
     "(`/var/log/clairfs/` for root, `~/.local/state/clairfs/` or `$XDG_STATE_HOME/clairfs/` for others; the "
     "mount point's `/` written as `-`: `/mnt/train` logs to `mnt-train.log`). `clairfs status` names it.",
     [](Options& o, const GivenOption& g) {
       if (g.value.empty()) bad_value(g.key, g.value, "give syslog, stderr or an absolute path");
       if (g.value != "syslog" && g.value != "stderr" && g.value[0] != '/')
         bad_value(g.key, g.value, "give syslog, stderr or an absolute path");
       o.log = g.value;
       o.log_given = true;
     }},
    {"log_level", Takes::kValue, "LEVEL", S::kLogs, "info", false, "debug, info, warning or error",
     "The least a line must be to be logged: `debug`, `info`, `warning` or `error`. The same line again "
     "within a minute is counted, not repeated (the count follows with the next line).",
     [](Options& o, const GivenOption& g) {
       if (g.value != "debug" && g.value != "info" && g.value != "warning" && g.value != "error")
         bad_value(g.key, g.value, "use debug, info, warning or error");
       o.log_level = g.value;
     }},
    {"metrics_file", Takes::kValue, "FILE", S::kLogs, "", false,
     "write the metrics to FILE every 5 s (node_exporter's textfile collector)",
     "Write the mount's metrics in the Prometheus text format to FILE every 5 seconds, atomically (a temporary file in "
     "the same folder, renamed), for node_exporter's textfile collector (name it `*.prom` in its folder). "
     "Removed when the mount ends. The same text is always at `MOUNTPOINT/.clairfs/metrics`.",
     [](Options& o, const GivenOption& g) {
       if (g.value.empty() || g.value[0] != '/') bad_value(g.key, g.value, "give an absolute path");
       o.metrics_file = g.value;
     }},

    // Kernel and FUSE.
    {"entry_timeout", Takes::kValue, "SECS", S::kKernel, "86400", false, "how long the kernel caches names",
     "How long the kernel caches names (and misses). The data set is immutable during training, so long.",
     [](Options& o, const GivenOption& g) { o.entry_timeout = parse_seconds(g.key, g.value); }},
    {"attr_timeout", Takes::kValue, "SECS", S::kKernel, "86400", false, "how long the kernel caches attributes",
     "How long the kernel caches attributes.",
     [](Options& o, const GivenOption& g) { o.attr_timeout = parse_seconds(g.key, g.value); }},
    {"timeout", Takes::kValue, "SECS", S::kKernel, "", false, "both of the above", "Sets both.",
     [](Options& o, const GivenOption& g) { o.entry_timeout = o.attr_timeout = parse_seconds(g.key, g.value); }},
    {"allow_other", Takes::kNothing, "", S::kKernel, "off", false, "let other users read the mount",
     "Let other users use the mount. Refused unless `default_permissions` is given too, since otherwise every "
     "user could read every file regardless of its mode. Non-root users need `user_allow_other` in "
     "/etc/fuse.conf.",
     [](Options& o, const GivenOption&) { o.allow_other = true; }},
    {"default_permissions", Takes::kNothing, "", S::kKernel, "off", false,
     "let the kernel check permissions against the mirrored modes",
     "The kernel checks each access against the mirrored modes and owners.",
     [](Options& o, const GivenOption&) { o.default_permissions = true; }},
    {"auto_unmount", Takes::kNothing, "", S::kKernel, "off (on under a launcher)", false,
     "unmount when the daemon exits",
     "Unmount when the daemon exits, even if killed (fusermount3 stays, in a session of its own, to do it, "
     "and a process named clairfs-keeper holds it back until the daemon has wholly exited). "
     "Always on for daemons started by a launcher (mpiexec, srun), whose death would otherwise leave dead mounts.",
     [](Options& o, const GivenOption&) { o.auto_unmount = true; }},
    {"nonempty", Takes::kNothing, "", S::kKernel, "off", false, "mount on a directory that is not empty",
     "Mount on a directory that has entries (hidden while the mount lasts). Without it such a mount is "
     "refused, naming how many entries it would hide.",
     [](Options& o, const GivenOption&) { o.nonempty = true; }},
    {"fsname", Takes::kValue, "NAME", S::kKernel, "SOURCE", false, "the name shown in /proc/mounts",
     "The name shown in the first column of /proc/mounts and `df`.",
     [](Options& o, const GivenOption& g) {
       if (g.value.empty()) bad_value(g.key, g.value, "empty name");
       o.fsname = g.value;
     }},
};

// Kernel mount flags libfuse understands; forwarded unchanged.
const std::vector<const char*> kMountFlags = {"exec",     "noexec",     "atime",       "noatime",  "relatime",
                                              "norelatime", "diratime", "nodiratime", "strictatime", "lazytime",
                                              "async",    "sync",       "dirsync"};
// What mount(8), mount.fuse3 and fstab may hand us that means nothing here. "rw" is accepted because
// mount(8) adds it by default; the mount stays read-only regardless. "dev" and "suid" (mount.fuse3 adds
// them for mount(8)) too: a mount of training data is always nosuid,nodev, by hand or from fstab.
const std::vector<const char*> kIgnored = {"ro",     "rw",    "defaults", "_netdev", "nofail", "auto",  "noauto", "user",
                                           "users",  "nouser", "owner",   "group",   "nosymfollow", "dev", "nodev", "suid",
                                           "nosuid"};

const std::vector<FlagSpec> kFlags = {
    {{"-f"}, FlagAction::kForeground, "stay in the foreground"},
    {{"-d", "debug"}, FlagAction::kDebug, "foreground, with libfuse's trace of every request"},
    {{"-h", "--help"}, FlagAction::kHelp, "list the options"},
    {{"-V", "--version"}, FlagAction::kVersion, "print the version"},
};

// `name=VALUE`, `name[=BOOL]` or `name`.
std::string spelled(const OptionSpec& o) {
  switch (o.takes) {
    case Takes::kValue: return std::string(o.name) + "=" + o.value;
    case Takes::kMaybeBool: return std::string(o.name) + "[=" + o.value + "]";
    case Takes::kNothing: break;
  }
  return o.name;
}

const char* section_title(OptionSection s) {
  switch (s) {
    case S::kSchedule: return "Training schedule (what the job's sampler and DataLoader use):";
    case S::kCaches: return "Caches:";
    case S::kLogs: return "Logs and metrics:";
    case S::kKernel: return "Kernel and FUSE:";
  }
  return "";
}

// One help entry: the left column padded to 21, then `text` wrapped at 108 columns under itself.
void help_line(std::string& out, const std::string& left, const std::string& text) {
  constexpr size_t kColumn = 23, kWidth = 108;
  std::string line = "  " + left;
  line += line.size() + 1 < kColumn ? std::string(kColumn - line.size(), ' ') : std::string("  ");
  size_t start = 0;
  while (start < text.size()) {
    size_t room = kWidth > line.size() ? kWidth - line.size() : 20;
    size_t stop = text.size();
    if (stop - start > room) {
      stop = text.rfind(' ', start + room);
      if (stop == std::string::npos || stop <= start) stop = text.find(' ', start + room);
      if (stop == std::string::npos) stop = text.size();
    }
    line += text.substr(start, stop - start);
    out += line + "\n";
    line = std::string(kColumn, ' ');
    start = stop < text.size() ? stop + 1 : stop;
  }
}

// The spellings a flag is shown with (those starting with '-'), each between `quote`s.
std::string flag_spellings(const FlagSpec& f, const std::string& quote) {
  std::string out;
  for (const char* s : f.spellings)
    if (s[0] == '-') out += (out.empty() ? "" : ", ") + quote + s + quote;
  return out;
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string joined_code(const std::vector<const char*>& words, const char* extra = nullptr) {
  std::string out;
  for (const char* w : words) out += std::string(out.empty() ? "" : ", ") + "`" + w + "`";
  if (extra) out += std::string(", ") + extra;
  return out;
}

}  // namespace

const std::vector<OptionSpec>& option_table() { return kTable; }

const OptionSpec* find_option(const std::string& key) {
  for (const auto& o : kTable)
    if (key == o.name) return &o;
  return nullptr;
}

const std::vector<const char*>& kernel_mount_flags() { return kMountFlags; }
const std::vector<const char*>& ignored_mount_words() { return kIgnored; }
const std::vector<FlagSpec>& flag_table() { return kFlags; }

std::string options_help() {
  std::string out;
  for (S section : {S::kSchedule, S::kCaches, S::kLogs, S::kKernel}) {
    out += std::string(out.empty() ? "" : "\n") + section_title(section) + "\n";
    for (const auto& o : kTable) {
      if (o.section != section) continue;
      std::string text = o.brief;
      if (*o.fallback) text += std::string("; default ") + o.fallback;
      help_line(out, spelled(o), text);
    }
  }
  help_line(out, "exec, noexec, noatime, relatime, ...", "mount flags, passed to the kernel");
  help_line(out, "ro, rw, dev, suid, defaults, _netdev, nofail, x-*",
            "accepted from fstab/mount(8); the mount is always read-only, nosuid and nodev");
  out += "\nFlags:\n";
  for (const auto& f : kFlags) help_line(out, flag_spellings(f, ""), f.brief);
  return out;
}

std::string options_markdown(OptionSection section) {
  std::string out = "| option | default | meaning |\n|---|---|---|\n";
  for (const auto& o : kTable) {
    if (o.section != section) continue;
    out += "| `" + markdown_cell(spelled(o)) + "` | " + (*o.fallback ? o.fallback : "—") + " | " + o.detail + " |\n";
  }
  if (section == S::kKernel) {
    out += "| " + joined_code(kMountFlags) + " | | Mount flags, passed to the kernel. |\n";
    out += "| " + joined_code(kIgnored, "`x-*`, `comment=*`") +
           " | | Accepted because mount(8), mount.fuse3 and fstab pass them on; no effect. The mount is "
           "read-only, `nosuid` and `nodev` whatever is asked. |\n";
  }
  return out;
}

// The docs' Markdown as roff: `code` in bold, [text](link) as its text, roff's special characters
// escaped.
std::string roff(const std::string& md) {
  std::string out;
  bool code = false;
  for (size_t i = 0; i < md.size(); ++i) {
    const char c = md[i];
    if (c == '`') {
      out += code ? "\\fR" : "\\fB";
      code = !code;
    } else if (c == '[' && md.find("](", i) != std::string::npos && md.find(']', i) == md.find("](", i)) {
      const size_t close = md.find("](", i), end = md.find(')', close);
      out += roff(md.substr(i + 1, close - i - 1));
      i = end == std::string::npos ? md.size() : end;
    } else if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
    if (out.size() >= 1 && (out.back() == '.' || out.back() == '\'') && (out.size() == 1 || out[out.size() - 2] == '\n'))
      out.insert(out.size() - 1, "\\&");
  }
  if (code) out += "\\fR";
  return out;
}

std::string options_man(OptionSection section) {
  std::string out;
  for (const auto& o : kTable) {
    if (o.section != section) continue;
    out += ".TP\n.B " + roff(spelled(o)) + "\n" + roff(o.detail);
    if (*o.fallback) out += " Default: " + roff(o.fallback) + ".";
    out += "\n";
  }
  if (section == S::kKernel) {
    std::string flags, ignored;
    for (const char* f : kMountFlags) flags += std::string(flags.empty() ? "" : ", ") + roff(f);
    for (const char* f : kIgnored) ignored += std::string(ignored.empty() ? "" : ", ") + roff(f);
    out += ".TP\n.B " + flags + "\nMount flags, passed to the kernel.\n";
    out += ".TP\n.B " + ignored + ", x\\-*, comment=*\nAccepted because mount(8), mount.fuse3 and fstab pass them on; "
           "no effect. The mount is read\\-only, nosuid and nodev whatever is asked.\n";
  }
  return out;
}

std::string flags_man() {
  std::string out;
  for (const auto& f : kFlags) {
    std::string text = f.brief;
    text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    out += ".TP\n.B " + roff(flag_spellings(f, "")) + "\n" + roff(text) + ".\n";
  }
  return out;
}

std::string flags_markdown() {
  std::string out = "| flag | meaning |\n|---|---|\n";
  for (const auto& f : kFlags) {
    std::string text = f.brief;
    text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    out += "| " + flag_spellings(f, "`") + " | " + text + ". |\n";
  }
  return out;
}

}  // namespace clairfs
