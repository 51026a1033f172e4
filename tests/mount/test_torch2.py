"""The oracle and the published order against real torch 2.x: Debian 13's python3-torch and
python3-torchvision, in the chroot scripts/torch2-chroot makes (scripts/test makes it before the suite).
torch runs in the chroot (tests/mount/torch_side.py answers questions over a pipe); the oracle and the
mounts run here.

1. DistributedSampler (+ BatchSampler), shuffled and not, over random sample counts, world sizes, ranks,
   seeds (negative, >= 2^32, >= 2^63) and epochs: the oracle's sequence equals torch's.
2. DataLoader(shuffle=True, generator=g), and a RandomSampler with g, over several epochs.
3. Which DataLoader worker loads which sample.
4. The published order: MOUNTPOINT/.clairfs/order/epoch-E/rank-R through a real mount, for order=torch and
   order=torch-random, on awkward trees (symlinked directories and files), equals torch 2.x's
   ImageFolder(mount).samples taken in its sampler's order — paths and all.
5. The same with a job's own sample list (samples=FILE): ImageFolder with an is_valid_file.
6. Jobs whose list the mount learns from their opens: ImageFolder of a subfolder, a sorted glob.
7. The global-seed script learned (seed=auto); jobs resumed from a checkpoint: at a later epoch (not told),
   mid-epoch (start_batch= told, and not); ImageFolder with an is_valid_file, its list learned once its
   first epoch ended (told seed, seed=auto).
"""
import json
import os
import random
import shutil
import subprocess

import harness as h
import pytest
from oracle_pipe import Oracle, random_seed
from trees import build

CHROOT = os.environ.get("CLAIRFS_TORCH2_ROOT", "/var/cache/clairfs/trixie")


class Torch2:
    """torch_side.py run by the chroot's python3."""

    def __init__(self, work):
        shutil.copy(os.path.join(os.path.dirname(__file__), "torch_side.py"), work)
        inside = "/" + os.path.relpath(work, CHROOT) + "/torch_side.py"
        self.p = subprocess.Popen(["/usr/sbin/chroot", CHROOT, "/usr/bin/python3", inside], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})

    def ask(self, **q):
        self.p.stdin.write(json.dumps(q) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("torch_side.py in the chroot stopped")
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)
def published_differs(rnd, torch2, mnt, samples, order, world, seed, batch, ldl, epoch, what):
    """Whether a random rank's published order of `epoch` differs from torch 2.x's sampler over `samples`
    (said when it does)."""
    rank = rnd.randrange(world)
    with open("%s/.clairfs/order/epoch-%d/rank-%d" % (mnt, epoch, rank)) as f:
        got = f.read().splitlines()
    if order == "torch":
        idx = torch2.ask(q="dist", n=len(samples), world=world, rank=rank, seed=seed, epoch=epoch, drop_last=False,
                         shuffle=True, batch=batch, ldl=ldl)
    else:
        idx = torch2.ask(q="random", n=len(samples), seed=seed, batch=batch, ldl=ldl, shared=True,
                         epochs=epoch + 1)[epoch]
    if got == [samples[i] for i in idx]:
        return False
    print("published order differs: %s epoch %d rank %d" % (what, epoch, rank))
    return True
class Chroot:
    """A folder of this test's in the chroot (its trees, its mount point), torch 2.x asked over a pipe, and
    the oracle. Trees here hold absolute symlinks (host paths under CHROOT): inside the chroot, CHROOT's
    own path leads back to its root, so they lead where they lead outside it. DataLoader workers need /proc
    and a /dev/shm in the chroot."""

    def __init__(self):
        self.work = os.path.join(CHROOT, "mnt", "clairfs-torch2-%d" % os.getpid())
        os.makedirs(self.work)
        self.mnt = os.path.join(self.work, "mnt")
        os.makedirs(self.mnt)
        self.loop = os.path.join(CHROOT, os.path.relpath(CHROOT, "/"))
        self.made_loop = not os.path.lexists(self.loop)
        if self.made_loop:
            os.makedirs(os.path.dirname(self.loop), exist_ok=True)
            os.symlink("/", self.loop)
        self.proc_mounted = False
        if not os.path.ismount(os.path.join(CHROOT, "proc")):
            subprocess.run(["mount", "-t", "proc", "proc", os.path.join(CHROOT, "proc")], check=True)
            self.proc_mounted = True
        os.makedirs(os.path.join(CHROOT, "dev", "shm"), exist_ok=True)
        self.torch2, self.oracle = Torch2(self.work), Oracle()
        self.versions = self.torch2.ask(q="version")
        shutil.copy(os.path.join(os.path.dirname(__file__), "mismatch_job.py"), self.work)
        self.digests = os.path.join(self.work, "digests.json")

    def tree(self, t):
        """Awkward tree number `t` (made once)."""
        root = os.path.join(self.work, "t%d" % t)
        if not os.path.exists(root):
            build(root, random.Random(300 + t))
        return root

    def job(self, args):
        """tests/mount/mismatch_job.py run by the chroot's torch 2.x with `args` (paths as seen inside)."""
        return subprocess.run(["/usr/sbin/chroot", CHROOT, "/usr/bin/python3", inside(self.work) + "/mismatch_job.py",
                               "--digests", inside(self.digests), "--compute", "0.005"] + args, capture_output=True,
                              text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})

    def close(self):
        if h.is_mounted(self.mnt):
            h.unmount(self.mnt)
        self.torch2.close()
        self.oracle.close()
        shutil.rmtree(self.work, ignore_errors=True)
        if self.proc_mounted:
            subprocess.run(["umount", "-l", os.path.join(CHROOT, "proc")])
        if self.made_loop:
            os.unlink(self.loop)


def inside(path):
    """A path under CHROOT as the chroot sees it."""
    return "/" + os.path.relpath(path, CHROOT)


@pytest.fixture(scope="module")
def c():
    if not os.path.isfile(os.path.join(CHROOT, "usr/lib/python3/dist-packages/torch/__init__.py")):
        pytest.fail("no torch 2.x chroot at %s (make it with scripts/torch2-chroot)" % CHROOT, pytrace=False)
    c = Chroot()
    try:
        yield c
    finally:
        c.close()


def test_the_chroots_torch_is_2x(c):
    versions = c.versions
    h.check(versions[0].startswith("2."), "the chroot's torch is 2.x: torch %s, torchvision %s" % tuple(versions))


def test_distributed_sampler(c):
    torch2, oracle, versions = c.torch2, c.oracle, c.versions
    rnd = random.Random(2026)
    cases = bad = 0
    for _ in range(300):
        n = rnd.choice([1, 2, 3, 7, 10, 64, 100, 257, 1000, rnd.randrange(1, 5000)])
        world = rnd.choice([1, 2, 3, 4, 5, 8, 16])
        rank = rnd.randrange(world)
        epoch = rnd.choice([0, 1, 2, rnd.randrange(0, 1000)])
        seed = random_seed(rnd, epoch)
        drop_last, shuffle, ldl = rnd.random() < 0.4, rnd.random() < 0.85, rnd.random() < 0.4
        batch = rnd.choice([1, 2, 3, 32])
        want = torch2.ask(q="dist", n=n, world=world, rank=rank, seed=seed, epoch=epoch, drop_last=drop_last,
                          shuffle=shuffle, batch=batch, ldl=ldl)
        got = oracle.ask("rank", "torch" if shuffle else "sequential", n, world, rank, seed, epoch, drop_last, batch, ldl)
        cases += 1
        if want != got:
            bad += 1
            if bad <= 3:
                print("differs: n=%d world=%d rank=%d seed=%d epoch=%d shuffle=%d: torch %s, oracle %s" % (
                    n, world, rank, seed, epoch, shuffle, want[:8], got[:8]))
    h.check(bad == 0, "torch %s DistributedSampler: %d/%d random cases bit-exact" % (versions[0], cases - bad, cases))


def test_a_dataloader_with_a_generator(c):
    torch2, oracle, versions = c.torch2, c.oracle, c.versions
    rnd = random.Random(2027)
    cases = bad = 0
    for trial in range(24):
        n = rnd.choice([1, 2, 5, 100, 1000, rnd.randrange(2, 3000)])
        seed = rnd.choice([0, 7, rnd.randrange(0, 2**40), -5])
        batch, ldl, shared = rnd.choice([1, 4, 16]), rnd.random() < 0.5, trial % 2 == 0
        want = torch2.ask(q="random", n=n, seed=seed, batch=batch, ldl=ldl, shared=shared, epochs=4)
        for epoch in range(4):
            cases += 1
            got = oracle.ask("rank", "torch-random", n, 1, 0, seed, epoch, 0, batch, ldl, 0, int(shared), 0, 0)
            if want[epoch] != got:
                bad += 1
                if bad <= 3:
                    print("torch-random differs: n=%d seed=%d epoch=%d shared=%d" % (n, seed, epoch, shared))
    h.check(bad == 0, "torch %s DataLoader(shuffle=True, generator=g): %d/%d epochs bit-exact (shared and not)" % (
        versions[0], cases - bad, cases))


def test_a_dataloader_without_a_generator(c):
    # After torch.manual_seed and some draws.
    torch2, oracle, versions = c.torch2, c.oracle, c.versions
    rnd = random.Random(2028)
    cases = bad = 0
    for trial in range(12):
        n = rnd.choice([2, 100, 1000, rnd.randrange(2, 3000)])
        seed, draws = rnd.choice([0, 5, rnd.randrange(0, 2**40)]), rnd.choice([0, 1, 64, rnd.randrange(1000)])
        batch, ldl, persistent = rnd.choice([1, 4, 16]), rnd.random() < 0.5, trial % 4 == 0
        want = torch2.ask(q="global", n=n, seed=seed, draws=draws, batch=batch, ldl=ldl, persistent=persistent, epochs=3)
        for epoch in range(3):
            cases += 1
            got = oracle.ask("rank", "torch-global", n, 1, 0, seed, epoch, 0, batch, ldl, 0, 1, int(persistent), 0,
                             draws=draws)
            if want[epoch] != got:
                bad += 1
                if bad <= 3:
                    print("torch-global differs: n=%d seed=%d draws=%d epoch=%d" % (n, seed, draws, epoch))
    h.check(bad == 0, "torch %s DataLoader(shuffle=True) after torch.manual_seed: %d/%d epochs bit-exact" % (
        versions[0], cases - bad, cases))


def test_which_worker_loads_what(c):
    torch2, oracle, versions = c.torch2, c.oracle, c.versions
    rnd = random.Random(2029)
    cases = bad = 0
    for _ in range(4):
        n, world = rnd.randrange(50, 400), rnd.choice([1, 2, 3])
        rank, workers, batch = rnd.randrange(world), rnd.choice([2, 3]), rnd.choice([1, 5, 8])
        ldl, seed, epoch = rnd.random() < 0.5, rnd.randrange(1000), rnd.randrange(5)
        want = torch2.ask(q="workers", n=n, world=world, rank=rank, seed=seed, epoch=epoch, batch=batch, ldl=ldl,
                          workers=workers)
        cases += 1
        bad += want != oracle.ask("workers", "torch", n, world, rank, seed, epoch, 0, batch, ldl, workers)
    h.check(bad == 0, "torch %s DataLoader workers: %d/%d cases load the predicted samples" % (versions[0], cases - bad, cases))


def test_the_published_order_through_mounts(c):
    torch2, versions = c.torch2, c.versions
    rnd, mnt = random.Random(2030), c.mnt
    # The published order through real mounts, read by torch 2.x's ImageFolder through the mount.
    cases = bad = 0
    for t in range(3):
        root = c.tree(t)
        for order in ("torch", "torch-random"):
            world = rnd.choice([1, 2, 3]) if order == "torch" else 1
            seed, batch, ldl = random_seed(rnd, 10), rnd.choice([1, 2, 4]), rnd.random() < 0.5
            opts = "order=%s,seed=%d,world_size=%d,ranks=0-%d,batch_size=%d,loader_drop_last=%d" % (
                order, seed, world, world - 1, batch, ldl)
            with h.mounted(root, mnt, opts):
                samples = torch2.ask(q="imagefolder", root="/" + os.path.relpath(mnt, CHROOT))
                for epoch in range(3):
                    cases += 1
                    bad += published_differs(rnd, torch2, mnt, samples, order, world, seed, batch, ldl, epoch,
                                             "tree %d %s" % (t, opts))
    h.check(bad == 0 and cases > 0, "torch %s: published .clairfs/order files equal ImageFolder + sampler through the "
            "mount: %d/%d (tree, order, epoch) cases" % (versions[0], cases - bad, cases))


def test_a_jobs_own_sample_list(c):
    torch2, work, versions = c.torch2, c.work, c.versions
    rnd, mnt = random.Random(2031), c.mnt
    # A job's own sample list (samples=FILE): ImageFolder with an is_valid_file that leaves files out,
    # its samples' paths written one a line (relative: inside the chroot the mount has another path). The
    # published order equals that dataset's in DistributedSampler's order.
    cases = bad = 0
    listed = os.path.join(work, "samples.txt")
    for t in range(3):
        root = c.tree(t)
        with h.mounted(root, mnt, "seed=42"):
            samples = torch2.ask(q="imagefolder", root="/" + os.path.relpath(mnt, CHROOT), skip=3)
        with open(listed, "w") as f:
            f.write("".join(p.replace("\\", "\\\\").replace("\n", "\\n") + "\n" for p in samples))
        world, seed, batch = rnd.choice([1, 2, 3]), random_seed(rnd, 10), rnd.choice([1, 4])
        opts = "seed=%d,world_size=%d,ranks=0-%d,batch_size=%d,samples=%s" % (seed, world, world - 1, batch, listed)
        with h.mounted(root, mnt, opts):
            for epoch in range(2):
                cases += 1
                bad += published_differs(rnd, torch2, mnt, samples, "torch", world, seed, batch, False, epoch,
                                         "tree %d %s" % (t, opts))
    h.check(bad == 0 and cases > 0, "torch %s: with samples= (ImageFolder with is_valid_file), the published order "
            "equals the job's dataset + DistributedSampler: %d/%d (tree, epoch) cases" % (versions[0], cases - bad, cases))


def test_lists_learned_from_the_opens(c):
    work, versions = c.work, c.versions
    mnt, digests, chroot_job = c.mnt, c.digests, c.job
    # Jobs whose list the mount learns (issue 32), run by torch 2.x in the chroot over a mount of a SOURCE
    # that holds train/ and val/: ImageFolder(MOUNTPOINT/train) with seed=auto, and a sorted glob of train/'s
    # .jpg files (120 .png among them) with seed=auto and on a mount told seed=42 (this fast job's list may
    # be found after its epoch 0's end: the plan is then placed by the opens of both epochs). Each read
    # right, its list named in the stats, followed to the end of its second epoch, at most 2% of that
    # epoch's opens served by SOURCE (none once followed).
    split = os.path.join(work, "split")
    h.make_dataset(split + "/train", 600, 6, 8, 7)
    h.make_dataset(split + "/val", 120, 6, 8, 8)
    for i in range(0, 600, 5):
        with open(split + "/train/c%04d/t%07d.png" % (i % 6, i), "wb") as f:
            f.write(os.urandom(1000 + i))
    digests = os.path.join(work, "digests.json")
    with open(digests, "w") as f:
        json.dump(h.digests(split + "/train"), f)
    for dataset, options, samples, named in (
            ("imagefolder", "seed=auto", 720, "ImageFolder(MOUNTPOINT/train) (720 samples)"),
            ("glob", "seed=auto", 600, "sorted(glob('MOUNTPOINT/train/**/*.jpg')) (600 samples)"),
            ("glob", "seed=42", 600, "sorted(glob('MOUNTPOINT/train/**/*.jpg')) (600 samples)")):
        with h.mounted(split, mnt, options + ",batch_size=16,workers=2,ram=%d" % (4 << 20)):
            r = chroot_job(["--data", inside(mnt) + "/train", "--mount", inside(mnt), "--dataset", dataset,
                            "--epochs", "2"])
            # The mount's count of the job's last epoch, once it has it all (the watch's news of the last
            # opens may come a moment after the job's end: under load, after the job's own look at it).
            s = h.stats_when(mnt, lambda s: h.rank0(s)[:2] == (1, samples))
            rank = (s.get("ranks") or [{}])[0]
        epochs = [json.loads(line[6:])["stats"] for line in r.stdout.splitlines() if line.startswith("STATS ")]
        ok = r.returncode == 0 and ", 0 wrong," in r.stdout and len(epochs) == 2
        world = s.get("plan", {}).get("world", {})
        # (opens served by SOURCE so far; while seed=auto learns, the stats are SOURCE's, with no stalls)
        served = [e["stalls"]["opens"] if "stalls" in e else e["tiers"]["source"]["files"] for e in epochs[:1] + [s]]
        second = served[1] - served[0] if ok else None
        h.check(ok and world.get("samples") == named and second <= 0.02 * samples and
                (rank.get("epoch"), rank.get("done"), rank.get("total"), rank.get("verdict")) == (1, samples, samples,
                                                                                         "following"),
                "torch %s, %s with %s: list learned %r, followed to %s, epoch 1's opens served by SOURCE %s %s" % (
                    versions[0], dataset, options, world.get("samples"),
                    (rank.get("epoch"), rank.get("done"), rank.get("total"), rank.get("verdict")), second,
                    s.get("learned", r.stderr.strip()[-300:])))


def test_restarted_jobs_and_the_global_seed(c):
    work, versions = c.work, c.versions
    mnt, digests, chroot_job = c.mnt, c.digests, c.job
    # The usual single-GPU script with seed=auto (torch.manual_seed(5), 100 draws, a DataLoader that
    # shuffles with no generator: its seed and draws learned, the job followed into its epoch 1), and jobs
    # restarted from a checkpoint (issue 32), run by torch 2.x: resumed at its epoch 5 on a mount
    # told seed=42 from epoch 0 (named off the plan, then planned again from epoch 5, followed to the end
    # of the job's last epoch), and resumed mid-epoch — epoch 1 from batch 20, the 320 samples before
    # skipped by its sampler — on a mount told start_epoch=1,start_batch=20 and on one told start_epoch=1
    # only (followed to the epoch's end, no open mispredicted; not told, SOURCE sends no more than the
    # job's files and the 32 files staged before its first opens); and ImageFolder with an is_valid_file
    # that leaves out a seventh, its list not given, told seed=42 and seed=auto (the walk less the files
    # never opened found once its epoch 0 ended, followed to the end of its epoch 1). 3,000 samples: an
    # epoch well beyond the tolerance (576 opens here), as data sets are; where an epoch is not much
    # longer, another epoch's opens lie near some place of it by chance.
    resume = os.path.join(work, "resume")
    h.make_dataset(resume, 3000, 10, 4, 9)
    with open(digests, "w") as f:
        json.dump(h.digests(resume), f)
    total = sum(os.path.getsize(os.path.join(resume, p)) for p in h.digests(resume))
    kept = sum(1 for i in range(3000) if i % 7 != 3)
    skipping = ["--dataset", "skip", "--epochs", "2"]
    for name, options, args, end, samples in (
            ("resumed at epoch 5", "seed=42", ["--epochs", "2", "--first-epoch", "5"], 6, 3000),
            ("resumed at batch 20 of epoch 1", "seed=42,start_epoch=1,epochs=2,start_batch=20",
             ["--first-epoch", "1", "--skip-batches", "20"], 1, 3000),
            ("resumed at batch 20 of epoch 1, not told", "seed=42,start_epoch=1,epochs=2",
             ["--first-epoch", "1", "--skip-batches", "20"], 1, 3000),
            ("torch.manual_seed(5), 100 draws, DataLoader(shuffle=True) with no generator", "seed=auto",
             ["--seed", "5", "--global-seed", "--draws", "100", "--epochs", "2"], 1, 3000),
            ("ImageFolder with is_valid_file, told seed=42", "seed=42", skipping, 1, kept),
            ("ImageFolder with is_valid_file, seed=auto", "seed=auto", skipping, 1, kept)):
        with h.mounted(resume, mnt, options + ",batch_size=16,workers=2,ram=%d" % (8 << 20)):
            r = chroot_job(["--data", inside(mnt)] + args)
            s = h.stats_when(mnt, lambda s: h.rank0(s)[:2] == (end, samples))
        at, world = h.rank0(s), s.get("plan", {}).get("world", {})
        ok = r.returncode == 0 and ", 0 wrong," in r.stdout and at == (end, samples, samples, "following")
        if end == 6:
            ok = ok and world.get("epoch") == 5 and world.get("replanned") == 1
        elif "is_valid_file" in name:
            ok = ok and world.get("samples") == "ImageFolder(MOUNTPOINT) less the %d files it never opened (%d " \
                "samples: is_valid_file?)" % (3000 - kept, kept)
        elif "seed=auto" in options:
            ok = ok and s.get("learned", {}).get("seed") == "seed=5,order=torch-global,draws=100"
        else:
            ok = ok and s.get("mispredicted_opens") == 0
        if "not told" in name:  # the job's files (2,680 of 3,000) and the 32 staged before its first opens
            ok = ok and h.source_bytes(s) <= total * (2680 + 40) // 3000
        h.check(ok, "torch %s, %s: followed to %s, plan %s, learned %s, %s mispredicted %s" % (
            versions[0], name, at, world, s.get("learned", {}).get("seed"), s.get("mispredicted_opens"),
            r.stderr.strip()[-300:]))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
