"""Scale, small. bench/scale.py over a synthetic SOURCE of 200,000 files (50,000 under a sanitizer;
bench/synthfs): clairfs mounts it
from a walk (as by default: up once the names are listed, the files' attributes read after, staging at once)
and from a manifest, eight ranks read in their order at once (files stat-ed as they are asked for), the
stager stages while the attributes are read, and every byte read through clairfs equals synthfs's; the daemon's peak memory stays within ram + 64 MiB + 100 B per file.
Then that index broadcast to a second MPI process (bench/index_bcast) arrives whole, and the cluster
simulation (bench/cluster_sim, the engine's planner and policy on every node) at 200,000 samples on 16
and 64 nodes reads SOURCE once in epoch 0 and, with room, never after. Last, a SOURCE that answers each
lookup after 200 µs with listings that carry no attributes, mounted with `stat_later=` above its size
(every file stat-ed before the mount, as below 1,000,000 files before names came first by default): the
scan's threads stat many directories at once there, and the bytes read through the mount are still
synthfs's. The full runs are in
scripts/bench --scale; times are reported there, never judged here."""
import json
import os
import subprocess
import sys

import harness as h
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
build = os.environ["CLAIRFS_BUILD"]
SANITIZED = bool(os.environ.get("CLAIRFS_SANITIZED"))
# Under a sanitizer a quarter of it (the same code; its pass took 92 s of the CI's time at 200,000).
FILES, CLASSES = (50000, 250) if SANITIZED else (200000, 1000)

def test_200000_files_mounted_read_and_their_index_broadcast():
    with h.tempdir() as tmp:
        out = tmp + "/scale.json"
        index = tmp + "/index"
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "scale.py"), build, "--files", str(FILES),
                            "--classes", str(CLASSES), "--reads", "100", "--json", out, "--keep-index", index, "--settle", "3",
                            "--stat-later", "0"],
                           capture_output=True, text=True, timeout=500)
        print(r.stdout)
        h.check(r.returncode == 0 and os.path.exists(out), "scale.py ran (rc %d) %s" % (r.returncode, r.stderr.strip()[-300:]))
        s = json.load(open(out))
        h.check(s["wrong"] == 0, "every byte read through clairfs equals synthfs's (800 files in rank order, 2000 spread)")
        staged = "%d of %d; stats: %s" % (s["ram_files"], FILES, json.dumps({k: s["stats"].get(k) for k in ("ram", "staged", "pagecache")}))
        if SANITIZED:
            # Under a sanitizer the stager can take minutes for 200,000 files (its page-cache pushes retried
            # by the million); what is judged there is that it stages, not how soon.
            h.check(s["ram_files"] > 0, "the stager stages (%s; not held to all of them under a sanitizer)" % staged)
        else:
            # The files read through the mount before (100) stay the kernel's once the engine saw them read:
            # those are not staged again (security finding 13), each counted as left to the kernel. (CI's red
            # run: 199,999 in RAM, the engine up before the last read.)
            held = s["stats"]["pagecache"]["left_to_kernel"]
            h.check(FILES - 100 <= s["ram_files"] and FILES - s["ram_files"] <= held,
                    "the stager staged every file but those the kernel holds (%s)" % staged)
        if SANITIZED:
            h.check(s["peak"] > 0, "daemon peak %.1f MiB (not held to its bound under a sanitizer)" % (s["peak"] / 2**20))
        else:
            h.check(0 < s["peak"] <= s["bound"], "daemon peak %.1f MiB within ram + 64 MiB + 100 B/file = %.1f MiB" % (
                s["peak"] / 2**20, s["bound"] / 2**20))

        env = dict(os.environ)
        if "ASAN_OPTIONS" in env:  # MPICH's allocations at exit are not this test's to count
            env["ASAN_OPTIONS"] += ":detect_leaks=0"
        r = subprocess.run(["mpiexec", "-n", "2", build + "/bench/index_bcast", index], capture_output=True, text=True,
                           timeout=120, env=env)
        print(r.stdout)
        got = sorted(line.split(": ", 1)[1].split(";")[0] for line in r.stdout.splitlines() if line.startswith("node "))
        h.check(r.returncode == 0 and len(got) == 2 and got[0] == got[1] and got[0].startswith("%d entries" % (FILES + CLASSES + 1)),
                "the index broadcast arrives whole on the other node: %s %s" % (got, r.stderr.strip()[-200:]))


def test_the_cluster_simulation_at_200000_samples():
    r = subprocess.run([build + "/bench/cluster_sim", "--samples", str(FILES), "--classes", "100", "--nodes", "16,64",
                        "--cache", "0.5,2,1+1"], capture_output=True, text=True, timeout=300)
    print(r.stdout)
    sims = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    h.check(r.returncode == 0 and len(sims) == 6, "cluster_sim ran: %d results %s" % (len(sims), r.stderr.strip()[-200:]))
    for s in sims:
        cache = s["ram"] + s["nvme"]
        where = "%d nodes, RAM %.1f + NVMe %.1f × a node's share" % (s["nodes"], s["ram"], s["nvme"])
        h.check(1.0 <= s["source_per_epoch"][0] <= 1.01, "%s: epoch 0 reads SOURCE once (%.3f; samples padded to even ranks)" % (
            where, s["source_per_epoch"][0]))
        later = s["source_per_epoch"][1:]
        if cache >= 1:
            h.check(all(x == 0 for x in later), "%s: later epochs read no SOURCE (%s)" % (where, later))
        else:
            h.check(all(0.4 <= x <= 0.6 for x in later), "%s: keepers holding half their files, half from SOURCE (%s)" % (where, later))
        h.check(s["busiest_served_over_mean"] <= 1.25, "%s: the busiest keeper serves %.2f× the mean" % (where, s["busiest_served_over_mean"]))


def test_a_slow_source_stat_ed_before_the_mount():
    with h.tempdir() as tmp:
        out = tmp + "/slow.json"
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "scale.py"), build, "--files", "20000",
                            "--classes", "200", "--reads", "20", "--meta-latency-us", "200", "--no-readdirplus",
                            "--synthfs-threads", "64", "--stat-later", "1000000", "--json", out], capture_output=True, text=True,
                           timeout=500)
        print(r.stdout)
        h.check(r.returncode == 0 and os.path.exists(out), "scale.py ran over a slow SOURCE (rc %d) %s" % (
            r.returncode, r.stderr.strip()[-300:]))
        s = json.load(open(out))
        h.check(s["wrong"] == 0, "a slow SOURCE scanned many lstat calls at once: every byte read through clairfs is synthfs's")


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
