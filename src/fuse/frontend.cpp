// One handler per operation, each ending in exactly one fuse_reply_* (libfuse's passthrough_hp is the
// model). Errors go through reply_error(), the one place that counts them and replies.
//
// Inode numbers are manifest ids + 1 (the root, id 0, is FUSE_ROOT_ID). They never change while mounted
// and need no reference counting, so forget is a no-op for them; it counts only the renderings of the
// live control files (control/control.hpp). Directory offsets: 1 is ".", 2 is "..", and
// child k of a directory is offset k + 3.
#include "fuse/frontend.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include "fuse/page_cache.hpp"
#include "util/fs.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

Frontend& self(fuse_req_t req) { return *static_cast<Frontend*>(fuse_req_userdata(req)); }

// The calling serving thread's memory (trivially destructible: nothing is registered at its first use).
thread_local Frontend::ThreadMemory* thread_memory = nullptr;

// The largest read the kernel sends: 256 pages, as libfuse's INIT asks.
constexpr size_t kLargestRead = size_t{256} << 12;

constexpr fuse_ino_t to_ino(EntryId id) { return Frontend::ino_of(id); }

}  // namespace

// A request handler whose allocation fails (the address space limited under the daemon) answers ENOMEM
// rather than let std::bad_alloc unwind through libfuse's C frames, which ends the daemon; the engine
// gives memory back for the next requests.
template <auto F>
struct Guarded;
template <class... A, void (*F)(fuse_req_t, A...)>
struct Guarded<F> {
  static void call(fuse_req_t req, A... a) {
    try {
      F(req, a...);
    } catch (const std::bad_alloc&) {
      Frontend& fe = self(req);
      fuse_reply_err(req, ENOMEM);
      fe.engine_.low_on_memory();
    }
  }
};

struct Handlers {
  static bool valid(const Frontend& fe, fuse_ino_t ino) { return ino >= 1 && ino <= fe.manifest_.size(); }
  static EntryId id_of(fuse_ino_t ino) { return static_cast<EntryId>(ino - 1); }

  static void reply_error(fuse_req_t req, int err) {
    Frontend& fe = self(req);
    if (err == EROFS) fe.erofs_++;
    else if (err != ENOENT && err != ENOSYS && err != ENODATA) fe.errors_++;
    fuse_reply_err(req, err);
  }

  // REQUIRES: the entry's attributes are known (ensure()).
  static void fill_stat(const Frontend& fe, EntryId id, struct stat* st) {
    const Entry& e = fe.manifest_.entry(id);
    std::memset(st, 0, sizeof(*st));
    st->st_ino = to_ino(id);
    st->st_mode = e.mode;
    st->st_nlink = S_ISDIR(e.mode) ? 2 + e.subdir_count : 1;
    st->st_uid = e.uid;
    st->st_gid = e.gid;
    st->st_size = static_cast<off_t>(e.size);
    st->st_blksize = 4096;
    st->st_blocks = static_cast<blkcnt_t>((e.size + 511) / 512);
    st->st_mtim.tv_sec = e.mtime_ns / 1000000000;
    st->st_mtim.tv_nsec = e.mtime_ns % 1000000000;
    if (st->st_mtim.tv_nsec < 0) {
      st->st_mtim.tv_nsec += 1000000000;
      st->st_mtim.tv_sec -= 1;
    }
    st->st_atim = st->st_mtim;
    st->st_ctim = st->st_mtim;
  }

  // REQUIRES: as fill_stat.
  static void fill_entry(const Frontend& fe, EntryId id, fuse_entry_param* ep) {
    std::memset(ep, 0, sizeof(*ep));
    ep->ino = to_ino(id);
    ep->generation = 1;
    ep->attr_timeout = fe.config_.attr_timeout;
    ep->entry_timeout = fe.config_.entry_timeout;
    fill_stat(fe, id, &ep->attr);
  }

  // The .clairfs control files: same owner and times as the root, their own modes and sizes.
  static void fill_control_stat(const Frontend& fe, const ControlAttr& a, struct stat* st) {
    fill_stat(fe, 0, st);
    st->st_ino = a.ino;
    st->st_mode = a.mode;
    st->st_nlink = S_ISDIR(a.mode) ? 2 : 1;
    st->st_size = static_cast<off_t>(a.size);
    st->st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
    if (a.mtime_ns != 0) {
      st->st_mtim.tv_sec = a.mtime_ns / 1000000000;
      st->st_mtim.tv_nsec = a.mtime_ns % 1000000000;
      st->st_ctim = st->st_mtim;
    }
  }

  static void fill_control_entry(const Frontend& fe, const ControlAttr& a, fuse_entry_param* ep) {
    std::memset(ep, 0, sizeof(*ep));
    ep->ino = a.ino;
    ep->generation = 1;
    ep->attr_timeout = fe.config_.attr_timeout;
    // A live file's name is asked for at every path walk: that is how its readers meet new renderings.
    ep->entry_timeout = ControlTree::is_live(a.ino) ? 0.0 : fe.config_.entry_timeout;
    fill_control_stat(fe, a, &ep->attr);
  }

  static void reply_control_entry(fuse_req_t req, const std::optional<ControlAttr>& a) {
    Frontend& fe = self(req);
    fuse_entry_param ep;
    if (!a) {
      std::memset(&ep, 0, sizeof(ep));
      ep.entry_timeout = fe.config_.entry_timeout;
    } else {
      fill_control_entry(fe, *a, &ep);
    }
    // The lookup the tree counted is not the kernel's when the reply did not reach it (an interrupted
    // lookup): no forget would come for it.
    if (fuse_reply_entry(req, &ep) != 0 && a) fe.control_.forget(a->ino, 1);
  }

  static void init(void* userdata, fuse_conn_info* conn) {
    Frontend& fe = *static_cast<Frontend*>(userdata);
    // The data set is immutable while mounted: let the kernel cache symlink targets and directory
    // listings, and look up names in one directory in parallel.
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    // Every listing with attributes (not only a directory's first): the kernel makes the listed files'
    // inodes, so pages can be pushed to them before their readers look them up.
    if (fe.config_.list_with_inodes) conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    if (fe.config_.acls) {
      if (conn->capable & FUSE_CAP_POSIX_ACL) {
        conn->want |= FUSE_CAP_POSIX_ACL;
        fe.acls_ = true;
      } else {
        log_warning("this kernel cannot check POSIX ACLs of FUSE files; only SOURCE's mode bits are checked");
      }
    }
    if (fe.config_.no_open) {
      if (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) fe.no_open_ = true;
      else log_warning("this kernel cannot open FUSE files without asking the daemon (no-open support); opens are sent as with progress=opens");
    }
    fe.initialised_ = true;
  }

  // The mount's owner (the daemon's user) and root see live control files fresh; others a recent copy.
  static ControlTree::Reader reader_of(fuse_req_t req) {
    const uid_t uid = fuse_req_ctx(req)->uid;
    return uid == 0 || uid == ::getuid() ? ControlTree::Reader::kOwner : ControlTree::Reader::kOther;
  }

  static void lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    Frontend& fe = self(req);
    if (ControlTree::owns(parent)) return reply_control_entry(req, fe.control_.lookup(parent, name, reader_of(req)));
    if (parent == FUSE_ROOT_ID && std::strcmp(name, ControlTree::kName) == 0)
      return reply_control_entry(req, fe.control_.getattr(ControlTree::root_ino()));
    if (!valid(fe, parent)) return reply_error(req, ESTALE);
    if (!fe.manifest_.is_dir(id_of(parent))) return reply_error(req, ENOTDIR);
    const fuse_ctx* caller = fuse_req_ctx(req);
    fe.engine_.caller(caller->pid, caller->uid);  // whose its open will be, while the opener is there
    const EntryId child = fe.manifest_.lookup(id_of(parent), name);
    fuse_entry_param ep;
    // A file gone from SOURCE before its attributes were read (a scan that left them for later) is
    // not there any more.
    if (child == kNoEntry || !fe.manifest_.ensure(child)) {
      // A negative entry (ino 0) lets the kernel cache the miss for entry_timeout.
      std::memset(&ep, 0, sizeof(ep));
      ep.entry_timeout = fe.config_.entry_timeout;
      fuse_reply_entry(req, &ep);
      return;
    }
    fill_entry(fe, child, &ep);
    if (fuse_reply_entry(req, &ep) == 0 && fe.config_.introduced) fe.config_.introduced(child);
  }

  static void forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
    if (ControlTree::owns(ino)) self(req).control_.forget(ino, n);
    fuse_reply_none(req);
  }
  static void forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
    for (size_t i = 0; i < count; ++i)
      if (ControlTree::owns(forgets[i].ino)) self(req).control_.forget(forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
  }
  // The kernel's answer to a probe of its page cache (FusePageCache::probe, the only retrieve sent).
  static void retrieve_reply(fuse_req_t req, void* cookie, fuse_ino_t ino, off_t, fuse_bufvec* bufv) {
    FusePageCache::retrieved(cookie, ino, fuse_buf_size(bufv));
    fuse_reply_none(req);
  }

  static void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    Frontend& fe = self(req);
    struct stat st;
    if (ControlTree::owns(ino)) {
      auto a = fe.control_.getattr(ino);
      if (!a) return reply_error(req, ESTALE);
      fill_control_stat(fe, *a, &st);
      return (void)fuse_reply_attr(req, &st, fe.config_.attr_timeout);
    }
    if (!valid(fe, ino)) return reply_error(req, ESTALE);
    if (!fe.manifest_.ensure(id_of(ino))) return reply_error(req, ESTALE);
    fill_stat(fe, id_of(ino), &st);
    fuse_reply_attr(req, &st, fe.config_.attr_timeout);
  }

  static void readlink(fuse_req_t req, fuse_ino_t ino) {
    Frontend& fe = self(req);
    if (!valid(fe, ino)) return reply_error(req, ESTALE);
    if (!S_ISLNK(fe.manifest_.mode(id_of(ino)))) return reply_error(req, EINVAL);
    const std::string target(fe.manifest_.link_target(id_of(ino)));
    fuse_reply_readlink(req, target.c_str());
  }

  static void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Frontend& fe = self(req);
    if (ControlTree::owns(ino)) {
      if (!fe.control_.list(ino)) return reply_error(req, ENOTDIR);
    } else {
      if (!valid(fe, ino)) return reply_error(req, ESTALE);
      if (!fe.manifest_.is_dir(id_of(ino))) return reply_error(req, ENOTDIR);
    }
    fi->cache_readdir = 1;  // listings never change
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
  }

  static void releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

  static void readdir_control(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, bool plus) {
    Frontend& fe = self(req);
    auto entries = fe.control_.list(ino);
    if (!entries) return reply_error(req, ENOTDIR);
    std::vector<char> buf(size);
    size_t used = 0;
    for (uint64_t p = static_cast<uint64_t>(offset); p < 2 + entries->size(); ++p) {
      struct stat st {};
      std::string name = p == 0 ? "." : p == 1 ? ".." : (*entries)[p - 2].first;
      st.st_ino = p < 2 ? ino : (*entries)[p - 2].second.ino;
      st.st_mode = p < 2 ? S_IFDIR : (*entries)[p - 2].second.mode;
      // No attributes, also for readdirplus (ino 0 there): a rank file's size costs a full order.
      size_t need;
      if (plus) {
        fuse_entry_param ep;
        std::memset(&ep, 0, sizeof(ep));
        ep.attr = st;
        need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &ep,
                                      static_cast<off_t>(p + 1));
      } else {
        need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, static_cast<off_t>(p + 1));
      }
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.data(), used);
  }

  static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, bool plus) {
    Frontend& fe = self(req);
    if (ControlTree::owns(ino)) return readdir_control(req, ino, size, offset, plus);
    if (!valid(fe, ino)) return reply_error(req, ESTALE);
    const EntryId dir = id_of(ino);
    const Entry& d = fe.manifest_.entry(dir);
    std::vector<char> buf(size);
    size_t used = 0;
    std::vector<EntryId> given;  // full entries: the kernel makes their inodes
    // Position p: 0 ".", 1 "..", 2+k child k. The offset we hand out for an entry is its position + 1.
    for (uint64_t p = static_cast<uint64_t>(offset); p < 2ull + d.child_count; ++p) {
      EntryId id;
      std::string name;
      if (p == 0) { id = dir; name = "."; }
      else if (p == 1) { id = d.parent; name = ".."; }
      else { id = d.first_child + static_cast<EntryId>(p - 2); name = fe.manifest_.name(id); }
      size_t need;
      if (plus && !fe.manifest_.known(id)) {
        // Attributes not read yet (or the file is gone): the name and type alone, as for control
        // files; the kernel looks it up when it needs more.
        fuse_entry_param ep;
        std::memset(&ep, 0, sizeof(ep));
        ep.attr.st_ino = to_ino(id);
        ep.attr.st_mode = fe.manifest_.mode(id);
        need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &ep,
                                      static_cast<off_t>(p + 1));
      } else if (plus) {
        fuse_entry_param ep;
        fill_entry(fe, id, &ep);
        if (p < 2) ep.ino = 0, ep.attr.st_ino = to_ino(id);  // no lookup count taken for . and ..
        need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &ep,
                                      static_cast<off_t>(p + 1));
      } else {
        struct stat st {};
        st.st_ino = to_ino(id);
        st.st_mode = fe.manifest_.mode(id);
        need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, static_cast<off_t>(p + 1));
      }
      if (need > size - used) break;
      used += need;
      if (plus && p >= 2 && fe.manifest_.known(id) && fe.config_.introduced) given.push_back(id);
    }
    // Told once the kernel has the entries: a push before would be refused.
    if (fuse_reply_buf(req, buf.data(), used) == 0)
      for (EntryId id : given) fe.config_.introduced(id);
  }

  static void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    readdir_common(req, ino, size, off, false);
  }
  static void readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    readdir_common(req, ino, size, off, true);
  }

  static void open_control(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Frontend& fe = self(req);
    auto content = fe.control_.content(ino);
    if (!content) return reply_error(req, fe.control_.list(ino) ? EISDIR : ESTALE);
    auto* held = new std::shared_ptr<const ControlFile>(std::move(content));
    fi->fh = reinterpret_cast<uint64_t>(held);
    fi->keep_cache = 1;  // a rank file's contents are a pure function of its name, a rendering's fixed
    fi->noflush = 1;
    if (fuse_reply_open(req, fi) == -ENOENT) delete held;
  }

  static void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    Frontend& fe = self(req);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) return reply_error(req, EROFS);
    // The kernel takes ENOSYS as "open files yourself" and asks no more (the mount is read-only, so it
    // refuses writers itself). Files are read by inode from then on.
    if (fe.no_open_) return reply_error(req, ENOSYS);
    if (ControlTree::owns(ino)) return open_control(req, ino, fi);
    if (!valid(fe, ino)) return reply_error(req, ESTALE);
    const uint32_t mode = fe.manifest_.mode(id_of(ino));
    if (S_ISDIR(mode)) return reply_error(req, EISDIR);
    if (!S_ISREG(mode)) return reply_error(req, ENXIO);  // FIFOs, sockets, devices are not served
    uint64_t handle = 0;
    if (int rc = fe.engine_.open(id_of(ino), fuse_req_ctx(req)->pid, &handle); rc < 0) return reply_error(req, -rc);
    fi->fh = handle;
    fi->keep_cache = 1;  // contents never change while mounted
    fi->noflush = 1;     // nothing to flush on close
    if (fuse_reply_open(req, fi) == -ENOENT) fe.engine_.release(handle);  // the opener was interrupted
  }

  static void reply_control_read(fuse_req_t req, const ControlFile& file, size_t size, off_t off) {
    std::string own;
    std::string& scratch = thread_memory ? thread_memory->text() : own;
    const std::string_view bytes = file.read(static_cast<uint64_t>(off), size, scratch);
    fuse_reply_buf(req, bytes.data(), bytes.size());
  }

  // Reads up to `size` bytes into the thread's read buffer (or one of its own for this read) with
  // `read_into`, and answers with them or its error.
  template <class ReadInto>
  static void reply_read(fuse_req_t req, size_t size, ReadInto read_into) {
    std::unique_ptr<char[]> own;
    char* const buf = thread_memory ? thread_memory->read_bytes(size) : (own.reset(new char[size]), own.get());
    HeldPiece held;  // (the bytes it points into kept until the reply is written)
    const ssize_t n = read_into(buf, &held);
    if (n < 0) return reply_error(req, static_cast<int>(-n));
    fuse_reply_buf(req, held.at ? held.at : buf, static_cast<size_t>(n));
  }

  static void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    Frontend& fe = self(req);
    if (fi->fh == 0) return read_unopened(req, ino, size, off);
    if (ControlTree::owns(ino)) {
      // Our own reference for the reply: once the kernel has the reply it may send the RELEASE, which
      // another thread handles while this one is still returning from writev.
      const std::shared_ptr<const ControlFile> file = *reinterpret_cast<std::shared_ptr<const ControlFile>*>(fi->fh);
      return reply_control_read(req, *file, size, off);
    }
    reply_read(req, size, [&](char* buf, HeldPiece* held) { return fe.engine_.read(fi->fh, buf, size, off, held); });
  }

  // A read of a file the kernel opened itself (no-open mode): no handle, so by inode.
  static void read_unopened(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off) {
    Frontend& fe = self(req);
    if (ControlTree::owns(ino)) {
      const std::shared_ptr<const ControlFile> file = fe.control_.content(ino);
      if (!file) return reply_error(req, fe.control_.list(ino) ? EISDIR : ESTALE);
      return reply_control_read(req, *file, size, off);
    }
    if (!valid(fe, ino)) return reply_error(req, ESTALE);
    if (!S_ISREG(fe.manifest_.mode(id_of(ino)))) return reply_error(req, EISDIR);
    const pid_t pid = fuse_req_ctx(req)->pid;
    reply_read(req, size, [&](char* buf, HeldPiece* held) {
      return fe.engine_.read_unopened(id_of(ino), pid, buf, size, off, held);
    });
  }

  static void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    if (ControlTree::owns(ino)) delete reinterpret_cast<std::shared_ptr<const ControlFile>*>(fi->fh);
    else self(req).engine_.release(fi->fh);
    fuse_reply_err(req, 0);
  }

  // Nothing to flush. Files opened through us say so (noflush); for those the kernel opened itself,
  // ENOSYS makes it stop sending a flush on every close.
  static void flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { reply_error(req, ENOSYS); }
  static void fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(req, 0); }

  static void statfs(fuse_req_t req, fuse_ino_t) {
    constexpr auto kStatfsReused = std::chrono::seconds(1);
    Frontend& fe = self(req);
    struct statvfs sv {};
    {
      MutexLock lock(fe.statfs_mutex_);
      const auto now = std::chrono::steady_clock::now();
      if (fe.statfs_at_ == std::chrono::steady_clock::time_point{} || now - fe.statfs_at_ >= kStatfsReused) {
        if (::fstatvfs(fe.root_fd_, &fe.statfs_) != 0) {
          const int e = errno;
          fe.statfs_at_ = {};
          return reply_error(req, e);
        }
        fe.statfs_.f_flag |= ST_RDONLY;  // SOURCE's sizes, so df shows the data set's file system
        fe.statfs_at_ = now;
      }
      sv = fe.statfs_;
    }
    fuse_reply_statfs(req, &sv);
  }

  static void access(fuse_req_t req, fuse_ino_t ino, int mask) {
    Frontend& fe = self(req);
    if (!valid(fe, ino) && !ControlTree::owns(ino)) return reply_error(req, ESTALE);
    if (mask & W_OK) return reply_error(req, EROFS);
    fuse_reply_err(req, 0);
  }

  // SOURCE's POSIX ACLs, for the kernel to enforce with default_permissions; no other attribute is shown
  // (security.capability and the like bear privileges). Without ACLs: ENOSYS, and the kernel asks no more.
  static void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    Frontend& fe = self(req);
    if (!fe.acls_) return reply_error(req, ENOSYS);
    const bool acl = std::strcmp(name, "system.posix_acl_access") == 0 || std::strcmp(name, "system.posix_acl_default") == 0;
    if (!acl || ControlTree::owns(ino) || !valid(fe, ino)) return reply_error(req, ENODATA);
    const EntryId id = id_of(ino);
    if (!S_ISREG(fe.manifest_.mode(id)) && !S_ISDIR(fe.manifest_.mode(id))) return reply_error(req, ENODATA);
    std::string value;
    struct stat now {};
    const ssize_t n = xattr_beneath(fe.root_fd_, fe.manifest_.components(id), name, &value, &now);
    // The file gone, replaced or with other owner or mode bits than the kernel was told: its ACL cannot
    // be known, and a copy staged before must not go to a user the file denied. EIO: the kernel then
    // refuses everyone but the owner (by the mode bits) and root.
    if (!fe.manifest_.ensure(id)) return reply_error(req, EIO);  // attributes read late: gone since
    const Entry scanned = fe.manifest_.entry(id);
    if (now.st_mode == 0 || !difference(scanned, now).empty() || (now.st_mode & 07777) != (scanned.mode & 07777) ||
        now.st_uid != scanned.uid || now.st_gid != scanned.gid)
      return reply_error(req, EIO);
    if (n < 0) return reply_error(req, ENODATA);  // none: the mode bits decide
    if (size == 0) return (void)fuse_reply_xattr(req, value.size());
    if (size < value.size()) return reply_error(req, ERANGE);
    fuse_reply_buf(req, value.data(), value.size());
  }
  static void listxattr(fuse_req_t req, fuse_ino_t, size_t) { reply_error(req, ENOSYS); }

  // Everything that would change the tree or a file.
  static void erofs(fuse_req_t req) { reply_error(req, EROFS); }
  static void setattr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) { erofs(req); }
  static void mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { erofs(req); }
  static void mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { erofs(req); }
  static void unlink(fuse_req_t req, fuse_ino_t, const char*) { erofs(req); }
  static void rmdir(fuse_req_t req, fuse_ino_t, const char*) { erofs(req); }
  static void symlink(fuse_req_t req, const char*, fuse_ino_t, const char*) { erofs(req); }
  static void rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) { erofs(req); }
  static void link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { erofs(req); }
  static void write(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) { erofs(req); }
  static void create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) { erofs(req); }
  static void setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) { erofs(req); }
  static void removexattr(fuse_req_t req, fuse_ino_t, const char*) { erofs(req); }
  static void fallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) { erofs(req); }
  static void copy_file_range(fuse_req_t req, fuse_ino_t, off_t, fuse_file_info*, fuse_ino_t, off_t,
                              fuse_file_info*, size_t, int) {
    erofs(req);
  }

  static fuse_lowlevel_ops make_ops() {
    fuse_lowlevel_ops o{};
    o.init = init;
    o.lookup = Guarded<lookup>::call;
    o.forget = forget;
    o.forget_multi = forget_multi;
    o.retrieve_reply = retrieve_reply;
    o.getattr = Guarded<getattr>::call;
    o.readlink = Guarded<readlink>::call;
    o.opendir = Guarded<opendir>::call;
    o.releasedir = releasedir;
    o.readdir = Guarded<readdir>::call;
    o.readdirplus = Guarded<readdirplus>::call;
    o.open = Guarded<open>::call;
    o.read = Guarded<read>::call;
    o.release = Guarded<release>::call;
    o.flush = flush;
    o.fsync = fsync;
    o.statfs = Guarded<statfs>::call;
    o.access = Guarded<access>::call;
    o.getxattr = Guarded<getxattr>::call;
    o.listxattr = listxattr;
    o.setattr = setattr;
    o.mknod = mknod;
    o.mkdir = mkdir;
    o.unlink = unlink;
    o.rmdir = rmdir;
    o.symlink = symlink;
    o.rename = rename;
    o.link = link;
    o.write = write;
    o.create = create;
    o.setxattr = setxattr;
    o.removexattr = removexattr;
    o.fallocate = fallocate;
    o.copy_file_range = copy_file_range;
    return o;
  }
};

Frontend::Frontend(const Manifest& manifest, Engine& engine, const ControlTree& control, int root_fd,
                   FrontendConfig config)
    : manifest_(manifest), engine_(engine), control_(control), root_fd_(root_fd), config_(config) {}

Frontend::ThreadMemory::ThreadMemory() {
  read_bytes_.reset(new (std::nothrow) char[kLargestRead]);
  if (read_bytes_) read_size_ = kLargestRead;
  thread_memory = this;
}

Frontend::ThreadMemory::~ThreadMemory() {
  if (thread_memory == this) thread_memory = nullptr;
}

char* Frontend::ThreadMemory::read_bytes(size_t size) {
  if (size > read_size_) {
    read_bytes_.reset(new char[size]);
    read_size_ = size;
  }
  return read_bytes_.get();
}

const fuse_lowlevel_ops& Frontend::ops() {
  static const fuse_lowlevel_ops kOps = Handlers::make_ops();
  return kOps;
}

}  // namespace clairfs
