"""Scale, small: bench/scale.py over a synthetic SOURCE of 200,000 files (bench/synthfs) — clairfs mounts it
from a walk and from a manifest, eight ranks read in their order, the stager stages, and every byte read
through clairfs equals synthfs's; the daemon's peak memory stays within ram + 64 MiB + 100 B per file.
The full runs (1.28 M and 14.2 M files) are in scripts/bench --scale; mount times are reported there,
never judged here."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

h.require_fuse()
HERE = os.path.dirname(os.path.abspath(__file__))
build = os.environ["CLAIRFS_BUILD"]

with h.tempdir() as tmp:
    out = tmp + "/scale.json"
    r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "scale.py"), build, "--files", "200000",
                        "--classes", "1000", "--reads", "100", "--json", out], capture_output=True, text=True, timeout=500)
    print(r.stdout)
    h.check(r.returncode == 0 and os.path.exists(out), "scale.py ran (rc %d) %s" % (r.returncode, r.stderr.strip()[-300:]))
    s = json.load(open(out))
    h.check(s["wrong"] == 0, "every byte read through clairfs equals synthfs's (800 files in rank order, 2000 spread)")
    h.check(s["ram_files"] == 200000, "the stager staged every file (%d of 200000)" % s["ram_files"])
    if os.environ.get("CLAIRFS_SANITIZED"):
        h.check(s["peak"] > 0, "daemon peak %.1f MiB (not held to its bound under a sanitizer)" % (s["peak"] / 2**20))
    else:
        h.check(0 < s["peak"] <= s["bound"], "daemon peak %.1f MiB within ram + 64 MiB + 100 B/file = %.1f MiB" % (
            s["peak"] / 2**20, s["bound"] / 2**20))

h.finish()
