#!/usr/bin/python3
"""Staged files read as a job reads them (issue 34): N files of ~110 KB (--mean-kb) in C class folders on tmpfs (the
folders as large as ImageNet's by default: 1,300 files), a mount with the default options and a seed,
the tree listed by names first as ImageFolder does (os.walk), reading started once every file is staged
and all the mount will push is pushed, then one reader opening, reading and closing every file of rank
0's epoch 0 and epoch 1 in their orders (bench/read_files). The same orders are read from the tmpfs copy
right after: files/s of each epoch, clairfs ÷ tmpfs, with --baseline OTHER_BUILD's clairfs beside this
one's in the same rotation. Prints medians of R runs and the pushes and refused pushes of the last run.

    bench/staged_epochs.py BUILD [--files 5200] [--classes 4] [--mean-kb 110] [--reps 3] [--threads 1] [--baseline OTHER]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import cached_dataset, unmount  # noqa: E402


def read_files(build, root, order, threads):
    r = subprocess.run([build + "/bench/read_files", root, "--list", order, "--threads", str(threads),
                        "--seed", "0", "--in-order"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["errors"] == 0, out
    return out["files_per_s"], out["bytes"] / out["seconds"] / 1e9


def mounted_run(clairfs, build, data, mnt, work, threads):
    """Files/s of epochs 0 and 1 through a fresh mount, and its page-cache counters before reading."""
    subprocess.run([clairfs, data, mnt, "-o", "seed=3,batch_size=32,epochs=2"], check=True)
    try:
        for _ in os.walk(mnt):  # ImageFolder's listing: names and types, no stat of the files
            pass
        orders = []
        for epoch in (0, 1):
            path = "%s/order-%d" % (work, epoch)
            with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, epoch)) as f, open(path, "w") as out:
                out.write(f.read())
            orders.append(path)
        deadline, last, since = time.monotonic() + 120, None, time.monotonic()
        while time.monotonic() < deadline:
            with open(mnt + "/.clairfs/stats") as f:
                s = json.load(f)
            now = (s["ram"]["files"], s["pagecache"]["pushes"])
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > 1.0 and now[0] > 0:
                break
            time.sleep(0.1)
        pagecache = dict(s["pagecache"])
        return [read_files(build, mnt, order, threads) for order in orders], orders, pagecache
    finally:
        unmount(mnt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=5200)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--mean-kb", type=float, default=110.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="/dev/shm/clairfs-bench-staged")
    ap.add_argument("--baseline", help="another build whose clairfs runs beside this one's")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    data = "%s/%d-%d-%g" % (a.data, a.files, a.classes, a.mean_kb)
    cached_dataset(data, "--files", a.files, "--classes", a.classes, "--mean-kb", a.mean_kb)
    work = tempfile.mkdtemp(prefix="clairfs-bench-staged-")
    mnt = work + "/mnt"
    os.makedirs(mnt)
    systems = [("clairfs", build + "/clairfs")]
    if a.baseline:
        systems.append(("baseline", os.path.abspath(a.baseline) + "/clairfs"))
    rates = {}
    counters = {}
    for rep in range(a.reps):
        for name, clairfs in systems[rep % len(systems):] + systems[:rep % len(systems)]:
            got, orders, counters[name] = mounted_run(clairfs, build, data, mnt, work, a.threads)
            tmpfs = [read_files(build, data, order, a.threads) for order in orders]
            for epoch in (0, 1):
                rates.setdefault((name, epoch), []).append(got[epoch][0])
                rates.setdefault((name + " tmpfs", epoch), []).append(tmpfs[epoch][0])
                rates.setdefault((name, epoch, "GB/s"), []).append(got[epoch][1])
            print("rep %d %s: epoch 0 %.0f (tmpfs %.0f), epoch 1 %.0f (tmpfs %.0f) files/s" % (
                rep, name, got[0][0], tmpfs[0][0], got[1][0], tmpfs[1][0]), file=sys.stderr)
    os.rmdir(mnt)
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)

    med = {k: statistics.median(v) for k, v in rates.items()}
    print("| system | epoch 0 files/s (GB/s) | ÷ tmpfs | epoch 1 files/s (GB/s) | ÷ tmpfs | pushes, refused (last run) |")
    print("|---|---:|---:|---:|---:|---|")
    for name, _ in systems:
        print("| %s | %.0f (%.2f) | **%.2f×** | %.0f (%.2f) | **%.2f×** | %d, %d |" % (
            name, med[(name, 0)], med[(name, 0, "GB/s")], med[(name, 0)] / med[(name + " tmpfs", 0)],
            med[(name, 1)], med[(name, 1, "GB/s")], med[(name, 1)] / med[(name + " tmpfs", 1)],
            counters[name]["pushes"], counters[name]["push_failures"]))


if __name__ == "__main__":
    main()
