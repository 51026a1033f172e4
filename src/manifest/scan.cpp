// The one scan of SOURCE: a breadth-first walk that never follows symlinks (they are recorded as
// symlinks, with their targets), so the tree is exactly what lstat sees. Directories are opened beneath
// the SOURCE descriptor without following symlinks, so a directory swapped for a symlink while we scan
// cannot lead the scan outside SOURCE.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "clairfs/manifest.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

struct Child {
  std::string name;
  struct stat st;
  std::string target;
};

Entry entry_from_stat(const struct stat& st) {
  Entry e;
  e.mode = st.st_mode;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  e.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return e;
}

// Reads the names and lstat data of one directory's entries. Returns -errno on failure to list.
int list_directory(int dir_fd, std::vector<Child>& out) {
  int fd = ::dup(dir_fd);
  if (fd < 0) return -errno;
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  for (;;) {
    errno = 0;
    dirent* d = ::readdir(dir);
    if (!d) break;
    if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
    Child c;
    c.name = d->d_name;
    if (::fstatat(dir_fd, d->d_name, &c.st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed while we listed
      log_warning("cannot stat '" + c.name + "': " + std::strerror(errno) + "; left out");
      continue;
    }
    if (S_ISLNK(c.st.st_mode)) {
      char buf[PATH_MAX];
      ssize_t n = ::readlinkat(dir_fd, d->d_name, buf, sizeof(buf));
      if (n < 0) continue;
      c.target.assign(buf, static_cast<size_t>(n));
      c.st.st_size = n;
    }
    out.push_back(std::move(c));
  }
  int err = errno;
  ::closedir(dir);
  return err ? -err : 0;
}

// What the scan accumulates, grown in chunks: a vector that doubles holds its old and new arrays at
// once (up to three times what it keeps: 1.4 GB for the entries of 14 M files), chunks never more than
// one chunk beyond. take() makes the manifest's table, chunk by chunk, freeing each.
class ChunkedEntries {
 public:
  void push_back(const Entry& e) {
    if (chunks_.empty() || chunks_.back().size() == kPerChunk) chunks_.emplace_back().reserve(kPerChunk);
    chunks_.back().push_back(e);
    ++size_;
  }
  Entry& operator[](size_t i) { return chunks_[i / kPerChunk][i % kPerChunk]; }
  size_t size() const { return size_; }
  EntryTable take() {
    EntryTable out;
    out.reserve(size_);
    for (auto& c : chunks_) {
      for (const Entry& e : c) out.push_back(e);
      std::vector<Entry>().swap(c);
    }
    return out;
  }

 private:
  static constexpr size_t kPerChunk = 1 << 18;  // 14 MiB of entries
  std::vector<std::vector<Entry>> chunks_;
  size_t size_ = 0;
};

// The names (each followed by a symlink's target), the same way; a name never spans two chunks.
class ChunkedNames {
 public:
  // Appends a name and its target; returns where they start in the whole.
  uint64_t append(std::string_view name, std::string_view target) {
    const size_t need = name.size() + target.size();
    if (chunks_.empty() || chunks_.back().size() + need > kPerChunk) {
      base_.push_back(size_);
      chunks_.emplace_back().reserve(std::max(kPerChunk, need));
    }
    const uint64_t at = size_;
    chunks_.back().append(name).append(target);
    size_ += need;
    return at;
  }
  std::string_view view(uint64_t at, size_t len) const {
    const size_t c = static_cast<size_t>(std::upper_bound(base_.begin(), base_.end(), at) - base_.begin()) - 1;
    return std::string_view(chunks_[c]).substr(at - base_[c], len);
  }
  std::string take() {
    std::string out;
    out.reserve(size_);
    for (auto& c : chunks_) {
      out += c;
      std::string().swap(c);
    }
    return out;
  }

 private:
  static constexpr size_t kPerChunk = 4 << 20;
  std::vector<std::string> chunks_;
  std::vector<uint64_t> base_;  // where each chunk starts in the whole
  uint64_t size_ = 0;
};

}  // namespace

Manifest Manifest::scan(const std::string& source, const std::vector<std::string>& extensions) {
  UniqueFd root(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) throw std::runtime_error("cannot open SOURCE '" + source + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(root.get(), &st) != 0) throw std::runtime_error("cannot stat SOURCE '" + source + "'");

  ChunkedEntries entries;
  ChunkedNames names;
  entries.push_back(entry_from_stat(st));

  std::vector<Child> children;
  std::vector<std::string_view> parts;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!S_ISDIR(entries[i].mode)) continue;
    children.clear();
    parts.clear();
    for (size_t id = i; id != 0; id = entries[id].parent)
      parts.push_back(names.view(entries[id].name_off, entries[id].name_len));
    std::reverse(parts.begin(), parts.end());
    int rc = open_beneath(root.get(), parts, O_RDONLY | O_DIRECTORY);
    if (rc >= 0) {
      UniqueFd dir(rc);
      rc = list_directory(dir.get(), children);
    }
    if (rc < 0) {
      if (i == 0) throw std::runtime_error("cannot read SOURCE '" + source + "': " + std::strerror(-rc));
      std::string where;
      for (auto p : parts) where += (where.empty() ? "" : "/") + std::string(p);
      log_warning("cannot read directory '" + where + "' in SOURCE: " + std::strerror(-rc) + "; shown empty");
      children.clear();
    }
    std::sort(children.begin(), children.end(), [](const Child& a, const Child& b) { return a.name < b.name; });
    if (entries.size() + children.size() >= kNoEntry) throw std::runtime_error("SOURCE has too many entries (2^32)");
    entries[i].first_child = static_cast<EntryId>(entries.size());
    entries[i].child_count = static_cast<uint32_t>(children.size());
    for (const Child& c : children) {
      Entry e = entry_from_stat(c.st);
      e.parent = static_cast<EntryId>(i);
      e.name_len = static_cast<uint16_t>(c.name.size());
      e.link_len = static_cast<uint16_t>(c.target.size());
      e.name_off = names.append(c.name, c.target);
      if (S_ISDIR(e.mode)) ++entries[i].subdir_count;
      entries.push_back(e);
    }
  }
  return from_parts(entries.take(), names.take(), extensions, source);
}

}  // namespace clairfs
