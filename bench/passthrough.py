#!/usr/bin/python3
"""Is FUSE passthrough worth building into clairfs for its NVMe copies? Files on this machine's disk (where
clairfs's NVMe tier keeps its copies: /var/tmp) read once each in a random order by T threads, (a)
directly, and through a fresh mount of bench/passthrough_ceiling, a minimal libfuse server, (b) with every
open answered by passthrough to the file itself (the kernel reads it; an OPEN and a RELEASE a file reach
the server), (c) with opens answered and READs served by pread from the file, (d) in no-open mode (the
kernel opens files itself, as clairfs's default; READs served by pread). Each system reads cold (the page
cache dropped: what epoch 1 reads of NVMe copies meet) and then again in the same mount, warm (what is
left is the per-file cost of the route). Systems rotated, R reps; prints medians and ratios to direct.

    bench/passthrough.py BUILD [--files 5200] [--reps 5] [--threads 1] [--dir /var/tmp]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import cached_dataset, unmount, wait_mounted  # noqa: E402
from frontend import read_files  # noqa: E402
from staged_epochs import drop_caches  # noqa: E402

SYSTEMS = ["direct", "passthrough", "daemon", "no-open"]


def run(build, system, data, mnt, listing, threads, seed):
    proc = None
    root = data
    if system != "direct":
        proc = subprocess.Popen([build + "/bench/passthrough_ceiling", data, mnt, system],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_mounted(mnt)
        root = mnt
    try:
        drop_caches()
        cold = read_files(build, root, listing, threads, seed)
        warm = read_files(build, root, listing, threads, seed + 1)
    finally:
        if proc:
            unmount(mnt, proc)
    for r in (cold, warm):
        if r["errors"]:
            err = proc.stderr.read().strip() if proc else ""
            raise SystemExit("%s: %d files not read %s" % (system, r["errors"], err))
    return cold["files_per_s"], warm["files_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=5200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    data = os.path.join(a.dir, "clairfs-bench-passthrough-%d" % a.files)
    cached_dataset(data, "--files", a.files, "--classes", 4)
    work = tempfile.mkdtemp(prefix="clairfs-passthrough-")
    mnt = work + "/mnt"
    os.mkdir(mnt)
    listing = work + "/list"
    with open(listing, "w") as f:
        for d, _, names in os.walk(data):
            for n in names:
                if not n.startswith("."):
                    f.write(os.path.relpath(os.path.join(d, n), data) + "\n")
    got = {s: ([], []) for s in SYSTEMS}
    for rep in range(a.reps):
        for s in SYSTEMS[rep % len(SYSTEMS):] + SYSTEMS[:rep % len(SYSTEMS)]:
            cold, warm = run(build, s, data, mnt, listing, a.threads, 100 + rep)
            got[s][0].append(cold)
            got[s][1].append(warm)
            print("rep %d %-12s cold %8.0f files/s   warm %8.0f files/s" % (rep, s, cold, warm), flush=True)
    os.rmdir(mnt)
    os.unlink(listing)
    os.rmdir(work)
    med = {s: (statistics.median(got[s][0]), statistics.median(got[s][1])) for s in SYSTEMS}
    print("\n%d files of ~110 KB in %s, %d reader thread(s), medians of %d\n" % (a.files, a.dir, a.threads, a.reps))
    print("| system | cold files/s | ÷ direct | warm files/s | ÷ direct |")
    print("|---|---:|---:|---:|---:|")
    for s in SYSTEMS:
        c, w = med[s]
        print("| %s | %.0f | %.2f× | %.0f | %.2f× |" % (s, c, c / med["direct"][0], w, w / med["direct"][1]))


if __name__ == "__main__":
    main()
