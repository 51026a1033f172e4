"""The NVMe tier (nvme=DIR) on real mounts: files read from SOURCE once and back from NVMe in later epochs,
the size limit never exceeded, clairfs touching only its own folder in DIR, corrupted cache files never
served (re-read from SOURCE and counted), a full disk (a small tmpfs) lowering the capacity only, and the
budget counted in the disk's blocks."""
import contextlib
import os
import subprocess
import threading
import time

import harness as h
import pytest

ALONE = True  # (conftest.py) it drops the kernel's page cache, every mount's pages with it


@contextlib.contextmanager
def tmpfs(path, size):
    """A tmpfs of `size` mounted at `path` for the while; the scenario skipped where none can be mounted."""
    with h.tmpfs(path, size) as got:
        if got is None:
            pytest.skip("cannot mount a tmpfs")
        yield got


def dir_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(d, f)).st_blocks * 512  # (copies are packed in sparse slabs)
            except FileNotFoundError:
                pass
    return total


class Tree:
    """300 files in SOURCE, a mount point, and an NVMe directory holding someone else's files too."""

    def __init__(self, tmp):
        self.tmp, self.src, self.mnt, self.cache = tmp, tmp + "/src", tmp + "/mnt", tmp + "/nvme"
        os.makedirs(self.mnt)
        os.makedirs(self.cache)
        self.want, self.total = h.dataset(self.src, 300, 5, 30, 5)
        # Someone else's files in DIR: never touched.
        with open(self.cache + "/not-ours.bin", "wb") as f:
            f.write(b"x" * 1000)
        os.makedirs(self.cache + "/other")

    def order(self, epoch):
        with open("%s/.clairfs/order/epoch-%d/rank-0" % (self.mnt, epoch)) as f:
            return f.read().splitlines()

    def read_epochs(self, epochs, between=None):
        """Reads the epochs in the predicted order; before each but the first the kernel drops the files'
        pages (as on a node whose page cache cannot hold the data set: the tiers below it serve)."""
        wrong = opened = 0
        for e in epochs:
            if e > 0:
                h.drop_page_cache()
            if between:
                between(e)
            for rel in self.order(e):
                time.sleep(0.0005)
                wrong += h.digest(os.path.join(self.mnt, rel)) != self.want[rel]
                opened += 1
        return wrong, opened

    def folder(self):
        return [os.path.join(self.cache, d) for d in os.listdir(self.cache) if d.startswith("clairfs-cache.")][0]


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        yield Tree(tmp)


def test_source_read_once_over_3_epochs(t):
    # RAM holds an eighth of the data set, NVMe all of it.
    with h.mounted(t.src, t.mnt, "seed=4,batch_size=4,epochs=3,ram=%d,nvme=%s" % (t.total // 8, t.cache)):
        ours = [d for d in os.listdir(t.cache) if d.startswith("clairfs-cache.")]
        h.check(len(ours) == 1, "one cache folder of its own in DIR: %s" % ours)
        wrong, opened = t.read_epochs(range(3))
        s = h.stats(t.mnt)
        h.check(wrong == 0, "3 epochs with RAM at 1/8 and NVMe: every byte equals SOURCE (%d files)" % opened)
        traffic = s["source_traffic"]["bytes"] / t.total
        h.check(traffic <= 1.05, "SOURCE read %.2f× the data set over 3 epochs (every byte once)" % traffic)
        h.check(s["staged"]["from_nvme"] > len(t.want), "later epochs were staged from NVMe: %s" % s["staged"])
        h.check(s["nvme"]["used"] <= s["nvme"]["capacity"] and s["checksum_failures"] == 0, "NVMe within capacity, no bad copies: %s" % s["nvme"])
    h.check(sorted(os.listdir(t.cache)) == ["not-ours.bin", "other"] and os.path.getsize(t.cache + "/not-ours.bin") == 1000,
            "after unmount only the files that were there before remain: %s" % os.listdir(t.cache))


def test_nvme_size_never_exceeded(t):
    # nvme_size a third of the data set: never exceeded, bytes still right.
    limit = t.total // 3
    with h.mounted(t.src, t.mnt, "seed=4,batch_size=4,epochs=3,ram=%d,nvme=%s,nvme_size=%d" % (t.total // 8, t.cache, limit)):
        folder = t.folder()
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], dir_bytes(folder))
                time.sleep(0.002)

        w = threading.Thread(target=watch)
        w.start()
        wrong, opened = t.read_epochs(range(3))
        done.set()
        w.join()
        s = h.stats(t.mnt)
        h.check(wrong == 0, "NVMe limited to 1/3 of the data set: every byte equals SOURCE")
        h.check(peak[0] <= limit and s["nvme"]["used"] <= limit,
                "files in the NVMe folder peaked at %d bytes, within nvme_size=%d" % (peak[0], limit))
        h.check(s["nvme"]["writes"] > 0 and s["staged"]["from_nvme"] > 0,
                "what fitted was written and read back: %s %s" % (s["nvme"], s["staged"]))


def test_corrupted_copies_are_never_served(t):
    # Re-read from SOURCE and counted.
    with h.mounted(t.src, t.mnt, "seed=4,batch_size=4,epochs=3,ram=%d,nvme=%s" % (t.total // 8, t.cache)):
        folder = t.folder()

        def corrupt(epoch):
            if epoch != 1:
                return
            time.sleep(0.3)  # let the writes of epoch 0 land
            for f in os.listdir(folder):  # slabs of packed copies: a byte every 512 flipped hits each copy
                p = os.path.join(folder, f)
                with open(p, "r+b") as fh:
                    for at in range(0, os.path.getsize(p), 512):
                        fh.seek(at)
                        b = fh.read(1)
                        fh.seek(at)
                        fh.write(bytes([(b[0] if b else 0) ^ 0xFF]))

        wrong, opened = t.read_epochs(range(3), corrupt)
        s = h.stats(t.mnt)
        h.check(wrong == 0, "every NVMe copy corrupted after epoch 0: every byte still equals SOURCE (%d files)" % opened)
        h.check(s["checksum_failures"] > 0, "the bad copies were caught and counted: %d" % s["checksum_failures"])


def test_a_full_disk(t):
    # NVMe on a 1 MiB tmpfs, told it has the whole data set. The first ENOSPC brings the capacity down to
    # what the files there take; admission goes on within it (it used to stop for the rest of the mount);
    # serving goes on. (On 256 KiB the few files that fitted, about 7, were read back 0-3 times a run:
    # none in 1 CI run of many.)
    with tmpfs(t.tmp + "/small", "1m") as small:
        with h.mounted(t.src, t.mnt, "seed=4,batch_size=4,epochs=3,ram=%d,nvme=%s,nvme_size=%d" % (t.total // 8, small, t.total)):
            wrong, opened = t.read_epochs(range(3))
            s = h.stats(t.mnt)
            n = s["nvme"]
            h.check(wrong == 0, "NVMe directory full: every byte equals SOURCE (%d files)" % opened)
            h.check(n["admitting"] and n["write_failures"] > 0 and n["used"] <= n["capacity"] <= (1 << 20),
                    "the full disk lowered the capacity to %d KiB (used %d KiB, %d failed writes), admission goes on"
                    % (n["capacity"] >> 10, n["used"] >> 10, n["write_failures"]))
            # (Staged from there, or read from there on demand: with a few files on it, the readers may
            # reach one before the stager has learned that the kernel no longer holds it.)
            used = s["staged"]["from_nvme"] + s["tiers"]["nvme"]["files"]
            h.check(used > 0, "files written there were used: %s %s" % (s["staged"], s["tiers"]["nvme"]))


def test_the_budget_counts_blocks(t):
    # Small files on a small disk: 2,000 files of about 2 KB on an 8 MiB tmpfs (4 KiB pages) with the
    # default nvme_size. A copy each, they took 8 MB of disk for 4 MB of bytes (and stats once said about
    # half used while the disk was full); packed, ~4 MB: what the stats say is what the disk says.
    with tmpfs(t.tmp + "/blocks", "8m") as blocks:
        small_src = t.tmp + "/small-src"
        small_want, small_total = h.dataset(small_src, 2000, 4, 2, 6)
        with h.mounted(small_src, t.mnt, "seed=4,batch_size=4,epochs=2,ram=256K,nvme=" + blocks):
            wrong = 0
            for e in range(2):
                for rel in t.order(e):
                    wrong += h.digest(os.path.join(t.mnt, rel)) != small_want[rel]
            n = h.stats(t.mnt)["nvme"]
            st = os.statvfs(blocks)
            disk = (st.f_blocks - st.f_bfree) * st.f_frsize
            h.check(wrong == 0 and n["write_failures"] == 0 and n["admitting"] and n["used"] <= n["capacity"],
                    "2,000 small files on an 8 MiB disk: every byte right, no failed write, used %d KiB of %d KiB"
                    % (n["used"] >> 10, n["capacity"] >> 10))
            h.check(abs(disk - n["used"]) <= (256 << 10),
                    "the disk says %d KiB used, the stats %d KiB (%d files, %d KiB of bytes)" % (
                        disk >> 10, n["used"] >> 10, n["files"], small_total >> 10))


def test_the_nvme_directory_turns_read_only(t):
    # Its file system remounted ro during the run: writes fail and are counted, nothing else changes.
    with tmpfs(t.tmp + "/ro", "64m") as ro:
        with h.mounted(t.src, t.mnt, "seed=4,batch_size=4,epochs=3,ram=%d,nvme=%s" % (t.total // 8, ro)):
            # Refused (EBUSY) while the stager has a file open for writing there: try until it is not.
            made = h.wait_until(lambda: subprocess.run(["mount", "-o", "remount,ro", ro],
                                                       capture_output=True).returncode == 0, timeout=4, step=0.02)
            h.check(made, "the NVMe directory's tmpfs made read-only (within 4 s)")
            wrong, opened = t.read_epochs(range(3))
            s = h.stats(t.mnt)
            h.check(wrong == 0 and s["nvme"]["write_failures"] > 0 and not s["nvme"]["admitting"],
                    "NVMe directory made read-only mid-run: every byte right, admission stopped after %d failed writes"
                    % s["nvme"]["write_failures"])
            subprocess.run(["mount", "-o", "remount,rw", ro], check=True)


def test_a_missing_nvme_directory(t):
    # Refused at mount with one line.
    r = h.run_clairfs([t.src, t.mnt, "-o", "nvme=%s/missing" % t.tmp])
    h.check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "missing" in r.stderr,
            "nvme=DIR that does not exist: exit 2, one line: %s" % r.stderr.strip())
    h.check(not h.is_mounted(t.mnt), "and nothing mounted")


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
