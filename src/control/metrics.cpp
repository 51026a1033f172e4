#include "control/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "util/fs.hpp"
#include "util/log.hpp"
#include "util/text.hpp"

#ifndef CLAIRFS_VERSION
#define CLAIRFS_VERSION "unknown"
#endif

namespace clairfs {

namespace {

// A label value as OpenMetrics writes it: backslash, quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

double at(const nlohmann::json& j, std::initializer_list<const char*> path, bool* found = nullptr) {
  const nlohmann::json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) {
      if (found) *found = false;
      return 0;
    }
    p = &(*p)[k];
  }
  if (found) *found = p->is_number();
  return p->is_number() ? p->get<double>() : 0;
}

// Writes families one after another: header lines, then samples. In the classic text format a family's
// lines name its samples (a counter's with _total), and its types are counter and gauge.
class Writer {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    const std::string named = std::string(type) == "counter" ? name + "_total" : name;
    out_ += "# HELP " + named + " " + help + "\n";
    out_ += "# TYPE " + named + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& labels, double v) {
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(v) + "\n";
  }
  // A family of one sample, if the stats have its number.
  void single(const std::string& name, const char* type, const char* help, const nlohmann::json& j,
              std::initializer_list<const char*> path) {
    bool found = true;
    const double v = at(j, path, &found);
    if (!found) return;
    family(name, type, help);
    sample(std::string(type) == std::string("counter") ? name + "_total" : name, "", v);
  }
  std::string done() { return out_; }

 private:
  std::string out_;
};

uint64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string metrics_text(const nlohmann::json& j, const std::string& mountpoint) {
  Writer w;
  w.family("clairfs_build_info", "gauge", "The clairfs daemon serving this mount (always 1).");
  w.sample("clairfs_build_info", "version=\"" + label(CLAIRFS_VERSION) + "\",mountpoint=\"" + label(mountpoint) + "\"", 1);

  if (j.contains("ranks") && j["ranks"].is_array()) {
    struct Gauge {
      const char* name;
      const char* key;
      const char* help;
    };
    const Gauge gauges[] = {
        {"clairfs_rank_epoch", "epoch", "The epoch the rank's reader is in."},
        {"clairfs_rank_files_done", "done", "Files of that epoch the rank read."},
        {"clairfs_rank_files_in_epoch", "total", "Files the rank reads in that epoch."},
        {"clairfs_rank_lead_files", "lead_files", "Files staged ahead of the rank's reader, in a row."},
        {"clairfs_rank_lead_seconds", "lead_seconds", "The lead in seconds of reading at the rank's rate."},
        {"clairfs_rank_files_per_second", "files_per_second", "The rank's reading rate."},
    };
    for (const Gauge& g : gauges) {
      w.family(g.name, "gauge", g.help);
      for (const auto& r : j["ranks"])
        w.sample(g.name, "rank=\"" + std::to_string(r.value("rank", uint64_t{0})) + "\"", r.value(g.key, 0.0));
    }
    w.family("clairfs_rank_verdict", "gauge",
             "1 for the rank's verdict (following, checking, off, idle): whether it reads in the planned order.");
    for (const auto& r : j["ranks"]) {
      const std::string verdict = r.value("verdict", std::string());
      for (const char* state : {"following", "checking", "off", "idle"})
        w.sample("clairfs_rank_verdict",
                 "rank=\"" + std::to_string(r.value("rank", uint64_t{0})) + "\",verdict=\"" + state + "\"",
                 verdict == state ? 1 : 0);
    }
    w.family("clairfs_rank_mispredicted_opens", "counter", "The rank's opens the plan did not expect.");
    for (const auto& r : j["ranks"])
      w.sample("clairfs_rank_mispredicted_opens_total", "rank=\"" + std::to_string(r.value("rank", uint64_t{0})) + "\"",
               r.value("mispredicted_opens", 0.0));
  }

  // Opens and bytes served, by where they came from.
  w.family("clairfs_served_files", "counter", "Files the readers opened, by the tier that served them.");
  const char* tiers[][2] = {{"page_cache", "pagecache"}, {"ram", "ram"}, {"nvme", "nvme"}, {"peer", "peer"}, {"source", "source"}};
  for (const auto& t : tiers) {
    bool found = true;
    const double v = at(j, {"tiers", t[1], "files"}, &found);
    if (found) w.sample("clairfs_served_files_total", std::string("tier=\"") + t[0] + "\"", v);
  }
  w.family("clairfs_served_bytes", "counter",
           "Bytes the readers read, by the tier that served them (pushed pages: not seen).");
  for (const auto& t : tiers) {
    bool found = true;
    const double v = at(j, {"tiers", t[1], "bytes"}, &found);
    if (found) w.sample("clairfs_served_bytes_total", std::string("tier=\"") + t[0] + "\"", v);
  }

  // What SOURCE saw: reads for the readers and for staging.
  bool staged = true;
  const double staged_files = at(j, {"staged", "files"}, &staged) - at(j, {"staged", "from_nvme"}) - at(j, {"staged", "from_peer"});
  w.family("clairfs_source_read_bytes", "counter", "Bytes read from SOURCE, for any reason.");
  w.sample("clairfs_source_read_bytes_total", "",
           j.contains("source_traffic") ? at(j, {"source_traffic", "bytes"}) : at(j, {"tiers", "source", "bytes"}));
  w.family("clairfs_source_opens", "counter", "Files opened in SOURCE, for any reason.");
  w.sample("clairfs_source_opens_total", "", at(j, {"tiers", "source", "files"}) + (staged ? staged_files : 0));

  w.single("clairfs_stall_seconds", "counter", "Time readers waited for files served from SOURCE.", j,
           {"stalls", "seconds"});
  w.single("clairfs_staging_waits_given_up", "counter",
           "Opens that stopped waiting for a staging read held up by the kernel and read the file themselves.", j,
           {"stalls", "staging_waits_given_up"});
  w.single("clairfs_mispredicted_opens", "counter", "Opens no rank's plan expected.", j, {"mispredicted_opens"});
  w.single("clairfs_source_changed", "counter", "Files found changed in SOURCE since the mount (reads refused).", j,
           {"source_changed"});
  w.single("clairfs_staging_failures", "counter", "Files the stager could not read.", j, {"staged", "failures"});
  w.single("clairfs_peer_timeouts", "counter", "Requests to peer nodes that timed out.", j, {"peers", "timeouts"});
  w.single("clairfs_peer_requests", "counter", "Files asked of peer nodes.", j, {"peers", "requests"});
  w.single("clairfs_peer_refusals", "counter", "Requests to peer nodes they refused (not held there).", j,
           {"peers", "refused"});
  w.single("clairfs_peer_failures", "counter", "Requests to peer nodes that failed.", j, {"peers", "failures"});
  w.single("clairfs_peer_handed_staged_files", "counter",
           "Files staged here for peer nodes that another node reads first (it had no room for them).", j,
           {"peers", "handed_staged"});
  w.single("clairfs_peer_unkept_files", "gauge",
           "Files past every node's room: no node keeps them for the others, their readers read SOURCE.", j,
           {"peers", "unkept"});
  w.single("clairfs_peer_returns", "counter", "Times a peer node given up for silence answered again.", j,
           {"peers", "returned"});
  w.single("clairfs_peer_links", "gauge", "Peer nodes linked to, whose deaths are seen at once.", j,
           {"peers", "links"});
  w.single("clairfs_peer_staged_bytes", "counter", "Bytes staged from peer nodes.", j, {"peers", "staged_bytes"});
  w.single("clairfs_peer_source_instead_bytes", "counter",
           "Bytes of files a peer keeps that staging read from SOURCE instead (the peer far slower).", j,
           {"peers", "source_instead_bytes"});
  w.single("clairfs_peer_served_files", "counter", "Files this node served to peer nodes.", j,
           {"peers", "served_files"});
  w.single("clairfs_peer_served_bytes", "counter", "Bytes this node served to peer nodes.", j,
           {"peers", "served_bytes"});
  w.single("clairfs_peer_refused_to_peers", "counter", "Peer nodes' requests this node refused (not held here).", j,
           {"peers", "refused_to_peers"});
  w.single("clairfs_peers_asked", "gauge", "Peer nodes still asked (not left, failed or silent).", j,
           {"peers", "usable"});
  if (j.contains("peers")) {
    w.family("clairfs_peers_gone", "gauge", "Peer nodes no longer asked: left, failed or silent.");
    w.sample("clairfs_peers_gone", "",
             j["peers"].contains("gone") ? static_cast<double>(j["peers"]["gone"].size()) : 0);
  }
  w.single("clairfs_ram_used_bytes", "gauge", "Bytes of files held in the RAM tier.", j, {"ram", "used"});
  w.single("clairfs_ram_budget_bytes", "gauge", "The RAM tier's budget (ram=).", j, {"ram", "budget"});
  w.single("clairfs_pagecache_used_bytes", "gauge", "Bytes pushed into the kernel's page cache, not yet read.", j,
           {"pagecache", "used"});
  w.single("clairfs_nvme_used_bytes", "gauge", "Bytes held in the NVMe tier.", j, {"nvme", "used"});
  w.single("clairfs_nvme_capacity_bytes", "gauge", "The NVMe tier's budget.", j, {"nvme", "capacity"});
  w.family("clairfs_resident_memory_bytes", "gauge", "The daemon's resident memory.");
  w.sample("clairfs_resident_memory_bytes", "", static_cast<double>(resident_bytes()));
  return w.done();
}

MetricsFile::MetricsFile(std::string path, std::function<std::string()> text, std::chrono::milliseconds every)
    : path_(std::move(path)), text_(std::move(text)), every_(every) {
  write_once();
  thread_ = std::thread([this] { run(); });
}

MetricsFile::~MetricsFile() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::unlink(path_.c_str());  // stale numbers would read as a live mount's
}

void MetricsFile::run() {
  for (;;) {
    {
      MutexLock lock(mutex_);
      if (!stop_) lock.wait_for(wake_, every_);  // (a wake-up before the time only writes sooner)
      if (stop_) return;
    }
    write_once();
  }
}

bool MetricsFile::write_once() {
  std::string text;
  try {
    text = text_();
  } catch (const std::exception&) {  // the stats could not be made this time: tried again next time
    text.clear();
  }
  int rc = 0;
  if (!text.empty()) {
    // A fresh temporary each time (not a fixed FILE.tmp, where a FIFO someone planted would block us).
    ReplacingFile out(path_, 0644);
    rc = out.error();
    if (rc == 0 && ::write(out.fd(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      rc = errno ? -errno : -ENOSPC;
    if (rc == 0) rc = out.commit(false);
  }
  const bool ok = rc == 0 && !text.empty();
  if (!ok && !failing_)
    log_warning("cannot write metrics_file '" + path_ + "': " +
                (rc < 0 ? why_not_written(rc) : "the stats could not be made") + " (tried again every few seconds)");
  if (ok && failing_) log_info("metrics_file '" + path_ + "' written again");
  failing_ = !ok;
  return ok;
}

}  // namespace clairfs
