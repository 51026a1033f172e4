#!/usr/bin/python3
"""Staged files read as a job reads them (issue 34): N files of ~110 KB (--mean-kb) in C class folders on tmpfs (the
folders as large as ImageNet's by default: 1,300 files), a mount with the default options, a seed and
start_batch=0 (the job starts at its epoch's beginning: --start-untold leaves it out), the tree listed by names first as ImageFolder does (os.walk), reading started once every file is staged
and all the mount will push is pushed, then one reader opening, reading and closing every file of rank
0's epoch 0 and epoch 1 in their orders (bench/read_files), the daemon's CPU time meanwhile counted (all its
threads, io_uring's workers among them). The same orders are read from the tmpfs copy
right after: files/s of each epoch, clairfs ÷ tmpfs, with --baseline OTHER_BUILD's clairfs beside this
one's in the same rotation. Prints medians of R runs and the pushes and refused pushes of the last run.

With --nvme DIR the mount has an NVMe tier in DIR and RAM for a few files (--ram, 1 MiB; the default
page-cache window, a quarter of that): epoch 0 is read first by one reader (staged through RAM, each file
written to the tier on its way), then, with the page caches dropped, epoch 1 (the tier's copies read back
a RAM's worth ahead) against the same files copied to DIR's device (once, left in DIR/clairfs-bench-copies)
read straight from there in the same order, cold too.

    bench/staged_epochs.py BUILD [--files 5200] [--classes 4] [--mean-kb 110] [--reps 3] [--threads 1] [--baseline OTHER]
                                 [--nvme DIR [--ram SIZE]] [--start-untold]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import cached_dataset, cpu_seconds, daemon_pid, unmount  # noqa: E402

START_UNTOLD = False  # --start-untold


def read_files(build, root, order, threads):
    r = subprocess.run([build + "/bench/read_files", root, "--list", order, "--threads", str(threads),
                        "--seed", "0", "--in-order"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["errors"] == 0, out
    return out["files_per_s"], out["bytes"] / out["seconds"] / 1e9


def read_mount(build, mnt, order, threads):
    """read_files through the mount, and the daemon's CPU time meanwhile in µs a file."""
    pid = daemon_pid(mnt)
    before = cpu_seconds(pid)
    got = read_files(build, mnt, order, threads)
    with open(order) as f:
        files = sum(1 for _ in f)
    return got + ((cpu_seconds(pid) - before) / files * 1e6,)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mounted_run(clairfs, build, data, mnt, work, threads, nvme=None, ram="1M"):
    """Files/s of epochs 0 and 1 through a fresh mount, and its page-cache counters before reading. With
    `nvme`: epoch 0 read by one reader (filling the tier), epoch 1 cold, then the same files on DIR's device cold."""
    # start_batch=0: the job says it starts at its epoch's beginning, so that everything is staged before
    # the first read (a mount not told so stages one batch per worker until the job's first opens show
    # where it starts: a job resumed mid-epoch skips the batches it did; --start-untold measures that).
    options = "seed=3,batch_size=32,epochs=2" + ("" if START_UNTOLD else ",start_batch=0")
    if nvme:
        options += ",ram=%s,nvme=%s" % (ram, nvme)
    subprocess.run([clairfs, data, mnt, "-o", options], check=True)
    try:
        for _ in os.walk(mnt):  # ImageFolder's listing: names and types, no stat of the files
            pass
        orders = []
        for epoch in (0, 1):
            path = "%s/order-%d" % (work, epoch)
            with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, epoch)) as f, open(path, "w") as out:
                out.write(f.read())
            orders.append(path)
        if nvme:
            # (the tier filled on the way: one reader, as more outrun the staging and the writes of the files
            # they read on demand, and far fewer reach the tier)
            first = read_mount(build, mnt, orders[0], 1)
        deadline, last, since = time.monotonic() + 120, None, time.monotonic()
        while time.monotonic() < deadline:
            with open(mnt + "/.clairfs/stats") as f:
                s = json.load(f)
            now = (s["ram"]["files"], s["pagecache"]["pushes"], s.get("nvme", {}).get("files", 0))
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > 1.0 and now[2 if nvme else 0] > 0:
                break
            time.sleep(0.1)
        pagecache = dict(s["pagecache"])
        if not nvme:
            return [read_mount(build, mnt, order, threads) for order in orders], orders, pagecache
        pagecache["nvme_files"] = s["nvme"]["files"]
        # The tier packs its copies into slabs: the same files as files of their own on DIR's device
        # (copied there once) stand for reading them straight from the disk, in epoch 1's order.
        copies = os.path.join(nvme, "clairfs-bench-copies")
        if not os.path.isdir(copies):
            shutil.copytree(data, copies + ".part")
            os.rename(copies + ".part", copies)
        drop_caches()
        got = read_mount(build, mnt, orders[1], threads)
        drop_caches()
        r = subprocess.run([build + "/bench/read_files", copies, "--list", orders[1], "--threads", str(threads),
                            "--seed", "0", "--in-order"], capture_output=True, text=True, check=True)
        out = json.loads(r.stdout)
        assert out["errors"] == 0, out
        with open(mnt + "/.clairfs/stats") as f:
            s = json.load(f)
        pagecache["served"] = {t: s["tiers"][t]["files"] for t in ("ram", "nvme", "source")}
        # (epoch 0 against SOURCE itself, as the mount read it: from the tmpfs copy, warm)
        pagecache["direct"] = [read_files(build, data, orders[0], 1),
                               (out["files_per_s"], out["bytes"] / out["seconds"] / 1e9)]
        return [first, got], orders, pagecache
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
    ap.add_argument("--nvme", help="stage on an NVMe tier in this directory, and read cold")
    ap.add_argument("--ram", default="1M", help="with --nvme: the mount's RAM budget")
    ap.add_argument("--start-untold", action="store_true",
                    help="mount without start_batch=0: one batch staged until the job's first opens")
    a = ap.parse_args()
    global START_UNTOLD
    START_UNTOLD = a.start_untold
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
    against = ("tmpfs", "the files on DIR's device, cold" if a.nvme else "tmpfs")
    for rep in range(a.reps):
        for name, clairfs in systems[rep % len(systems):] + systems[:rep % len(systems)]:
            got, orders, counters[name] = mounted_run(clairfs, build, data, mnt, work, a.threads, a.nvme, a.ram)
            tmpfs = counters[name].get("direct") or [read_files(build, data, order, a.threads) for order in orders]
            for epoch in (0, 1):
                rates.setdefault((name, epoch), []).append(got[epoch][0])
                rates.setdefault((name + " tmpfs", epoch), []).append(tmpfs[epoch][0])
                rates.setdefault((name, epoch, "GB/s"), []).append(got[epoch][1])
                rates.setdefault((name, epoch, "cpu"), []).append(got[epoch][2])
            print("rep %d %s: epoch 0 %.0f (%s %.0f), epoch 1 %.0f (%s %.0f) files/s; the daemon's CPU %.0f, %.0f µs a file"
                  % (rep, name, got[0][0], against[0], tmpfs[0][0], got[1][0], against[1], tmpfs[1][0], got[0][2],
                     got[1][2]), file=sys.stderr)
    os.rmdir(mnt)
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)

    med = {k: statistics.median(v) for k, v in rates.items()}
    last = "NVMe files (last run)" if a.nvme else "pushes, refused (last run)"
    print("| system | epoch 0 files/s (GB/s) | ÷ %s | epoch 1 files/s (GB/s) | ÷ %s | the daemon's CPU a file, "
          "epochs 0, 1 | %s |" % (against + (last,)))
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, _ in systems:
        c = counters[name]
        print("| %s | %.0f (%.2f) | **%.2f×** | %.0f (%.2f) | **%.2f×** | %.0f, %.0f µs | %s |" % (
            name, med[(name, 0)], med[(name, 0, "GB/s")], med[(name, 0)] / med[(name + " tmpfs", 0)],
            med[(name, 1)], med[(name, 1, "GB/s")], med[(name, 1)] / med[(name + " tmpfs", 1)],
            med[(name, 0, "cpu")], med[(name, 1, "cpu")],
            "%d; served %s" % (c["nvme_files"], c["served"]) if a.nvme else "%d, %d" % (c["pushes"],
                                                                                     c["push_failures"])))


if __name__ == "__main__":
    main()
