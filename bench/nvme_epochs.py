#!/usr/bin/env python3
"""What SOURCE sends in each epoch through a mount with an NVMe tier and a small RAM.

5,200 files of ~110 KB on tmpfs (SOURCE), mounted with `ram=RAM,nvme=DIR` (DIR in /var/tmp); epoch 0 read
by THREADS threads in rank 0's predicted order, the NVMe tier left to settle, the page caches dropped,
epoch 1 read the same way. Prints each epoch's files/s and SOURCE ÷ the data set, the files NVMe held
after epoch 0, and what staging and the demand reader did. With --baseline, another build's mount runs
after this one's, for each rep.

    bench/nvme_epochs.py BUILD [--threads 1] [--ram 32M] [--reps 1] [--baseline OTHER_BUILD]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import cached_dataset, unmount  # noqa: E402
from staged_epochs import drop_caches, read_files  # noqa: E402

DATA = "/dev/shm/clairfs-bench-nvme-epochs"


def stats(mnt):
    with open(mnt + "/.clairfs/stats") as f:
        return json.load(f)


def order(mnt, work, epoch):
    path = "%s/order-%d" % (work, epoch)
    with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, epoch)) as f, open(path, "w") as out:
        out.write(f.read())
    return path


def run(build, threads, ram, total):
    work = tempfile.mkdtemp(prefix="clairfs-nvme-epochs-")
    nvme = tempfile.mkdtemp(prefix="clairfs-nvme-epochs-", dir="/var/tmp")
    mnt = work + "/mnt"
    os.mkdir(mnt)
    subprocess.run([build + "/clairfs", DATA, mnt, "-o",
                    "seed=3,batch_size=32,epochs=2,start_batch=0,ram=%s,nvme=%s" % (ram, nvme)], check=True)
    try:
        for _ in os.walk(mnt):  # ImageFolder's listing
            pass
        first, _ = read_files(build, mnt, order(mnt, work, 0), threads)
        last, since = None, time.monotonic()
        while time.monotonic() - since < 2:  # until NVMe's writes stop
            s = stats(mnt)
            now = (s["nvme"]["files"], s["nvme"]["writes"])
            if now != last:
                last, since = now, time.monotonic()
            time.sleep(0.2)
        source0 = s["source_traffic"]["bytes"]
        drop_caches()
        second, _ = read_files(build, mnt, order(mnt, work, 1), threads)
        t = stats(mnt)
        return {"files_per_s": (round(first), round(second)),
                "source": (round(source0 / total, 3), round((t["source_traffic"]["bytes"] - source0) / total, 3)),
                "nvme_files_after_epoch_0": s["nvme"]["files"], "staged": s["staged"],
                "demand": s["demand"], "nvme_files_written": s["nvme"]["writes"]}
    finally:
        unmount(mnt)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(nvme, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ram", default="32M")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--baseline")
    a = ap.parse_args()
    cached_dataset(DATA, "--files", 5200, "--classes", 4, "--mean-kb", 110)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(DATA) for f in fs if f != ".complete")
    builds = [("clairfs", os.path.abspath(a.build))] + ([("baseline", os.path.abspath(a.baseline))] if a.baseline else [])
    for rep in range(a.reps):
        for name, build in builds:
            r = run(build, a.threads, a.ram, total)
            print("rep %d %s: epoch 0 %d files/s, SOURCE %.3f× the data set; epoch 1 %d files/s, SOURCE %.3f×; "
                  "NVMe held %d files after epoch 0; %s" % (rep, name, r["files_per_s"][0], r["source"][0],
                                                            r["files_per_s"][1], r["source"][1],
                                                            r["nvme_files_after_epoch_0"], json.dumps(r)), flush=True)


if __name__ == "__main__":
    main()
