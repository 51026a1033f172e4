// The samples of a job whose Dataset is a sorted glob of a folder:
//
//   samples = sorted(glob.glob(f"{root}/**/*.jpg", recursive=True))
//
// Python's glob lists every name under `root` (through symlinked folders) but those starting with '.',
// neither descending into such folders; `*.jpg` is matched with case (on Linux). `sorted` orders the
// paths as strings. Within a folder every path starts with the same prefix, so the order of two
// children's paths is that of their names, a folder's with '/' after it ("a-b.jpg" < "a/x.jpg", since
// '-' < '/'): a walk that visits each folder's children in that order lists the paths sorted, and no
// path is ever made whole (at 14 M files that would be a gigabyte of strings).
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "clairfs/manifest.hpp"

namespace clairfs {

namespace {

// Whether `a` (with '/' after it if `a_dir`) sorts before `b` (the same), byte by byte.
bool before(std::string_view a, bool a_dir, std::string_view b, bool b_dir) {
  const size_t a_len = a.size() + a_dir, b_len = b.size() + b_dir;
  for (size_t i = 0; i < a_len && i < b_len; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : '/';
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : '/';
    if (x != y) return x < y;
  }
  return a_len < b_len;
}

bool matches(std::string_view name, const std::vector<std::string>& suffixes) {
  return std::any_of(suffixes.begin(), suffixes.end(), [&](const std::string& s) { return name.ends_with(s); });
}

}  // namespace

std::optional<Manifest> Manifest::with_sorted_glob(const std::string& dir,
                                                   const std::vector<std::string>& suffixes) const {
  const EntryId top = resolve_relative(dir);
  if (top == kNoEntry || !is_dir(top) || suffixes.empty()) return std::nullopt;
  Manifest view;
  view.tree_ = tree_;
  view.compute_glob_samples(top, dir, suffixes);
  return view;
}

void Manifest::compute_glob_samples(EntryId top, const std::string& top_path,
                                    const std::vector<std::string>& suffixes) {
  reset_samples(top_path, suffixes, true);
  samples_.reserve(tree_->entries.size());
  struct Child {
    EntryId entry;
    EntryId dir;  // the folder it is or leads to; kNoEntry for a file
  };
  struct Level {
    std::vector<Child> children;  // in the order of their paths
    size_t next = 0;
    size_t path_size = 0;   // `path`'s length at this folder
    bool via_link = false;  // reached through a symlinked folder: its paths are not the entries'
  };
  auto children_of = [&](EntryId dir) {
    std::vector<Child> out;
    const Entry d = tree_->entries[dir];
    for (EntryId k = d.first_child; k < d.first_child + d.child_count; ++k) {
      const std::string_view n = name(k);
      if (n.empty() || n.front() == '.') continue;  // glob leaves out names starting with '.'
      const uint32_t mode = tree_->entries.mode(k);
      EntryId sub = kNoEntry;
      if (S_ISDIR(mode)) sub = k;
      if (S_ISLNK(mode))
        if (const EntryId r = resolve(k); r != kNoEntry && is_dir(r)) sub = r;
      out.push_back({k, sub});
    }
    std::sort(out.begin(), out.end(), [&](const Child& a, const Child& b) {
      return before(name(a.entry), a.dir != kNoEntry, name(b.entry), b.dir != kNoEntry);
    });
    return out;
  };
  std::string path = top_path;          // the folder's path as glob gives it
  std::vector<EntryId> walked = {top};  // the folders on the way down, for symlink cycles
  std::vector<Level> levels;
  levels.push_back({children_of(top), 0, path.size(), top != 0 && this->path(top) != top_path});
  while (!levels.empty()) {
    Level& at = levels.back();
    if (at.next == at.children.size()) {
      levels.pop_back();
      walked.pop_back();
      continue;
    }
    const Child c = at.children[at.next++];
    path.resize(at.path_size);
    if (!path.empty()) path += '/';
    path.append(name(c.entry));
    const bool via_link = at.via_link || S_ISLNK(tree_->entries.mode(c.entry));
    if (c.dir != kNoEntry) {
      if (std::find(walked.begin(), walked.end(), c.dir) != walked.end()) {
        if (warnings_.size() < 100)
          warnings_.push_back("symlink cycle at '" + this->path(c.entry) +
                              "': a glob would list its files repeatedly; clairfs lists them once");
        continue;
      }
      walked.push_back(c.dir);
      const size_t size = path.size();
      levels.push_back({children_of(c.dir), 0, size, via_link});  // (`at` is not used after this)
      continue;
    }
    if (!matches(name(c.entry), suffixes)) continue;
    const uint32_t mode = tree_->entries.mode(c.entry);
    const EntryId target = S_ISLNK(mode) ? resolve(c.entry) : c.entry;
    add_sample(target == kNoEntry ? c.entry : target, via_link ? std::string_view(path) : std::string_view());
  }
  samples_.shrink_to_fit();
}

}  // namespace clairfs
