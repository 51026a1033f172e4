// The sample order of torchvision's ImageFolder (make_dataset in torchvision 0.14), computed on the
// in-memory tree so that a scan and a loaded manifest give the same ids:
//
//   classes = sorted(d.name for d in os.scandir(root) if d.is_dir())          # follows symlinks
//   for class in classes:
//     for dirpath, _, files in sorted(os.walk(root/class, followlinks=True)):  # sorted by path string
//       for f in sorted(files):                                                # non-directories
//         if f.lower().endswith(extensions): sample
//
// Python sorts str by code point, which for valid UTF-8 is byte order: std::string's order. Symlinks
// are resolved inside the tree (relative targets, and absolute ones under SOURCE). A symlink cycle would
// make os.walk repeat files until paths grow too long; we walk each directory once per path and warn.
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "clairfs/manifest.hpp"

namespace clairfs {

namespace {

// The kernel's limit on symlinks followed in one path resolution.
constexpr int kMaxSymlinkDepth = 40;

bool has_extension(std::string_view name, const std::vector<std::string>& extensions) {
  for (const auto& ext : extensions) {
    if (name.size() < ext.size()) continue;
    bool match = true;
    for (size_t i = 0; i < ext.size() && match; ++i) {
      char c = name[name.size() - ext.size() + i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      match = c == ext[i];
    }
    if (match) return true;
  }
  return false;
}

}  // namespace

EntryId Manifest::resolve_path(EntryId start_dir, std::string_view target, int depth) const {
  if (depth > kMaxSymlinkDepth) return kNoEntry;
  EntryId at = start_dir;
  if (!target.empty() && target.front() == '/') {
    // Absolute: inside only if it names SOURCE itself or something under it.
    std::string_view root = tree_->source_root;
    while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
    if (root.empty() || target.substr(0, root.size()) != root ||
        (target.size() > root.size() && target[root.size()] != '/'))
      return kNoEntry;
    target.remove_prefix(root.size());
    at = 0;
  }
  size_t pos = 0;
  while (pos <= target.size()) {
    size_t slash = target.find('/', pos);
    if (slash == std::string_view::npos) slash = target.size();
    std::string_view part = target.substr(pos, slash - pos);
    pos = slash + 1;
    if (part.empty() || part == ".") continue;
    if (!is_dir(at)) return kNoEntry;
    if (part == "..") {
      if (at == 0) return kNoEntry;  // above SOURCE
      at = tree_->entries.parent(at);
      continue;
    }
    EntryId next = lookup(at, part);
    if (next == kNoEntry) return kNoEntry;
    if (S_ISLNK(tree_->entries.mode(next))) {
      next = resolve_path(at, link_target(next), depth + 1);
      if (next == kNoEntry) return kNoEntry;
    }
    at = next;
  }
  return at;
}

EntryId Manifest::resolve(EntryId id) const {
  if (!S_ISLNK(tree_->entries.mode(id))) return id;
  return resolve_path(tree_->entries.parent(id), link_target(id), 1);
}

void Manifest::use_root(const std::string& dir, const std::vector<std::string>& extensions) {
  const EntryId top = resolve_relative(dir);
  if (top == kNoEntry || !is_dir(top))
    throw std::runtime_error("root=" + dir +
                             " is no folder in SOURCE (give the data set's folder, relative to SOURCE)");
  compute_samples(extensions, top, dir);
}

std::optional<Manifest> Manifest::with_root(const std::string& dir) const {
  if (!sample_root_ || globbed_) return std::nullopt;
  const EntryId top = resolve_relative(dir);
  if (top == kNoEntry || !is_dir(top)) return std::nullopt;
  Manifest view;
  view.tree_ = tree_;
  view.compute_samples(extensions_, top, dir);
  return view;
}

Manifest Manifest::with_samples_kept(const std::function<bool(EntryId)>& keep) const {
  Manifest view;
  view.tree_ = tree_;
  view.reset_samples(sample_root_, extensions_, globbed_);
  for (size_t i = 0; i < samples_.size(); ++i) {
    if (!keep(samples_[i])) {
      ++view.left_out_;
      continue;
    }
    const auto named = sample_paths_.find(static_cast<uint32_t>(i));
    view.add_sample(samples_[i], named != sample_paths_.end() ? std::string_view(named->second) : std::string_view());
  }
  view.left_out_ += left_out_;
  return view;
}

void Manifest::reset_samples(std::optional<std::string> root, std::vector<std::string> suffixes, bool globbed) {
  sample_root_ = std::move(root);
  extensions_ = std::move(suffixes);
  globbed_ = globbed;
  left_out_ = 0;
  samples_.clear();
  irregular_samples_ = 0;
  sample_paths_.clear();
  classes_.clear();
  warnings_.clear();
}

void Manifest::add_sample(EntryId id, std::string_view named) {
  if (!named.empty()) sample_paths_.emplace(static_cast<uint32_t>(samples_.size()), std::string(named));
  samples_.push_back(id);
  irregular_samples_ += !S_ISREG(tree_->entries.mode(id));
}

void Manifest::compute_samples(const std::vector<std::string>& extensions, EntryId top, const std::string& top_path) {
  reset_samples(top_path, extensions, false);
  auto followed_dir = [&](EntryId id) {
    EntryId r = resolve(id);
    return (r != kNoEntry && is_dir(r)) ? r : kNoEntry;
  };
  auto warn_outside = [&](EntryId id) {
    const EntryId r = resolve(id);
    if (S_ISLNK(tree_->entries.mode(id)) && r == kNoEntry && warnings_.size() < 100)
      warnings_.push_back("symlink '" + path(id) + "' leads outside SOURCE or nowhere; clairfs does not follow it");
  };

  // At most one sample per entry; the room never written costs no memory, and the block is large enough
  // for huge pages from the start (growing it would fault its first megabytes in 4 KiB pages).
  samples_.reserve(tree_->entries.size());
  const Entry root = tree_->entries[top];
  // Reached through a symlink, the folder's samples are named by the path given, not their entries'.
  const bool top_via_link = top != 0 && path(top) != top_path;
  const std::string prefix = top_path.empty() ? "" : top_path + "/";
  struct WalkDir {
    std::string path;
    EntryId dir;    // resolved directory
    bool via_link;  // reached through a symlinked directory: its path is not the entry's
  };
  std::vector<WalkDir> dirs;
  std::vector<EntryId> stack;  // resolved directories on the current walk path, for cycle detection
  for (EntryId c = root.first_child; c < root.first_child + root.child_count; ++c) {
    const EntryId class_dir = followed_dir(c);
    if (class_dir == kNoEntry) {
      warn_outside(c);
      continue;
    }
    classes_.push_back({c, samples_.size()});

    // os.walk(followlinks=True): collect every directory path reachable, then sort by path string.
    dirs.clear();
    struct Frame {
      EntryId dir;
      std::string path;
      size_t depth;
      bool via_link;
    };
    std::vector<Frame> todo = {
        {class_dir, prefix + std::string(name(c)), 0, top_via_link || S_ISLNK(tree_->entries.mode(c))}};
    stack.clear();
    while (!todo.empty()) {
      Frame f = std::move(todo.back());
      todo.pop_back();
      stack.resize(f.depth);
      stack.push_back(f.dir);
      dirs.push_back({f.path, f.dir, f.via_link});
      const Entry d = tree_->entries[f.dir];
      for (EntryId k = d.first_child + d.child_count; k-- > d.first_child;) {
        const EntryId sub = followed_dir(k);
        if (sub == kNoEntry) continue;
        if (std::find(stack.begin(), stack.end(), sub) != stack.end()) {
          if (warnings_.size() < 100)
            warnings_.push_back("symlink cycle at '" + path(k) + "': ImageFolder would list its files repeatedly; clairfs lists them once");
          continue;
        }
        todo.push_back(
            {sub, f.path + "/" + std::string(name(k)), f.depth + 1, f.via_link || S_ISLNK(tree_->entries.mode(k))});
      }
    }
    std::sort(dirs.begin(), dirs.end(), [](const WalkDir& a, const WalkDir& b) { return a.path < b.path; });
    for (const WalkDir& w : dirs) {
      const Entry d = tree_->entries[w.dir];
      for (EntryId k = d.first_child; k < d.first_child + d.child_count; ++k) {
        // A directory, or a symlink to one: os.walk lists it under dirs, not files. Most entries are
        // regular files, taken without resolving.
        const uint32_t mode = tree_->entries.mode(k);
        if (S_ISDIR(mode) || (S_ISLNK(mode) && followed_dir(k) != kNoEntry)) continue;
        if (!has_extension(name(k), extensions)) continue;
        const EntryId target = S_ISLNK(mode) ? resolve(k) : k;
        if (target == kNoEntry) warn_outside(k);
        // ImageFolder names a sample by the path it walked: through symlinked directories, and the
        // link itself for a linked file. Kept where that is not the entry's own path.
        const EntryId sample = target == kNoEntry ? k : target;
        if (w.via_link || S_ISLNK(mode))
          add_sample(sample, w.path + "/" + std::string(name(k)));
        else
          add_sample(sample);
      }
    }
  }
  samples_.shrink_to_fit();
}

}  // namespace clairfs
