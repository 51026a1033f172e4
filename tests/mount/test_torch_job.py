"""End to end: an unmodified ImageFolder + DistributedSampler + DataLoader(num_workers=2) job, two ranks,
three epochs, over the mount. Every worker process must open exactly the samples the oracle predicted
for it, in that order (the daemon's trace, grouped by pid), and the main processes none."""
import collections
import os
import random
import subprocess
import sys

import harness as h
import pytest
from PIL import Image
from trees import torch_samples

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train_like.py")
DUMP = os.environ["CLAIRFS_ORACLE_DUMP"]

SEED, WORLD, BATCH, WORKERS, EPOCHS = 1234567890123, 2, 5, 2, 3

def test_each_worker_opens_what_was_predicted():
    rnd = random.Random(5)
    with h.tempdir() as tmp:
        src, mnt, trace = tmp + "/src", tmp + "/mnt", tmp + "/trace"
        os.makedirs(mnt)
        for cls in ["cat", "dog", "dog-x", ".hidden"]:
            for sub in ["", "sub/", "sub-a/"]:
                os.makedirs(os.path.join(src, cls, sub), exist_ok=True)
                for i in range(rnd.randrange(5, 20)):
                    Image.new("RGB", (8, 8), (rnd.randrange(256), i, 7)).save(os.path.join(src, cls, sub, "%d.png" % i))
        for odd in ["new\nline.png", "back\\slash.png"]:
            Image.new("RGB", (8, 8), (1, 2, 3)).save(os.path.join(src, "cat", odd), format="PNG")
        # As the trace and the order files write them: backslash and newline escaped.
        samples = [p.replace("\\", "\\\\").replace("\n", "\\n") for _, p in torch_samples(src)]
        opts = "seed=%d,world_size=%d,ranks=0-%d,batch_size=%d,workers=%d,trace=%s" % (
            SEED, WORLD, WORLD - 1, BATCH, WORKERS, trace)
        with h.mounted(src, mnt, opts):
            jobs = [subprocess.Popen([sys.executable, TRAIN, "--data", mnt, "--seed", str(SEED), "--world-size", str(WORLD),
                                      "--rank", str(r), "--batch-size", str(BATCH), "--workers", str(WORKERS),
                                      "--epochs", str(EPOCHS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    for r in range(WORLD)]
            outputs = [j.communicate(timeout=300)[0] for j in jobs]
            h.check(all(j.returncode == 0 for j in jobs), "both ranks ran %d epochs over the mount: %s" % (
                EPOCHS, " | ".join(o.strip().replace("\n", "; ") for o in outputs)))
            main_pids = {j.pid for j in jobs}

            # A plain loop that takes its order from the mount reads exactly the published order.
            loop = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "examples", "order_plain_loop.py"), mnt,
                                   "--epoch", "1", "--rank", "1"], capture_output=True, text=True, timeout=120)
            with open(mnt + "/.clairfs/order/epoch-1/rank-1", "rb") as f:
                published = f.read().decode().splitlines()

        by_pid = collections.OrderedDict()
        with open(trace) as f:
            for line in f:
                pid, path = line.rstrip("\n").split(" ", 1)
                by_pid.setdefault(int(pid), []).append(path)
        loop_opens = by_pid.pop(list(by_pid)[-1])
        h.check(loop.returncode == 0 and loop_opens == published and
                loop.stdout.startswith("read %d files" % len(published)),
                "examples/order_plain_loop.py reads the published order, odd names included: " + loop.stdout.strip())
        traced = [p for v in by_pid.values() for p in v]
        h.check("cat/new\\nline.png" in traced and "cat/back\\\\slash.png" in traced,
                "names with a newline and a backslash are escaped in the trace")
        h.check(not (main_pids & set(by_pid)), "the main processes opened no sample (workers load)")

        # The oracle's prediction for every (epoch, rank, worker).
        dump = subprocess.Popen([DUMP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        predicted = []
        for epoch in range(EPOCHS):
            for rank in range(WORLD):
                dump.stdin.write("workers torch %d %d %d %d %d 0 %d 0 %d 1 0 0 split\n" % (
                    len(samples), WORLD, rank, SEED, epoch, BATCH, WORKERS))
                dump.stdin.flush()
                while True:
                    line = dump.stdout.readline().strip()
                    if line == ".":
                        break
                    predicted.append(tuple(samples[int(i)] for i in line.split()))
        dump.stdin.close()
        dump.wait()
        observed = [tuple(v) for v in by_pid.values()]
        h.check(len(observed) == EPOCHS * WORLD * WORKERS,
                "%d worker processes opened files (%d epochs x %d ranks x %d workers)" % (
                    len(observed), EPOCHS, WORLD, WORKERS))
        h.check(collections.Counter(observed) == collections.Counter(predicted),
                "each worker opened exactly its predicted samples, in order (%d opens)" % sum(map(len, observed)))
        h.check(len(set(predicted)) == len(predicted), "the predictions differ between workers, epochs and ranks")


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
