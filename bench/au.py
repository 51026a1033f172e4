#!/usr/bin/python3
"""Accelerator utilisation, in MLPerf Storage's terms: N simulated accelerators on one node, each a
training loop (bench/train_loop: rank r of N under DistributedSampler, worker threads loading batches
ahead, the model's step a sleep of --compute-ms a batch), reading the data set four ways over the same
slow-source stand-in (bench/slowfs), side by side in one run:

  direct     each accelerator reads the slow source
  stage-in   the data set copied to local disk first (the copy counted as time without compute), then read
  clairfs    one mount of the slow source told the job (world_size=N)
  tmpfs      the data set read from memory (the node's limit, no slow source at all)

An accelerator's utilisation (AU) is its compute time over its wall time; a run's, the mean over its
accelerators; "most accelerators" is the largest N at which a system's AU held 90%. AU is given after the first epoch (every epoch reads the whole data set; the first is
where each system meets the slow source once, stage-in its copy) and over the whole run.

Workloads, scaled to this machine (a 100 MB/s source): ResNet-50-like (~110 KB files, batch 16, a 40 ms
step: 44 MB/s an accelerator) and UNet3D-like (~140 MB files, batch 1, a 4 s step: 35 MB/s). N doubles
from 1 until a system's AU falls below 90%, and the gap found is halved twice.

    au.py BUILD [--quick] [--workloads resnet,unet3d] [--out docs] [--data-dir DIR]
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
from benchlib import SlowSource, cached_dataset, unmount, write_section  # noqa: E402

SYSTEMS = ("direct", "stage-in", "clairfs", "tmpfs")
TARGET = 0.9


class Workload:
    def __init__(self, name, files, mean_kb, sigma, classes, batch, workers, compute_ms, epochs, max_n):
        self.name, self.files, self.mean_kb, self.sigma, self.classes = name, files, mean_kb, sigma, classes
        self.batch, self.workers, self.prefetch, self.compute_ms, self.epochs = batch, workers, 2, compute_ms, epochs
        self.max_n = max_n
        self.seed = 7
        # The slow source (as bench/harness.py's): 2 ms an open, 100 MB/s shared, 16 requests in flight.
        self.latency_ms, self.bandwidth_mbps, self.inflight = 2, 100, 16


def workloads(quick):
    if quick:
        return {"resnet": Workload("resnet", 480, 110, 0.6, 4, 16, 2, 20, 2, 1)}  # (one accelerator: a smoke run)
    return {
        "resnet": Workload("resnet", 3000, 110, 0.6, 20, 16, 4, 40, 3, 128),
        "unet3d": Workload("unet3d", 8, 140 * 1024, 0.1, 1, 1, 2, 4000, 2, 8),
    }


def loops(build, w, n, root, order_root):
    """N training loops at once, rank r of n each; their per-epoch JSON lines, by rank."""
    procs = []
    for rank in range(n):
        cmd = [build + "/bench/train_loop", "--root", root, "--order-root", order_root, "--seed", str(w.seed),
               "--world-size", str(n), "--rank", str(rank), "--batch-size", str(w.batch), "--workers",
               str(w.workers), "--prefetch-factor", str(w.prefetch), "--epochs", str(w.epochs), "--compute-ms",
               str(w.compute_ms)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit("au: a training loop failed (rc %d)" % p.returncode)
        out.append([json.loads(line) for line in text.splitlines() if line.startswith("{")])
    return out


def utilisation(ranks, w, first_extra_s=0.0):
    """(AU after the first epoch, AU over the run): compute time over wall time, mean of the accelerators.
    first_extra_s: time before the first epoch without compute (stage-in's copy)."""
    later, whole = [], []
    for epochs in ranks:
        compute = [e["batches"] * w.compute_ms / 1000 for e in epochs]
        wall = [e["wall_s"] for e in epochs]
        later.append(sum(compute[1:]) / sum(wall[1:]))
        whole.append(sum(compute) / (sum(wall) + first_extra_s))
    return statistics.mean(later), statistics.mean(whole)


def run(build, w, system, n, data, work):
    """AU of `system` with n accelerators, and the slow source's bytes served over the data set's."""
    if system == "tmpfs":
        return utilisation(loops(build, w, n, data, data), w) + (0.0,)
    slow = SlowSource(build, data, work, w)
    try:
        if system == "direct":
            au = utilisation(loops(build, w, n, slow.mnt, data), w)
        elif system == "stage-in":
            local = tempfile.mkdtemp(prefix="stage-", dir="/var/tmp")
            try:
                t0 = time.perf_counter()
                subprocess.run(["cp", "-r", slow.mnt + "/.", local], check=True)
                au = utilisation(loops(build, w, n, local, data), w, time.perf_counter() - t0)
            finally:
                shutil.rmtree(local, ignore_errors=True)
        else:
            mnt = tempfile.mkdtemp(prefix="clairfs-", dir=work)
            opts = "seed=%d,batch_size=%d,workers=%d,prefetch_factor=%d,epochs=%d,world_size=%d,ranks_per_node=%d" % (
                w.seed, w.batch, w.workers, w.prefetch, w.epochs, n, n)
            subprocess.run([build + "/clairfs", slow.mnt, mnt, "-o", opts], check=True)
            try:
                au = utilisation(loops(build, w, n, mnt, data), w)
            finally:
                unmount(mnt, lazy=True)
                os.rmdir(mnt)
    finally:
        served = slow.close()["bytes"]
    return au + (served,)


def plot(results, loads, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(loads), figsize=(5.2 * len(loads), 4), squeeze=False)
    for ax, (name, w) in zip(axes[0], loads.items()):
        for system in SYSTEMS:
            pts = sorted((n, au[0]) for (load, s, n), au in results.items() if load == name and s == system)
            ax.plot([n for n, _ in pts], [100 * a for _, a in pts], marker="o", label=system)
        ax.axhline(100 * TARGET, color="black", linestyle="dashed", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated accelerators on the node")
        ax.set_ylabel("accelerator utilisation after epoch 0 (%)")
        ax.set_ylim(0, 105)
        ax.set_title("%s-like: %d files of ~%s, %d ms a batch of %d" % (
            name, w.files, "%d MB" % (w.mean_kb / 1024) if w.mean_kb >= 1024 else "%d KB" % w.mean_kb,
            w.compute_ms, w.batch), fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default="")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs"))
    ap.add_argument("--data-dir", default="/dev/shm/clairfs-bench-au")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    loads = workloads(a.quick)
    if a.workloads:
        loads = {k: v for k, v in loads.items() if k in a.workloads.split(",")}
    work = tempfile.mkdtemp(prefix="clairfs-au-")
    t_start = time.monotonic()
    results = {}
    unbounded = {}
    lines = []
    try:
        for name, w in loads.items():
            data = "%s/%s-%d-%g" % (a.data_dir, name, w.files, w.mean_kb)
            cached_dataset(data, "--files", w.files, "--classes", w.classes, "--mean-kb", w.mean_kb, "--sigma", w.sigma)
            total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
            for system in SYSTEMS:
                def held(n):
                    results[(name, system, n)] = r = run(build, w, system, n, data, work)
                    print("%s %s N=%d: AU %.3f after epoch 0, %.3f over the run; SOURCE %.2f× the data set" % (
                        name, system, n, r[0], r[1], r[2] / total), file=sys.stderr)
                    return r[0] >= TARGET
                # Doubling until AU falls below the target, then two halvings of the gap found.
                good, bad, n = 0, None, 1
                while n <= min(w.max_n, w.files):
                    if not held(n):
                        bad = n
                        break
                    good, n = n, n * 2
                for _ in range(0 if a.quick else 2):
                    if not good or not bad or bad - good <= 1:
                        break
                    mid = (good + bad) // 2
                    good, bad = (mid, bad) if held(mid) else (good, mid)
                unbounded[(name, system)] = bad is None  # held at the largest N tried
            ns = sorted({n for (load, _, n) in results if load == name})
            lines.append("%s-like: %d files, %.0f MB, %d ms a batch of %d, %d workers, %d epochs" % (
                name, w.files, total / 1e6, w.compute_ms, w.batch, w.workers, w.epochs))
            lines.append("")
            lines.append("| accelerators | " + " | ".join(SYSTEMS) + " |")
            lines.append("|---:|" + "---:|" * len(SYSTEMS))
            for n in ns:
                cells = []
                for system in SYSTEMS:
                    r = results.get((name, system, n))
                    cells.append("%.0f%% (%.0f%%)" % (100 * r[0], 100 * r[1]) if r else "")
                lines.append("| %d | %s |" % (n, " | ".join(cells)))
            most = {}
            for system in SYSTEMS:
                held = [n for (load, s, n), r in results.items() if load == name and s == system and r[0] >= TARGET]
                most[system] = max(held, default=0)
            lines.append("| **most ≥ 90%%** | %s |" % " | ".join(
                "**%s%d**" % ("≥ " if unbounded[(name, s)] else "", most[s]) for s in SYSTEMS))
            lines.append("")
            lines.append("clairfs ÷ direct: %s; clairfs ÷ tmpfs: %s (AU after epoch 0, over the whole run in "
                         "parentheses)" % ("%.1f×" % (most["clairfs"] / most["direct"]) if most["direct"] else "direct none",
                                           "%.2f×" % (most["clairfs"] / most["tmpfs"]) if most["tmpfs"] else "tmpfs none"))
            lines.append("")
        os.makedirs(a.out, exist_ok=True)
        plot(results, loads, os.path.join(a.out, "bench-au.png"))
        lines.append("![accelerator utilisation against accelerators](bench-au.png)")
        lines.append("")
        lines.append("Run took %.0f s." % (time.monotonic() - t_start))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if not a.quick:
        write_section(a.out, "au", "scripts/bench --au", text)


if __name__ == "__main__":
    main()
