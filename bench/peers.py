#!/usr/bin/python3
"""Many nodes on this machine: 4 clairfs daemons (one hydra proxy per "host", MPMD: a mount point, RAM
budget and NVMe directory each) over one shared slow SOURCE (bench/slowfs), each node running the C++
training loop for its rank. Side by side, systems rotated, medians of R runs:

  peers     the 4 daemons under mpiexec: one cache across the nodes
  no peers  the same 4 daemons started alone (no launcher): each node caches only for itself
  1 node    one daemon and one loop at the same per-node load (rank 0 of 4, a quarter of SOURCE's
            bandwidth), for the stall comparison

Each node's RAM holds 15% of the data set and its NVMe 30% unless told (--ram, --nvme): by default the
data set fits only in the nodes' caches together. Reports SOURCE bytes over the run ÷ data set and the
stall per epoch (the median node).

    bench/peers.py BUILD [--files 2400] [--epochs 3] [--reps 3] [--compute-ms 20] [--ram 0.15] [--nvme 0.30]
                         [--systems peers,no peers,1 node] [--pagecache SIZE] [--drop-pages] [--dump]

With `peers` among the systems it also prints what bench/cluster_sim predicts for the same tree, job and
budgets (SOURCE ÷ data set), beside the measured median.
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
from benchlib import cached_dataset, unmount, wait_mounted  # noqa: E402

NODES = 4


def slow_source(build, data, work, nodes):
    # 100 MB/s for the 4 nodes; one node alone gets its share, 25 MB/s (and a quarter of the requests).
    mnt = tempfile.mkdtemp(prefix="slow-", dir=work)
    proc = subprocess.Popen([build + "/bench/slowfs", data, mnt, "--open-latency-ms", "2", "--bandwidth-mbps",
                             str(100 * nodes // NODES), "--max-inflight", str(16 * nodes // NODES), "--stats",
                             mnt + ".json"], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    wait_mounted(mnt)
    return mnt, proc


def close_source(mnt, proc):
    unmount(mnt, proc, lazy=True)
    with open(mnt + ".json") as f:
        return json.load(f)


def options(args, rank, total, nvme):
    o = ("seed=3,batch_size=%d,workers=%d,prefetch_factor=2,world_size=%d,ranks=%d,epochs=%d,ram=%d"
         % (args.batch, args.workers, NODES, rank, args.epochs, int(total * args.ram)))
    if args.pagecache is not None:
        o += ",pagecache=%s" % args.pagecache
    # (--nvme 0: no NVMe tier, no nvme=; nvme_size=0 is refused)
    return o + (",nvme=%s,nvme_size=%d" % (nvme, int(total * args.nvme)) if args.nvme > 0 else "")


def loop(build, args, mnt, rank):
    return subprocess.Popen([build + "/bench/train_loop", "--root", mnt, "--seed", "3", "--world-size", str(NODES),
                             "--rank", str(rank), "--batch-size", str(args.batch), "--workers", str(args.workers),
                             "--prefetch-factor", "2", "--epochs", str(args.epochs), "--compute-ms",
                             str(args.compute_ms), "--drop-pages", "1" if args.drop_pages else "0"],
                            stdout=subprocess.PIPE, text=True)


def run(system, build, args, data, total, work):
    nodes = 1 if system == "1 node" else NODES
    src, sproc = slow_source(build, data, work, nodes)
    mnts = [tempfile.mkdtemp(prefix="m%d-" % n, dir=work) for n in range(nodes)]
    nvmes = [tempfile.mkdtemp(prefix="nvme%d-" % n, dir="/var/tmp") for n in range(nodes)]
    state = work + "/job.state"
    try:
        if system == "peers":
            cmd = [HERE + "/../scripts/clairfs-job-mount", "--state", state, "mpiexec", "-disable-auto-cleanup",
                   "-launcher", "fork", "-ppn", "1", "-hosts", ",".join("127.0.0.%d" % (n + 1) for n in range(nodes))]
            for n in range(nodes):
                cmd += ([":"] if n else []) + ["-n", "1", build + "/clairfs", src, mnts[n], "-o",
                                               options(args, n, total, nvmes[n])]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        else:
            for n in range(nodes):
                subprocess.run([build + "/clairfs", src, mnts[n], "-o", options(args, n, total, nvmes[n])], check=True)
        loops = [loop(build, args, mnts[n], n) for n in range(nodes)]
        epochs = []
        for p in loops:
            out, _ = p.communicate()
            epochs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
        node_stats = []
        for m in mnts:
            with open(m + "/.clairfs/stats") as f:
                node_stats.append(json.load(f))
    finally:
        if system == "peers":
            subprocess.run([HERE + "/../scripts/clairfs-job-umount", "--state", state], stdout=subprocess.DEVNULL)
        else:
            for m in mnts:
                unmount(m, lazy=True)
        time.sleep(0.5)
        for d in nvmes:
            shutil.rmtree(d, ignore_errors=True)
    if args.dump:
        for n, st in enumerate(node_stats):
            print("node %d: %s" % (n, json.dumps(st)), file=sys.stderr)
        if system == "peers":
            with open(state[:-len(".state")] + ".log") as f:
                sys.stderr.write("".join("log: " + line for line in f))
    seen = close_source(src, sproc)
    stalls = [statistics.median(e[i]["stall_s"] for e in epochs) for i in range(args.epochs)]
    fetched = sum(s.get("peers", {}).get("staged_files", 0) + s.get("peers", {}).get("demand_files", 0)
                  for s in node_stats)
    return {"source": seen["bytes"] / total, "stalls": stalls, "fetched": fetched}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=2400)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compute-ms", type=float, default=20)
    ap.add_argument("--ram", type=float, default=0.15, help="each node's RAM, a fraction of the data set")
    ap.add_argument("--nvme", type=float, default=0.30, help="each node's NVMe, a fraction of the data set")
    ap.add_argument("--systems", default="peers,no peers,1 node", help="which of them to run")
    ap.add_argument("--pagecache", help="the daemons' pagecache= (default: theirs, a quarter of ram)")
    ap.add_argument("--drop-pages", action="store_true",
                    help="each loop drops a file's pages once read: no node's page cache keeps the data set")
    ap.add_argument("--dump", action="store_true", help="print each node's stats (and the daemons' log) to stderr")
    ap.add_argument("--data-dir", default="/dev/shm/clairfs-bench-peers")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    data = "%s/%d" % (args.data_dir, args.files)
    cached_dataset(data, "--files", args.files, "--classes", 10, "--seed", 5)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs if f.endswith(".jpg"))
    work = tempfile.mkdtemp(prefix="clairfs-peers-")
    systems = args.systems.split(",")
    results = {s: [] for s in systems}
    t0 = time.monotonic()
    for rep in range(args.reps):
        for i in range(len(systems)):
            name = systems[(rep + i) % len(systems)]
            results[name].append(run(name, build, args, data, total, work))
            r = results[name][-1]
            print("rep %d %-8s SOURCE %.2f× stalls %s fetched %d" % (
                rep, name, r["source"], " ".join("%.2f" % x for x in r["stalls"]), r["fetched"]), file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)

    print("Workload: %d files, %.0f MB (lognormal, mean ~110 KB); world size 4, one rank per node; C++ loop, "
          "batch %d, %d workers, %g ms compute per batch, %d epochs. SOURCE: bench/slowfs, 2 ms per open, 100 MB/s "
          "shared by all nodes (one node alone: 25 MB/s, its share). Each node: RAM %d%% and NVMe %d%% of the data set. Medians of %d runs, "
          "systems rotated." % (args.files, total / 1e6, args.batch, args.workers, args.compute_ms, args.epochs,
                                100 * args.ram, 100 * args.nvme, args.reps))
    print()
    print("| system | SOURCE bytes ÷ data set |" + "".join(" epoch %d stall (s) |" % e for e in range(args.epochs)) +
          " files fetched from peers |")
    print("|---|---:|" + "---:|" * args.epochs + "---:|")
    med = {}
    for name in systems:
        runs = results[name]
        med[name] = {"source": statistics.median(r["source"] for r in runs),
                     "stalls": [statistics.median(r["stalls"][e] for r in runs) for e in range(args.epochs)],
                     "fetched": statistics.median(r["fetched"] for r in runs)}
        print("| %s | %.3f |" % (name, med[name]["source"]) + "".join(" %.2f |" % x for x in med[name]["stalls"]) +
              " %d |" % med[name]["fetched"])
    print()
    if "peers" in med:
        predicted = json.loads(subprocess.run(
            [build + "/bench/cluster_sim", "--tree", data, "--nodes", str(NODES), "--ranks-per-node", "1", "--batch",
             str(args.batch), "--seed", "3", "--epochs", str(args.epochs), "--loader-window",
             str(2 * max(args.workers, 1) * args.batch), "--cache", "%g+%g" % (NODES * args.ram, NODES * args.nvme)],
            check=True, capture_output=True, text=True).stdout)
        print("bench/cluster_sim predicts SOURCE %.3f× (by epoch %s; the kept files %.3f of the data set over their "
              "keepers' room); measured with peers %.3f×." % (predicted["source"], predicted["source_per_epoch"],
                                                            predicted["over_room"], med["peers"]["source"]))
        print()
    if "peers" not in med or "1 node" not in med:
        return
    ratios = ["%.2f" % (p / s) if s > 0.05 else "— (%.2f s vs %.2f s)" % (p, s)
              for p, s in zip(med["peers"]["stalls"], med["1 node"]["stalls"])]
    print("Stall with peers ÷ one node at the same per-node load, by epoch: %s. The 4 nodes share this machine's "
          "2 cores (4 daemons, 4 loops); the one node has them to itself. Took %.0f s." % (
              ", ".join(ratios), time.monotonic() - t0))


if __name__ == "__main__":
    main()
