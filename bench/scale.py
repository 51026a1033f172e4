"""Scale on one node, over bench/synthfs (N files in C class folders, 64-200 B each, no bytes held): the
time of a warm `find SOURCE -type f` against clairfs's mount from a walk and from `clairfs index`'s
manifest, and the daemon's peak memory against its bound (ram + 64 MiB + 100 B per file) once a job's
ranks read in their order and the stager has filled RAM. Bytes read through clairfs are compared with
synthfs's own. Prints one Markdown table row per mount. With --nodes N, then N daemons under `mpiexec` on
this host (one node each, the job's ranks split among them) mount from that manifest as a job's nodes
do — node 0 loads it and sends it to the others in pieces — and each node's peak memory, once its stager
has filled RAM, is printed against the same bound.

  python3 bench/scale.py BUILD [--files 1281167] [--classes 1000] [--ram 256M] [--world 8] [--reads 200]
                         [--meta-latency-us 0] [--no-readdirplus] [--synthfs-threads 8] [--settle 3] [--json FILE]
                         [--clairfs BINARY] [--keep-index FILE] [--reps R [--against BINARY]]
                         [--nodes N [--nodes-wait 60]]

--meta-latency-us and --no-readdirplus make SOURCE a high-latency file system whose listings carry no
attributes: every file's lstat is then a round trip (synthfs --threads serves that many at once).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MIB = 1 << 20


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def stats(mnt):
    with open(mnt + "/.clairfs/stats") as f:
        return json.load(f)


def settled(mnt, files, settle, attributes_read=None, at_most=None):
    """Waits until the stager has staged every file into RAM, or RAM's use stayed the same for `settle`
    seconds (RAM full), or `at_most` seconds went by; returns the stats then. attributes_read(stats) is
    called once, when the files' attributes are first seen all read."""
    last, still = -1, 0
    until = time.monotonic() + at_most if at_most else None
    while still < settle and (until is None or time.monotonic() < until):
        time.sleep(1)
        s = stats(mnt)
        if s.get("attributes_pending", 0) > 0 or "ram" not in s:  # not all read yet
            continue
        if attributes_read:
            attributes_read(s)
            attributes_read = None
        if s["ram"]["files"] >= files:
            break
        # (No file in RAM yet is not full: staging has not begun. Its use counts bookkeeping too.)
        still = still + 1 if s["ram"]["used"] == last and s["ram"]["files"] > 0 else 0
        last = s["ram"]["used"]
    return stats(mnt)


def nodes_peaks(a, clairfs, src, index, tmp, shape, synthfs):
    """N daemons under mpiexec (a host name each, the fork launcher) from the manifest; per node: its
    peak memory with RAM filled, and the files in its RAM. Bytes of a sample checked on the last node."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    mnts = ["%s/node%d" % (tmp, n) for n in range(a.nodes)]
    cmd = ["mpiexec", "-disable-auto-cleanup", "-launcher", "fork", "-ppn", "1",
           "-hosts", ",".join("127.0.0.%d" % (n + 1) for n in range(a.nodes))]
    per = max(1, a.world // a.nodes)
    for n, mnt in enumerate(mnts):
        os.mkdir(mnt)
        first = n * per
        ranks = "%d-%d" % (first, min(first + per, a.world) - 1)
        if n:
            cmd.append(":")
        cmd += ["-n", "1", clairfs, src, mnt, "-o", "seed=1,start_batch=0,batch_size=32,world_size=%d,ranks=%s,ram=%d,manifest=%s"
                % (a.world, ranks, size_arg(a.ram), index)]
    state = tmp + "/nodes.state"
    t0 = time.monotonic()
    subprocess.run([root + "/scripts/clairfs-job-mount", "--timeout", "900", "--state", state, "--"] + cmd,
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, CLAIRFS=clairfs))
    up = time.monotonic() - t0
    try:
        out = []
        for mnt in mnts:
            # (Files staged from peers come more slowly than from SOURCE: RAM may take long to fill. Its
            # bytes are the RAM tier's, within `ram`; what the bound tests is the rest.)
            s = settled(mnt, a.files, a.settle, at_most=a.nodes_wait)
            out.append({"peak": benchlib.daemon_peak(mnt), "ram_files": s["ram"]["files"], "ram_used": s["ram"]["used"]})
        check = subprocess.run([synthfs, "--check", mnts[-1], "--sample", "500"] + shape, capture_output=True, text=True)
        return up, out, check.returncode != 0
    finally:
        subprocess.run([root + "/scripts/clairfs-job-umount", "--timeout", "60", "--state", state],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(cmd, **kw):
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    return time.monotonic() - t0


def staged_files(mnt):
    """Files the mount's stats count as staged."""
    return stats(mnt).get("staged", {}).get("files", 0)


def first_staged(mnt, limit=60):
    """Seconds from now (the mount just returned) until its stats count a staged file; None past `limit`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if staged_files(mnt) > 0:
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=1281167)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--ram", default="256M")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--reads", type=int, default=200, help="files each rank reads in its order")
    ap.add_argument("--meta-latency-us", type=int, default=0)
    ap.add_argument("--no-readdirplus", action="store_true")
    ap.add_argument("--settle", type=int, default=3, help="seconds RAM's use must stay still to count as full")
    ap.add_argument("--synthfs-threads", type=int, default=8)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--clairfs", help="this clairfs binary instead of BUILD's (to compare builds)")
    ap.add_argument("--keep-index", help="copy the index `clairfs index` wrote here")
    ap.add_argument("--stat-later", type=int, help="the walk's mount with stat_later=N (default: clairfs's)")
    ap.add_argument("--nodes", type=int, default=0, help="then N daemons under mpiexec from the manifest")
    ap.add_argument("--reps", type=int, default=1, help="time the walk's mount and find this many times in turns "
                    "(medians), with the time from each mount's return to its first staged file")
    ap.add_argument("--against", help="with --reps: this clairfs binary's mount too, in the same turns")
    ap.add_argument("--nodes-wait", type=int, default=60, help="seconds each node's RAM is given to fill")
    a = ap.parse_args()
    clairfs, synthfs = a.clairfs or a.build + "/clairfs", a.build + "/bench/synthfs"
    shape = ["--files", str(a.files), "--classes", str(a.classes)]
    ram = size_arg(a.ram)
    out = {"files": a.files, "classes": a.classes, "ram": ram, "world": a.world}
    wrong = 0
    with tempfile.TemporaryDirectory(prefix="clairfs-scale-") as tmp:
        src, mnt, index = tmp + "/src", tmp + "/mnt", tmp + "/index"
        os.mkdir(src)
        os.mkdir(mnt)
        server = subprocess.Popen([synthfs, src, "--meta-latency-us", str(a.meta_latency_us), "--threads",
                                   str(a.synthfs_threads)] + (["--no-readdirplus"] if a.no_readdirplus else []) + shape,
                                  stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "ready":
                raise SystemExit("scale: synthfs did not mount")
            find_cmd = "find %s -type f | wc -l >/dev/null" % src
            find = [timed(find_cmd, shell=True) for _ in range(3)]
            out["find_s"] = min(find[1:])  # warm
            # (start_batch=0: staging measured before any read runs ahead, not the start window alone)
            opts = "seed=1,start_batch=0,batch_size=32,world_size=%d,ranks=0-%d,ram=%d" % (a.world, a.world - 1, ram)
            walk_opts = opts + (",stat_later=%d" % a.stat_later if a.stat_later is not None else "")
            if a.reps > 1:
                # A mount (then unmounted once it staged its first file) and a warm find in turns, and
                # --against's mount in the same turns: the medians, on a noisy machine.
                finds, turns = [], {b: ([], [], []) for b in [clairfs] + ([a.against] if a.against else [])}
                for _ in range(a.reps):
                    finds.append(timed(find_cmd, shell=True))
                    for b, (mounts, firsts, early) in turns.items():
                        mounts.append(timed([b, src, mnt, "-o", walk_opts]))
                        early.append(staged_files(mnt))  # staged before it returned
                        firsts.append(first_staged(mnt))
                        benchlib.unmount(mnt)
                out["find_s"] = statistics.median(finds)
                out["turns"] = {b: {"mount_s": m, "first_staged_after_s": f, "staged_at_return": e}
                                for b, (m, f, e) in turns.items()}
                out["walk_mount_median_s"] = statistics.median(turns[clairfs][0])
            for how in ("walk", "manifest"):
                o = walk_opts if how == "walk" else opts
                if how == "manifest":
                    out["index_s"] = timed([clairfs, "index", src, index], stdout=subprocess.DEVNULL)
                    if a.keep_index:
                        shutil.copyfile(index, a.keep_index)
                    o += ",manifest=" + index
                t0 = time.monotonic()
                out[how + "_mount_s"] = timed([clairfs, src, mnt, "-o", o])
                if not benchlib.daemon_peak(mnt):
                    raise SystemExit("scale: no clairfs daemon for " + mnt)
                if how == "walk":
                    # Staging starts before the files' attributes are all read: its first file, timed.
                    if first_staged(mnt, 600) is not None:
                        out["first_staged_s"] = time.monotonic() - t0
                    # Each rank reads the start of its epoch-0 order, through clairfs and through synthfs.
                    for r in range(a.world):
                        with open("%s/.clairfs/order/epoch-0/rank-%d" % (mnt, r)) as f:
                            names = [next(f).rstrip("\n") for _ in range(a.reads)]
                        for n in names:
                            with open(mnt + "/" + n, "rb") as x, open(src + "/" + n, "rb") as y:
                                wrong += x.read() != y.read()
                    # The stager fills RAM (or stages all there is). (A mount up before the files'
                    # attributes were read stages as they are read: what SOURCE sent until then, kept.)
                    def attributes_read(s):
                        out["attributes_s"] = time.monotonic() - t0
                        out["fill"] = {"source_bytes": s["source_traffic"]["bytes"],
                                       "staged_bytes": s["staged"]["bytes"], "staged_files": s["staged"]["files"],
                                       "source_opens": s["tiers"]["source"]["files"],
                                       "opens": sum(t["files"] for t in s["tiers"].values())}
                    s = settled(mnt, a.files, a.settle, attributes_read)
                    out["stats"] = s
                    out["ram_used"], out["ram_files"] = s["ram"]["used"], s["ram"]["files"]
                    out["memory"] = s.get("memory", {})
                    out["peak"] = benchlib.daemon_peak(mnt)
                    out["bound"] = ram + 64 * MIB + 100 * a.files
                    check = subprocess.run([synthfs, "--check", mnt, "--sample", "2000"] + shape,
                                           capture_output=True, text=True)
                    wrong += check.returncode != 0
                else:
                    out["manifest_peak"] = benchlib.daemon_peak(mnt)
                benchlib.unmount(mnt)
            if a.nodes:
                up, out["nodes"], bad = nodes_peaks(a, clairfs, src, index, tmp, shape, synthfs)
                out["nodes_mount_s"] = up
                wrong += bad
        finally:
            benchlib.unmount(src, server, lazy=True)
    out["wrong"] = wrong
    print("| files | find (warm) | mount from walk | ratio | index | mount from manifest | ratio | daemon peak "
          "| bound | beyond the RAM tier, per file | files in RAM | wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("| {:,} | {:.2f} s | {:.2f} s | {:.2f}× | {:.2f} s | {:.2f} s | {:.2f}× | {:.1f} MiB | {:.1f} MiB | {:.0f} B "
          "| {:,} | {} |".format(a.files, out["find_s"], out["walk_mount_s"], out["walk_mount_s"] / out["find_s"],
                                 out["index_s"], out["manifest_mount_s"], out["manifest_mount_s"] / out["find_s"],
                                 out["peak"] / MIB, out["bound"] / MIB, (out["peak"] - out["ram_used"]) / a.files,
                                 out["ram_files"], wrong))
    if a.reps > 1:
        print()
        for b, t in out["turns"].items():
            firsts = [f for f in t["first_staged_after_s"] if f is not None]
            print("{}: mount from walk, {} in turns with a warm find: median {:.1f} ms against find's {:.1f} ms: {:.2f}×; "
                  "the first file staged {} s after the mount returned (median {:.2f} s{}); files staged by "
                  "its return: {}".format(
                      b, a.reps, statistics.median(t["mount_s"]) * 1e3, out["find_s"] * 1e3,
                      statistics.median(t["mount_s"]) / out["find_s"],
                      ", ".join("%.2f" % f if f is not None else "never" for f in t["first_staged_after_s"]),
                      statistics.median(firsts) if firsts else -1,
                      "" if len(firsts) == len(t["first_staged_after_s"]) else "; some never within 60 s",
                      ", ".join("%d" % n for n in t["staged_at_return"])))
    print("\nmount from walk: the first file staged {:.2f} s after the mount began; the files' attributes all "
          "read {:.0f} s after it (to the second)".format(out.get("first_staged_s", -1), out.get("attributes_s", 0)))
    fill = out.get("fill")
    if fill:
        print("until then: SOURCE sent {:.1f} MiB for {:,} files staged ({:.1f} MiB, {:.3f}x); {:,} of the readers' "
              "{:,} opens served by SOURCE".format(fill["source_bytes"] / MIB, fill["staged_files"],
                                                   fill["staged_bytes"] / MIB,
                                                   fill["source_bytes"] / max(1, fill["staged_bytes"]),
                                                   fill["source_opens"], fill["opens"]))
    if a.nodes:
        print("\n%d daemons under mpiexec from the manifest (node 0 sends it in pieces): all mounted in %.2f s"
              % (a.nodes, out["nodes_mount_s"]))
        print("\n| node | peak | bound | files in RAM | RAM used | beyond the RAM tier, per file |")
        print("|---|---|---|---|---|---|")
        for n, x in enumerate(out["nodes"]):
            print("| %d | %.1f MiB | %.1f MiB | %s | %.1f MiB | %.0f B |" % (
                n, x["peak"] / MIB, out["bound"] / MIB, format(x["ram_files"], ","), x["ram_used"] / MIB,
                (x["peak"] - x["ram_used"]) / a.files))
    mem = out.get("memory")
    if mem:
        parts = ["manifest", "plan", "policy", "per_entry", "ram_bookkeeping"]
        print()
        print("| bytes per file | " + " | ".join(parts) + " | named parts | whole daemon beyond the RAM tier's bytes |")
        print("|---|" + "---|" * (len(parts) + 2))
        named = sum(mem[p] for p in parts)
        files_bytes = out["ram_used"] - mem["ram_bookkeeping"]
        print("| {:,} files | ".format(a.files) + " | ".join("%.1f" % (mem[p] / a.files) for p in parts) +
              " | %.1f | %.1f |" % (named / a.files, (out["peak"] - files_bytes) / a.files))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
