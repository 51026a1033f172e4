// The manifest: an immutable index of SOURCE, built once at mount (or loaded from `clairfs index`).
//
// Entries are laid out breadth first: entry 0 is the root, and the children of every directory are
// contiguous and sorted by name (byte order), so a lookup is a binary search and a readdir is a slice.
// An entry's id is its position; the FUSE inode number is id + 1. Each entry is 56 bytes in the file
// (Entry) and 32 in memory (EntryTable), plus its name (and a symlink's target) in one shared blob.
//
// On top of the tree the manifest computes the *samples*: the files torchvision's ImageFolder would list,
// in its order (classes sorted, directories of a class walked following symlinks and visited in the order
// of their sorted path strings, file names sorted in each). Sample i is the file a DataLoader index i
// opens; the oracle speaks in sample indices. A sample names the regular file it resolves to inside
// SOURCE, or, when it resolves outside SOURCE or nowhere, the entry as walked.
//
// The on-disk form is the in-memory arrays behind a header with a hash, so loading is one read plus a
// validation pass that rejects anything that could make a lookup go out of bounds.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "clairfs/types.hpp"
#include "util/realloc_array.hpp"

namespace clairfs {

struct Entry {
  uint64_t size = 0;       // bytes; for symlinks the target's length
  int64_t mtime_ns = 0;    // nanoseconds since the epoch
  uint64_t name_off = 0;   // into the name blob; a symlink's target follows its name
  uint32_t mode = 0;       // st_mode: type and permission bits
  uint32_t uid = 0;
  uint32_t gid = 0;
  EntryId parent = 0;       // the root is its own parent
  EntryId first_child = 0;  // directories only
  uint32_t child_count = 0;
  uint16_t name_len = 0;
  uint16_t link_len = 0;
  uint32_t subdir_count = 0;  // directories: children that are directories (for st_nlink)
};
static_assert(sizeof(Entry) == 56, "Entry is part of the manifest file format");

// "" if `st` (SOURCE's file now) still describes `e` as scanned — its kind, and a regular file's size
// and mtime — else what differs, in words ("was modified after it was indexed").
std::string difference(const Entry& e, const struct stat& st);

// The entries as held in memory: 32 bytes each where an Entry takes 56. Mode, owner and group are kept
// once per distinct combination (a data set has a handful), a directory's children and size in a table
// of directories (one entry in hundreds is one). entry() gives back the Entry that was added.
class EntryTable {
 public:
  EntryTable() = default;
  EntryTable(EntryTable&&) = default;
  EntryTable& operator=(EntryTable&&) = default;

  void reserve(size_t n) { rows_.reserve(n); }
  // Throws std::runtime_error past 2^24 distinct (mode, owner, group) or 2^40 bytes of names.
  void push_back(const Entry& e);
  // A file whose attributes come later (set_late): only its type (e.mode & S_IFMT), name and parent
  // are known, and they are all another thread may read of it until then (mode() gives the type).
  void push_back_late(const Entry& e);
  // A directory's children, once they are known (the scan adds a directory before them).
  // REQUIRES: `dir` was added as a directory.
  void set_children(size_t dir, EntryId first_child, uint32_t child_count, uint32_t subdir_count);
  // Frees what only adding needed.
  void finish();
  size_t size() const { return rows_.size(); }
  // REQUIRES: the entry's attributes are known (late_state() is not kUnknown), unless none are late.
  Entry operator[](size_t id) const;
  // Its mode; of a late entry not stat-ed yet, the type alone.
  uint32_t mode(size_t id) const { return attrs_[attr_index(id)].mode; }

  // Late attributes. Any thread may ask late_state(); set_late() publishes an entry's attributes (its
  // fields written before, the state after, with release order), so a reader that sees its state
  // change may read them.
  enum LateState : uint32_t { kUnknown = 0, kKnown = 1, kGone = 2 };
  bool has_late() const { return late_.size() != 0; }
  LateState late_state(size_t id) const;
  // `st` from lstat of the entry, or nullptr: gone. A type other than the one listed counts as gone.
  // REQUIRES: calls serialized by the caller; late_state(id) is kUnknown.
  void set_late(size_t id, const struct stat* st);
  EntryId parent(size_t id) const { return rows_[id].parent; }
  uint64_t name_off(size_t id) const { return rows_[id].name & ((uint64_t{1} << 40) - 1); }
  uint16_t name_len(size_t id) const { return static_cast<uint16_t>(rows_[id].name >> 48); }
  uint16_t link_len(size_t id) const { return rows_[id].link_len; }
  size_t memory_bytes() const;

 private:
  struct Row {
    uint64_t size_or_dir;  // a directory's: its index in dirs_
    int64_t mtime_ns;
    uint64_t name;         // name_off in bits 0-39, the attribute index's high 8 bits in 40-47, name_len above
    EntryId parent;
    uint16_t attr_low;     // the attribute index's low 16 bits
    uint16_t link_len;
  };
  static_assert(sizeof(Row) == 32);
  struct Attr {
    uint32_t mode, uid, gid;
  };
  struct Dir {
    uint64_t size;
    EntryId first_child;
    uint32_t child_count, subdir_count;
  };
  static uint32_t attr_of(const Row& r) { return static_cast<uint32_t>((r.name >> 40 & 0xff) << 16 | r.attr_low); }
  // The row's attribute index, or the one set_late() gave.
  uint32_t attr_index(size_t id) const;
  // Index of (mode, uid, gid) in attrs_, added if new. Throws past kAttrLimit.
  uint32_t attr_for(uint32_t mode, uint32_t uid, uint32_t gid);
  struct AttrKey {
    uint64_t owner;  // uid << 32 | gid
    uint32_t mode;
    bool operator==(const AttrKey& o) const { return owner == o.owner && mode == o.mode; }
  };
  struct AttrHash {
    size_t operator()(const AttrKey& k) const { return std::hash<uint64_t>()(k.owner * 0x9e3779b97f4a7c15ull ^ k.mode); }
  };

  // Distinct (mode, owner, group) in chunks that never move: set_late() adds to it while other threads
  // read it. Chunk 0 holds indexes [0, kFirst), chunk k > 0 [kFirst * 2^(k-1), kFirst * 2^k).
  class AttrStore {
   public:
    static constexpr size_t kFirst = 16, kChunks = 21;  // 2^24 in all
    const Attr& operator[](size_t i) const { return slot(i); }
    size_t size() const { return size_; }
    void push_back(const Attr& a);
    size_t memory_bytes() const;

   private:
    static size_t chunk_of(size_t i) { return i < kFirst ? 0 : static_cast<size_t>(std::bit_width(i / kFirst)); }
    static size_t chunk_size(size_t k) { return k == 0 ? kFirst : kFirst << (k - 1); }
    Attr& slot(size_t i) const {
      const size_t k = chunk_of(i);
      return chunks_[k][k == 0 ? i : i - (kFirst << (k - 1))];
    }
    std::array<std::unique_ptr<Attr[]>, kChunks> chunks_;
    size_t size_ = 0;
  };

  ReallocArray<Row> rows_;
  AttrStore attrs_;
  // Entries whose attributes come later: per entry 0 (the row's own), or kLate plus a LateState, or
  // kLateAttr plus the attribute index once set_late() gave it. Empty when no entry is late. Read and
  // written through std::atomic_ref.
  ReallocArray<uint32_t> late_;
  std::vector<Dir> dirs_;
  std::unordered_map<AttrKey, uint32_t, AttrHash> attr_index_;  // while adding
  // The last combination added, found again without hashing (any value is a valid key: no sentinel).
  bool have_last_ = false;
  AttrKey last_key_{0, 0};
  uint32_t last_attr_ = 0;
};

// A data set class: a directory (or symlink to one) directly under the root.
struct SampleClass {
  EntryId entry;         // the root's child that names the class
  uint64_t first_sample;  // its samples are [first_sample, next class's first_sample)
};

class Manifest {
 public:
  // Scans SOURCE (an absolute path) once. Unreadable subdirectories are listed empty, with a warning
  // on stderr. Throws std::runtime_error if SOURCE itself cannot be read. `threads` list directories at
  // once (0: the default); the tree is the same whatever their number.
  //
  // Attributes::kLater: files listed as regular files are not stat-ed, as `find -type f` does not (at
  // millions of files that is most of a scan's time: the kernel makes an inode and a dentry for each
  // file stat-ed). Their type and names are known, so the samples are; sizes, times, modes and owners
  // come from fill_attributes() (in the background, after the mount) or ensure() (one at once).
  enum class Attributes { kNow, kLater };
  static Manifest scan(const std::string& source, const std::vector<std::string>& extensions,
                       unsigned threads = 0, Attributes files = Attributes::kNow);

  Manifest();
  ~Manifest();
  Manifest(Manifest&&) noexcept;
  Manifest& operator=(Manifest&&) noexcept;

  // --- late attributes (scan with Attributes::kLater); thread-safe ---
  // Entries whose attributes are not known yet (0: none). Until they all are, a thread other than the
  // filler reads an entry's attributes (entry(), not just mode() or names) only after ensure().
  uint64_t attributes_pending() const;
  // Whether the entry's attributes are known now (false for one gone).
  bool known(EntryId id) const { return tree_->entries.late_state(id) == EntryTable::kKnown; }
  // Whether they are still to be read (neither known nor found gone).
  bool pending(EntryId id) const { return tree_->entries.late_state(id) == EntryTable::kUnknown; }
  // Asks the fill to read these entries' attributes before the rest's (the files a job reads next);
  // those known by then are passed over. At most kWantedFirst wait: the oldest go beyond.
  static constexpr size_t kWantedFirst = 65536;
  void want_first(const std::vector<EntryId>& ids) const;
  // Makes the entry's attributes known, stat-ing it now if the fill has not reached it. False if it is
  // gone from SOURCE or no longer the type listed (its attributes are then the type alone, size 0).
  bool ensure(EntryId id) const;
  // Stats every entry whose attributes are not known, `threads` at once (0: the scan's default), until
  // all are or `stop` is set.
  void fill_attributes(const std::atomic<bool>& stop, unsigned threads = 0) const;
  // Entries found gone (or replaced) when their attributes were asked for.
  uint64_t gone_at_fill() const;

  // Loads a file written by save(). `source` is where SOURCE is now (absolute symlink targets inside it
  // stay inside); empty means where it was when indexed. Throws std::runtime_error naming the defect.
  static Manifest load(const std::string& file, const std::vector<std::string>& extensions,
                       const std::string& source = "");

  // Writes the tree (not the samples, which depend on extensions) atomically: a fresh temporary beside
  // `file`, renamed over it (ReplacingFile: no symlink followed, nothing planted written through), made
  // with `mode` (0600 by default: it names every file).
  void save(const std::string& file, mode_t mode = 0600) const;
  // The bytes save() writes, and back. deserialize() checks them like load() and throws
  // std::runtime_error naming the defect.
  std::string serialize() const;
  // The same bytes in pieces, handed to `sink` in order, serialized_size() of them in all: the index is
  // never held whole beside the manifest (1.1 GB at 14.2 M entries). save() and the broadcast to other
  // nodes use it.
  using Sink = std::function<void(const char* data, size_t len)>;
  uint64_t serialized_size() const;
  void serialize_to(const Sink& sink) const;
  // Reads `size` bytes written by serialize_to through `read` (which fills exactly `len` bytes or
  // throws), entries straight into the table, and checks them as load() does.
  using Source = std::function<void(char* to, size_t len)>;
  static Manifest read_from(const Source& read, uint64_t size, const std::vector<std::string>& extensions,
                            const std::string& source = "");
  // Recomputes the checksum in the header of serialized bytes over what follows the header, where the
  // header's sizes describe the bytes (left as they are otherwise): for the fuzzer, so that its inputs
  // reach the structure checks behind the checksum.
  static void reseal(std::string* bytes);
  static Manifest deserialize(std::string bytes, const std::vector<std::string>& extensions,
                              const std::string& source = "");

  size_t size() const { return tree_->entries.size(); }
  Entry entry(EntryId id) const { return tree_->entries[id]; }
  std::string_view name(EntryId id) const;
  std::string_view link_target(EntryId id) const;
  bool is_dir(EntryId id) const;
  // Its st_mode; the type alone while late (see ensure()).
  uint32_t mode(EntryId id) const { return tree_->entries.mode(id); }

  // The child of `dir` named `name`, or kNoEntry.
  EntryId lookup(EntryId dir, std::string_view name) const;
  // The entry a path relative to the root names, following symlinks inside SOURCE; kNoEntry if none.
  EntryId resolve_relative(std::string_view path) const { return resolve_path(0, path, 0); }
  // Path relative to the root ("" for the root itself).
  std::string path(EntryId id) const;
  // Path components from the root down to id.
  std::vector<std::string_view> components(EntryId id) const;

  // The samples become ImageFolder's of the folder `dir` (a clean path relative to the root, symlinks
  // inside SOURCE followed) instead of the root's: a job that reads ImageFolder(MOUNTPOINT/dir). Their
  // paths stay relative to the root. Throws std::runtime_error if `dir` is no folder.
  void use_root(const std::string& dir, const std::vector<std::string>& extensions);
  // The samples become the files the list `in` names, in its order (samples=FILE, sample_list.cpp: a job
  // whose Dataset is no ImageFolder walk): a JSON list of paths or of [path, label] pairs, or one path a
  // line; each relative to the root or absolute under one of `roots` (the mount point, SOURCE); a file
  // listed twice is two samples, one that is no regular file (a dangling link) an irregular one, as in
  // ImageFolder's walk. `file` names the list in errors. Throws std::runtime_error naming the first path
  // that names nothing in SOURCE or a folder, or the first thing that is no path.
  void use_samples(std::FILE* in, const std::string& file, const std::vector<std::string>& roots);

  // A view of the same tree (shared, not copied) whose samples are ImageFolder's of the folder `dir`, as
  // use_root makes them, with the extensions of this manifest's walk: a job found to read a subfolder
  // (LearningEngine). nullopt where `dir` is no folder or this manifest's samples are no walk (a list,
  // samples=, or a glob).
  std::optional<Manifest> with_root(const std::string& dir) const;
  // A view of the same tree whose samples are those of a job's sorted glob of the folder `dir`:
  // `sorted(glob(f"{dir}/**/*{suffix}", recursive=True))` for each of `suffixes` together (glob.cpp).
  // nullopt where `dir` is no folder.
  std::optional<Manifest> with_sorted_glob(const std::string& dir, const std::vector<std::string>& suffixes) const;
  // A view of the same tree whose samples are this manifest's, in their order, less those `keep` is
  // false for (left_out() of them): a walk from which a job's Dataset leaves some files out (ImageFolder's
  // is_valid_file), learned from the files the job opened (LearningEngine). Its root and suffixes are
  // this manifest's; its classes are not kept.
  Manifest with_samples_kept(const std::function<bool(EntryId)>& keep) const;
  uint64_t left_out() const { return left_out_; }
  // The folder (relative to the root, "" for the root) whose ImageFolder walk — or, globbed(), sorted glob —
  // the samples are, or nullopt when they are a list (samples=).
  const std::optional<std::string>& sample_root() const { return sample_root_; }
  bool globbed() const { return globbed_; }
  // The extensions of the walk (lower case), or the suffixes of the glob (as matched).
  const std::vector<std::string>& sample_suffixes() const { return extensions_; }

  const ReallocArray<EntryId>& samples() const { return samples_; }
  // Samples that are no regular file (a link that leads nowhere, a FIFO named like an image): none, as
  // a rule, and then a walk over millions of samples need not look at each.
  uint64_t irregular_samples() const { return irregular_samples_; }
  // The path ImageFolder gives sample i (relative to the root): through the symlinks it walked, which
  // is not path(samples()[i]) for a sample reached through a symlinked directory or a linked file.
  std::string sample_path(size_t i) const {
    auto it = sample_paths_.find(static_cast<uint32_t>(i));
    return it != sample_paths_.end() ? it->second : path(samples_[i]);
  }
  const std::vector<SampleClass>& classes() const { return classes_; }
  // Warnings from the sample walk (symlink cycles, symlinks leaving SOURCE).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Total bytes held for the index (entries, names, samples).
  size_t memory_bytes() const;

  // Builders used by scan(); public for unit tests that build trees without a file system.
  // REQUIRES: entries in breadth-first layout as described above.
  static Manifest from_parts(std::vector<Entry> entries, std::string names,
                             const std::vector<std::string>& extensions, std::string source_root);
  static Manifest from_parts(EntryTable entries, ReallocArray<char> names, const std::vector<std::string>& extensions,
                             std::string source_root);

 private:
  void validate() const;  // throws std::runtime_error
  // ImageFolder's samples of the folder `top`, whose path ImageFolder is given is `top_path` (relative to
  // the root; "" for the root).
  void compute_samples(const std::vector<std::string>& extensions, EntryId top = 0, const std::string& top_path = "");
  // No samples yet, to be those of `root`'s walk or glob (nullopt: a list) with `suffixes`.
  void reset_samples(std::optional<std::string> root, std::vector<std::string> suffixes, bool globbed);
  // The next sample: `id` (a file, or a link that leads nowhere or a FIFO: irregular), named `named` where
  // that is not its entry's own path (empty: its own) — through a symlink the walk or the list went by.
  void add_sample(EntryId id, std::string_view named = {});
  // A sorted glob's samples of the folder `top` (with_sorted_glob).
  void compute_glob_samples(EntryId top, const std::string& top_path, const std::vector<std::string>& suffixes);
  // Follows symlinks (up to 40, like the kernel) from `id`; kNoEntry if it leaves SOURCE or dangles.
  EntryId resolve(EntryId id) const;
  EntryId resolve_path(EntryId start_dir, std::string_view target, int depth) const;
  // Whether `path` (relative to the root) is the entry's own path, no symlink on the way.
  bool names(EntryId id, std::string_view path) const;

  struct LateFill;
  // Publishes an entry's attributes (nullptr: gone) unless another thread did.
  void set_late(EntryId id, const struct stat* st) const;

  // The tree, shared by a manifest and the views made of it (with_root): only the samples are a view's.
  struct Tree {
    Tree();
    ~Tree();
    mutable EntryTable entries;      // mutable: late attributes are set by ensure() and fill_attributes()
    std::unique_ptr<LateFill> late;  // with late attributes: SOURCE and the fill's state
    ReallocArray<char> names;
    std::string source_root;  // absolute SOURCE, to resolve absolute symlink targets that stay inside
  };
  std::shared_ptr<Tree> tree_;
  ReallocArray<EntryId> samples_;
  uint64_t irregular_samples_ = 0;
  std::unordered_map<uint32_t, std::string> sample_paths_;  // sample_path where it is not the entry's
  std::vector<SampleClass> classes_;
  std::vector<std::string> warnings_;
  std::optional<std::string> sample_root_;  // compute_samples's folder; nullopt after use_samples
  std::vector<std::string> extensions_;     // and the extensions it walked with (a glob's suffixes)
  bool globbed_ = false;                    // the samples are a sorted glob's (compute_glob_samples)
  uint64_t left_out_ = 0;                   // samples of that walk or glob left out (with_samples_kept)
};

}  // namespace clairfs
