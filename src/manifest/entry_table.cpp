// The manifest's entries in memory (see EntryTable in clairfs/manifest.hpp).
#include <sys/stat.h>

#include <atomic>
#include <stdexcept>

#include "clairfs/manifest.hpp"

namespace clairfs {

namespace {
constexpr uint64_t kNameOffBits = 40;
constexpr uint32_t kAttrLimit = uint32_t{1} << 24;
// A row's size_or_dir with this bit set, or a directory's, is an index into the table of directories.
constexpr uint64_t kInDirs = uint64_t{1} << 63;
// late_ values: 0 is the row's own attributes.
constexpr uint32_t kLate = uint32_t{1} << 31;      // | LateState: not known yet, or gone
constexpr uint32_t kLateAttr = uint32_t{1} << 30;  // | the attribute index set_late() gave
static_assert(kAttrLimit <= kLateAttr);

uint32_t load(const uint32_t& v) { return std::atomic_ref<const uint32_t>(v).load(std::memory_order_acquire); }
}  // namespace

void EntryTable::AttrStore::push_back(const Attr& a) {
  if (size_ == kAttrLimit)
    throw std::runtime_error("SOURCE has more than 16,777,216 distinct combinations of mode, owner and group");
  const size_t k = chunk_of(size_);
  if (!chunks_[k]) chunks_[k].reset(new Attr[chunk_size(k)]);
  slot(size_++) = a;
}

size_t EntryTable::AttrStore::memory_bytes() const {
  size_t bytes = 0;
  for (size_t k = 0; k < kChunks && chunks_[k]; ++k) bytes += chunk_size(k) * sizeof(Attr);
  return bytes;
}

uint32_t EntryTable::attr_for(uint32_t mode, uint32_t uid, uint32_t gid) {
  const AttrKey key{uint64_t{uid} << 32 | gid, mode};
  if (!have_last_ || !(key == last_key_)) {
    auto [it, added] = attr_index_.try_emplace(key, static_cast<uint32_t>(attrs_.size()));
    if (added) attrs_.push_back({mode, uid, gid});
    have_last_ = true;
    last_key_ = key;
    last_attr_ = it->second;
  }
  return last_attr_;
}

void EntryTable::push_back_late(const Entry& e) {
  if (late_.size() == 0) late_.resize(rows_.size());  // 0: the entries before are their rows'
  Entry type_only = e;
  type_only.mode = e.mode & S_IFMT;
  type_only.uid = type_only.gid = 0;
  type_only.size = 0;
  type_only.mtime_ns = 0;
  push_back(type_only);
  late_.back() = kLate | kUnknown;
}

EntryTable::LateState EntryTable::late_state(size_t id) const {
  if (late_.size() == 0) return kKnown;
  const uint32_t v = load(late_[id]);
  return (v & kLate) ? static_cast<LateState>(v & ~kLate) : kKnown;
}

uint32_t EntryTable::attr_index(size_t id) const {
  if (late_.size() != 0)
    if (const uint32_t v = load(late_[id]); v & kLateAttr) return v & ~kLateAttr;
  return attr_of(rows_[id]);
}

void EntryTable::set_late(size_t id, const struct stat* st) {
  Row& r = rows_[id];
  uint32_t v = kLate | kGone;
  if (st && (st->st_mode & S_IFMT) == (attrs_[attr_of(r)].mode & S_IFMT) && !S_ISDIR(st->st_mode)) {
    v = kLateAttr | attr_for(st->st_mode, st->st_uid, st->st_gid);
    r.size_or_dir = static_cast<uint64_t>(st->st_size);
    r.mtime_ns = static_cast<int64_t>(st->st_mtim.tv_sec) * 1000000000 + st->st_mtim.tv_nsec;
  }
  std::atomic_ref<uint32_t>(late_[id]).store(v, std::memory_order_release);
}

void EntryTable::push_back(const Entry& e) {
  const uint32_t attr = attr_for(e.mode, e.uid, e.gid);
  if (e.name_off >> kNameOffBits) throw std::runtime_error("SOURCE's names take more than 1 TiB");
  Row r{};
  r.mtime_ns = e.mtime_ns;
  r.name = e.name_off | uint64_t{attr >> 16} << kNameOffBits | uint64_t{e.name_len} << 48;
  r.parent = e.parent;
  r.attr_low = static_cast<uint16_t>(attr & 0xffff);
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
  if (late_.size() != 0) late_.push_back(0);
}

void EntryTable::set_children(size_t dir, EntryId first_child, uint32_t child_count, uint32_t subdir_count) {
  Dir& d = dirs_[rows_[dir].size_or_dir & ~kInDirs];
  d.first_child = first_child;
  d.child_count = child_count;
  d.subdir_count = subdir_count;
}

void EntryTable::finish() {
  rows_.shrink_to_fit();
  late_.shrink_to_fit();
  dirs_.shrink_to_fit();
  if (late_.size() == 0) decltype(attr_index_)().swap(attr_index_);  // else set_late() adds to it
  have_last_ = false;
}

Entry EntryTable::operator[](size_t id) const {
  const Attr& a = attrs_[attr_index(id)];  // first: a late entry's fields are published with it
  const Row& r = rows_[id];
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
  return rows_.capacity() * sizeof(Row) + late_.capacity() * sizeof(uint32_t) + attrs_.memory_bytes() +
         dirs_.capacity() * sizeof(Dir) + attr_index_.size() * 32;
}

}  // namespace clairfs
