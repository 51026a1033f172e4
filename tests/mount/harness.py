"""Shared helpers for tests that mount clairfs for real.

Each scenario starts the built daemon on a temporary SOURCE, waits for the command to return (it returns
only once the mount is live), checks what it must, and always unmounts with `fusermount3 -u -z`,
killing the daemon if it does not go. The scenarios are pytest's test functions (conftest.py).
"""
import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# What meson test sets (tests/meson.build); run by hand from a checkout, the build in build/.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BUILD = os.environ.get("CLAIRFS_BUILD", os.path.join(_ROOT, "build"))
for _name, _default in (("CLAIRFS_BIN", os.path.join(_BUILD, "clairfs")),
                        ("CLAIRFS_BUILD", _BUILD),
                        ("CLAIRFS_SOURCE_ROOT", _ROOT),
                        ("CLAIRFS_LIST_SAMPLES", os.path.join(_BUILD, "tests", "tools", "list_samples")),
                        ("CLAIRFS_ORACLE_DUMP", os.path.join(_BUILD, "tests", "tools", "oracle_dump"))):
    os.environ.setdefault(_name, _default)
CLAIRFS = os.environ["CLAIRFS_BIN"]
MAKE_DATASET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "make_dataset.py")
FAILURES = []


def check(cond, what):
    """Records a failed check: the scenario goes on, and fails at its end naming every one (conftest.py)."""
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        FAILURES.append(what)


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].encode().decode("unicode_escape") == mnt:
                return True
    return False


def running(pid):
    """Whether process `pid` runs: it exists and is not a zombie. An exited daemon (detached: init is its
    parent) stays a zombie until init reaps it — on this machine 1-1.5 s later, later still when busy."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def thread_stats(pid):
    """Each thread of process `pid` still there: (its id, the fields of its /proc stat after the command
    name — [0] the state letter, [16] the nice value)."""
    out = []
    for tid in sorted(os.listdir("/proc/%d/task" % pid)):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                out.append((tid, f.read().rsplit(")", 1)[1].split()))
        except OSError:
            pass
    return out


def wait_gone(pids, seconds):
    """Waits up to `seconds` for the processes to end (zombies count as ended); True if they all did."""
    deadline = time.monotonic() + seconds
    while any(running(p) for p in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def wait_until(predicate, timeout=20, step=0.05):
    """Asks predicate() every `step` s until it gives a true value, which is returned, or `timeout` s pass
    (its last value is returned then): in place of a sleep that guesses how long something takes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


def command_lines():
    """(pid, command line as a list of bytes) of each process but this one that can be read."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                yield int(pid), f.read().split(b"\0")
        except OSError:
            continue


def live_processes(match):
    """PIDs of the processes (zombies left out) whose command line, a list of bytes, `match` accepts."""
    return [pid for pid, argv in command_lines() if argv and match(argv) and running(pid)]


def _names(path, mnt):
    """Whether `path` resolves to `mnt` (False where it cannot be resolved: another test's mount point
    may be half gone, and realpath then fails with EINVAL)."""
    try:
        return os.path.realpath(path) == mnt
    except OSError:
        return False


def daemon_pids(mnt):
    """PIDs of clairfs processes whose command line names this mount point."""
    mnt = os.path.realpath(mnt)
    return [pid for pid, args in command_lines()
            if args and os.path.basename(args[0]) == b"clairfs" and any(
                _names(a.decode(errors="replace"), mnt) for a in args[1:] if a)]


def unmount(mnt, timeout=10):
    """Lazy-unmounts and waits for the daemon to exit; kills it if it does not. Returns seconds taken."""
    t0 = time.monotonic()
    pids = daemon_pids(mnt)
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
    wait_gone(pids, timeout)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, 9)
    return time.monotonic() - t0


def run_clairfs(args, timeout=120, env=None):
    return subprocess.run([CLAIRFS] + list(args), capture_output=True, text=True, timeout=timeout, env=env)


@contextlib.contextmanager
def mounted(source, mnt, options="", extra=(), env=None):
    args = [source, mnt] + (["-o", options] if options else []) + list(extra)
    r = run_clairfs(args, env=env)
    if r.returncode != 0:
        raise RuntimeError("clairfs %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    try:
        yield mnt
    finally:
        unmount(mnt)


@contextlib.contextmanager
def tempdir(prefix="clairfs-test-", base=None):
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield d
    finally:
        for sub in os.listdir(d):
            p = os.path.join(d, sub)
            if is_mounted(p):
                unmount(p)
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def tmpfs(path, size="512m"):
    """A tmpfs mounted at `path` (made) for the while: yields path, or None where none can be mounted (the
    folder then stays a plain one). Trees of many entries are made there in a fraction of the time this
    machine's disk takes (50,000 directories with a file each: about 30 s on it)."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path], capture_output=True, text=True)
    if r.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], stderr=subprocess.DEVNULL)


# The second user of this test file's process (its own name: files run two at a time, and one file's
# userdel at its end must not take the user from under the other's checks).
OTHER_USER = "clairfs-other-%d" % os.getpid()


@contextlib.contextmanager
def other_user(name=OTHER_USER):
    """A second user for permission checks, made for the test and removed after: yields a function that
    runs a command as that user (no groups of ours), returning the CompletedProcess."""
    subprocess.run(["userdel", name], stderr=subprocess.DEVNULL)
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)

    def run_as(cmd, timeout=30):
        return subprocess.run(["setpriv", "--reuid=" + name, "--regid=" + name, "--clear-groups"] + list(cmd),
                              capture_output=True, text=True, errors="replace", timeout=timeout)
    try:
        yield run_as
    finally:
        subprocess.run(["userdel", name], stderr=subprocess.DEVNULL)


def expect_errno(fn, code):
    try:
        fn()
    except OSError as e:
        return e.errno == code
    return False


def reads_as_or_eio(path, expected):
    """True if reading path whole gives exactly `expected`, or fails with EIO."""
    try:
        with open(path, "rb") as f:
            return f.read() == expected
    except OSError as e:
        return e.errno == errno.EIO


EROFS = errno.EROFS


def concurrently(fn, args):
    """Runs fn(a) for each a in args, each in its own thread, and waits for them all."""
    threads = [threading.Thread(target=fn, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def digest(path):
    """SHA-256 of a file's bytes, hex."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def digest_within(path, timeout=60):
    """digest(path) read by a child process killed after `timeout` s (a read the daemon never answers
    waits in the kernel, killable only): the hex digest, or "still reading after N s"."""
    try:
        r = subprocess.run(["sha256sum", path], capture_output=True, text=True, timeout=timeout)
        return r.stdout.split()[0] if r.returncode == 0 else r.stderr.strip()
    except subprocess.TimeoutExpired:
        return "still reading after %d s" % timeout


def forget_pages(root, rels):
    """Has the kernel drop the cached pages of these files (as memory pressure would): their next reads
    reach the daemon, and a staging engine that asks the kernel finds them gone."""
    for rel in rels:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def active_pages(path):
    """(pages of the file in the kernel's cache, how many of them on its active list), read through a
    mapping of the file: /proc/self/pagemap gives each mapped page's frame, /proc/kpageflags its flags
    (root). Mapping a page does not mark it used, as a read does."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    finally:
        os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap " + path)
    present = active = 0
    try:
        with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as flags:
            for page in range((size + 4095) // 4096):
                ctypes.string_at(addr + page * 4096, 1)  # mapped (a page not held is read in: not counted)
                pagemap.seek((addr // 4096 + page) * 8)
                entry = struct.unpack("Q", pagemap.read(8))[0]
                if not entry >> 63:
                    continue
                flags.seek((entry & ((1 << 55) - 1)) * 8)
                f = struct.unpack("Q", flags.read(8))[0]
                if f >> 5 & 1:  # KPF_LRU: a page-cache page
                    present += 1
                    active += f >> 6 & 1  # KPF_ACTIVE
    finally:
        libc.munmap(addr, size)
    return present, active


def drop_page_cache():
    """The kernel drops every clean cached page (root; no file is opened, so no open is seen)."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def digests(root):
    """{path relative to root: digest} for every file below root."""
    return {os.path.relpath(os.path.join(d, f), root): digest(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


def stats_readable(mnt):
    """False for a dead mount (its daemon gone: ENOTCONN) or one whose stats cannot be read."""
    try:
        stats(mnt)
        return True
    except (OSError, ValueError):
        return False


def stats(mnt):
    """A mount's .clairfs/stats, parsed."""
    with open(mnt + "/.clairfs/stats") as f:
        return json.load(f)


# For daemons whose memory is measured: meson sets MALLOC_PERTURB_, which makes glibc fill every buffer
# it hands out, so memory a daemon only reserves (libfuse's 1 MiB receive buffer per thread) counts too.
MEASURED = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}


def settled_stats(mnt, opens, timeout=20):
    """Stats once the engine has heard of `opens` opens and as many closes through the watch on the mount
    (its events reach the engine a moment after them: read sooner, under load or a sanitizer, some would
    be missing), or at once when opens are not watched."""
    deadline = time.monotonic() + timeout
    while True:
        s = stats(mnt)
        p = s.get("progress", {})
        heard = p.get("opens_seen", 0) >= opens and p.get("closes_seen", 0) >= opens
        if p.get("from") != "watched opens" or heard:
            return s
        if time.monotonic() > deadline:  # (a test's time lost: said, so that it is seen)
            print("note: %d opens and %d closes heard of %d after %d s" % (
                p.get("opens_seen", 0), p.get("closes_seen", 0), opens, timeout))
            return s
        time.sleep(0.05)


def rank0(s):
    """Rank 0's place in the stats — (epoch, done, total, verdict) — or () while there is no plan."""
    r = (s.get("ranks") or [None])[0]
    return (r["epoch"], r["done"], r["total"], r["verdict"]) if r else ()


def stats_when(mnt, done, timeout=20):
    """Stats once done(stats) holds (a plan that follows the job's last opens may come a moment after the
    job's end, when the job was quicker than the learning), or the last read at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        s = stats(mnt)
        if done(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def quiet_stats(mnt, timeout=20):
    """Stats once every open the watch heard of has its close heard too and nothing has changed for 0.3 s
    (for a check that cannot know how many opens there were)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        s = stats(mnt)
        p = s.get("progress", {})
        now = (p.get("opens_seen"), p.get("closes_seen"), sum(v["files"] for v in s["tiers"].values()))
        if (now == last and now[0] == now[1]) or time.monotonic() > deadline:
            return s
        last = now
        time.sleep(0.3)


def attributes_read(mnt, timeout=60):
    """Waits until the mount has read the attributes of every file it listed (it is up once SOURCE's names
    are listed, their attributes read after): a file changed in SOURCE before its own were read is, to
    the mount, the file as it found it. True once read."""
    deadline = time.monotonic() + timeout
    while stats(mnt).get("attributes_pending", 0) != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def source_bytes(s):
    """What SOURCE served, by a mount's stats: all its traffic when staging (staging included), else its reads."""
    return s["source_traffic"]["bytes"] if "source_traffic" in s else s["tiers"]["source"]["bytes"]


def within_memory_bound(pids, budget, files, label=""):
    """Checks the daemons' peak memory (VmHWM) against ram + 64 MiB + 100 B/file (not under a sanitizer)."""
    peak = 0
    for pid in pids:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) * 1024)
    bound = budget + (64 << 20) + 100 * files
    if os.environ.get("CLAIRFS_SANITIZED"):
        check(peak > 0, "%sdaemon peak memory %.1f MiB (not held to its bound under a sanitizer)" % (label, peak / 2**20))
    else:
        check(0 < peak <= bound, "%sdaemon peak memory %.1f MiB within ram + 64 MiB + 100 B/file = %.1f MiB" % (
            label, peak / 2**20, bound / 2**20))


def make_dataset(path, files, classes, mean_kb, seed):
    """An ImageFolder tree of random files with lognormal sizes (bench/make_dataset.py)."""
    subprocess.run([sys.executable, MAKE_DATASET, path, "--files", str(files), "--classes", str(classes),
                    "--mean-kb", str(mean_kb), "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)


def write_digests(path, want):
    """{relative path: digest} written as JSON at `path` (returned), for a job that checks the bytes it
    reads (mismatch_job.py --digests)."""
    with open(path, "w") as f:
        json.dump(want, f)
    return path


def dataset(path, files, classes, mean_kb, seed):
    """make_dataset(), then what a test checks reads against: ({relative path: digest}, total bytes)."""
    make_dataset(path, files, classes, mean_kb, seed)
    want = digests(path)
    return want, sum(os.path.getsize(os.path.join(path, p)) for p in want)
