"""Faults a long run meets, each on a real mount: a reader SIGKILLed mid-read; a lazy unmount while 8
readers run (the daemon exits within seconds, nothing hangs); SIGINT unmounts cleanly; a data set 4×
the RAM budget read for 3 epochs, files larger than it read by 8 readers at once, and rounds of concurrent
readers over small and large files, with daemon memory under ram + 64 MiB + 100 B/file; a file rewritten in
SOURCE during the run reads as its staged copy or EIO, never other bytes."""
import os
import random
import signal
import subprocess
import sys
import threading
import time

import harness as h
import pytest


@pytest.fixture(scope="module")
def tmp():
    with h.tempdir() as tmp:
        os.makedirs(tmp + "/mnt")
        yield tmp


@pytest.fixture(scope="module")
def data(tmp):
    """600 files of ~60 KB and one of 96 MiB: (src, mnt, {path: digest}, bytes of all but the big one)."""
    src = tmp + "/src"
    h.make_dataset(src, 600, 6, 60, 9)
    with open(src + "/c0000/big.jpg", "wb") as f:
        f.write(os.urandom(96 << 20))  # read piece by piece (too large to hold whole on demand)
    want = h.digests(src)
    total = sum(os.path.getsize(os.path.join(src, p)) for p in want if not p.endswith("big.jpg"))
    return src, tmp + "/mnt", want, total


def test_a_reader_killed_mid_read(data):
    # The mount serves the next reader right.
    src, mnt, want, total = data
    with h.mounted(src, mnt, "seed=2,batch_size=4,ram=%d" % (total // 4)):
        reader = subprocess.Popen([sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'rb') as f:\n"
                                   "    while f.read(1 << 16): pass", mnt + "/c0000/big.jpg"])
        time.sleep(0.3)  # (into its read of 96 MiB)
        reader.send_signal(signal.SIGKILL)
        reader.wait()
        h.check(h.digest(mnt + "/c0000/big.jpg") == want["c0000/big.jpg"] and
                all(h.digest(os.path.join(mnt, p)) == want[p] for p in list(want)[:50]),
                "a reader SIGKILLed mid-read: the next ones read every byte right")


def test_a_lazy_unmount_while_8_readers_run(data):
    # The daemon exits within seconds once they stop, nobody hangs.
    src, mnt, want, total = data
    with h.mounted(src, mnt, "seed=2,batch_size=4,ram=%d" % (total // 4)):
        pids = h.daemon_pids(mnt)
        stop = threading.Event()
        outcomes = []

        def reader(seed):
            paths = sorted(want)
            i, ok, errors = seed, 0, 0
            while not stop.is_set():
                p = paths[i % len(paths)]
                i += 7
                try:
                    ok += h.digest(os.path.join(mnt, p)) == want[p]
                except OSError:
                    errors += 1
                    if errors > 100:
                        break
            outcomes.append((ok, errors))

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # (the readers under way)
        t0 = time.monotonic()
        subprocess.run(["fusermount3", "-u", "-z", mnt], check=True, timeout=30)
        took = time.monotonic() - t0
        time.sleep(0.5)  # (the readers go on reading what they hold open)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        h.check(took < 5 and not any(t.is_alive() for t in threads),
                "fusermount3 -u -z with 8 readers running returned in %.2f s; every reader finished" % took)
        h.check(h.wait_gone(pids, 10), "the daemon exited after the lazy unmount")
        h.check(sum(ok for ok, _ in outcomes) > 0, "the readers read right bytes until then: %s" % outcomes)


def test_sigint_unmounts(data):
    src, mnt, _, total = data
    with h.mounted(src, mnt, "ram=%d" % (total // 4)):
        pids = h.daemon_pids(mnt)
        os.kill(pids[0], signal.SIGINT)
        h.check(h.wait_gone(pids, 10) and not h.is_mounted(mnt), "SIGINT: the daemon unmounted and exited")


def test_a_data_set_4x_the_ram_for_3_epochs(data):
    # Right bytes, memory under its bound.
    src, mnt, want, total = data
    budget = total // 4
    with h.mounted(src, mnt, "seed=5,batch_size=8,workers=2,epochs=3,ram=%d" % budget, env=h.MEASURED):
        pids = h.daemon_pids(mnt)
        wrong = 0
        for e in range(3):
            with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, e)) as f:
                rels = f.read().splitlines()
            for rel in rels:
                wrong += h.digest(os.path.join(mnt, rel)) != want[rel]
        h.check(wrong == 0, "a data set 4× the RAM budget, 3 epochs: every byte equals SOURCE")
        h.within_memory_bound(pids, budget, len(want))


@pytest.fixture(scope="module")
def big_files(tmp):
    big_src = tmp + "/big"
    os.makedirs(big_src + "/c0")
    for i in range(8):
        with open("%s/c0/f%d.bin" % (big_src, i), "wb") as f:
            f.write(os.urandom((10 + 3 * i) << 20))
    return big_src, h.digests(big_src)


@pytest.mark.parametrize("progress", ["opens", "reads"])
def test_files_larger_than_the_ram_by_8_readers(tmp, big_files, progress):
    # What is read whole on demand stays within its allowance, the rest is read piece by piece; memory
    # under the same bound, in both modes.
    big_src, big_want = big_files
    mnt = tmp + "/mnt"
    budget = 8 << 20
    with h.mounted(big_src, mnt, "seed=1,batch_size=2,ram=%d,progress=%s" % (budget, progress), env=h.MEASURED):
        pids = h.daemon_pids(mnt)
        wrong = []

        def big_reader(n):
            for p in sorted(big_want)[n:] + sorted(big_want)[:n]:
                if h.digest(os.path.join(mnt, p)) != big_want[p]:
                    wrong.append(p)

        h.concurrently(big_reader, range(8))
        st = h.stats(mnt)
        h.check(not wrong, "progress=%s: 8 readers of files of 10-31 MiB (RAM 8 MiB) read every byte right" % progress)
        h.check(st["demand"]["piecewise_files"] > 0 and st["demand"]["used"] <= st["demand"]["limit"],
                "progress=%s: files with no room to be held whole were read piece by piece: %s" % (progress, st["demand"]))
        h.within_memory_bound(pids, budget, len(big_want), "progress=%s: " % progress)


@pytest.fixture(scope="module")
def mixed_sizes(tmp):
    mixed = tmp + "/mixed"
    h.make_dataset(mixed, 1000, 6, 30, 11)
    rnd = random.Random(4)
    for i in range(6):
        with open("%s/c%04d/large-%d.jpg" % (mixed, i, i), "wb") as f:
            f.write(rnd.randbytes(rnd.randrange(2 << 20, 24 << 20)))
    return mixed, h.digests(mixed)


@pytest.mark.parametrize("progress", ["opens", "reads"])
def test_rounds_of_readers_over_mixed_sizes(tmp, mixed_sizes, progress):
    # Small files and a few of 2-24 MiB, RAM a third of them, NVMe half: rounds of 1-8 concurrent readers,
    # each in a predicted or a random order. Before demand reads had an allowance and freed buffers went
    # back to the system, the daemon's memory passed the bound here (330 MiB with opens, 127 without,
    # against 93).
    mixed, mixed_want = mixed_sizes
    mnt = tmp + "/mnt"
    rnd = random.Random(4 if progress == "opens" else 5)
    mixed_total = sum(os.path.getsize(os.path.join(mixed, p)) for p in mixed_want)
    nvme = tmp + "/nvme-" + progress
    os.makedirs(nvme)
    budget = mixed_total // 3
    with h.mounted(mixed, mnt, "seed=3,batch_size=4,workers=2,ram=%d,nvme=%s,nvme_size=%d,progress=%s" % (
            budget, nvme, mixed_total // 2, progress), env=h.MEASURED):
        pids = h.daemon_pids(mnt)
        wrong, files = [], [0]
        paths = sorted(mixed_want)

        def mixed_reader(seed):
            r = random.Random(seed)
            if r.random() < 0.5:
                with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, r.randrange(0, 6))) as f:
                    rels = f.read().splitlines()
            else:
                rels = r.sample(paths, len(paths))
            start = r.randrange(len(rels))
            for rel in (rels[start:] + rels[:start])[:r.randrange(50, 400)]:
                files[0] += 1
                if h.digest(os.path.join(mnt, rel)) != mixed_want[rel]:
                    wrong.append(rel)

        for _ in range(30):
            h.concurrently(mixed_reader, [rnd.randrange(1 << 30) for _ in range(rnd.randrange(1, 9))])
        h.check(not wrong, "progress=%s: 30 rounds of concurrent readers over small and 2-24 MiB files: "
                "%d files read, every byte right" % (progress, files[0]))
        h.within_memory_bound(pids, budget, len(mixed_want), "progress=%s, mixed sizes: " % progress)


def test_a_file_rewritten_during_the_run(data):
    # Its staged copy or EIO, never new or mixed bytes. (The last scenarios: they change SOURCE.)
    src, mnt, _, total = data
    with h.mounted(src, mnt, "seed=5,batch_size=8,epochs=3,ram=%d" % (total * 2)):
        with open("%s/.clairfs/order/epoch-0/rank-0" % mnt) as f:
            rels = f.read().splitlines()
        h.quiet_stats(mnt)  # (everything staged that will be)
        victims = rels[len(rels) // 2:len(rels) // 2 + 20]
        old = {p: open(os.path.join(src, p), "rb").read() for p in victims}
        for p in victims:
            with open(os.path.join(src, p), "r+b") as f:
                f.write(b"NEW BYTES")
        results = [h.reads_as_or_eio(os.path.join(mnt, p), old[p]) for p in victims]
        h.check(all(results), "20 files rewritten after staging: each reads as its staged copy or EIO")


def test_a_file_changed_without_staging_is_eio(data):
    # Without staging there is no copy: a file rewritten (same size, new mtime), truncated or deleted after
    # the scan is EIO.
    src, mnt, want, _ = data
    victims = sorted(p for p in want if not p.endswith("big.jpg"))[-5:]
    with h.mounted(src, mnt, "ram=0"):
        read = h.attributes_read(mnt)  # ("after the scan": the mount is up before the files' attributes are read)
        for p in victims[:3]:
            with open(os.path.join(src, p), "r+b") as f:
                f.write(b"NEWER")
        os.truncate(os.path.join(src, victims[3]), 10)
        os.unlink(os.path.join(src, victims[4]))
        h.check(read and all(h.expect_errno(lambda p=p: open(os.path.join(mnt, p), "rb").read(), 5) for p in victims),
                "ram=0: files rewritten, truncated or deleted after the scan read as EIO (attributes read first: %s)" % read)


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
