"""The benchmark harness runs end to end (quick mode, into a scratch directory): the slow source counts
what it serves, stage-in reads SOURCE once, reading directly reads it once per epoch, and the tables and
plots are written. No figure is judged on time."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

h.require_fuse()
HERE = os.path.dirname(os.path.abspath(__file__))
build = os.environ["CLAIRFS_BUILD"]

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

h.finish()
