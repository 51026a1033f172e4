"""The benchmark harness runs end to end (quick mode, into a scratch directory): the slow source counts
what it serves, stage-in reads SOURCE once, reading directly reads it once per epoch, and the tables and
plots are written. So does the accelerator-utilisation benchmark (bench/au.py --quick). No figure is
judged on time."""
import re
import os
import subprocess
import sys

import harness as h
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
build = os.environ["CLAIRFS_BUILD"]


def test_the_benchmark_harness_quick():
    with h.tempdir() as tmp:
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "harness.py"), build, "--quick",
                            "--out", tmp, "--data-dir", tmp + "/data"], capture_output=True, text=True, timeout=600)
        h.check(r.returncode == 0, "harness --quick ran (rc %d) %s" % (r.returncode, r.stderr.strip()[-300:]))
        rows = {}  # the first table's row for each system (later tables reuse the names)
        for line in r.stdout.splitlines():
            if line.startswith("| "):
                rows.setdefault(line.split("|")[1].strip(), line)

        def source_ratio(name):
            return float(rows[name].rstrip(" |").split("|")[-1])

        h.check(abs(source_ratio("direct") - 2.0) < 0.01, "direct reads SOURCE once per epoch (2 epochs): %s" % rows.get("direct"))
        h.check(abs(source_ratio("stage-in") - 1.0) < 0.01, "stage-in reads SOURCE once: %s" % rows.get("stage-in"))
        h.check(source_ratio("clairfs") <= 2.0, "clairfs reads SOURCE at most once per epoch: %s" % rows.get("clairfs"))
        h.check("Belady MIN" in r.stdout and "LRU" in r.stdout, "the cache-policy table is there")
        h.check(all(os.path.getsize(os.path.join(tmp, p)) > 1000 for p in ("bench-stalls.png", "bench-cache.png")),
                "both plots are written")


def test_the_accelerator_utilisation_benchmark_quick():
    with h.tempdir() as tmp:
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "au.py"), build, "--quick",
                            "--out", tmp, "--data-dir", tmp + "/data"], capture_output=True, text=True, timeout=600)
        h.check(r.returncode == 0, "au --quick ran (rc %d) %s" % (r.returncode, r.stderr.strip()[-300:]))
        # "resnet clairfs N=1: AU 0.989 after epoch 0, 0.967 over the run; SOURCE 1.00× the data set"
        runs = {}
        for m in re.finditer(r"^\w+ ([\w-]+) N=(\d+): AU ([\d.]+) after epoch 0, ([\d.]+) over the run; SOURCE ([\d.]+)×",
                             r.stderr, re.M):
            runs[(m[1], int(m[2]))] = (float(m[3]), float(m[4]), float(m[5]))
        h.check(("direct", 1) in runs and ("clairfs", 1) in runs and ("tmpfs", 1) in runs and ("stage-in", 1) in runs,
                "every system ran with one accelerator: %s" % sorted(runs))
        h.check(all(0 < au <= 1.0 and 0 < whole <= 1.0 for au, whole, _ in runs.values()),
                "every utilisation is a fraction: %s" % runs)
        direct, clairfs = runs.get(("direct", 1), (0, 0, 0)), runs.get(("clairfs", 1), (0, 0, 9))
        h.check(abs(direct[2] - 2.0) < 0.01 and clairfs[2] <= 1.05,
                "direct reads SOURCE once an epoch (2 epochs), clairfs about once: %s %s" % (direct, clairfs))
        h.check("most ≥ 90%" in r.stdout and os.path.getsize(os.path.join(tmp, "bench-au.png")) > 1000,
                "the table and the plot are written")


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
