// Manifest storage: accessors, the file format, and the validation that makes a loaded file safe.
//
// File layout (native little-endian; the header records the byte order and entry size):
//   Header (64 bytes) | Entry[entry_count] | names[names_size] | source root[root_len]
// The hash covers everything after the header. validate() checks every index and offset, the
// breadth-first layout and the sorted children, so lookups on a loaded manifest can trust them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "clairfs/manifest.hpp"
#include "util/fs.hpp"

namespace clairfs {

namespace {

constexpr char kMagic[8] = {'C', 'L', 'A', 'I', 'R', 'F', 'S', 'M'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kByteOrderMark = 0x01020304;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t byte_order;
  uint32_t entry_size;
  uint32_t root_len;
  uint64_t entry_count;
  uint64_t names_size;
  uint64_t hash;
  uint64_t reserved[2];
};
static_assert(sizeof(Header) == 64);

[[noreturn]] void corrupt(const std::string& why) { throw std::runtime_error("invalid manifest: " + why); }

// A fast 64-bit hash (multiply-xorshift over 8-byte words); detects truncation and corruption, not
// tampering. hash_words takes the whole words (len a multiple of 8), so a long run of them can be hashed
// in pieces; hash_end the last bytes and the final mix.
constexpr uint64_t kHashSeed = 0x9e3779b97f4a7c15ull;

// Entries put in file form, or read from it, at a time (serialize_to, read_from).
constexpr size_t kEntriesPerPiece = 4096;

uint64_t hash_words(const char* data, size_t len, uint64_t h) {
  for (size_t i = 0; i + 8 <= len; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}

uint64_t hash_end(const char* tail, size_t len, uint64_t h) {
  for (size_t i = 0; i < len; ++i) h = (h ^ static_cast<unsigned char>(tail[i])) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return h;
}

uint64_t hash_bytes(const char* data, size_t len, uint64_t h = kHashSeed) {
  const size_t whole = len & ~size_t{7};
  return hash_end(data + whole, len - whole, hash_words(data, whole, h));
}

// The checksum of a manifest's body: its entries, names and root, one after another.
uint64_t body_hash(const char* body, uint64_t entries_len, uint64_t names_len, uint64_t root_len) {
  return hash_bytes(body + entries_len + names_len, root_len,
                    hash_bytes(body + entries_len, names_len, hash_bytes(body, entries_len)));
}

// The header's checks against the bytes that follow it (`body` of them); returns the entries' length.
uint64_t checked_layout(const Header& h, uint64_t body) {
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) corrupt("not a clairfs manifest");
  if (h.version != kFormatVersion) corrupt("format version " + std::to_string(h.version) + ", expected " + std::to_string(kFormatVersion));
  if (h.byte_order != kByteOrderMark || h.entry_size != sizeof(Entry)) corrupt("written on a machine of another kind");
  if (h.entry_count > body / sizeof(Entry)) corrupt("truncated");
  const uint64_t elen = h.entry_count * sizeof(Entry);
  if (h.names_size > body - elen || h.root_len != body - elen - h.names_size) corrupt("truncated or has trailing bytes");
  return elen;
}

void write_all(int fd, const void* data, size_t len, const std::string& file) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot write manifest '" + file + "': " + std::strerror(errno));
    p += n;
    len -= static_cast<size_t>(n);
  }
}

}  // namespace

std::string_view Manifest::name(EntryId id) const {
  return view(tree_->names).substr(tree_->entries.name_off(id), tree_->entries.name_len(id));
}

std::string_view Manifest::link_target(EntryId id) const {
  return view(tree_->names)
      .substr(tree_->entries.name_off(id) + tree_->entries.name_len(id), tree_->entries.link_len(id));
}

bool Manifest::is_dir(EntryId id) const { return S_ISDIR(tree_->entries.mode(id)); }

EntryId Manifest::lookup(EntryId dir, std::string_view child) const {
  if (!S_ISDIR(tree_->entries.mode(dir))) return kNoEntry;  // before reading the rest: a file's may be late
  const Entry d = tree_->entries[dir];
  EntryId lo = d.first_child, hi = d.first_child + d.child_count;
  while (lo < hi) {
    EntryId mid = lo + (hi - lo) / 2;
    int c = name(mid).compare(child);
    if (c == 0) return mid;
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return kNoEntry;
}

std::vector<std::string_view> Manifest::components(EntryId id) const {
  std::vector<std::string_view> parts;
  while (id != 0) {
    parts.push_back(name(id));
    id = tree_->entries.parent(id);
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string Manifest::path(EntryId id) const {
  std::string out;
  for (auto part : components(id)) {
    if (!out.empty()) out += '/';
    out.append(part);
  }
  return out;
}

size_t Manifest::memory_bytes() const {
  size_t bytes = tree_->entries.memory_bytes() + tree_->names.capacity() + samples_.capacity() * sizeof(EntryId) +
                 classes_.capacity() * sizeof(SampleClass);
  for (const auto& [i, p] : sample_paths_) bytes += 48 + p.capacity();  // a node and its string
  return bytes;
}

Manifest Manifest::from_parts(std::vector<Entry> entries, std::string names,
                              const std::vector<std::string>& extensions, std::string source_root) {
  EntryTable table;
  table.reserve(entries.size());
  for (const Entry& e : entries) table.push_back(e);
  std::vector<Entry>().swap(entries);
  return from_parts(std::move(table), ReallocArray<char>(names.data(), names.size()), extensions, std::move(source_root));
}

Manifest Manifest::from_parts(EntryTable entries, ReallocArray<char> names, const std::vector<std::string>& extensions,
                              std::string source_root) {
  entries.finish();
  names.shrink_to_fit();
  Manifest m;
  m.tree_->entries = std::move(entries);
  m.tree_->names = std::move(names);
  m.tree_->source_root = std::move(source_root);
  m.validate();
  m.compute_samples(extensions);
  return m;
}

void Manifest::validate() const {
  const size_t n = tree_->entries.size();
  if (n == 0) corrupt("no root entry");
  if (n >= kNoEntry) corrupt("too many entries");
  if (!S_ISDIR(tree_->entries.mode(0)) || tree_->entries.parent(0) != 0 || tree_->entries.name_len(0) != 0)
    corrupt("entry 0 is not a root directory");
  // Every name in range first: the structure checks below compare the names of later entries.
  for (size_t i = 0; i < n; ++i) {
    const uint64_t off = tree_->entries.name_off(i);
    if (off > tree_->names.size() ||
        uint64_t{tree_->entries.name_len(i)} + tree_->entries.link_len(i) > tree_->names.size() - off)
      corrupt("entry " + std::to_string(i) + " names bytes outside the name table");
  }
  uint64_t children_total = 0;
  for (size_t i = 0; i < n; ++i) {
    const Entry e = tree_->entries[i];
    if (i != 0) {
      std::string_view nm = name(static_cast<EntryId>(i));
      if (nm.empty() || nm == "." || nm == ".." || nm.find('/') != std::string_view::npos ||
          nm.find('\0') != std::string_view::npos)
        corrupt("entry " + std::to_string(i) + " has an invalid name");
      if (e.parent >= i) corrupt("entry " + std::to_string(i) + " is not after its parent");
    }
    if (!S_ISLNK(e.mode) && e.link_len != 0) corrupt("entry " + std::to_string(i) + " has a target but is no symlink");
    if (S_ISDIR(e.mode)) {
      if (e.child_count > 0 && (e.first_child <= i || uint64_t{e.first_child} + e.child_count > n))
        corrupt("directory " + std::to_string(i) + " has children out of range");
      uint32_t subdirs = 0;
      for (uint32_t c = 0; c < e.child_count; ++c) {
        const EntryId child = e.first_child + c;
        if (tree_->entries.parent(child) != i) corrupt("entry " + std::to_string(child) + " has the wrong parent");
        if (c > 0 && !(name(child - 1) < name(child)))
          corrupt("directory " + std::to_string(i) + " has unsorted or duplicate names");
        if (S_ISDIR(tree_->entries.mode(child))) ++subdirs;
      }
      if (subdirs != e.subdir_count) corrupt("directory " + std::to_string(i) + " has a wrong subdirectory count");
      children_total += e.child_count;
    } else if (e.child_count != 0) {
      corrupt("entry " + std::to_string(i) + " has children but is no directory");
    }
  }
  if (children_total != n - 1) corrupt("entries not reachable from the root");
}

uint64_t Manifest::serialized_size() const {
  return sizeof(Header) + tree_->entries.size() * sizeof(Entry) + tree_->names.size() + tree_->source_root.size();
}

void Manifest::serialize_to(const Sink& sink) const {
  std::vector<Entry> piece;
  piece.reserve(kEntriesPerPiece);
  auto each_piece = [&](const auto& f) {
    for (size_t i = 0; i < tree_->entries.size();) {
      piece.clear();
      for (; i < tree_->entries.size() && piece.size() < kEntriesPerPiece; ++i) piece.push_back(tree_->entries[i]);
      f(reinterpret_cast<const char*>(piece.data()), piece.size() * sizeof(Entry));
    }
  };
  // The header carries the body's checksum: a first pass over the entries for it, a second to send them.
  uint64_t hv = kHashSeed;
  each_piece([&](const char* data, size_t len) { hv = hash_words(data, len, hv); });
  static_assert(sizeof(Entry) % 8 == 0, "the entries hash in whole words");
  hv = hash_end(nullptr, 0, hv);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kFormatVersion;
  h.byte_order = kByteOrderMark;
  h.entry_size = sizeof(Entry);
  h.root_len = static_cast<uint32_t>(tree_->source_root.size());
  h.entry_count = tree_->entries.size();
  h.names_size = tree_->names.size();
  h.hash = hash_bytes(tree_->source_root.data(), tree_->source_root.size(),
                      hash_bytes(tree_->names.data(), tree_->names.size(), hv));
  sink(reinterpret_cast<const char*>(&h), sizeof(h));
  each_piece(sink);
  sink(tree_->names.data(), tree_->names.size());
  sink(tree_->source_root.data(), tree_->source_root.size());
}

std::string Manifest::serialize() const {
  std::string out;
  out.reserve(serialized_size());
  serialize_to([&](const char* data, size_t len) { out.append(data, len); });
  return out;
}

std::string difference(const Entry& e, const struct stat& st) {
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if ((st.st_mode & S_IFMT) != (e.mode & S_IFMT)) return "is no longer the same kind of file";
  if (S_ISREG(e.mode) && static_cast<uint64_t>(st.st_size) != e.size)
    return "has size " + std::to_string(st.st_size) + ", the manifest says " + std::to_string(e.size);
  if (S_ISREG(e.mode) && mtime_ns != e.mtime_ns) return "was modified after it was indexed";
  return "";
}

void Manifest::save(const std::string& file, mode_t mode) const {
  ReplacingFile out(file, mode);
  if (out.error() < 0)
    throw std::runtime_error("cannot write manifest '" + file + "': " + why_not_written(out.error()));
  serialize_to([&](const char* data, size_t len) { write_all(out.fd(), data, len, file); });
  if (const int rc = out.commit(true); rc < 0)
    throw std::runtime_error("cannot write manifest '" + file + "': " + why_not_written(rc));
}

Manifest Manifest::load(const std::string& file, const std::vector<std::string>& extensions,
                        const std::string& source) {
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO: refused, not waited on
  if (!fd) throw std::runtime_error("cannot open manifest '" + file + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw std::runtime_error("cannot stat manifest '" + file + "'");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error("manifest '" + file + "' is not a regular file");
  if (make_blocking(fd.get()) < 0) throw std::runtime_error("cannot read manifest '" + file + "'");
  // Read in pieces, the entries straight into the table: the file's bytes are never held whole beside
  // the manifest (at 14.2 M entries they are 1.1 GB).
  auto read_exact = [&](char* to, size_t len) {
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::read(fd.get(), to + got, len - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error("cannot read manifest '" + file + "': " + std::strerror(errno));
      if (n == 0) corrupt("truncated");
      got += static_cast<size_t>(n);
    }
  };
  try {
    Manifest m = read_from(read_exact, static_cast<uint64_t>(st.st_size), extensions, source);
    char extra;
    if (::read(fd.get(), &extra, 1) != 0) corrupt("truncated or has trailing bytes");  // it grew as we read
    return m;
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("manifest '" + file + "': " + e.what());
  }
}

Manifest Manifest::read_from(const Source& read, uint64_t size, const std::vector<std::string>& extensions,
                             const std::string& source) {
  if (size < sizeof(Header)) corrupt("too short for a header");
  Header h;
  read(reinterpret_cast<char*>(&h), sizeof(h));
  checked_layout(h, size - sizeof(Header));
  EntryTable entries;
  entries.reserve(h.entry_count);
  std::vector<Entry> piece(static_cast<size_t>(std::min<uint64_t>(h.entry_count, kEntriesPerPiece)));  // a small index: a small buffer
  uint64_t hv = kHashSeed;
  for (uint64_t done = 0; done < h.entry_count;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), h.entry_count - done));
    read(reinterpret_cast<char*>(piece.data()), n * sizeof(Entry));
    hv = hash_words(reinterpret_cast<const char*>(piece.data()), n * sizeof(Entry), hv);
    for (size_t k = 0; k < n; ++k) entries.push_back(piece[k]);
    done += n;
  }
  hv = hash_end(nullptr, 0, hv);
  ReallocArray<char> names;
  names.resize(h.names_size);
  read(names.data(), names.size());
  std::string root(h.root_len, '\0');
  read(root.data(), root.size());
  if (hash_bytes(root.data(), root.size(), hash_bytes(names.data(), names.size(), hv)) != h.hash)
    corrupt("checksum mismatch (damaged file)");
  return from_parts(std::move(entries), std::move(names), extensions, source.empty() ? std::move(root) : source);
}

void Manifest::reseal(std::string* bytes) {
  if (bytes->size() < sizeof(Header)) return;
  Header h;
  std::memcpy(&h, bytes->data(), sizeof(h));
  const uint64_t body = bytes->size() - sizeof(Header);
  if (h.entry_count > body / sizeof(Entry)) return;
  const uint64_t elen = h.entry_count * sizeof(Entry);
  if (h.names_size > body - elen || h.root_len != body - elen - h.names_size) return;
  h.hash = body_hash(bytes->data() + sizeof(Header), elen, h.names_size, h.root_len);
  std::memcpy(bytes->data(), &h, sizeof(h));
}

Manifest Manifest::deserialize(std::string data, const std::vector<std::string>& extensions, const std::string& source) {
  size_t at = 0;
  auto read = [&](char* to, size_t len) {
    if (len > data.size() - at) corrupt("truncated");
    std::memcpy(to, data.data() + at, len);
    at += len;
  };
  return read_from(read, data.size(), extensions, source);
}

}  // namespace clairfs
