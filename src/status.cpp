// `clairfs status MOUNTPOINT [--watch [SECONDS]]`: .clairfs/stats made readable for people — where the
// readers are in the epoch, how far staging leads them, how full the RAM budget is, and where the
// files came from.
#include "status.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace clairfs {

namespace {

std::string bar(double fraction, int width = 30) {
  if (fraction < 0) fraction = 0;
  if (fraction > 1) fraction = 1;
  const int full = static_cast<int>(fraction * width + 0.5);
  return "[" + std::string(static_cast<size_t>(full), '#') + std::string(static_cast<size_t>(width - full), '.') + "]";
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", bytes, units[u]);
  return buf;
}

uint64_t get(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return 0;
    at = &(*at)[key];
  }
  return at->is_number() ? at->get<uint64_t>() : 0;
}

// One screen of status. Returns false (and prints why) if the stats cannot be read.
bool show(const std::string& mountpoint) {
  std::ifstream in(mountpoint + "/.clairfs/stats");
  if (!in) {
    std::fprintf(stderr, "clairfs: '%s' is not a clairfs mount (no .clairfs/stats)\n", mountpoint.c_str());
    return false;
  }
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clairfs: cannot read %s/.clairfs/stats: %s\n", mountpoint.c_str(), e.what());
    return false;
  }
  const uint64_t ram_files = get(j, {"tiers", "ram", "files"});
  const uint64_t cached = get(j, {"tiers", "pagecache", "files"});
  const uint64_t source = get(j, {"tiers", "source", "files"});
  const uint64_t opens = ram_files + cached + source;
  std::printf("clairfs at %s\n", mountpoint.c_str());
  if (j.contains("plan")) {
    const uint64_t files = get(j, {"plan", "files"}), cursor = get(j, {"plan", "cursor"});
    std::printf("  epoch %llu   %s %llu / %llu files opened\n", static_cast<unsigned long long>(get(j, {"epoch"})),
                bar(files ? static_cast<double>(cursor) / static_cast<double>(files) : 0).c_str(),
                static_cast<unsigned long long>(cursor), static_cast<unsigned long long>(files));
    std::printf("  staged ahead  %llu files\n", static_cast<unsigned long long>(get(j, {"plan", "lead_files"})));
    const uint64_t budget = get(j, {"ram", "budget"}), used = get(j, {"ram", "used"});
    std::printf("  RAM           %s %s of %s\n",
                bar(budget ? static_cast<double>(used) / static_cast<double>(budget) : 0).c_str(), human(used).c_str(),
                human(budget).c_str());
  } else {
    std::printf("  staging off (mount with ram=SIZE to stage ahead)\n");
  }
  auto share = [&](uint64_t n) { return opens ? 100.0 * static_cast<double>(n) / static_cast<double>(opens) : 0.0; };
  std::printf("  opens served  RAM %llu (%.1f%%)   page cache %llu (%.1f%%)   SOURCE %llu (%.1f%%)\n",
              static_cast<unsigned long long>(ram_files), share(ram_files), static_cast<unsigned long long>(cached),
              share(cached), static_cast<unsigned long long>(source), share(source));
  std::printf("  bytes served  RAM %s   SOURCE %s\n", human(static_cast<double>(get(j, {"tiers", "ram", "bytes"}))).c_str(),
              human(static_cast<double>(get(j, {"tiers", "source", "bytes"}))).c_str());
  if (j.contains("stalls"))
    std::printf("  stalls        %llu opens waited on SOURCE, %.2f s in all\n",
                static_cast<unsigned long long>(get(j, {"stalls", "opens"})), j["stalls"].value("seconds", 0.0));
  if (j.contains("mispredicted_opens"))
    std::printf("  mispredicted  %llu opens\n", static_cast<unsigned long long>(get(j, {"mispredicted_opens"})));
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
      if (i + 1 < argc && std::isdigit(static_cast<unsigned char>(argv[i + 1][0]))) every = std::stod(argv[++i]);
      if (every <= 0) every = 2;
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: clairfs status MOUNTPOINT [--watch [SECONDS]]");
      return 0;
    } else if (mountpoint.empty() && a[0] != '-') {
      mountpoint = a;
    } else {
      std::fprintf(stderr, "clairfs: unexpected argument '%s' (usage: clairfs status MOUNTPOINT [--watch [SECONDS]])\n",
                   a.c_str());
      return 2;
    }
  }
  if (mountpoint.empty()) {
    std::fprintf(stderr, "clairfs: missing MOUNTPOINT (usage: clairfs status MOUNTPOINT [--watch [SECONDS]])\n");
    return 2;
  }
  if (every == 0) return show(mountpoint) ? 0 : 1;
  for (;;) {
    std::printf("\033[H\033[2J");  // clear the screen
    if (!show(mountpoint)) return 1;
    ::usleep(static_cast<useconds_t>(every * 1e6));
  }
}

}  // namespace clairfs
