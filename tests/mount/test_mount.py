"""Real-mount test: an awkward tree served byte for byte, attributes mirrored, writes refused, unmount
under load does not hang, and manifests that no longer match SOURCE are refused."""
import hashlib
import mmap
import os
import random
import stat
import subprocess
import time

import harness as h
import pytest

random.seed(7)

BIG = 5 * 1024**3 + 12345  # over 4 GiB, sparse in SOURCE


def build_tree(src):
    """Writes the awkward tree; returns the relative path of the big file."""
    os.makedirs(src + "/cls a/sub-dir")
    os.makedirs(src + "/cls a/sub")
    os.makedirs(src + "/ünï cødé/.hidden")
    for i in range(40):
        with open(src + "/cls a/sub/f%d.png" % i, "wb") as f:
            f.write(os.urandom(random.randrange(0, 300_000)))
    open(src + "/cls a/empty.png", "wb").close()
    with open(src + "/cls a/name with spaces.jpg", "wb") as f:
        f.write(os.urandom(1000))
    with open(src + "/cls a/new\nline.png", "wb") as f:
        f.write(b"newline\n")
    with open(src + "/ünï cødé/snow☃.png", "wb") as f:
        f.write("☃".encode() * 1000)
    with open(src + "/ünï cødé/.hidden/.h.png", "wb") as f:
        f.write(b"hidden")
    # 40-level-deep tree.
    deep = src + "/deep"
    for level in range(40):
        deep += "/d%02d" % level
    os.makedirs(deep)
    with open(deep + "/bottom.png", "wb") as f:
        f.write(b"bottom of the tree")
    # 20,000+ entries in one directory.
    os.makedirs(src + "/wide")
    for i in range(20_050):
        with open(src + "/wide/%05d.jpg" % i, "wb") as f:
            f.write(b"%d" % i)
    # Symlinks: relative, absolute, to a directory, dangling.
    os.symlink("sub/f1.png", src + "/cls a/rel-link.png")
    os.symlink(src + "/cls a/empty.png", src + "/cls a/abs-link.png")
    os.symlink("../cls a", src + "/ünï cødé/dir-link")
    os.symlink("/nonexistent/target", src + "/dangling")
    # Files SOURCE changes under a mount (test_a_changed_file_*), read by no other test.
    os.makedirs(src + "/changed")
    for name in ("grew.png", "gone.png", "grew-unstaged.png"):
        with open(src + "/changed/" + name, "wb") as f:
            f.write(os.urandom(5000))
    # A sparse file over 4 GiB, with data at both ends.
    with open(src + "/big.bin", "wb") as f:
        f.write(b"start" * 1000)
        f.seek(BIG - 5000)
        f.write(b"E" * 5000)
    # Modes, owners and mtimes to mirror.
    os.chmod(src + "/cls a/name with spaces.jpg", 0o604)
    os.chown(src + "/cls a/empty.png", 1234, 5678)
    os.utime(src + "/cls a/sub/f0.png", ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    os.utime(src + "/ünï cødé/snow☃.png", ns=(-86_400_500_000_000, -86_400_500_000_000))
    return "big.bin"


def tree_listing(root):
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
                                             os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out


def sha(path, limit=None):
    hsh = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            hsh.update(b)
    return hsh.hexdigest()


def regular_files(listing):
    return [p for p, a in listing.items() if stat.S_ISREG(a[0]) and p != "big.bin" and not p.startswith("changed/")]


@pytest.fixture(scope="module")
def tree():
    """The awkward tree in SOURCE and a mount point beside it: (src, mnt, SOURCE's listing as made). (The
    scenarios that only read share a mount of their own, `served`, beside it.)"""
    with h.tempdir() as tmp:
        src, mnt = tmp + "/src", tmp + "/mnt"
        os.makedirs(mnt)
        os.makedirs(src)
        build_tree(src)
        yield src, mnt, tree_listing(src)


@pytest.fixture(scope="module")
def served(tree):
    """The tree mounted for the scenarios that only read it."""
    src, _, listing = tree
    mnt = os.path.dirname(src) + "/served"
    os.makedirs(mnt)
    t0 = time.monotonic()
    with h.mounted(src, mnt, "seed=3,batch_size=8"):
        yield src, mnt, listing, time.monotonic() - t0


def test_the_tree_is_mirrored(served):
    src, mnt, source_listing, took = served
    h.check(h.is_mounted(mnt), "the command returned with the mount live (%.2f s)" % took)
    with open("/proc/self/mounts") as f:
        line = [l for l in f if " %s " % os.path.realpath(mnt) in l][0]
    h.check(" fuse.clairfs ro," in line, "mounted as fuse.clairfs, read-only: " + line.strip())

    mount_listing = tree_listing(mnt)
    h.check(set(mount_listing) == set(source_listing),
            "same names (%d entries; missing %s, extra %s)" % (
                len(source_listing), sorted(set(source_listing) - set(mount_listing))[:3],
                sorted(set(mount_listing) - set(source_listing))[:3]))
    diffs = [p for p in source_listing
             if p in mount_listing and source_listing[p] != mount_listing[p]
             and not stat.S_ISDIR(source_listing[p][0])]
    h.check(not diffs, "mode, owner, size, mtime and link target mirrored for every non-directory %s" % (
        [(p, source_listing[p], mount_listing[p]) for p in diffs[:2]]))
    dir_diffs = [p for p in source_listing if stat.S_ISDIR(source_listing[p][0])
                 and source_listing[p][:3] + source_listing[p][4:] != mount_listing[p][:3] + mount_listing[p][4:]]
    h.check(not dir_diffs, "directory modes, owners and mtimes mirrored %s" % dir_diffs[:2])
    h.check(len(os.listdir(mnt + "/wide")) == 20_050, "20,050 entries listed in one directory")


def test_every_byte_equals_source(served):
    src, mnt, source_listing, _ = served
    files = regular_files(source_listing)
    wrong = [p for p in files if sha(os.path.join(src, p)) != sha(os.path.join(mnt, p))]
    h.check(not wrong, "every byte of %d files equals SOURCE %s" % (len(files), wrong[:3]))
    h.check(open(mnt + "/cls a/rel-link.png", "rb").read() == open(src + "/cls a/sub/f1.png", "rb").read(),
            "a relative symlink resolves inside the mount")
    h.check(sorted(os.listdir(mnt + "/ünï cødé/dir-link")) == sorted(os.listdir(src + "/cls a")),
            "a symlinked directory lists through the mount")


def test_reads_in_requests_of_a_mebibyte(served):
    # Root's mount reads through the daemon in requests of up to 1 MiB (the mount's own readahead
    # window, set after INIT; the kernel's default is 128 KiB).
    _, mnt, _, _ = served
    dev = os.stat(mnt).st_dev
    with open("/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))) as f:
        readahead = int(f.read())
    h.check(readahead == 1024, "the mount's readahead window is 1024 KiB: %d" % readahead)


def test_a_file_over_4_gib(served):
    # The big sparse file: size, both ends, and a read that straddles 4 GiB.
    src, mnt, _, _ = served
    with open(mnt + "/big.bin", "rb") as fm, open(src + "/big.bin", "rb") as fs:
        ok = os.fstat(fm.fileno()).st_size == BIG
        for off in (0, 4 * 1024**3 - 3000, BIG - 6000, BIG - 100):
            ok = ok and os.pread(fm.fileno(), 1 << 17, off) == os.pread(fs.fileno(), 1 << 17, off)
        h.check(ok, "file over 4 GiB: size and bytes at 0, across 4 GiB and at the end")


def test_concurrent_preads_and_mmaps(served):
    src, mnt, source_listing, _ = served
    files = regular_files(source_listing)
    errors = []
    sample = random.sample(files, 400) if len(files) > 400 else files

    def reader(seed):
        rnd = random.Random(seed)
        for p in rnd.sample(sample, len(sample)):
            a, b = os.path.join(src, p), os.path.join(mnt, p)
            size = os.path.getsize(a)
            with open(a, "rb") as fa, open(b, "rb") as fb:
                for _ in range(3):
                    off = rnd.randrange(0, size + 10) if size else 0
                    n = rnd.randrange(1, 200_000)
                    if os.pread(fa.fileno(), n, off) != os.pread(fb.fileno(), n, off):
                        errors.append("pread %s @%d" % (p, off))
                if size and rnd.random() < 0.3:
                    with mmap.mmap(fb.fileno(), 0, prot=mmap.PROT_READ) as m:
                        if m[:] != fa.read():
                            errors.append("mmap " + p)

    h.concurrently(reader, range(8))
    h.check(not errors, "8 concurrent readers, random preads and mmap reads all equal SOURCE %s" % errors[:3])


def test_writes_are_refused(served):
    src, mnt, source_listing, _ = served
    f = mnt + "/cls a/sub/f2.png"
    calls = {
        "open O_WRONLY": lambda: os.open(f, os.O_WRONLY),
        "open O_RDWR": lambda: os.open(f, os.O_RDWR),
        "open O_TRUNC": lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        "create": lambda: os.open(mnt + "/new.png", os.O_WRONLY | os.O_CREAT, 0o644),
        "mkdir": lambda: os.mkdir(mnt + "/newdir"),
        "rmdir": lambda: os.rmdir(mnt + "/cls a/sub-dir"),
        "unlink": lambda: os.unlink(f),
        "rename": lambda: os.rename(f, mnt + "/cls a/moved.png"),
        "symlink": lambda: os.symlink("x", mnt + "/newlink"),
        "link": lambda: os.link(f, mnt + "/hardlink"),
        "chmod": lambda: os.chmod(f, 0o777),
        "chown": lambda: os.chown(f, 1, 1),
        "utime": lambda: os.utime(f, (1, 1)),
        "truncate": lambda: os.truncate(f, 0),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        "removexattr": lambda: os.removexattr(f, "user.x"),
        "mknod": lambda: os.mkfifo(mnt + "/fifo"),
    }
    for name, call in calls.items():
        h.check(h.expect_errno(call, h.EROFS), "EROFS for " + name)
    h.check(tree_listing(src) == source_listing, "SOURCE untouched by the write attempts")
    h.check(os.statvfs(mnt).f_flag & os.ST_RDONLY, "statfs reports read-only")


def test_a_changed_file_reads_as_its_copy_or_eio(served):
    # A file changed in SOURCE after the scan is never served with other bytes: a reader gets the whole
    # copy staged before the change (it matched the scan), or EIO — never new or mixed bytes.
    src, mnt, _, _ = served
    victim = "changed/grew.png"
    h.check(h.attributes_read(mnt), "the files' attributes read (the mount is up before they are)")
    before = open(os.path.join(src, victim), "rb").read()
    with open(os.path.join(src, victim), "ab") as fv:
        fv.write(b"appended")
    h.check(h.reads_as_or_eio(os.path.join(mnt, victim), before),
            "a file that grew in SOURCE after the scan reads as its staged copy or EIO, not as other bytes")
    before = open(os.path.join(src, "changed/gone.png"), "rb").read()
    os.unlink(os.path.join(src, "changed/gone.png"))
    h.check(h.reads_as_or_eio(os.path.join(mnt, "changed/gone.png"), before),
            "a file deleted from SOURCE reads as its staged copy or EIO")


def test_a_changed_file_without_staging_is_eio(tree):
    # Without staging (ram=0) there is no copy: a changed file is always EIO.
    src, mnt, _ = tree
    with h.mounted(src, mnt, "ram=0"):
        read = h.attributes_read(mnt)  # (the mount is up before the files' attributes are read)
        with open(os.path.join(src, "changed/grew-unstaged.png"), "ab") as fv:
            fv.write(b"appended")
        h.check(read and h.expect_errno(lambda: open(os.path.join(mnt, "changed/grew-unstaged.png"), "rb").read(), 5),
                "ram=0: a file that grew in SOURCE after the scan reads as EIO (attributes read first: %s)" % read)
    h.check(not h.is_mounted(mnt), "unmounted")


def test_lazy_unmount_with_a_file_held_open(tree):
    # Unmount while a reader holds a file open: nothing hangs, the open file stays readable.
    src, mnt, _ = tree
    with h.mounted(src, mnt):
        held = open(mnt + "/cls a/sub/f5.png", "rb")
        pids = h.daemon_pids(mnt)
        h.check(len(pids) == 1, "one daemon for the mount")
        t0 = time.monotonic()
        busy = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True, timeout=30)
        h.check(busy.returncode != 0, "plain unmount with an open file is refused at once (%s)" % busy.stderr.strip())
        subprocess.run(["fusermount3", "-u", "-z", mnt], check=True, timeout=30)
        took = time.monotonic() - t0
        h.check(took < 5, "lazy unmount with a file held open returns in %.2f s" % took)
        h.check(held.read() == open(src + "/cls a/sub/f5.png", "rb").read(), "the held file still reads correctly")
        held.close()
        h.check(h.wait_gone(pids, 10), "the daemon exits once the file is closed")


def test_sigterm_unmounts(tree):
    src, mnt, _ = tree
    with h.mounted(src, mnt):
        os.kill(h.daemon_pids(mnt)[0], 15)
        h.check(h.wait_until(lambda: not h.is_mounted(mnt), timeout=10), "SIGTERM unmounts")


def test_mounted_from_a_manifest(tree):
    # Same bytes without a scan.
    src, mnt, _ = tree
    manifest = os.path.dirname(src) + "/data.manifest"
    r = h.run_clairfs(["index", src, manifest])
    h.check(r.returncode == 0 and "indexed" in r.stdout, "clairfs index writes a manifest: " + r.stdout.strip())
    with h.mounted(src, mnt, "manifest=" + manifest):
        listing = tree_listing(mnt)
        h.check(listing == tree_listing(src), "mounted from the manifest: same tree")
        some = random.sample(regular_files(listing), 50)
        h.check(all(sha(os.path.join(src, p)) == sha(os.path.join(mnt, p)) for p in some),
                "mounted from the manifest: same bytes")


def test_a_stale_or_damaged_manifest_is_refused(tree):
    _, mnt, _ = tree
    with h.tempdir() as tmp:
        small = tmp + "/small"
        os.makedirs(small + "/c")
        for i in range(20):
            with open(small + "/c/%d.png" % i, "wb") as fsmall:
                fsmall.write(b"x" * i)
        r = h.run_clairfs(["index", small, tmp + "/small.manifest"])
        os.truncate(small + "/c/7.png", 3)
        r = h.run_clairfs([small, mnt, "-o", "manifest=" + tmp + "/small.manifest"])
        h.check(r.returncode == 2 and "does not match SOURCE" in r.stderr and "7.png" in r.stderr
                and r.stderr.count("\n") == 1, "a stale manifest is refused with one line: " + r.stderr.strip())
        h.check(not h.is_mounted(mnt), "nothing mounted for a stale manifest")
        with open(tmp + "/small.manifest", "r+b") as fm:
            fm.seek(100)
            fm.write(b"\xff\xff")
        os.truncate(small + "/c/7.png", 7)
        r = h.run_clairfs([small, mnt, "-o", "manifest=" + tmp + "/small.manifest"])
        h.check(r.returncode == 2 and "manifest" in r.stderr, "a damaged manifest is refused: " + r.stderr.strip())


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
