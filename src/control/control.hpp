// The .clairfs control tree: virtual files that let any loader see what clairfs predicts.
//
//   MOUNTPOINT/.clairfs/README                   what these files are
//   MOUNTPOINT/.clairfs/stats                    the engine's counters (JSON), made afresh on each open
//   MOUNTPOINT/.clairfs/order/epoch-E/rank-R     rank R's samples in epoch E, in the order its DataLoader
//                                                loads them: one path relative to the mount root a line
//
// `.clairfs` never appears in a listing of the root (ImageFolder would take it for a class) but opens by
// name. Its inode numbers live far above the manifest's (bit 62 set), so the two never meet. A rank
// file's contents are computed from the oracle when first needed and kept in a small cache, since the
// kernel asks for the size (getattr) before it reads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"

namespace clairfs {

struct ControlAttr {
  uint64_t ino = 0;
  mode_t mode = 0;
  uint64_t size = 0;
};

struct ControlConfig {
  uint64_t start_epoch = 0;
  std::optional<uint64_t> epochs;
  std::vector<uint64_t> ranks;  // the ranks this mount serves (listed first)
  uid_t uid = 0;                // owner shown for the virtual files (SOURCE's root owner)
  gid_t gid = 0;
  std::function<std::string()> stats;  // .clairfs/stats, made afresh on each open
};

class ControlTree {
 public:
  static constexpr const char* kName = ".clairfs";

  // REQUIRES: manifest and oracle outlive the tree.
  ControlTree(const Manifest& manifest, const Oracle& oracle, ControlConfig config);

  static bool owns(uint64_t ino) { return (ino >> 62) == 1; }
  static uint64_t root_ino();

  // The child `name` of control directory `dir`; nullopt if there is none.
  std::optional<ControlAttr> lookup(uint64_t dir, std::string_view name) const;
  std::optional<ControlAttr> getattr(uint64_t ino) const;
  // A directory's entries (without "." and ".."), or nullopt if `ino` is no control directory.
  std::optional<std::vector<std::pair<std::string, ControlAttr>>> list(uint64_t dir) const;
  // True for files whose contents change (stats): served uncached, size 0 in attributes.
  static bool is_live(uint64_t ino);
  // A file's contents; nullptr if `ino` is no control file.
  std::shared_ptr<const std::string> content(uint64_t ino) const;

  const ControlConfig& config() const { return config_; }

 private:
  std::shared_ptr<const std::string> rank_file(uint64_t epoch, uint64_t rank) const;
  std::optional<ControlAttr> file_attr(uint64_t ino) const;

  const Manifest& manifest_;
  const Oracle& oracle_;
  ControlConfig config_;
  std::string readme_;

  // Recently built rank files. Guards cache_; never held while the oracle computes.
  mutable std::mutex mutex_;
  mutable std::list<std::pair<uint64_t, std::shared_ptr<const std::string>>> cache_;  // most recent first
};

}  // namespace clairfs
