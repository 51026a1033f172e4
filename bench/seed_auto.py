#!/usr/bin/python3
"""seed=auto against a mount told the seed and a plain one (ram=0), side by side in one run: the
harness's workload and slow source (bench/harness.py), the C++ loop and unmodified PyTorch, two epochs.
Prints, per system, the stall of each epoch (medians), its ratio to the told mount's, SOURCE bytes ÷ the
data set, and the opens seed=auto needed to find the seed.

    seed_auto.py BUILD [--reps 3] [--files 3000]
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Params, dataset_bytes, run_system  # noqa: E402
from benchlib import cached_dataset  # noqa: E402

SYSTEMS = ["clairfs ram=0", "clairfs", "clairfs seed=auto"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--data-dir", default="/dev/shm/clairfs-bench-harness")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    p = Params(False)
    p.files, p.epochs = args.files, 2
    data = "%s/%d" % (args.data_dir, p.files)
    cached_dataset(data, "--files", p.files, "--classes", p.classes, "--seed", 1)
    total = dataset_bytes(data)
    work = tempfile.mkdtemp(prefix="clairfs-seed-auto-")
    for loop, torch in (("C++ loop", False), ("PyTorch loop", True)):
        runs = {s: [] for s in SYSTEMS}
        for rep in range(args.reps):
            for i in range(len(SYSTEMS)):
                name = SYSTEMS[(rep + i) % len(SYSTEMS)]
                runs[name].append(run_system(name, build, p, data, work, torch=torch))
        print("%s: %d files, %.0f MB, batch %d, %d workers, %d epochs; medians of %d runs, systems rotated" % (
            loop, p.files, total / 1e6, p.batch, p.workers, p.epochs, args.reps))
        print("| system | epoch 0 stall (s) | ÷ told | epoch 1 stall (s) | ÷ told | SOURCE bytes ÷ data set | opens to find the seed |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        told = [statistics.median(r["epochs"][e]["stall_s"] for r in runs["clairfs"]) for e in range(p.epochs)]
        for name in SYSTEMS:
            stall = [statistics.median(r["epochs"][e]["stall_s"] for r in runs[name]) for e in range(p.epochs)]
            found = [r["learned"]["after_opens"] for r in runs[name] if r["learned"]]
            print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |" % (
                "clairfs seed=42 (told)" if name == "clairfs" else name, stall[0], stall[0] / max(told[0], 1e-9),
                stall[1], stall[1] / max(told[1], 1e-9), statistics.median(r["source_bytes"] for r in runs[name]) / total,
                "/".join(str(f) for f in found) if found else "—"))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
