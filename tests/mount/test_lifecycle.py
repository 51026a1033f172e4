"""A daemon's start and end on one node, as a job script meets them: a stop by signal exits 0 and
leaves nothing, a second signal does not cut the cleanup short, a mount point that already holds a
clairfs mount (live or dead) is refused with one line, a SIGKILLed daemon's cache folder is removed by
the next mount (with a line saying so) or by `clairfs cleanup`, a SIGKILLed daemon mounted with
auto_unmount leaves no mount (nor one that crashed while its watch was marking), and a daemon that a
launcher started as one of several tasks but whose MPI world is one refuses to mount, naming the fix."""
import os
import resource
import signal
import subprocess
import time

import harness as h
import pytest
from cluster import leftovers, wait_clean


def foreground(src, mnt, opts, env=None, no_core=False):
    """clairfs -f in the background; returns once the mount is live. `no_core`: it may dump no core."""
    p = subprocess.Popen([h.CLAIRFS, src, mnt, "-f", "-o", opts], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env,
                         preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))) if no_core else None)
    h.wait_until(lambda: h.is_mounted(mnt) or p.poll() is not None, timeout=30, step=0.02)
    return p
def thread_states(pid):
    """Each thread of process `pid`: its state letter and the kernel function it waits in."""
    out = []
    try:
        for tid, fields in h.thread_stats(pid):
            try:
                with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                    out.append("%s %s" % (fields[0], f.read().strip() or "-"))
            except OSError:
                pass
    except OSError as e:
        return str(e)
    return out


def watching(pid):
    """Whether process `pid` holds a fanotify group (the watch on its mount)."""
    try:
        for fd in os.listdir("/proc/%d/fdinfo" % pid):
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                if "fanotify" in f.read():
                    return True
    except OSError:
        pass
    return False
class Tree:
    """300 files in SOURCE, a mount point and an NVMe directory."""

    def __init__(self, tmp):
        self.tmp, self.src, self.mnt, self.nvme = tmp, tmp + "/src", tmp + "/mnt", tmp + "/nvme"
        h.make_dataset(self.src, 300, 3, 8, 5)
        os.makedirs(self.mnt)
        os.makedirs(self.nvme)
        self.opts = "seed=3,batch_size=4,nvme=" + self.nvme
        self.want = h.digests(self.src)
        self.some = sorted(self.want)[:20]

    def wide(self, dirs):
        """A SOURCE of `dirs` directories of one file each (made up to that many)."""
        wide = self.tmp + "/wide"
        for i in range(dirs):
            if not os.path.isdir("%s/d%d" % (wide, i)):
                os.makedirs("%s/d%d" % (wide, i))
                with open("%s/d%d/f" % (wide, i), "wb") as f:
                    f.write(b"x")
        return wide


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        t = Tree(tmp)
        yield t
        h.check(not wait_clean(tmp, [t.nvme]), "nothing left at the end: %s" % leftovers(tmp, [t.nvme]))




def test_sigterm_exits_0_leaving_nothing(t):
    src, mnt, nvme, opts, want, some, tmp = t.src, t.mnt, t.nvme, t.opts, t.want, t.some, t.tmp
    p = foreground(src, mnt, opts)
    ok = all(h.digest(os.path.join(mnt, r)) == want[r] for r in some)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
    h.check(ok and rc == 0 and not leftovers(tmp, [nvme]),
            "-f stopped by SIGTERM: exit %d, nothing left (%s; %s)" % (rc, leftovers(tmp, [nvme]), p.stderr.read().strip()[-200:]))


@pytest.mark.parametrize("gap", [0.0, 0.002, 0.01])
def test_two_sigterms_a_moment_apart(t, gap):
    # The second does not kill it halfway through its cleanup.
    src, mnt, nvme, opts, some, tmp = t.src, t.mnt, t.nvme, t.opts, t.some, t.tmp
    p = foreground(src, mnt, opts)
    for r in some:
        h.digest(os.path.join(mnt, r))
    p.send_signal(signal.SIGTERM)
    time.sleep(gap)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
    left = leftovers(tmp, [nvme])
    h.check(rc == 0 and not left, "two SIGTERMs %.0f ms apart: exit %d, nothing left %s" % (gap * 1000, rc, left))
    if left:
        subprocess.run([h.CLAIRFS, "cleanup", "-o", "nvme=" + nvme, mnt], capture_output=True)


def test_a_second_mount_on_a_live_one(t):
    # Refused, and the first keeps serving.
    src, mnt, opts, want, some = t.src, t.mnt, t.opts, t.want, t.some
    with h.mounted(src, mnt, opts):
        r = h.run_clairfs([src, mnt, "-o", opts])
        h.check(r.returncode == 2 and "already a clairfs mount" in r.stderr and "fusermount3 -u" in r.stderr
                and len(r.stderr.strip().splitlines()) == 1,
                "mounting again on a live mount: exit %d, %s" % (r.returncode, r.stderr.strip()))
        h.check(h.digest(os.path.join(mnt, some[0])) == want[some[0]] and len(h.daemon_pids(mnt)) == 1,
                "the first mount still serves, alone")


def test_a_sigkilled_daemon(t):
    # Its dead mount is refused with the command that clears it; its cache folder is removed by the next
    # mount on the node, which says so.
    src, mnt, nvme, opts, some = t.src, t.mnt, t.nvme, t.opts, t.some
    p = foreground(src, mnt, opts)
    for r in some:
        h.digest(os.path.join(mnt, r))
    p.kill()
    p.wait(timeout=10)
    stale = [d for d in os.listdir(nvme) if d.startswith("clairfs-cache.")]
    r = h.run_clairfs([src, mnt, "-o", opts])
    h.check(r.returncode == 2 and "dead clairfs mount" in r.stderr and "fusermount3 -u -z" in r.stderr,
            "mounting on a dead mount: exit %d, %s" % (r.returncode, r.stderr.strip()))
    r = h.run_clairfs(["status", mnt])
    h.check(r.returncode == 1 and "is dead" in r.stderr and "clairfs cleanup" in r.stderr,
            "clairfs status on the dead mount says it is dead, and what clears it: %s" % r.stderr.strip())
    subprocess.run(["fusermount3", "-u", "-z", mnt], check=True)
    p = foreground(src, mnt, opts)
    there = [d for d in stale if os.path.exists(os.path.join(nvme, d))]
    h.check(len(stale) == 1 and not there and p.poll() is None,
            "the next mount removed the killed daemon's cache folder %s (still there: %s; the daemon's exit: %s)"
            % (stale, there, p.poll()))
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    err = p.stderr.read()
    h.check("removed " in err and stale and stale[0] in err and "that is gone" in err,
            "and said so in one line: %s" % [line for line in err.splitlines() if "removed" in line])


def test_cleanup_after_a_sigkill(t):
    # The dead mount and the folder go, each named; a second run finds nothing; a live daemon's folder is
    # left alone.
    src, mnt, nvme, opts, some, tmp = t.src, t.mnt, t.nvme, t.opts, t.some, t.tmp
    p = foreground(src, mnt, opts)
    h.digest(os.path.join(mnt, some[0]))
    p.kill()
    p.wait(timeout=10)
    r = subprocess.run([h.CLAIRFS, "cleanup", "-o", opts, mnt], capture_output=True, text=True, timeout=60)
    lines = r.stdout.strip().splitlines()
    h.check(r.returncode == 0 and len(lines) == 2 and "dead clairfs mount" in lines[0] and "clairfs-cache." in lines[1]
            and not leftovers(tmp, [nvme]), "clairfs cleanup: exit %d, %s" % (r.returncode, lines))
    r = subprocess.run([h.CLAIRFS, "cleanup", "-o", opts, mnt], capture_output=True, text=True, timeout=60)
    h.check(r.returncode == 0 and not r.stdout.strip(), "again: nothing to do (%r)" % r.stdout.strip())
    mnt2 = tmp + "/mnt2"
    os.makedirs(mnt2)
    with h.mounted(src, mnt2, opts):
        r = subprocess.run([h.CLAIRFS, "cleanup", "-o", opts, mnt], capture_output=True, text=True, timeout=60)
        h.check(r.returncode == 0 and not r.stdout.strip() and h.is_mounted(mnt2)
                and len([d for d in os.listdir(nvme) if d.startswith("clairfs-cache.")]) == 1,
                "a live daemon's mount elsewhere and its cache folder are left alone")


def test_auto_unmount_takes_a_sigkilled_daemons_mount(t):
    src, mnt, some = t.src, t.mnt, t.some
    # auto_unmount (what every daemon under a launcher uses): a SIGKILLed daemon's mount goes with it,
    # every time of 20 — fusermount3 looks only once the connection is gone, which the keeper process
    # (one per mount, holding fusermount3's socket) waits for; no keeper outlives its daemon.
    def keepers():
        return h.live_processes(lambda argv: argv[0] == b"clairfs-keeper" and mnt.encode() in argv)

    dead, kept, said_of_keeper = 0, [], []
    for i in range(20):
        p = foreground(src, mnt, "seed=3,batch_size=4,auto_unmount")
        h.wait_until(keepers, timeout=5, step=0.02)  # spawned just after the mount: a moment later under load
        kept.append(len(keepers()))
        h.digest(os.path.join(mnt, some[i]))
        p.kill()
        p.wait(timeout=10)
        if kept[-1] != 1:  # what the daemon said of its keeper
            said_of_keeper += [line for line in p.stderr.read().splitlines() if "auto_unmount" in line]
        if not h.wait_until(lambda: not h.is_mounted(mnt), timeout=10, step=0.02):
            dead += 1
            subprocess.run(["fusermount3", "-u", "-z", mnt])
    h.wait_until(lambda: not keepers(), timeout=10)
    h.check(dead == 0 and kept == [1] * 20 and not keepers(),
            "auto_unmount: 20 SIGKILLed daemons, %d dead mounts left; keepers while mounted %s, after: %s %s" % (
                dead, sorted(set(kept)), keepers(), said_of_keeper))
    p = foreground(src, mnt, "seed=3,batch_size=4,auto_unmount")
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    p.wait(timeout=30)
    h.wait_until(lambda: not keepers(), timeout=10)
    h.check(p.returncode == 0 and not h.is_mounted(mnt) and not keepers(),
            "auto_unmount, unmounted by fusermount3 -u: exit %d, no keeper left" % p.returncode)


def test_srun_without_mpi_is_refused(t):
    src, mnt, opts = t.src, t.mnt, t.opts
    # Started by srun as one of two tasks, but MPI sees a world of one (srun without --mpi): refused,
    # naming --mpi=pmi2; nothing mounted. (The real srun case is in test_slurm.)
    env = dict(os.environ, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1")
    for k in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMIX_SIZE", "OMPI_COMM_WORLD_SIZE"):
        env.pop(k, None)
    r = h.run_clairfs([src, mnt, "-o", opts], env=env, timeout=60)
    h.check(r.returncode == 2 and "--mpi=pmi2" in r.stderr and not h.is_mounted(mnt),
            "one of 2 srun tasks alone in its MPI world: exit %d, %s" % (r.returncode, r.stderr.strip()[-300:]))


def test_unmounted_while_the_watch_marks(t):
    mnt = t.mnt
    # Unmounted the moment it is mounted (-f), while its watch still marks 2,000 directories (root's
    # watch marks through a copy of the mount): the unmount succeeds, and the daemon exits 0.
    wide = t.wide(2000)
    p = foreground(wide, mnt, "seed=1,batch_size=4")
    read = open(mnt + "/d7/f", "rb").read() == b"x"
    r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        subprocess.run(["fusermount3", "-u", "-z", mnt])
        p.kill()
        rc = None
    h.check(read and r.returncode == 0 and rc == 0 and not h.is_mounted(mnt),
            "unmounted at once while 2,000 directories are marked: fusermount3 %d %s, daemon exit %s"
            % (r.returncode, r.stderr.strip(), rc))


def test_a_crash_while_the_watch_marks(t):
    mnt = t.mnt
    # A crash (SIGABRT, as an abort() or a failed check sends; SIGSEGV takes the same handler, and
    # under ASan its handler reports it) while the watch marks 8,000 directories: the daemon ends and,
    # with auto_unmount, its mount goes. (Before, a thread of it waiting on its own mount held the core
    # dump forever: the process stayed in D state, 4 times in 5.) A hung one is cleared through fusectl.
    wide = t.wide(8000)
    ended, why = [], []
    for attempt in range(3):
        p = foreground(wide, mnt, "seed=1,batch_size=4,auto_unmount", no_core=True)
        h.wait_until(lambda: watching(p.pid), timeout=5, step=0.01)  # its watch begins: marking is under way
        time.sleep(0.1 * attempt)
        p.send_signal(signal.SIGABRT)
        try:
            p.wait(timeout=10)
            ended.append(True)
        except subprocess.TimeoutExpired:
            ended.append(False)
            why.append("attempt %d: not ended within 10 s; its threads (state, wait): %s" % (attempt, thread_states(p.pid)))
            with open("/proc/self/mountinfo") as f:
                dev = [line.split()[2] for line in f if line.split()[4] == os.path.realpath(mnt)]
            if dev and not os.path.isdir("/sys/fs/fuse/connections/" + dev[-1].split(":")[1]):
                subprocess.run(["mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections"], capture_output=True)
            for d in dev:
                with open("/sys/fs/fuse/connections/%s/abort" % d.split(":")[1], "w") as f:
                    f.write("1")
            p.kill()
            p.wait(timeout=30)
        if not h.wait_until(lambda: not h.is_mounted(mnt), timeout=10):
            why.append("attempt %d: the mount stayed 10 s after the daemon (exit %s)" % (attempt, p.returncode))
        ended[-1] = ended[-1] and not h.is_mounted(mnt)
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    h.check(all(ended), "SIGABRT while 8,000 directories are marked: the daemon ended and its mount went, "
            "%d of 3 times %s" % (sum(ended), why))


def test_status_watch_sees_its_mount_end(t):
    src, mnt, nvme, opts, tmp = t.src, t.mnt, t.nvme, t.opts, t.tmp
    # clairfs status --watch sees its mount end: it says so and exits 0; a user the mount is not
    # readable by is told that, not that it is no clairfs mount.
    p = foreground(src, mnt, opts)
    watch = subprocess.Popen([h.CLAIRFS, "status", mnt, "--watch", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    time.sleep(0.6)
    denied = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", h.CLAIRFS, "status", mnt],
                            capture_output=True, text=True, timeout=30)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    out, err = watch.communicate(timeout=30)
    h.check(watch.returncode == 0 and "clairfs at" in out and err.strip() == "clairfs: the mount at '%s' ended" % mnt,
            "status --watch: screens, then its mount's end, exit %d: %s" % (watch.returncode, err.strip()))
    h.check(denied.returncode == 1 and "Permission denied" in denied.stderr and "allow_other" in denied.stderr,
            "status as a user the mount is not readable by: %s" % denied.stderr.strip())

    h.check(not wait_clean(tmp, [nvme]), "nothing left at the end: %s" % leftovers(tmp, [nvme]))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
