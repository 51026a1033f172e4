"""The staging engine (ram=) on a real mount: every byte equals SOURCE whatever the order — predicted,
wrong seed, concurrent readers — under budgets from generous to smaller than one file; the RAM budget is
never exceeded; files read in the predicted order come from RAM; the stats add up to what was read."""
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

h.require_fuse()
HERE = os.path.dirname(os.path.abspath(__file__))
rnd = random.Random(11)


def stats(mnt):
    with open(mnt + "/.clairfs/stats") as f:
        return json.load(f)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


with h.tempdir() as tmp:
    src, mnt = tmp + "/src", tmp + "/mnt"
    os.makedirs(mnt)
    subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "make_dataset.py"), src, "--files", "400",
                    "--classes", "7", "--mean-kb", "40", "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    open(os.path.join(src, "c0000", "empty.jpg"), "wb").close()
    want = {}
    for d, _, files in os.walk(src):
        for f in files:
            want[os.path.relpath(os.path.join(d, f), src)] = digest(os.path.join(d, f))
    total = sum(os.path.getsize(os.path.join(src, p)) for p in want)

    def order(epoch, rank=0):
        with open("%s/.clairfs/order/epoch-%d/rank-%d" % (mnt, epoch, rank)) as f:
            return f.read().splitlines()

    # 1. The predicted order with a budget of a quarter of the data set.
    budget = total // 4
    with h.mounted(src, mnt, "seed=9,batch_size=8,workers=2,epochs=3,ram=%d" % budget):
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], stats(mnt)["ram"]["used"])
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        wrong = opened = 0
        for epoch in range(2):
            for rel in order(epoch):
                time.sleep(0.001)  # a little compute, so the stager can run ahead
                wrong += digest(os.path.join(mnt, rel)) != want[rel]
                opened += 1
        done.set()
        watcher.join()
        time.sleep(0.3)  # the kernel sends releases after close, asynchronously
        s = stats(mnt)
        h.check(wrong == 0, "predicted order, 2 epochs: every byte equals SOURCE (%d files)" % opened)
        h.check(peak[0] <= budget, "RAM use peaked at %d bytes, within the %d budget" % (peak[0], budget))
        ram, nvme, source, cached = (s["tiers"][t]["files"] for t in ("ram", "nvme", "source", "pagecache"))
        h.check(ram + nvme + source + cached == opened,
                "stats add up: RAM %d + NVMe %d + SOURCE %d + page cache %d opens = %d" % (ram, nvme, source, cached, opened))
        h.check(ram + cached >= opened * 0.9, "the predicted opens were staged (RAM or pushed pages): %s" % s["tiers"])
        h.check(cached > 0 and s["pagecache"]["pushes"] > 0,
                "some files were pushed into the kernel and read with no read reaching the daemon: %s" % s["pagecache"])
        h.check(s["pagecache"]["used"] <= s["pagecache"]["budget"], "pushed pages within their budget: %s" % s["pagecache"])
        # A quarter of the data set held by next use: epoch 2 reads SOURCE again for most, not all, of it.
        from_source = s["source_traffic"]["bytes"]
        h.check(total <= from_source < 2 * total, "SOURCE read %.2f× the data set over 2 epochs" % (from_source / total))
        h.check(s["mispredicted_opens"] == 0, "no misprediction on the predicted order")
        r = h.run_clairfs(["status", mnt])
        h.check(r.returncode == 0 and "epoch 2" in r.stdout and "RAM" in r.stdout and "opens served" in r.stdout
                and "lead" in r.stdout,
                "clairfs status shows the epoch, RAM and tiers:\n" + r.stdout)
    r = h.run_clairfs(["status", tmp])
    h.check(r.returncode == 1 and "not a clairfs mount" in r.stderr, "clairfs status on a plain directory: " + r.stderr.strip())

    # 2. A reader that does not follow the prediction (another seed), and 8 concurrent readers.
    with h.mounted(src, mnt, "seed=1,batch_size=8,ram=%d" % (total // 3)):
        paths = list(want)
        rnd.shuffle(paths)
        h.check(all(digest(os.path.join(mnt, p)) == want[p] for p in paths),
                "a reader in another order: every byte equals SOURCE")
        s = stats(mnt)
        h.check(s["mispredicted_opens"] == 0 or s["tiers"]["source"]["files"] > 0,
                "it is served anyway (%d mispredicted, %d from SOURCE)" % (s["mispredicted_opens"],
                                                                       s["tiers"]["source"]["files"]))
        errors = []

        def reader(seed):
            r = random.Random(seed)
            for p in r.sample(paths, len(paths)):
                if digest(os.path.join(mnt, p)) != want[p]:
                    errors.append(p)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h.check(not errors, "8 concurrent readers in random orders: every byte equals SOURCE %s" % errors[:3])
        h.check(stats(mnt)["ram"]["used"] <= total // 3, "RAM use within budget after concurrent readers")

    # 3. A budget smaller than any file: nothing but empty files can be staged; reads still right.
    with h.mounted(src, mnt, "seed=9,batch_size=8,ram=1K"):
        rels = order(0)
        h.check(all(digest(os.path.join(mnt, p)) == want[p] for p in rels),
                "budget smaller than one file: every byte equals SOURCE")
        s = stats(mnt)
        h.check(s["staged"]["bytes"] == 0 and s["ram"]["used"] <= 1024,
                "nothing over the budget was staged: %s %s" % (s["staged"], s["ram"]))

h.finish()
