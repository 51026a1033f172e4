// `clairfs status MOUNTPOINT [--watch [SECONDS]]`: .clairfs/stats made readable for people — where the
// readers are in the epoch, how far staging leads them, how full the RAM budget is, and where the
// files came from.
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "util/mounts.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

std::string bar(double fraction, int width = 30) {
  if (fraction < 0) fraction = 0;
  if (fraction > 1) fraction = 1;
  const int full = static_cast<int>(fraction * width + 0.5);
  return "[" + std::string(static_cast<size_t>(full), '#') + std::string(static_cast<size_t>(width - full), '.') + "]";
}

uint64_t get(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return 0;
    at = &(*at)[key];
  }
  return at->is_number() ? at->get<uint64_t>() : 0;
}

// Every string in `j` made safe to print (escape_controls): the stats file is read from any DIR given,
// and its strings (names of SOURCE's files among them) are not ours to trust.
void escape_strings(nlohmann::json& j) {
  if (j.is_string()) {
    j = escape_controls(j.get<std::string>());
  } else if (j.is_structured()) {
    for (auto& v : j) escape_strings(v);
  }
}

// What this node's peers did for it and it for them (the stats' `peers`).
void print_peers(const nlohmann::json& p) {
  const uint64_t nodes = get(p, {"nodes"}), usable = get(p, {"usable"});
  std::printf(
      "  peers         node %llu of %llu; %llu of the %llu others asked; linked to %llu (a death seen at once)\n",
      static_cast<unsigned long long>(get(p, {"node"})), static_cast<unsigned long long>(nodes),
      static_cast<unsigned long long>(usable), static_cast<unsigned long long>(nodes ? nodes - 1 : 0),
      static_cast<unsigned long long>(get(p, {"links"})));
  if (p.contains("gone") && p["gone"].is_array() && !p["gone"].empty()) {
    std::string gone;
    for (const auto& n : p["gone"])
      gone += (gone.empty() ? "" : ", ") + std::to_string(n.is_number() ? n.get<uint64_t>() : 0);
    std::printf("                no longer asked (left, failed or silent): node %s; what they keep comes from SOURCE\n",
                gone.c_str());
  }
  if (const uint64_t returned = get(p, {"returned"}))
    std::printf("                %llu times a peer given up for silence answered again and was asked again\n",
                static_cast<unsigned long long>(returned));
  std::printf(
      "  from peers    %llu files staged (%s) and %llu read on demand; asked %llu: %llu served, %llu refused, "
      "%llu timed out, %llu failed; %llu put off until needed soon\n",
      static_cast<unsigned long long>(get(p, {"staged_files"})),
      human_bytes(static_cast<double>(get(p, {"staged_bytes"}))).c_str(),
      static_cast<unsigned long long>(get(p, {"demand_files"})), static_cast<unsigned long long>(get(p, {"requests"})),
      static_cast<unsigned long long>(get(p, {"hits"})), static_cast<unsigned long long>(get(p, {"refused"})),
      static_cast<unsigned long long>(get(p, {"timeouts"})), static_cast<unsigned long long>(get(p, {"failures"})),
      static_cast<unsigned long long>(get(p, {"deferred"})));
  if (const uint64_t instead = get(p, {"source_instead"}))
    std::printf(
        "                %llu files a peer keeps staged from SOURCE instead (%s): the peer answered far slower\n",
        static_cast<unsigned long long>(instead),
        human_bytes(static_cast<double>(get(p, {"source_instead_bytes"}))).c_str());
  std::printf("  to peers      %llu files served (%s); %llu asks refused (not held here)\n",
              static_cast<unsigned long long>(get(p, {"served_files"})),
              human_bytes(static_cast<double>(get(p, {"served_bytes"}))).c_str(),
              static_cast<unsigned long long>(get(p, {"refused_to_peers"})));
  if (const uint64_t handed = get(p, {"handed"}))
    std::printf(
        "                %llu files kept here that another node reads first (no room left there): %llu staged\n",
        static_cast<unsigned long long>(handed), static_cast<unsigned long long>(get(p, {"handed_staged"})));
  if (const uint64_t unkept = get(p, {"unkept"}))
    std::printf("  unkept        %llu files past every node's room: no node keeps them, their readers read SOURCE\n",
                static_cast<unsigned long long>(unkept));
}

// One screen of status from the stats `j`. Throws nlohmann::json::exception on stats of another shape.
void print_status(const nlohmann::json& j, const std::string& mountpoint) {
  const char* tiers[] = {"pagecache", "ram", "nvme", "peer", "source"};
  const char* names[] = {"page cache", "RAM", "NVMe", "peer", "SOURCE"};
  uint64_t opens = 0;
  for (const char* t : tiers) opens += get(j, {"tiers", t, "files"});
  auto pct = [](uint64_t n, uint64_t of) { return of ? 100.0 * static_cast<double>(n) / static_cast<double>(of) : 0.0; };
  auto fill = [&](const char* label, uint64_t used, uint64_t budget) {
    std::printf("  %-12s %s %s of %s\n", label, bar(budget ? static_cast<double>(used) / static_cast<double>(budget) : 0).c_str(),
                human_bytes(static_cast<double>(used)).c_str(), human_bytes(static_cast<double>(budget)).c_str());
  };
  std::printf("clairfs at %s\n", escape_controls(mountpoint).c_str());
  if (j.contains("learned")) {
    const auto& l = j["learned"];
    const std::string state = l.value("state", std::string());
    const std::string seed = l.value("seed", std::string());
    const auto opens = static_cast<unsigned long long>(l.value("opens_seen", uint64_t{0}));
    if (state == "learning")
      std::printf("  seed=auto: learning the job's seed (%llu opens seen); reads go to SOURCE until then\n", opens);
    // By then a likely seed would have been found: say what cannot be.
    if ((state == "learning" && opens >= 256) || state == "not found")
      std::printf(
          "             (DataLoader(shuffle=True) without a generator is learned only after torch.manual_seed with\n"
          "             under 1,024 draws before it; give it generator=torch.Generator().manual_seed(S) and mount\n"
          "             with order=torch-random,seed=S: docs/order.md)\n");
    else if (state == "found" && l.value("relearned", uint64_t{0}) > 0)
      std::printf(
          "  seed=auto: the job reads as %s (learned again %llu time(s): it read in another order than the "
          "seed first learned; found after %llu opens)\n",
          seed.c_str(), static_cast<unsigned long long>(l.value("relearned", uint64_t{0})), opens);
    else if (state == "found")
      std::printf("  seed=auto: the job reads as %s (found after %llu opens)\n", seed.c_str(), opens);
    else if (state == "not found")
      std::printf("  seed=auto: no likely seed fits the first %llu opens: staging off, reads go to SOURCE (give seed=)\n", opens);
    else
      std::printf("  seed=auto: the job reads as %s, but staging could not start (see the log)\n", seed.c_str());
    if (const uint64_t others = l.value("other_users_opens", uint64_t{0}))
      std::printf("             %llu other users' opens not learned from (learn_from=)\n",
                  static_cast<unsigned long long>(others));
  }
  if (j.contains("waited")) {
    const std::string state = j["waited"].value("state", std::string());
    if (const uint64_t pending = get(j, {"attributes_pending"}))
      std::printf(
          "  reading the files' sizes after the mount (%llu to go); staging reads those of the files it comes "
          "to first\n",
          static_cast<unsigned long long>(pending));
    if (state == "waiting")
      std::printf("  staging starts in a moment; reads go to SOURCE until then\n");
    else if (state == "failed")
      std::printf("  staging could not start (see the log); reads go to SOURCE\n");
  }
  if (j.contains("ranks")) {
    for (const auto& r : j["ranks"]) {
      const uint64_t done = r.value("done", uint64_t{0}), total = r.value("total", uint64_t{0});
      const std::string verdict = r.value("verdict", std::string("following"));
      std::printf("  rank %-4llu epoch %-3llu %s %llu / %llu   ", static_cast<unsigned long long>(r.value("rank", uint64_t{0})),
                  static_cast<unsigned long long>(r.value("epoch", uint64_t{0})),
                  bar(total ? static_cast<double>(done) / static_cast<double>(total) : 0, 24).c_str(),
                  static_cast<unsigned long long>(done), static_cast<unsigned long long>(total));
      if (verdict == "off") {
        std::printf("OFF THE PLAN: staging for it stopped\n");
        const std::string why = r.value("reads_as", std::string());
        std::printf("             %s\n", why.empty() ? "(finding out what order it reads in)" : why.c_str());
      } else if (verdict == "idle") {
        std::printf("not reading: staging for it stopped\n");
      } else {
        std::printf("lead %llu files (%.1f s)%s\n", static_cast<unsigned long long>(r.value("lead_files", uint64_t{0})),
                    r.value("lead_seconds", 0.0), verdict == "checking" ? "   (checking its order)" : "");
        // Following, but another epoch's order than the plan had it in: why. Checking after it was off:
        // what it read as then.
        if (const std::string why = r.value("reads_as", std::string()); !why.empty())
          std::printf("             %s the job %s\n",
                      verdict == "checking" ? "checking whether it is back; before," : "the plan's epoch, not the job's:", why.c_str());
      }
    }
    fill("RAM", get(j, {"ram", "used"}), get(j, {"ram", "budget"}));
    if (j.contains("idle") && j["idle"].value("now", false))
      std::printf(
          "               idle: nothing read for %llu s, RAM and pushed pages given back; staging again at the "
          "next read\n",
          static_cast<unsigned long long>(get(j, {"idle", "after_seconds"})));
    if (get(j, {"pagecache", "budget"})) fill("pushed pages", get(j, {"pagecache", "used"}), get(j, {"pagecache", "budget"}));
    if (j.contains("nvme")) {
      fill("NVMe", get(j, {"nvme", "used"}), get(j, {"nvme", "capacity"}));
      if (!j["nvme"].value("admitting", true)) std::printf("               NVMe admission stopped (disk full or unwritable)\n");
    }
  } else if (!j.contains("learned") && !j.contains("waited")) {
    std::printf("  staging off (mounted with ram=0)\n");
  }
  std::printf("  opens served ");
  for (size_t t = 0; t < 5; ++t) {
    const uint64_t n = get(j, {"tiers", tiers[t], "files"});
    if (n || t == 0 || t == 4) std::printf(" %s %llu (%.1f%%) ", names[t], static_cast<unsigned long long>(n), pct(n, opens));
  }
  std::printf("\n  bytes served  RAM %s   NVMe %s   SOURCE %s\n",
              human_bytes(static_cast<double>(get(j, {"tiers", "ram", "bytes"}))).c_str(),
              human_bytes(static_cast<double>(get(j, {"tiers", "nvme", "bytes"}))).c_str(),
              human_bytes(static_cast<double>(get(j, {"tiers", "source", "bytes"}))).c_str());
  if (j.contains("peers")) print_peers(j["peers"]);
  if (j.contains("source_traffic"))
    std::printf("  SOURCE read   %s in all (staging and demand)\n",
                human_bytes(static_cast<double>(get(j, {"source_traffic", "bytes"}))).c_str());
  if (j.contains("stalls"))
    std::printf("  stalls        %llu opens waited on SOURCE, %.2f s in all\n",
                static_cast<unsigned long long>(get(j, {"stalls", "opens"})), j["stalls"].value("seconds", 0.0));
  if (const uint64_t n = get(j, {"stalls", "staging_waits_given_up"}))
    std::printf("  gave up       %llu waits for staging held up in the kernel (read again instead)\n",
                static_cast<unsigned long long>(n));
  if (j.contains("mispredicted_opens"))
    std::printf("  mispredicted  %llu opens\n", static_cast<unsigned long long>(get(j, {"mispredicted_opens"})));
  if (const uint64_t world = get(j, {"progress", "reads_as_world_size"}))
    std::printf(
        "  world size    a process reads as world_size=%llu, not as planned: progress by rank is the plan's (see the "
        "log)\n",
        static_cast<unsigned long long>(world));
  if (const uint64_t times = get(j, {"plan", "world", "replanned"}))
    std::printf(
        "  planned again %llu time%s: the job reads as world_size=%llu, ranks %s here, from epoch %llu of %s (%llu "
        "files in RAM kept)\n",
        static_cast<unsigned long long>(times), times == 1 ? "" : "s",
        static_cast<unsigned long long>(get(j, {"plan", "world", "world_size"})),
        j["plan"]["world"].value("ranks", std::string()).c_str(),
        static_cast<unsigned long long>(get(j, {"plan", "world", "epoch"})),
        j["plan"]["world"].value("order", std::string("its seed")).c_str(),
        static_cast<unsigned long long>(get(j, {"plan", "world", "kept_files"})));
  if (j.contains("plan") && j["plan"].contains("world")) {
    const std::string samples = j["plan"]["world"].value("samples", std::string());
    if (!samples.empty()) std::printf("  samples   %s, learned from the job's opens\n", samples.c_str());
  }
  if (const uint64_t others = get(j, {"progress", "other_opens"}))
    std::printf(
        "  other readers %llu opens by %llu processes in another order (another job?): not the plan's, counted apart\n",
        static_cast<unsigned long long>(others),
        static_cast<unsigned long long>(get(j, {"progress", "other_readers"})));
  if (get(j, {"checksum_failures"}))
    std::printf("  checksum failures  %llu (re-read from SOURCE)\n", static_cast<unsigned long long>(get(j, {"checksum_failures"})));
  if (const uint64_t changed = get(j, {"source_changed"}))
    std::printf("  SOURCE changed     %llu files no longer match the scan: their reads fail (EIO); remount to rescan\n",
                static_cast<unsigned long long>(changed));
  if (const uint64_t failed = get(j, {"staged", "failures"}))
    std::printf("  staging failures   %llu reads (served on demand instead)\n", static_cast<unsigned long long>(failed));
  if (const uint64_t nvme_failed = get(j, {"nvme", "read_failures"}))
    std::printf("  NVMe read failures %llu (read from SOURCE instead)\n", static_cast<unsigned long long>(nvme_failed));
  if (const std::string log = j.value("log", std::string()); !log.empty())
    std::printf("  log           %s\n", log.c_str());
}

// What is wrong when a mount's stats cannot be read (errno `e`), in one line (show() says a watched
// mount's end itself).
std::string why_no_stats(const std::string& mountpoint, int e) {
  const std::string at = "'" + escape_controls(mountpoint) + "'";
  switch (e) {
    case ENOTCONN:
      return "the clairfs mount at " + at +
             " is dead (its daemon ended without unmounting it): clear it with "
             "'clairfs cleanup " +
             escape_controls(mountpoint) + "'";
    case EACCES:
    case EPERM:
      return "cannot read .clairfs/stats of " + at + ": " + std::strerror(e) +
             " (a mount is the user's who made it, and root's; others read it only with allow_other)";
    case ENOENT:
    case ENOTDIR: return at + " is not a clairfs mount (no .clairfs/stats)";
    case ECONNABORTED: return "the mount at " + at + " ended as its stats were read";
    default: return "cannot read .clairfs/stats of " + at + ": " + std::strerror(e);
  }
}

// What reading a mount's stats fails with once the mount has gone: its folder is the mount point's
// again, or the daemon ended its connection while the read was under way (ECONNABORTED), or after the
// file was opened (ENOTCONN, as from a dead daemon — but a dead daemon's mount is still there).
bool ended_with(int e, const std::string& mountpoint) {
  return e == ENOENT || e == ENOTDIR || e == ECONNABORTED || (e == ENOTCONN && !is_dead_fuse_mount(mountpoint));
}

// One screen of status. Returns false (and prints why) if the stats cannot be read; *ended: the mount a
// screen was shown of before (`seen`) has ended.
bool show(const std::string& mountpoint, bool seen = false, bool* ended = nullptr) {
  const int fd = ::open((mountpoint + "/.clairfs/stats").c_str(), O_RDONLY | O_CLOEXEC);
  // Says why the stats cannot be read (errno `e`); false.
  const auto cannot = [&](int e) {
    const bool gone = seen && ended_with(e, mountpoint);
    if (ended) *ended = gone;
    const std::string why =
        gone ? "the mount at '" + escape_controls(mountpoint) + "' ended" : why_no_stats(mountpoint, e);
    std::fprintf(stderr, "clairfs: %s\n", why.c_str());
    return false;
  };
  if (fd < 0) return cannot(errno);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return cannot(e);
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    escape_strings(j);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clairfs: cannot read %s/.clairfs/stats: %s\n", mountpoint.c_str(), e.what());
    return false;
  }
  try {
    print_status(j, mountpoint);
  } catch (const nlohmann::json::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "clairfs: %s/.clairfs/stats is not as this clairfs writes it (another version's?): %s\n",
                 mountpoint.c_str(), e.what());
    return false;
  }
  std::fflush(stdout);
  return true;
}

}  // namespace

int run_status(int argc, char** argv) {
  // clairfs status MOUNTPOINT [--watch [SECONDS]]
  std::string mountpoint;
  double every = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--watch") {
      every = 2;
      if (i + 1 < argc && (std::isdigit(static_cast<unsigned char>(argv[i + 1][0])) || argv[i + 1][0] == '.')) {
        const std::string v = argv[++i];
        char* end = nullptr;
        every = std::strtod(v.c_str(), &end);
        if (*end != '\0' || !(every >= 0.1) || every > 86400) {
          std::fprintf(stderr, "clairfs: --watch %s: the interval is seconds from 0.1 to 86400\n", v.c_str());
          return kExitUsage;
        }
      }
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: clairfs status MOUNTPOINT [--watch [SECONDS]]");
      return 0;
    } else if (mountpoint.empty() && a[0] != '-') {
      mountpoint = a;
    } else {
      std::fprintf(stderr, "clairfs: unexpected argument '%s' (usage: clairfs status MOUNTPOINT [--watch [SECONDS]])\n",
                   a.c_str());
      return kExitUsage;
    }
  }
  if (mountpoint.empty()) {
    std::fprintf(stderr, "clairfs: missing MOUNTPOINT (usage: clairfs status MOUNTPOINT [--watch [SECONDS]])\n");
    return kExitUsage;
  }
  if (every == 0) return show(mountpoint) ? 0 : 1;
  // On a terminal each screen replaces the last; into a pipe or file they follow each other, blank-line
  // separated, without escape codes.
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  for (bool first = true;; first = false) {
    if (terminal) std::printf("\033[H\033[2J");
    else if (!first) std::printf("\n");
    bool ended = false;
    if (!show(mountpoint, !first, &ended)) return ended ? 0 : 1;  // a mount that ended: the watch is over
    ::usleep(static_cast<useconds_t>(every * 1e6));
  }
}

}  // namespace clairfs
