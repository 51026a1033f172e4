#!/usr/bin/python3
"""Front-end benchmark: reading N files of ~110 KB once each, in a random order, with one reader,
(a) directly from SOURCE on tmpfs, (b) through a fresh plain clairfs mount (ram=0), (c) through a fresh
mount of memfs_ceiling, a minimal libfuse server holding every byte in RAM (the ceiling any FUSE
front-end reaches on this machine), and first reads of files clairfs staged before they were asked for:
(d) served from the daemon's RAM (pagecache=0) and (e) pushed into the kernel's page cache, the kernel
sending every open to the daemon (progress=opens) or opening files itself (FUSE no-open mode, where a
pushed file costs no request), (f) with the watch on the mount that tells the daemon of every open and
close (progress=watch, the default) and (g) without it (progress=reads): (f) ÷ (g) is what seeing every
open costs a reader. For (d)-(g) the order is given to
clairfs (order=list), the tree is listed first (as ImageFolder does, so the kernel knows every inode),
and reading starts once everything is staged (and pushed). Runs the systems side by side,
rotating which goes first, R times; prints medians and ratios as a markdown table. Also times the
manifest for a tree of M entries. With --baseline OTHER_BUILD, (f) and (g) run with that build's clairfs
too, in the same rotation: what a change costs the no-open reader, side by side.

    bench/frontend.py BUILD [--files 20000] [--reps 5] [--threads 1] [--manifest-entries 1000000]
                            [--baseline OTHER_BUILD]
"""
import argparse
import json
import mmap
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import cached_dataset, unmount, wait_mounted  # noqa: E402


def warm_guest_memory(gib):
    # On a VM, memory the guest touches for the first time costs host page faults; whichever system runs
    # first would pay them. Touch it once so all runs start equal.
    m = mmap.mmap(-1, gib << 30)
    for i in range(0, gib << 30, 4096):
        m[i] = 1
    m.close()


def read_files(build, root, listing, threads, seed, in_order=False):
    r = subprocess.run([build + "/bench/read_files", root, "--list", listing, "--threads", str(threads),
                        "--seed", str(seed)] + (["--in-order"] if in_order else []),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def staged_first(build, data, mnt, listing, work, threads, seed, push, progress=None):
    """Mounts with the reading order given, lists the tree, waits until every file is staged (and all it
    will push is pushed: progress=reads leaves some files unpushed, as beacons), reads."""
    paths = open(listing).read().splitlines()
    random.Random(seed).shuffle(paths)
    order = work + "/order-%d" % seed
    with open(order, "w") as f:
        f.write("\n".join(paths) + "\n")
    total = sum(os.path.getsize(os.path.join(data, p)) for p in paths)
    budget = total + (64 << 20)
    # (start_batch=0: staged whole before the first read, not the start window alone)
    opts = "order=list,order_file=%s,start_batch=0,ram=%d,pagecache=%d" % (order, budget, budget if push else 0)
    if progress:
        opts += ",progress=" + progress
    subprocess.run([build + "/clairfs", data, mnt, "-o", opts], check=True)
    try:
        for _ in os.walk(mnt):
            pass
        deadline = time.monotonic() + 120
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            with open(mnt + "/.clairfs/stats") as f:
                s = json.load(f)
            if s["ram"]["used"] >= total:
                if not push:
                    break
                now = (s["pagecache"]["pushes"], s["pagecache"]["push_failures"])
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since > 0.3:
                    break
            time.sleep(0.05)
        return read_files(build, mnt, order, threads, seed, in_order=True)
    finally:
        unmount(mnt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--manifest-entries", type=int, default=1000000)
    ap.add_argument("--data", default="/dev/shm/clairfs-bench-frontend")
    ap.add_argument("--baseline", help="another build whose clairfs runs (f) and (g) beside this one's")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    baseline = os.path.abspath(args.baseline) if args.baseline else None

    data = "%s/%d" % (args.data, args.files)
    cached_dataset(data, "--files", args.files)
    work = tempfile.mkdtemp(prefix="clairfs-bench-")
    listing = work + "/files"
    with open(listing, "w") as f:
        for d, _, files in os.walk(data):
            for name in files:
                if name.endswith(".jpg"):
                    f.write(os.path.relpath(os.path.join(d, name), data) + "\n")
    mnt = work + "/mnt"
    os.makedirs(mnt)
    warm_guest_memory(int(os.environ.get("CLAIRFS_BENCH_WARM_GIB", "12")))

    def direct(seed):
        return read_files(build, data, listing, args.threads, seed)

    def clairfs(seed):
        subprocess.run([build + "/clairfs", data, mnt, "-o", "ram=0"], check=True)
        try:
            return read_files(build, mnt, listing, args.threads, seed)
        finally:
            unmount(mnt)

    def ceiling(seed):
        p = subprocess.Popen([build + "/bench/memfs_ceiling", data, mnt], stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        wait_mounted(mnt)
        try:
            return read_files(build, mnt, listing, args.threads, seed)
        finally:
            unmount(mnt, p)

    def staged_ram(seed):
        return staged_first(build, data, mnt, listing, work, args.threads, seed, push=False)

    def staged_pushed_opens(seed):
        return staged_first(build, data, mnt, listing, work, args.threads, seed, push=True, progress="opens")

    def staged_pushed(seed):
        return staged_first(build, data, mnt, listing, work, args.threads, seed, push=True)

    def staged_pushed_reads(seed):
        return staged_first(build, data, mnt, listing, work, args.threads, seed, push=True, progress="reads")

    systems = [("direct (tmpfs)", direct), ("clairfs", clairfs), ("memfs ceiling", ceiling),
               ("clairfs staged, RAM", staged_ram), ("clairfs staged, pushed, progress=opens", staged_pushed_opens),
               ("clairfs staged, pushed", staged_pushed), ("clairfs staged, pushed, progress=reads", staged_pushed_reads)]
    if baseline:
        systems += [("baseline: clairfs staged, pushed",
                     lambda seed: staged_first(baseline, data, mnt, listing, work, args.threads, seed, push=True)),
                    ("baseline: clairfs staged, pushed, progress=reads",
                     lambda seed: staged_first(baseline, data, mnt, listing, work, args.threads, seed, push=True,
                                               progress="reads"))]
    rates = {name: [] for name, _ in systems}
    for rep in range(args.reps):
        order = systems[rep % len(systems):] + systems[:rep % len(systems)]
        for name, fn in order:
            r = fn(rep)
            assert r["errors"] == 0 and r["files"] == args.files, r
            rates[name].append(r["files_per_s"])
        print("rep %d: %s" % (rep, ", ".join("%s %.0f" % (n, rates[n][-1]) for n, _ in systems)), file=sys.stderr)
    med = {n: statistics.median(v) for n, v in rates.items()}
    mb = 2262.5 / 20000 * 1e6  # not used for ratios
    del mb

    print("| system | files/s (median of %d) | runs | vs ceiling |" % args.reps)
    print("|---|---:|---|---:|")
    for n, _ in systems:
        print("| %s | %.0f | %s | %.2f× |" % (n, med[n], " ".join("%.0f" % x for x in rates[n]), med[n] / med["memfs ceiling"]))
    print()
    print("clairfs ÷ ceiling = **%.2f×** (target ≥ 0.8×); clairfs ÷ direct = %.2f×" % (
        med["clairfs"] / med["memfs ceiling"], med["clairfs"] / med["direct (tmpfs)"]))
    print("first reads of staged files ÷ direct (tmpfs): RAM **%.2f×**, pushed with opens %.2f×, pushed (default) "
          "**%.2f×** (target ≥ 0.5×)" % (
              med["clairfs staged, RAM"] / med["direct (tmpfs)"],
              med["clairfs staged, pushed, progress=opens"] / med["direct (tmpfs)"],
              med["clairfs staged, pushed"] / med["direct (tmpfs)"]))
    print("seeing every open (the watch, the default) ÷ inferring from reads (progress=reads), "
          "pushed files: **%.2f×**" % (med["clairfs staged, pushed"] / med["clairfs staged, pushed, progress=reads"]))
    if baseline:
        print("this build ÷ the baseline's, pushed files: the watch **%.2f×**, progress=reads **%.2f×**" % (
            med["clairfs staged, pushed"] / med["baseline: clairfs staged, pushed"],
            med["clairfs staged, pushed, progress=reads"] / med["baseline: clairfs staged, pushed, progress=reads"]))

    if args.manifest_entries:
        tree = "%s/tree-%d" % (args.data, args.manifest_entries)
        per_dir = 1000
        if not os.path.exists(tree + "/.complete"):
            shutil.rmtree(tree, ignore_errors=True)
            for d in range((args.manifest_entries + per_dir - 1) // per_dir):
                p = "%s/c%04d" % (tree, d)
                os.makedirs(p)
                for i in range(min(per_dir, args.manifest_entries - d * per_dir)):
                    os.close(os.open("%s/n%08d.JPEG" % (p, d * per_dir + i), os.O_CREAT | os.O_WRONLY, 0o644))
            open(tree + "/.complete", "w").close()
        runs = []
        for _ in range(3):
            r = subprocess.run([build + "/bench/manifest_bench", tree, work + "/tree.manifest"],
                               capture_output=True, text=True, check=True)
            runs.append(json.loads(r.stdout))
        m = runs[-1]
        print()
        print("| manifest of %d entries | median of 3 |" % m["entries"])
        print("|---|---:|")
        print("| scan (SOURCE on tmpfs) | %.2f s |" % statistics.median(r["scan_s"] for r in runs))
        print("| load from file | %.3f s |" % statistics.median(r["load_s"] for r in runs))
        print("| memory besides names | %.1f bytes/entry |" % m["bytes_per_entry_besides_names"])
        print("| memory in all | %.1f MB (names %.1f MB) |" % (m["memory_bytes"] / 1e6, m["name_bytes"] / 1e6))
        print("| manifest file | %.1f MB |" % (m["file_bytes"] / 1e6))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
