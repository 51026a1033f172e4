#!/usr/bin/python3
"""RAM smaller than the data set, the kernel's page cache larger (security finding 13) or smaller: SOURCE
bytes ÷ the data set and the readers' stall over 3 epochs, clairfs against another clairfs binary (an
older build, say) and a plain mount, side by side in one run. SOURCE is bench/slowfs (2 ms an open,
200 MB/s); the reader opens and reads rank 0's published order (.clairfs/order) with plain Python, in a
memory cgroup (v1) limited to --reader-mib for the smaller page cache.

    kernel_keeps.py BUILD [--other CLAIRFS] [--files 1500] [--kb 64] [--reader-mib 40] [--reps 2]
                    [--progress reads]

--progress: the clairfs mounts' progress= (default: the default, opens watched).
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "mount"))
import harness as h  # noqa: E402  (the mount tests' helpers: mounts, data sets, stats)

# The benchmark harness's slow source (its module is also named harness).
_spec = importlib.util.spec_from_file_location("bench_harness", os.path.join(HERE, "harness.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CGROUP = "/sys/fs/cgroup/memory"
READER = r'''
import os, sys, time
mnt, orders = sys.argv[1], sys.argv[2]
t0 = time.monotonic()
for e in range(3):
    for name in open(os.path.join(orders, "epoch-%d" % e)).read().splitlines():
        with open(os.path.join(mnt, name), "rb") as f:
            while f.read(1 << 20):
                pass
print(time.monotonic() - t0)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--other", help="another clairfs binary to compare")
    ap.add_argument("--files", type=int, default=1500)
    ap.add_argument("--kb", type=int, default=64)
    ap.add_argument("--reader-mib", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--progress")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    binaries = [("this", build + "/clairfs")] + ([("other", os.path.abspath(args.other))] if args.other else [])
    limited = os.path.join(CGROUP, "clairfs-bench-reader")
    os.makedirs(limited, exist_ok=True)
    with open(limited + "/memory.limit_in_bytes", "w") as f:
        f.write(str(args.reader_mib << 20))
    with tempfile.TemporaryDirectory(prefix="clairfs-bench-") as tmp:
        data, mnt = tmp + "/data", tmp + "/mnt"
        os.mkdir(mnt)
        want, total = h.dataset(data, args.files, 8, args.kb, 30)
        p = bench.Params(False)
        p.bandwidth_mbps = 200
        source = bench.SlowSource(build, data, tmp, p)
        slow = source.mnt
        told = "seed=42,batch_size=16,workers=0,world_size=1,ram=%d" % (total // 3)
        if args.progress:
            told += ",progress=" + args.progress
        orders = tmp + "/orders"
        os.mkdir(orders)
        h.CLAIRFS = build + "/clairfs"
        with h.mounted(data, mnt, told):  # the order every mount below is read in
            for e in range(3):
                with open(mnt + "/.clairfs/order/epoch-%d/rank-0" % e) as f, open(orders + "/epoch-%d" % e, "w") as o:
                    o.write(f.read())
        print("%d files, %.1f MiB; RAM a third of it; reader's page cache: all, or %d MiB%s" % (
            args.files, total / 2**20, args.reader_mib, "; progress=" + args.progress if args.progress else ""))
        try:
            for rep in range(args.reps):
                for cache in ("all", "%d MiB" % args.reader_mib):
                    for label, binary in binaries + [("plain", build + "/clairfs")]:
                        h.CLAIRFS = binary
                        opts = "ram=%d" % (total // 3) if label == "plain" else told
                        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
                        with h.mounted(slow, mnt, opts):
                            enter = (lambda: open(limited + "/cgroup.procs", "w").write(str(os.getpid()))) \
                                if cache != "all" else None
                            out = subprocess.run([sys.executable, "-c", READER, mnt, orders], capture_output=True, text=True, preexec_fn=enter)
                            s = h.settled_stats(mnt, 3 * len(want))
                        if out.returncode != 0:
                            print("%-6s page cache %-7s reader failed: %s" % (label, cache, out.stderr.strip()[-200:]))
                            continue
                        print("%-6s page cache %-7s SOURCE %.3f× the data set, reader %.2f s, stalls %.2f s" % (
                            label, cache, h.source_bytes(s) / total, float(out.stdout), s["stalls"]["seconds"]), flush=True)
        finally:
            source.close()
            os.rmdir(limited)


if __name__ == "__main__":
    main()
