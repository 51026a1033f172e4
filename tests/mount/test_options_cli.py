"""The command line as a job script meets it: every bad input prints one line naming the culprit, exits 2
and mounts nothing; --help exits 0; a good mount returns 0 only once live."""
import os
import subprocess

import harness as h
import pytest


@pytest.fixture(scope="module")
def tree():
    """A small SOURCE, a mount point, a plain file and a directory only root may enter: (tmp, src, mnt)."""
    with h.tempdir() as tmp:
        src, mnt = tmp + "/src", tmp + "/mnt"
        os.makedirs(src + "/c")
        os.makedirs(mnt)
        for name, data in [("a", b"a")] + [(str(i), b"%d" % i) for i in range(6)]:
            with open(src + "/c/%s.png" % name, "wb") as f:
                f.write(data)
        with open(tmp + "/file", "w") as f:
            f.write("x")
        os.makedirs(tmp + "/locked/inner")
        os.chmod(tmp + "/locked", 0o700)
        yield tmp, src, mnt


BAD = [
    (["SRC", "MNT", "-o", "frobnicate=1"], "frobnicate"),
    (["SRC", "MNT", "-o", "seed=abc"], "seed"),
    (["SRC", "MNT", "-o", "batch_size=0"], "batch_size"),
    (["SRC", "MNT", "-o", "world_size=0"], "world_size"),
    (["SRC", "MNT", "-o", "ram=12XB"], "ram"),
    (["SRC", "MNT", "-o", "world_size=4,ranks=4"], "rank 4"),
    (["SRC", "MNT", "-o", "world_size=4,ranks=0,2,7"], "rank 7"),
    (["SRC", "MNT", "-o", "order=list"], "order_file"),
    (["SRC", "MNT", "-o", "nvme=TMP/nope"], "nvme"),
    (["SRC", "MNT", "-o", "manifest=TMP/file"], "manifest"),
    (["SRC", "MNT", "--bogus"], "--bogus"),
    (["TMP/missing", "MNT"], "SOURCE"),
    (["TMP/file", "MNT"], "SOURCE"),
    (["SRC", "TMP/file"], "MOUNTPOINT"),
    (["SRC", "TMP/missing"], "MOUNTPOINT"),
    (["SRC"], "MOUNTPOINT"),
    ([], "SOURCE"),
]


@pytest.mark.parametrize("args,culprit", BAD, ids=[" ".join(a) or "nothing" for a, _ in BAD])
def test_a_bad_input_is_one_line_and_exit_2(tree, args, culprit):
    tmp, src, mnt = tree
    args = [a.replace("SRC", src).replace("MNT", mnt).replace("TMP", tmp) for a in args]
    r = h.run_clairfs(args)
    lines = r.stderr.strip().splitlines()
    h.check(r.returncode == 2 and len(lines) == 1 and culprit in lines[0] and not h.is_mounted(mnt),
            "exit 2, one line naming %s, nothing mounted: %s -> %d %r" % (culprit, " ".join(args[2:]) or args,
                                                                       r.returncode, r.stderr.strip()))


def test_an_unreadable_source(tree):
    # As a user who cannot read it.
    tmp = tree[0]
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", h.CLAIRFS,
                        tmp + "/locked/inner", "/tmp"], capture_output=True, text=True)
    h.check(r.returncode == 2 and "SOURCE" in r.stderr and r.stderr.count("\n") == 1,
            "unreadable SOURCE: exit 2, one line: %r" % r.stderr.strip())


def test_help_and_version():
    r = h.run_clairfs(["--help"])
    h.check(r.returncode == 0 and "seed=" in r.stdout and "batch_size=" in r.stdout, "--help exits 0 and lists options")
    r = h.run_clairfs(["--version"])
    h.check(r.returncode == 0 and r.stdout.startswith("clairfs ") and "(commit " in r.stdout
            and all(("\n" + lib) in r.stdout for lib in ("libfuse 3.", "liburing 2.", "MPI: MPICH", "xxHash 0.")),
            "--version names the commit and the libraries: " + r.stdout.strip().replace("\n", "; "))


def test_foreground_with_mount8_spellings(tree):
    # Foreground mode stays until unmounted; the spellings of fstab and mount(8) are accepted.
    _, src, mnt = tree
    p = subprocess.Popen([h.CLAIRFS, src, mnt, "-f", "-o", "rw,nodev,nosuid,_netdev,x-systemd.automount,batch-size=4"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    h.wait_until(lambda: h.is_mounted(mnt) or p.poll() is not None, timeout=10, step=0.02)
    h.check(h.is_mounted(mnt) and p.poll() is None, "-f mounts and stays in the foreground")
    h.check(open(mnt + "/c/a.png", "rb").read() == b"a", "-f serves reads")
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    try:
        rc = p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = None
    h.check(rc == 0, "-f exits 0 after unmount (rc=%s)" % rc)


def test_mount_flags_reach_the_kernel(tree):
    # Mount flags from mount(8) reach the kernel; the mount stays read-only whatever is asked.
    _, src, mnt = tree
    with h.mounted(src, mnt, "rw,noexec,fsname=imagenet\\,v2"):
        with open("/proc/self/mounts") as f:
            line = [l for l in f if os.path.realpath(mnt) in l][0]
        h.check(line.startswith("imagenet,v2 ") and " ro," in line and "noexec" in line,
                "fsname, noexec and ro reach the kernel: " + line.strip())


def test_order_list(tree):
    # order=list: the published order is the file's; a bad file fails the mount naming its line.
    tmp, src, mnt = tree
    with open(tmp + "/order.txt", "w") as f:
        f.write("# two epochs of my own order\nc/3.png\n./c/a.png\nc/1.png\n@epoch 1\n@rank 0\nc/5.png\n")
    with h.mounted(src, mnt, "order=list,order_file=%s/order.txt,world_size=2,ranks=0" % tmp):
        e0 = [open(mnt + "/.clairfs/order/epoch-0/rank-%d" % r).read().split() for r in (0, 1)]
        e1 = open(mnt + "/.clairfs/order/epoch-1/rank-0").read().split()
        h.check(e0 == [["c/3.png", "c/1.png"], ["c/a.png", "c/3.png"]] and e1 == ["c/5.png"],
                "order=list: epoch 0 split like DistributedSampler, epoch 1 given per rank: %s %s" % (e0, e1))
    with open(tmp + "/order.txt", "a") as f:
        f.write("c/missing.png\n")
    r = h.run_clairfs([src, mnt, "-o", "order=list,order_file=%s/order.txt" % tmp])
    h.check(r.returncode == 2 and "line 8" in r.stderr and r.stderr.count("\n") == 1 and not h.is_mounted(mnt),
            "a bad order file: exit 2, one line naming the line: " + r.stderr.strip())


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
