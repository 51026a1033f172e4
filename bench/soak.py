#!/usr/bin/python3
"""Soak: clairfs under random readers for a long time. One mount lives for the whole run (RAM a third of
the data set, NVMe half of it, epochs unbounded) while rounds of 1-8 concurrent readers read it in the
predicted order of a random epoch, in another seed's order, or in sample order; every few rounds a fresh
mount with random options (budget from 1 KiB to twice the data set, NVMe or not, a random seed,
progress from reads or opens) is read and checked too. A few files of 2-24 MiB among the small ones
exercise reads of files too large to hold whole (read piece by piece, or whole within the demand
allowance). The classes of issue 18 come along: every 10th round a file of SOURCE is replaced by a FIFO
(a special file after the scan: it must read EIO, or its bytes from a copy staged before, and never
hold a thread); in some rounds another thread drops the mount's pages (POSIX_FADV_DONTNEED) while the
readers read (the waits between the stager and the request threads); fresh mounts sometimes take the
largest values the options allow (their arithmetic). Every byte read is compared with SOURCE. Reports
rounds, files, wrong bytes, and the long-lived daemon's resident memory over time (to see that it is
stable).

    bench/soak.py BUILD [--minutes 30] [--files 2000] [--large 6]
"""
import argparse
import errno
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import unmount  # noqa: E402


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def rss(mnt):
    r = subprocess.run(["pgrep", "-f", "clairfs .* " + mnt], capture_output=True, text=True)
    for pid in r.stdout.split():
        try:
            for line in open("/proc/%s/status" % pid):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
    return 0


def read_ok(path, want, swapped):
    """Whether reading `path` whole gives its SOURCE bytes (or EIO, for a file replaced by a FIFO)."""
    try:
        return digest(path) == want
    except OSError as e:
        return swapped and e.errno == errno.EIO


def drop_pages(mnt, paths, rnd, stop):
    """Drops the mount's cached pages of random files until `stop` is set."""
    while not stop.is_set():
        try:
            fd = os.open(os.path.join(mnt, rnd.choice(paths)), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        except OSError:
            pass
        time.sleep(0.001)


def read_round(mnt, want, rnd, readers, swapped=frozenset(), fifos=frozenset()):
    """1-8 concurrent readers, each in a random mode; returns (files, wrong). A third of the rounds, pages
    are dropped meanwhile. `swapped`: files replaced after the mount's scan (EIO allowed); `fifos`: FIFOs
    the mount's scan saw (shown as FIFOs, which block an opener like any FIFO: not read)."""
    paths = sorted(p for p in want if p not in fifos)
    counts = []
    stop = threading.Event()
    dropper = threading.Thread(target=drop_pages, args=(mnt, paths, random.Random(rnd.random()), stop))
    if rnd.random() < 0.3:
        dropper.start()

    def reader(seed):
        r = random.Random(seed)
        mode = r.choice(["predicted", "wrong seed", "sequential"])
        if mode == "predicted":
            with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, r.randrange(0, 6))) as f:
                rels = [p for p in f.read().splitlines() if p not in fifos]
        elif mode == "wrong seed":
            rels = r.sample(paths, len(paths))
        else:
            rels = paths
        start = r.randrange(0, len(rels))
        n = r.randrange(50, 400)
        rels = (rels[start:] + rels[:start])[:n]
        wrong = sum(not read_ok(os.path.join(mnt, p), want[p], p in swapped) for p in rels)
        counts.append((len(rels), wrong))

    threads = [threading.Thread(target=reader, args=(rnd.randrange(1 << 30),)) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if dropper.is_alive():
        dropper.join()
    return sum(c for c, _ in counts), sum(w for _, w in counts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--large", type=int, default=6, help="files of 2-24 MiB added to the data set")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rnd = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="clairfs-soak-")
    data = work + "/data"
    subprocess.run([sys.executable, HERE + "/make_dataset.py", data, "--files", str(args.files), "--classes", "8",
                    "--mean-kb", "24", "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
    classes = sorted(os.listdir(data))
    for i in range(args.large):
        with open(os.path.join(data, classes[i % len(classes)], "large-%d.jpg" % i), "wb") as f:
            f.write(rnd.randbytes(rnd.randrange(2 << 20, 24 << 20)))
    want = {}
    for d, _, files in os.walk(data):
        for f in files:
            want[os.path.relpath(os.path.join(d, f), data)] = digest(os.path.join(d, f))
    total = sum(os.path.getsize(os.path.join(data, p)) for p in want)

    main_mnt, nvme = work + "/main", work + "/nvme"
    os.makedirs(main_mnt)
    os.makedirs(nvme)
    subprocess.run([build + "/clairfs", data, main_mnt, "-o", "seed=3,batch_size=4,workers=2,ram=%d,nvme=%s,"
                    "nvme_size=%d" % (total // 3, nvme, total // 2)], check=True)
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    rounds = files = wrong = fresh = 0
    samples = []  # (minutes, rss)
    swapped = set()  # SOURCE files replaced by FIFOs
    small = sorted(p for p in want if "large-" not in p)
    try:
        while time.monotonic() < end:
            if rounds % 10 == 9 and len(swapped) < 20:
                victim = rnd.choice(small)
                if victim not in swapped:
                    os.unlink(os.path.join(data, victim))
                    os.mkfifo(os.path.join(data, victim))
                    swapped.add(victim)
            n, w = read_round(main_mnt, want, rnd, rnd.randrange(1, 9), swapped)
            rounds += 1
            files += n
            wrong += w
            samples.append(((time.monotonic() - t0) / 60, rss(main_mnt)))
            if rounds % 5 == 0:
                mnt = tempfile.mkdtemp(prefix="fresh-", dir=work)
                opts = "seed=%d,batch_size=%d,ram=%d" % (rnd.randrange(-5, 1 << 40), rnd.choice([1, 4, 16, 16777216]),
                                                         rnd.choice([1024, total // 10, total // 2, total * 2]))
                if rnd.random() < 0.2:
                    opts += ",workers=1024,prefetch_factor=1024"
                opts += ",progress=%s" % rnd.choice(["reads", "opens"])
                extra = None
                if rnd.random() < 0.5:
                    extra = tempfile.mkdtemp(prefix="nv-", dir=work)
                    opts += ",nvme=%s,nvme_size=%d" % (extra, rnd.choice([4096, total // 4, total]))
                subprocess.run([build + "/clairfs", data, mnt, "-o", opts], check=True)
                try:
                    n, w = read_round(mnt, want, rnd, rnd.randrange(1, 9), fifos=frozenset(swapped))
                    files += n
                    wrong += w
                    fresh += 1
                finally:
                    unmount(mnt, lazy=True)
                    time.sleep(0.3)
                    if extra:
                        shutil.rmtree(extra, ignore_errors=True)
            if rounds % 20 == 0:
                print("%.1f min: %d rounds, %d files, %d wrong, RSS %.1f MiB" % (
                    samples[-1][0], rounds, files, wrong, samples[-1][1] / 2**20), file=sys.stderr)
    finally:
        unmount(main_mnt, lazy=True)
        time.sleep(0.5)
        shutil.rmtree(work, ignore_errors=True)
    half = [r for m, r in samples if m >= args.minutes / 2]
    first = [r for m, r in samples if m < args.minutes / 2]
    print("Soak, %.0f minutes, %d files (%.0f MB, %d of them 2-24 MiB): %d rounds of 1-8 concurrent readers on one long-lived mount "
          "(RAM %.0f MB, NVMe %.0f MB) and %d fresh mounts with random options; %d files of SOURCE replaced by FIFOs; "
          "%d files read, **%d wrong**." % (args.minutes, len(want), total / 1e6, args.large, rounds, total / 3e6, total / 2e6,
                                            fresh, len(swapped), files, wrong))
    if first and half:
        print("Long-lived daemon's resident memory: first half %.1f–%.1f MiB, second half %.1f–%.1f MiB." % (
            min(first) / 2**20, max(first) / 2**20, min(half) / 2**20, max(half) / 2**20))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
