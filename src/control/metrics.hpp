// The mount's numbers in the Prometheus text format (0.0.4, the one node_exporter's textfile collector
// and `promtool check metrics` read; Prometheus and OpenMetrics scrapers read it too), made from the
// stats (.clairfs/stats, one source for both): MOUNTPOINT/.clairfs/metrics, and with metrics_file=PATH
// a file rewritten every few seconds by a thread of its own (MetricsFile).
//
// Families (every name starts clairfs_; counters end _total; labels in braces):
//   clairfs_build_info{version, mountpoint}                    1
//   clairfs_rank_epoch{rank}, clairfs_rank_files_done{rank}, clairfs_rank_files_in_epoch{rank},
//   clairfs_rank_lead_files{rank}, clairfs_rank_lead_seconds{rank}, clairfs_rank_files_per_second{rank}
//   clairfs_rank_verdict{rank, verdict}     1 for its verdict (following, checking, off, idle), else 0
//   clairfs_rank_mispredicted_opens_total{rank}
//   clairfs_served_files_total{tier}, clairfs_served_bytes_total{tier}   page_cache, ram, nvme, peer, source
//   clairfs_source_read_bytes_total, clairfs_source_opens_total           all SOURCE traffic, staging too
//   clairfs_stall_seconds_total, clairfs_mispredicted_opens_total, clairfs_source_changed_total,
//   clairfs_staging_failures_total, clairfs_peer_timeouts_total
//   clairfs_ram_used_bytes, clairfs_ram_budget_bytes, clairfs_pagecache_used_bytes, clairfs_nvme_used_bytes,
//   clairfs_nvme_capacity_bytes, clairfs_resident_memory_bytes
// Families the mount has no number for (no staging: no ranks, no RAM tier) are left out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "util/thread_annotations.hpp"

namespace clairfs {

std::string metrics_text(const nlohmann::json& stats, const std::string& mountpoint);

// Writes `text()` to `path` every `every` (a temporary file beside it, renamed over it), and removes it
// when destroyed. A write that fails is said once in the log, then tried again each time.
class MetricsFile {
 public:
  MetricsFile(std::string path, std::function<std::string()> text, std::chrono::milliseconds every);
  ~MetricsFile();

 private:
  void run() EXCLUDES(mutex_);
  bool write_once();

  const std::string path_;
  const std::function<std::string()> text_;
  const std::chrono::milliseconds every_;
  Mutex mutex_;
  std::condition_variable wake_;
  bool stop_ GUARDED_BY(mutex_) = false;
  bool failing_ = false;  // the writing thread's
  std::thread thread_;
};

}  // namespace clairfs
