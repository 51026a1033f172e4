#!/usr/bin/python3
"""The benchmark harness: the same training workload over a slow shared file system, read four ways,
side by side in one run, plus the cache-policy simulation. Writes tables and plots into docs/.

Systems (each run starts from a fresh slow-source mount, so its SOURCE traffic is its own):
  direct              the training loop reads the slow source directly
  stage-in            copy the whole data set to local disk first (copy time counted in epoch 1), then read that
  clairfs ram=0       a plain clairfs mount of the slow source (no staging)
  clairfs ram=¼       the engine with a RAM budget of a quarter of the data set: the cache is smaller than it
  clairfs ram=¼ nvme  the same with an NVMe tier (a directory on local disk) that holds the rest
  clairfs             the engine with its defaults (RAM: a quarter of the machine's memory)
  bound               not a run: epoch 1 cannot stall less than max(0, bytes from SOURCE / bandwidth - compute);
                      later epochs 0 when the data set fits the caches
Then a long unmodified-PyTorch run (10 epochs) read directly and through clairfs, end to end.

    harness.py BUILD [--quick] [--out docs]
"""
import argparse
import copy
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
from benchlib import SlowSource, cached_dataset, daemon_peak, unmount, write_section  # noqa: E402


class Params:
    def __init__(self, quick):
        self.files = 500 if quick else 3000
        self.classes = 20
        self.epochs = 2 if quick else 3
        self.reps = 1 if quick else 3
        self.batch = 16
        self.workers = 4
        self.prefetch = 2
        self.compute_ms = 10
        self.seed = 42
        self.latency_ms = 2
        self.bandwidth_mbps = 100
        self.inflight = 16
        self.torch = True
        self.sim_files = 1000 if quick else 10000


def run_loop(build, p, root, order_root, stalls=None, torch=False):
    if torch:
        cmd = [sys.executable, HERE + "/torch_loop.py", root]
    else:
        cmd = [build + "/bench/train_loop", "--root", root, "--order-root", order_root]
        if stalls:
            cmd += ["--stalls", stalls]
    cmd += ["--seed", str(p.seed), "--batch-size", str(p.batch), "--workers", str(p.workers), "--prefetch-factor",
            str(p.prefetch), "--epochs", str(p.epochs), "--compute-ms", str(p.compute_ms)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


# A system run with every CPU of the node busy beside it (one spinning process per CPU, at the job's own
# priority): the other work of a training node.
BUSY = " + busy CPUs"


def run_system(name, build, p, data, work, torch=False, stalls=None):
    if not name.endswith(BUSY):
        return run_one(name, build, p, data, work, torch, stalls)
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 2)]
    try:
        return run_one(name[:-len(BUSY)], build, p, data, work, torch, stalls)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def run_one(name, build, p, data, work, torch, stalls):
    slow = SlowSource(build, data, work, p)
    copy_s = 0.0
    memory = 0
    learned = None
    try:
        if name == "direct":
            epochs = run_loop(build, p, slow.mnt, slow.mnt, stalls, torch)
        elif name == "stage-in":
            local = tempfile.mkdtemp(prefix="stage-", dir="/var/tmp")
            try:
                t0 = time.perf_counter()
                subprocess.run(["cp", "-r", slow.mnt + "/.", local], check=True)
                copy_s = time.perf_counter() - t0
                epochs = run_loop(build, p, local, local, stalls, torch)
            finally:
                shutil.rmtree(local, ignore_errors=True)
            epochs[0]["wall_s"] += copy_s
            epochs[0]["stall_s"] += copy_s  # the GPU waits for the copy as it would for data
        elif name.startswith("clairfs"):
            mnt = tempfile.mkdtemp(prefix="clairfs-", dir=work)
            opts = "seed=%d,batch_size=%d,workers=%d,prefetch_factor=%d,epochs=%d" % (
                p.seed, p.batch, p.workers, p.prefetch, p.epochs)
            nvme = None
            if name == "clairfs ram=0":
                opts += ",ram=0"
            elif name.startswith("clairfs ram=¼"):
                opts += ",ram=%d" % p.ram
            if name.endswith("seed=auto"):
                opts = opts.replace("seed=%d," % p.seed, "seed=auto,", 1)
            if name.endswith("nvme"):
                nvme = tempfile.mkdtemp(prefix="nvme-", dir="/var/tmp")
                opts += ",nvme=" + nvme
            subprocess.run([build + "/clairfs", slow.mnt, mnt, "-o", opts], check=True)
            try:
                epochs = run_loop(build, p, mnt, mnt, stalls, torch)
                memory = daemon_peak(mnt)
                with open(mnt + "/.clairfs/stats") as f:
                    learned = json.load(f).get("learned")
            finally:
                unmount(mnt, lazy=True)
                if nvme:
                    time.sleep(0.5)  # the daemon removes its cache folder on the way out
                    shutil.rmtree(nvme, ignore_errors=True)
        else:
            raise ValueError(name)
    finally:
        stats = slow.close()
    return {"epochs": epochs, "source_bytes": stats["bytes"], "source_opens": stats["opens"], "copy_s": copy_s,
            "memory": memory, "learned": learned}


def bound(p, data_bytes, batches):
    compute = batches * p.compute_ms / 1000
    first = max(0.0, data_bytes / (p.bandwidth_mbps * 1e6) - compute)
    return [first] + [0.0] * (p.epochs - 1)


def dataset_bytes(data):
    total = 0
    for d, _, files in os.walk(data):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files if f.endswith((".jpg", ".png")))
    return total


def plot_stalls(results, lower, p, png):
    """Per-epoch stall, one group of bars per epoch, a bar per system (medians), the bound marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        stalls = [statistics.median(r["epochs"][e]["stall_s"] for r in results[name]) for e in range(p.epochs)]
        xs = [e + (i - (len(names) - 1) / 2) * width for e in range(p.epochs)]
        bars = ax.bar(xs, stalls, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    for e in range(p.epochs):
        ax.hlines(lower[e], e - 0.45, e + 0.45, colors="black", linestyles="dashed",
                  label="bound (bytes from SOURCE ÷ bandwidth − compute)" if e == 0 else None)
    ax.set_xticks(range(p.epochs))
    ax.set_xticklabels(["epoch %d" % e for e in range(p.epochs)])
    ax.set_ylabel("time the loop waited for data (s)")
    ax.set_title("Stall per epoch, C++ loop: %d files, %d ms per open, %d MB/s (median of %d)" % (
        p.files, p.latency_ms, p.bandwidth_mbps, p.reps))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def plot_cache(rows, files, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    label = {"lru": "LRU", "min": "Belady MIN (the optimum)", "clairfs": "clairfs planner"}
    for policy in ("lru", "min", "clairfs"):
        pts = sorted((r["fraction"], r["hit_ratio"]) for r in rows if r["policy"] == policy)
        if pts:
            ax.plot([x * 100 for x, _ in pts], [y for _, y in pts], marker="o", label=label.get(policy, policy))
    ax.set_xlabel("cache size (% of the bytes the node reads)")
    ax.set_ylabel("hit ratio (files)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Hit ratio against cache size: %d files, world size 8,\n4 ranks on the node, 4 epochs" % files,
                 fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs"))
    ap.add_argument("--data-dir", default="/dev/shm/clairfs-bench-harness")
    ap.add_argument("--dataset", choices=["imagenet-like", "fashion-mnist"], default="imagenet-like",
                    help="generated ImageNet-like sizes, or the demo's 70,000 Fashion-MNIST PNGs")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    p = Params(args.quick)
    t_start = time.monotonic()

    data = "%s/%d" % (args.data_dir, p.files)
    if args.dataset == "fashion-mnist":
        data = args.data_dir + "/fashion-mnist"
        subprocess.run([sys.executable, HERE + "/../examples/fashion_mnist_imagefolder.py", data], check=True)
        p.files = sum(len(f) for _, _, f in os.walk(data)) - 1  # less the completion marker
        p.batch = 256  # 300-byte images: a realistic batch, and epochs of 274 steps
    else:
        cached_dataset(data, "--files", p.files, "--classes", p.classes, "--seed", 1)
    total_bytes = dataset_bytes(data)
    work = tempfile.mkdtemp(prefix="clairfs-harness-")

    p.ram = total_bytes // 4  # the staging engine's budget: a quarter of the data set
    systems = ["direct", "stage-in", "clairfs ram=0", "clairfs ram=¼", "clairfs ram=¼ nvme", "clairfs",
               "direct" + BUSY, "clairfs" + BUSY]
    results = {s: [] for s in systems}
    torch_results = {s: [] for s in ("direct", "clairfs ram=0", "clairfs ram=¼ nvme", "clairfs")}
    for rep in range(p.reps):
        for i in range(len(systems)):
            name = systems[(rep + i) % len(systems)]
            results[name].append(run_system(name, build, p, data, work))
            print("rep %d %-18s %s" % (rep, name, " ".join("e%d %.2fs/%.2fs" % (e["epoch"], e["wall_s"], e["stall_s"])
                                                       for e in results[name][-1]["epochs"])), file=sys.stderr)
        if p.torch:
            for name in torch_results:
                torch_results[name].append(run_system(name, build, p, data, work, torch=True))

    # The long run: 10 epochs of the unmodified PyTorch loop, direct and through clairfs, at two computes.
    long_rows = []
    if p.torch and not args.quick:
        for compute in (10, 2):
            lp = copy.copy(p)
            lp.epochs, lp.compute_ms = 10, compute
            for name in ("clairfs", "direct"):
                r = run_system(name, build, lp, data, work, torch=True)
                long_rows.append({"compute": compute, "name": name, "wall": sum(e["wall_s"] for e in r["epochs"]),
                                  "stall": sum(e["stall_s"] for e in r["epochs"]), "source": r["source_bytes"]})
                print("long %-8s %2d ms: %.1f s" % (name, compute, long_rows[-1]["wall"]), file=sys.stderr)

    batches = results["direct"][0]["epochs"][0]["batches"]
    lower = bound(p, total_bytes, batches)

    def med(runs, epoch, key):
        return statistics.median(r["epochs"][epoch][key] for r in runs)

    lines = []
    out = lines.append
    out("Workload: %d files, %.0f MB (%s), one rank, batch %d, %d workers, "
        "prefetch_factor %d, %d ms compute per batch (%d batches per epoch), %d epochs. Slow source: %d ms per "
        "open, %d MB/s shared, %d requests in flight, no page cache. Medians of %d run(s), systems rotated." % (
            p.files, total_bytes / 1e6, "Fashion-MNIST PNGs" if args.dataset == "fashion-mnist" else
            "lognormal sizes, mean ~110 KB", p.batch, p.workers, p.prefetch, p.compute_ms, batches, p.epochs,
            p.latency_ms, p.bandwidth_mbps, p.inflight, p.reps))
    out("")
    out("`clairfs ram=0` is the plain mount (no staging); `clairfs ram=¼` stages with a RAM budget of a quarter "
        "of the data set (%.0f MB), smaller than the data set; `clairfs ram=¼ nvme` adds an NVMe tier (a directory "
        "in /var/tmp) that holds the rest; `clairfs` is the engine with its defaults (RAM: a quarter of this "
        "machine's memory, so the data set fits). `+ busy CPUs`: the same with every CPU of the node kept busy "
        "beside the job (one spinning process per CPU, at the job's priority), as a training node's other work "
        "does; its ratios are to direct reads with busy CPUs too." % (p.ram / 1e6))
    out("")
    out("C++ loop (`bench/train_loop`), stall and epoch time in seconds:")
    out("")
    header = "| system |" + "".join(" epoch %d stall | epoch %d time |" % (e, e) for e in range(p.epochs)) + \
             " SOURCE bytes ÷ data set |"
    out(header)
    out("|---|" + "---:|---:|" * p.epochs + "---:|")
    for name in systems:
        runs = results[name]
        row = "| %s |" % name
        for e in range(p.epochs):
            row += " %.2f | %.2f |" % (med(runs, e, "stall_s"), med(runs, e, "wall_s"))
        row += " %.2f |" % (statistics.median(r["source_bytes"] for r in runs) / total_bytes)
        out(row)
    out("| bound |" + "".join(" %.2f | |" % b for b in lower) + " 1.00 |")
    out("")
    out("Peak daemon memory (VmHWM), C++ loop runs: " + ", ".join(
        "%s %.0f MiB" % (name, max(r["memory"] for r in results[name]) / 2**20) for name in systems
        if name.startswith("clairfs")) + "; data set %.0f MiB in %d files." % (total_bytes / 2**20, p.files))
    out("")
    out("Ratios of stall (C++ loop): to direct, and to the bound where the bound is not 0.")
    out("")
    out("| system |" + "".join(" epoch %d ÷ direct | epoch %d ÷ bound |" % (e, e) for e in range(p.epochs)))
    out("|---|" + "---:|---:|" * p.epochs)
    for name in systems:
        row = "| %s |" % name
        for e in range(p.epochs):
            s = med(results[name], e, "stall_s")
            d = med(results["direct" + BUSY if name.endswith(BUSY) else "direct"], e, "stall_s")
            row += " %.2f | %s |" % (s / d if d else 0, "%.2f" % (s / lower[e]) if lower[e] > 0 else "—")
        out(row)
    if p.torch:
        out("")
        out("Unmodified PyTorch loop (`bench/torch_loop.py`: ImageFolder + DistributedSampler + DataLoader), "
            "stall and epoch time in seconds:")
        out("")
        out(header)
        out("|---|" + "---:|---:|" * p.epochs + "---:|")
        for name, runs in torch_results.items():
            row = "| %s |" % name
            for e in range(p.epochs):
                row += " %.2f | %.2f |" % (med(runs, e, "stall_s"), med(runs, e, "wall_s"))
            row += " %.2f |" % (statistics.median(r["source_bytes"] for r in runs) / total_bytes)
            out(row)

    if long_rows:
        out("")
        out("Unmodified PyTorch loop, 10 epochs end to end (one run each; the same compute per batch for both):")
        out("")
        out("| compute per batch | direct: time (stall) | clairfs: time (stall) | speed-up | SOURCE bytes ÷ data set, direct / clairfs |")
        out("|---:|---:|---:|---:|---:|")
        for compute in (10, 2):
            d = [r for r in long_rows if r["compute"] == compute and r["name"] == "direct"][0]
            c = [r for r in long_rows if r["compute"] == compute and r["name"] == "clairfs"][0]
            out("| %d ms | %.1f s (%.1f s) | %.1f s (%.1f s) | **%.2f×** | %.2f / %.2f |" % (
                compute, d["wall"], d["stall"], c["wall"], c["stall"], d["wall"] / c["wall"], d["source"] / total_bytes,
                c["source"] / total_bytes))

    # Cache policies on the predicted trace.
    sim_data = "%s/sim-%d" % (args.data_dir, p.sim_files)
    cached_dataset(sim_data, "--files", p.sim_files, "--classes", 50, "--seed", 2, "--mean-kb", 1)
    sim_rows = []
    for ranks_per_node in (1, 4):
        r = subprocess.run([build + "/bench/cache_sim", "--root", sim_data, "--seed", str(p.seed), "--world-size", "8",
                            "--ranks-per-node", str(ranks_per_node), "--epochs", "4", "--loader-window", "8"],
                           capture_output=True, text=True, check=True)
        sim_rows += [json.loads(line) for line in r.stdout.splitlines()]
    out("")
    out("Cache policies on the predicted trace (`bench/cache_sim`): %d samples (lognormal sizes), world size 8, "
        "4 epochs, the ranks of node 0 interleaved; the engine's own staging policy with a loader window of 8 "
        "files per rank; cache sizes as a share of the bytes the node reads. Hit ratio by files:" % p.sim_files)
    out("")
    fractions = sorted({r["fraction"] for r in sim_rows})
    out("| ranks per node | policy |" + "".join(" %d%% |" % (f * 100) for f in fractions))
    out("|---:|---|" + "---:|" * len(fractions))
    for rpn in (1, 4):
        label = {"lru": "LRU", "min": "Belady MIN", "clairfs": "clairfs planner"}
        for policy in ("lru", "min", "clairfs"):
            vals = {r["fraction"]: r["hit_ratio"] for r in sim_rows if r["ranks_per_node"] == rpn and r["policy"] == policy}
            out("| %d | %s |" % (rpn, label[policy]) + "".join(" %.3f |" % vals[f] for f in fractions))
        mins = {r["fraction"]: r["hit_ratio"] for r in sim_rows if r["ranks_per_node"] == rpn and r["policy"] == "min"}
        ours = {r["fraction"]: r["hit_ratio"] for r in sim_rows if r["ranks_per_node"] == rpn and r["policy"] == "clairfs"}
        out("| %d | planner ÷ MIN |" % rpn + "".join(" %.2f× |" % (ours[f] / mins[f] if mins[f] else 0) for f in fractions))

    os.makedirs(args.out, exist_ok=True)
    plot_stalls({k: v for k, v in results.items() if not k.endswith(BUSY)}, lower, p,
                os.path.join(args.out, "bench-stalls.png"))
    plot_cache([r for r in sim_rows if r["ranks_per_node"] == 4], p.sim_files, os.path.join(args.out, "bench-cache.png"))
    out("")
    out("![stall per epoch](bench-stalls.png) ![hit ratio against cache size](bench-cache.png)")
    out("")
    out("Run took %.0f s." % (time.monotonic() - t_start))
    text = "\n".join(lines)
    print(text)

    # Into docs/benchmarks.md between the markers.
    write_section(args.out, "harness", "scripts/bench" + (" --quick" if args.quick else "") + (
        " --dataset fashion-mnist" if args.dataset == "fashion-mnist" else ""), text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
