"""The staging engine (ram=) on a real mount: every byte equals SOURCE whatever the order — predicted,
wrong seed, concurrent readers — under budgets from generous to smaller than one file; the RAM budget is
never exceeded; files read in the predicted order come from RAM; the stats add up to what was read."""
import json
import os
import random
import threading
import time

import harness as h
import pytest


class Tree:
    """400 files and an empty one in SOURCE, and a mount point."""

    def __init__(self, tmp):
        self.tmp, self.src, self.mnt = tmp, tmp + "/src", tmp + "/mnt"
        os.makedirs(self.mnt)
        h.make_dataset(self.src, 400, 7, 40, 3)
        open(os.path.join(self.src, "c0000", "empty.jpg"), "wb").close()
        self.want = h.digests(self.src)
        self.total = sum(os.path.getsize(os.path.join(self.src, p)) for p in self.want)

    def order(self, epoch, rank=0):
        with open("%s/.clairfs/order/epoch-%d/rank-%d" % (self.mnt, epoch, rank)) as f:
            return f.read().splitlines()


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        yield Tree(tmp)


@pytest.mark.parametrize("progress", ["reads", "watch", "opens"])
def test_the_predicted_order(t, progress):
    # With a budget of a quarter of the data set: the kernel opening files itself (pushed files are read
    # with no request) and the engine following reads (progress=reads, the default) or the watch on the
    # mount telling every open (watch), or the kernel sending every open.
    src, mnt, want, total, order = t.src, t.mnt, t.want, t.total, t.order
    budget = total // 4
    with h.mounted(src, mnt, "seed=9,batch_size=8,workers=2,epochs=3,ram=%d,progress=%s" % (budget, progress)):
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], h.stats(mnt)["ram"]["used"])
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        wrong = opened = 0
        for epoch in range(2):
            for rel in order(epoch):
                time.sleep(0.001)  # a little compute, so the stager can run ahead
                wrong += h.digest(os.path.join(mnt, rel)) != want[rel]
                opened += 1
        done.set()
        watcher.join()
        time.sleep(0.3)  # the kernel sends releases after close, asynchronously
        s = h.stats(mnt)
        h.check(wrong == 0 and s["progress"]["from"] == {"watch": "watched opens"}.get(progress, progress),
                "progress=%s, predicted order, 2 epochs: every byte equals SOURCE (%d files)" % (progress, opened))
        h.check(peak[0] <= budget, "RAM use peaked at %d bytes, within the %d budget" % (peak[0], budget))
        ram, nvme, source, cached = (s["tiers"][t]["files"] for t in ("ram", "nvme", "source", "pagecache"))
        # Following reads, a file read wholly from pushed pages is counted once its reader reads a file
        # past it through the daemon (nothing else tells of it): the job's last few may never be. And
        # the engine learns where the reader is only from those reads (and beacons), later than from
        # opens: on a loaded machine (the sanitizer pass) a tenth of the opens came before their file.
        lag, staged = opened - (ram + nvme + source + cached), 0.8 if progress == "reads" else 0.9
        h.check(lag == 0 or (progress == "reads" and 0 < lag <= 8),
                "stats add up: RAM %d + NVMe %d + SOURCE %d + page cache %d opens = %d%s (%s; progress %s)" % (
                    ram, nvme, source, cached, opened, " - %d read last from pushed pages" % lag if lag else "",
                    progress, s["progress"]))
        h.check(ram + cached >= opened * staged,
                "%d%% or more of the predicted opens were staged (RAM or pushed pages): %s" % (staged * 100, s["tiers"]))
        # (Pushed, or kept from a read before: following reads, epoch 1 may need no push at all, the
        # kernel holding every file; epoch 0's pushes fail until the reader has looked the files up.)
        h.check(cached > 0 and (s["pagecache"]["pushes"] > 0 or s["pagecache"]["left_to_kernel"] > 0),
                "some files were read from pages in the kernel (pushed, or kept) with no read reaching the daemon: %s"
                % s["pagecache"])
        h.check(s["pagecache"]["used"] <= s["pagecache"]["budget"], "pushed pages within their budget: %s" % s["pagecache"])
        # RAM for a quarter of the data set, the kernel's page cache for all of it (security finding 13).
        # The engine leaves the pages the reader read to the kernel, and asks it before staging a file
        # again: SOURCE is read about once, as through a plain mount (1.000-1.008× in 8 runs; a file the
        # kernel kept only in part is read again). Following reads too (it was 1.85×), but the pages of a
        # file next read as a beacon go, so that its read reaches the daemon: that file is read again,
        # one use in beacon_every (here 6, a small page-cache budget; 1 in 256 at common sizes).
        from_source, every = s["source_traffic"]["bytes"], s["progress"]["beacon_every"]
        h.check(total <= from_source <= total * (1.15 + (1 / every if every else 0)),
                "SOURCE read %.3f× the data set over 2 epochs (%d uses left to the kernel's pages%s)" % (
                    from_source / total, s["pagecache"]["left_to_kernel"], ", beacons every %d" % every if every else ""))
        h.check(s["mispredicted_opens"] == 0, "no misprediction on the predicted order")
        # stats: each open reads one rendering, as long as the open file says (read without opens,
        # the kernel caches it like any file and trusts the size it was told), made afresh for each
        # reader.
        path = mnt + "/.clairfs/stats"
        sized = []
        for _ in range(3):
            with open(path, "rb") as f:
                sized.append(len(f.read()) == os.fstat(f.fileno()).st_size)
        # (With the watch, a read whose open the watch has not told yet, of a file whose last use
        # was told within 2 s, is taken as the kernel reading that use's file ahead after its close,
        # and the open's use is counted as the page cache's at its close: the watch runs behind the
        # reader under a sanitizer — red once in CI. The file read here was read in epoch 1: its
        # 2 s are let pass first, and the read is counted by where it is served from, at once.)
        if progress == "watch":
            time.sleep(2.1)
        with open(path) as f:
            before = sum(v["files"] for t, v in json.load(f)["tiers"].items() if t != "pagecache")
        fd = os.open(os.path.join(mnt, order(0)[7]), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # its pages go: this read reaches the daemon
        os.read(fd, 1 << 20)
        os.close(fd)
        # (Counted as the read is answered: the reader may ask for stats a moment before.)
        deadline = time.monotonic() + 0.3
        after = sum(v["files"] for t, v in h.stats(mnt)["tiers"].items() if t != "pagecache")
        while after == before and time.monotonic() < deadline:
            after = sum(v["files"] for t, v in h.stats(mnt)["tiers"].items() if t != "pagecache")
        h.check(all(sized) and after == before + 1, "progress=%s: stats read whole, at the size the open file "
                "has %s, and fresh: a read through the daemon is counted at once (%d, %d)" % (
                    progress, sized, before, after))
        if progress == "watch":
            # A file the kernel holds only in part (its first page): the read of the rest reaches the
            # daemon, and that use is counted once, by where the rest came from (it was counted twice,
            # as SOURCE's and as the page cache's at the close).
            big = next(rel for rel in order(0) if os.path.getsize(os.path.join(src, rel)) > 3 * 4096)
            fd = os.open(os.path.join(mnt, big), os.O_RDONLY)
            os.read(fd, 1 << 20)
            os.posix_fadvise(fd, 4096, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            # (Heard before this process opens the file again: the kernel merges one process's events
            # on one file while they wait to be read, and two opens would be heard as one.)
            # Judged by what this one open adds: the counts before it need not agree to the file (an
            # open of the epochs above heard as merged with another leaves opens_seen one short of the
            # files served, in about one run in three here, with the build before this session too).
            s1 = h.quiet_stats(mnt)
            right = h.digest(os.path.join(mnt, big)) == want[big]
            s2 = h.quiet_stats(mnt)  # (its events come a moment after: under ASan the count read late)
            served = sum(v["files"] for v in s2["tiers"].values()) - sum(v["files"] for v in s1["tiers"].values())
            heard = s2["progress"]["opens_seen"] - s1["progress"]["opens_seen"]
            h.check(right and served == heard == 1,
                    "a file held in part: read right (%s), its use counted once: %d served for %d open heard "
                    "(before it: %d served, %d opens heard)" % (
                        right, served, heard, sum(v["files"] for v in s1["tiers"].values()),
                        s1["progress"]["opens_seen"]))
        h.within_memory_bound(h.daemon_pids(mnt), budget, len(want))
        r = h.run_clairfs(["status", mnt])
        h.check(r.returncode == 0 and "epoch 2" in r.stdout and "RAM" in r.stdout and "opens served" in r.stdout
                and "lead" in r.stdout,
                "clairfs status shows the epoch, RAM and tiers:\n" + r.stdout)


def test_status_of_a_plain_directory(t):
    r = h.run_clairfs(["status", t.tmp])
    h.check(r.returncode == 1 and "not a clairfs mount" in r.stderr, "clairfs status on a plain directory: " + r.stderr.strip())


def test_a_job_without_set_epoch(t):
    # It reads epoch 0's order every epoch (security finding 13's second case): with RAM for a quarter of
    # the data set, SOURCE is still read about once (it was 1.76× a plain mount).
    src, mnt, want, total, order = t.src, t.mnt, t.want, t.total, t.order
    budget = total // 4
    with h.mounted(src, mnt, "seed=9,batch_size=8,workers=2,ram=%d" % budget):
        rels = order(0)
        bad = sum(h.digest(os.path.join(mnt, rel)) != want[rel] for _ in range(3) for rel in rels)
        s = h.settled_stats(mnt, 3 * len(rels))
        h.check(bad == 0 and h.source_bytes(s) <= total * 1.15,
                "epoch 0's order read 3 times: every byte right (%d wrong), SOURCE read %.3f× the data set" % (
                    bad, h.source_bytes(s) / total))


def test_another_order_and_8_concurrent_readers(t):
    # A reader that does not follow the prediction (another seed), and 8 concurrent readers.
    src, mnt, want, total = t.src, t.mnt, t.want, t.total
    rnd = random.Random(11)
    with h.mounted(src, mnt, "seed=1,batch_size=8,ram=%d" % (total // 3)):
        paths = list(want)
        rnd.shuffle(paths)
        h.check(all(h.digest(os.path.join(mnt, p)) == want[p] for p in paths),
                "a reader in another order: every byte equals SOURCE")
        s = h.stats(mnt)
        h.check(s["mispredicted_opens"] == 0 or s["tiers"]["source"]["files"] > 0,
                "it is served anyway (%d mispredicted, %d from SOURCE)" % (s["mispredicted_opens"],
                                                                       s["tiers"]["source"]["files"]))
        errors = []

        def reader(seed):
            r = random.Random(seed)
            for p in r.sample(paths, len(paths)):
                if h.digest(os.path.join(mnt, p)) != want[p]:
                    errors.append(p)

        h.concurrently(reader, range(8))
        h.check(not errors, "8 concurrent readers in random orders: every byte equals SOURCE %s" % errors[:3])
        h.check(h.stats(mnt)["ram"]["used"] <= total // 3, "RAM use within budget after concurrent readers")


def test_off_the_plan_and_back(t):
    # A reader off the plan is noticed within a bounded number of opens, and resyncs when it returns; a
    # reader in sample order gets read-ahead. batch_size=1: tolerance 96 steps, so opens are judged in
    # blocks of 256; 3,000 files, so a random reader lands inside the tolerance only now and then.
    mnt, order = t.mnt, t.order
    rnd = random.Random(12)
    many = t.tmp + "/many"
    h.make_dataset(many, 3000, 4, 1, 4)
    many_want = h.digests(many)
    with h.mounted(many, mnt, "seed=9,batch_size=1,epochs=3,ram=%d" % (sum(os.path.getsize(os.path.join(many, p)) for p in many_want) // 2)):
        # (The mount is up before its plan: opens made meanwhile are placed once it is, but the rank's
        # verdict is read below as the opens go. Three test files at a time once took longer than 8 opens.)
        h.check(h.wait_until(lambda: "ranks" in h.stats(mnt)), "the plan made")
        wrong_order = list(many_want)
        rnd.shuffle(wrong_order)
        lost_at, bad = None, 0
        for n, p in enumerate(wrong_order[:1000], 1):
            bad += h.digest(os.path.join(mnt, p)) != many_want[p]
            if lost_at is None and n % 8 == 0 and not h.stats(mnt)["ranks"][0]["live"]:
                lost_at = n
        s = h.settled_stats(mnt, 1000)
        h.check(bad == 0, "another order: every byte equals SOURCE")
        h.check(lost_at is not None and lost_at <= 256 + 8,
                "the rank was marked off the plan after %s opens (bound: one block of 256)" % lost_at)
        h.check(s["mispredicted_opens"] >= 900, "mispredicted opens counted: %d of 1000" % s["mispredicted_opens"])
        served_before = s["tiers"]["ram"]["files"] + s["tiers"]["pagecache"]["files"]
        rels = order(1)
        for rel in rels:
            time.sleep(0.0005)  # a little compute: the lead is short once RAM is full of files kept for later
            bad += h.digest(os.path.join(mnt, rel)) != many_want[rel]
        s = h.stats(mnt)
        staged = s["tiers"]["ram"]["files"] + s["tiers"]["pagecache"]["files"] - served_before
        h.check(bad == 0 and s["ranks"][0]["live"] and staged >= len(rels) * 0.7,
                "back in the predicted order (epoch 1): live again, %d of %d opens staged" % (staged, len(rels)))
        before = s["readahead_files"]
        h.forget_pages(mnt, many_want)  # the kernel takes their pages back: read ahead once it says so
        for p in sorted(many_want):  # ImageFolder's order: a sequential pass
            time.sleep(0.0005)  # a little compute, as any reader has (and a sanitized daemon needs)
            bad += h.digest(os.path.join(mnt, p)) != many_want[p]
        s = h.stats(mnt)
        h.check(bad == 0 and s["readahead_files"] - before >= 1000,
                "a pass in sample order: every byte right, %d of %d files read ahead" % (s["readahead_files"] - before, len(many_want)))


def test_a_budget_smaller_than_any_file(t):
    # Nothing but empty files can be staged; reads still right.
    src, mnt, want, order = t.src, t.mnt, t.want, t.order
    with h.mounted(src, mnt, "seed=9,batch_size=8,ram=1K"):
        rels = order(0)
        h.check(all(h.digest(os.path.join(mnt, p)) == want[p] for p in rels),
                "budget smaller than one file: every byte equals SOURCE")
        s = h.stats(mnt)
        h.check(s["staged"]["bytes"] == 0 and s["ram"]["used"] <= 1024,
                "nothing over the budget was staged: %s %s" % (s["staged"], s["ram"]))


def test_a_listing_by_names_pushes_every_file(t):
    # A listing by names (os.walk, as ImageFolder does) gives the kernel every file's inode (READDIRPLUS
    # for every part of a directory): each staged file is pushed before its first read, no push refused,
    # and epoch 0 is read from pushed pages. (Before: the kernel listed with inodes only the start of each
    # directory; the other pushes were refused every 50 ms, and those files read through the daemon: 184
    # of 600 from pushed pages. One run here counted 595, the other 5 from RAM: likely this machine's
    # proactive reclaim, which drops page-cache pages it sees as cold — docs/benchmarks.md.)
    # One folder of 600 files, as ImageNet's classes hold 1,300. (start_batch=0: the job is said to start
    # at its epoch's beginning, so that all is staged before the first read, not one batch.)
    mnt, order = t.mnt, t.order
    big = t.tmp + "/big"
    h.make_dataset(big, 600, 1, 8, 5)
    big_want = h.digests(big)
    big_total = sum(os.path.getsize(os.path.join(big, p)) for p in big_want)
    with h.mounted(big, mnt, "seed=9,batch_size=8,start_batch=0,ram=%d,pagecache=%d" % (2 * big_total, 2 * big_total)):
        # (Listed before the mount has read the files' attributes, a file is given to the kernel by name
        # and type alone, without an inode, and is not pushed until looked up: beside another test file
        # the listing came first once, and 361 of 600 were pushed.)
        h.check(h.attributes_read(mnt), "the files' attributes read before the listing")
        for _ in os.walk(mnt):
            pass
        files = sum(1 for p in big_want if os.path.getsize(os.path.join(big, p)) > 0)
        h.wait_until(lambda: h.stats(mnt)["pagecache"]["pushes"] >= files, timeout=30, step=0.1)
        before = h.stats(mnt)["pagecache"]
        # Pushed pages are on the kernel's active list before any read (each pushed twice): a reader's
        # first read moves no page (before: all inactive, each moved at its first read).
        first = [p for p in order(0) if os.path.getsize(os.path.join(big, p)) > 0][:40]
        held = [h.active_pages(os.path.join(mnt, p)) for p in first]
        present, active = sum(n for n, _ in held), sum(a for _, a in held)
        h.check(present > 0 and active >= 0.9 * present,
                "pushed pages are active before their first read: %d of %d pages of %d files" % (active, present, len(first)))
        bad = sum(h.digest(os.path.join(mnt, p)) != big_want[p] for p in order(0))
        time.sleep(0.3)  # releases come after the closes
        s = h.stats(mnt)
        # (The 40 looks at the first files' pages are opens too, counted as served from the pages — unless
        # the watch's queue held that file's open when its epoch-0 open came: fanotify then merges the two
        # into one event, as a CI run at 43b7dc3 counted, 600 of 640. Epoch 0's own opens are the measure.)
        h.check(before["pushes"] == files and before["push_failures"] == 0 and bad == 0
                and s["tiers"]["pagecache"]["files"] >= 0.95 * files,
                "after a listing by names, every staged file pushed before its first read, none refused: %s; "
                "epoch 0 read from the kernel's pages: %s of %d opens (%d mapped before), every byte right %s (tiers %s)" % (
                    before, s["tiers"]["pagecache"]["files"], files + len(first), len(first), bad == 0, s["tiers"]))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
