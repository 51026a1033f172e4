// The manifest's entries in memory (see EntryTable in clairfs/manifest.hpp).
#include <sys/stat.h>

#include <stdexcept>

#include "clairfs/manifest.hpp"

namespace clairfs {

namespace {
constexpr uint64_t kNameOffBits = 40;
constexpr uint32_t kAttrLimit = uint32_t{1} << 24;
// A row's size_or_dir with this bit set, or a directory's, is an index into the table of directories.
constexpr uint64_t kInDirs = uint64_t{1} << 63;
}  // namespace

void EntryTable::push_back(const Entry& e) {
  const AttrKey key{uint64_t{e.uid} << 32 | e.gid, e.mode};
  if (!have_last_ || !(key == last_key_)) {
    auto [it, added] = attr_index_.try_emplace(key, static_cast<uint32_t>(attrs_.size()));
    if (added) {
      if (attrs_.size() == kAttrLimit)
        throw std::runtime_error("SOURCE has more than 16,777,216 distinct combinations of mode, owner and group");
      attrs_.push_back({e.mode, e.uid, e.gid});
    }
    have_last_ = true;
    last_key_ = key;
    last_attr_ = it->second;
  }
  if (e.name_off >> kNameOffBits) throw std::runtime_error("SOURCE's names take more than 1 TiB");
  Row r{};
  r.mtime_ns = e.mtime_ns;
  r.name = e.name_off | uint64_t{last_attr_ >> 16} << kNameOffBits | uint64_t{e.name_len} << 48;
  r.parent = e.parent;
  r.attr_low = static_cast<uint16_t>(last_attr_ & 0xffff);
  r.link_len = e.link_len;
  if (S_ISDIR(e.mode)) {
    r.size_or_dir = dirs_.size();
    dirs_.push_back({e.size, e.first_child, e.child_count, e.subdir_count});
  } else {
    r.size_or_dir = e.size;
    // Only directories have children (anything else saying so is kept, for validation to refuse) and no
    // size reaches 2^63 (a loaded file's may: kept the same way).
    if (e.first_child || e.child_count || e.subdir_count || e.size >> 63) {
      r.size_or_dir = dirs_.size() | kInDirs;
      dirs_.push_back({e.size, e.first_child, e.child_count, e.subdir_count});
    }
  }
  rows_.push_back(r);
}

void EntryTable::set_children(size_t dir, EntryId first_child, uint32_t child_count, uint32_t subdir_count) {
  Dir& d = dirs_[rows_[dir].size_or_dir & ~kInDirs];
  d.first_child = first_child;
  d.child_count = child_count;
  d.subdir_count = subdir_count;
}

void EntryTable::finish() {
  rows_.shrink_to_fit();
  attrs_.shrink_to_fit();
  dirs_.shrink_to_fit();
  decltype(attr_index_)().swap(attr_index_);
  have_last_ = false;
}

Entry EntryTable::operator[](size_t id) const {
  const Row& r = rows_[id];
  const Attr& a = attrs_[attr_of(r)];
  Entry e;
  e.mtime_ns = r.mtime_ns;
  e.name_off = r.name & ((uint64_t{1} << kNameOffBits) - 1);
  e.name_len = static_cast<uint16_t>(r.name >> 48);
  e.link_len = r.link_len;
  e.mode = a.mode;
  e.uid = a.uid;
  e.gid = a.gid;
  e.parent = r.parent;
  if (S_ISDIR(a.mode) || (r.size_or_dir & kInDirs)) {
    const Dir& d = dirs_[r.size_or_dir & ~kInDirs];
    e.size = d.size;
    e.first_child = d.first_child;
    e.child_count = d.child_count;
    e.subdir_count = d.subdir_count;
  } else {
    e.size = r.size_or_dir;
  }
  return e;
}

size_t EntryTable::memory_bytes() const {
  return rows_.capacity() * sizeof(Row) + attrs_.capacity() * sizeof(Attr) + dirs_.capacity() * sizeof(Dir) +
         attr_index_.size() * 32;
}

}  // namespace clairfs
