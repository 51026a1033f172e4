#!/usr/bin/python3
"""The demo's comparison: the same unmodified PyTorch epochs (ImageFolder + DistributedSampler +
DataLoader, a fixed compute time per batch standing in for the model's step) read from a slow shared
file system stand-in (bench/slowfs: a delay per open, a shared bandwidth, a cap on requests in flight,
no page cache — what a parallel file system under load looks like from one node), first directly, then
through clairfs mounted on it. Prints each epoch's time, the time the loop waited for data (the stall:
a GPU idle), files/s, and what SOURCE served, then says what the figures mean.

    slow_source_demo.py BUILD DATA [--epochs 3] [--compute-ms 20] [--batch-size 256] [--workers 4]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from harness import Params, dataset_bytes, run_system  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    p = Params(False)
    p.epochs, p.compute_ms, p.batch, p.workers, p.seed = args.epochs, args.compute_ms, args.batch_size, args.workers, 0
    total = dataset_bytes(args.data)
    work = tempfile.mkdtemp(prefix="clairfs-demo-slow-")
    print("   slow source: %d ms per open, %d MB/s shared, %d requests in flight, no page cache" % (
        p.latency_ms, p.bandwidth_mbps, p.inflight))
    print("   loop: %d epochs, batch %d, %d workers, %g ms of compute per batch" % (
        p.epochs, p.batch, p.workers, p.compute_ms), flush=True)
    runs = {}
    for name in ("direct", "clairfs"):
        runs[name] = run_system(name, build, p, args.data, work, torch=True)
        print("   %s: done" % name, flush=True)
    # The runs' emptied mount points and slowfs's stats files (never a recursive delete: one may still be
    # a mount). What cannot go is named.
    for name in os.listdir(work):
        path = os.path.join(work, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
            else:
                os.rmdir(path)
        except OSError as e:
            print("   left behind: %s (%s)" % (path, e.strerror), file=sys.stderr)
    try:
        os.rmdir(work)
    except OSError:
        pass

    print("   %-6s %28s   %28s" % ("", "read directly", "through clairfs"))
    print("   %-6s %8s %8s %10s   %8s %8s %10s" % ("epoch", "time s", "stall s", "files/s", "time s", "stall s", "files/s"))
    for e in range(p.epochs):
        a, b = runs["direct"]["epochs"][e], runs["clairfs"]["epochs"][e]
        print("   %-6d %8.1f %8.1f %10.0f   %8.1f %8.1f %10.0f" % (
            e, a["wall_s"], a["stall_s"], a["files"] / a["wall_s"], b["wall_s"], b["stall_s"], b["files"] / b["wall_s"]))
    direct_stall = sum(x["stall_s"] for x in runs["direct"]["epochs"])
    clairfs_stall = sum(x["stall_s"] for x in runs["clairfs"]["epochs"])
    later_direct = sum(x["stall_s"] for x in runs["direct"]["epochs"][1:])
    later_clairfs = sum(x["stall_s"] for x in runs["clairfs"]["epochs"][1:])
    source = {n: runs[n]["source_bytes"] / total for n in runs}
    print("   SOURCE served: %.2fx the data set read directly, %.2fx through clairfs" % (source["direct"], source["clairfs"]))
    print("== what it means: over %d epochs the loop waited %.1f s for data reading directly and %.1f s through "
          "clairfs (%.0f%% of it)%s; the shared file system served %.1fx less. clairfs knew the order from the "
          "seed and read each file ahead, once." % (
              p.epochs, direct_stall, clairfs_stall, 100 * clairfs_stall / max(direct_stall, 1e-9),
              "; from epoch 1 on %.1f s against %.1f s" % (later_clairfs, later_direct) if p.epochs > 1 else "",
              source["direct"] / max(source["clairfs"], 1e-9)))


if __name__ == "__main__":
    main()
