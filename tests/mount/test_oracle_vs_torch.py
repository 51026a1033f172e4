"""The oracle against Debian's real PyTorch.

1. Hundreds of random (N, world_size, rank, seed, epoch, drop_last, batch_size, loader drop_last) cases:
   the oracle's sequence for a rank equals what DistributedSampler (+ BatchSampler) yields, for
   shuffle on and off. Seeds include negative ones and ones >= 2^32.
2. torch-random: RandomSampler with a seeded generator, shared with the DataLoader or not, across
   several epochs; and with persistent workers.
3. Workers: which samples each DataLoader worker loads, from torch's own get_worker_info().
4. The published order: MOUNTPOINT/.clairfs/order/epoch-E/rank-R on several awkward trees equals
   ImageFolder.samples taken in DistributedSampler's order.
"""
import os
import random

import harness as h
import pytest
import torch
from oracle_pipe import Oracle, random_seed
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler
from torch_side import WhoLoads  # (the class test_torch2 asks torch 2.x with)
from trees import build, torch_samples


def torch_rank_sequence(n, world, rank, seed, epoch, drop_last, shuffle, batch, loader_drop_last):
    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return [i for b in BatchSampler(s, batch, loader_drop_last) for i in b]


@pytest.fixture(scope="module")
def oracle():
    o = Oracle()
    yield o
    o.close()


def test_distributed_sampler(oracle):
    # Shuffled and not.
    rnd = random.Random(1234)
    cases = bad = 0
    for _ in range(400):
        n = rnd.choice([1, 2, 3, 7, 10, 64, 100, 257, 1000, rnd.randrange(1, 5000)])
        world = rnd.choice([1, 2, 3, 4, 5, 8, 16])
        rank = rnd.randrange(world)
        epoch = rnd.choice([0, 1, 2, rnd.randrange(0, 1000)])
        seed = random_seed(rnd, epoch)
        drop_last = rnd.random() < 0.4
        shuffle = rnd.random() < 0.85
        batch = rnd.choice([1, 2, 3, 32])
        ldl = rnd.random() < 0.4
        want = torch_rank_sequence(n, world, rank, seed, epoch, drop_last, shuffle, batch, ldl)
        got = oracle.ask("rank", "torch" if shuffle else "sequential", n, world, rank, seed, epoch, drop_last, batch, ldl)
        cases += 1
        if want != got:
            bad += 1
            if bad <= 3:
                print("differs: n=%d world=%d rank=%d seed=%d epoch=%d drop_last=%d shuffle=%d batch=%d ldl=%d" % (
                    n, world, rank, seed, epoch, drop_last, shuffle, batch, ldl))
                print("  torch  %s\n  oracle %s" % (want[:12], got[:12]))
    h.check(bad == 0, "DistributedSampler: %d/%d random cases bit-exact (seeds negative, >= 2^32, >= 2^63)" % (
        cases - bad, cases))


def test_random_sampler_with_a_seeded_generator(oracle):
    # Over several epochs.
    rnd = random.Random(1235)
    bad = cases = 0
    for trial in range(24):
        n = rnd.choice([1, 2, 5, 100, 1000, rnd.randrange(2, 3000)])
        seed = rnd.choice([0, 7, rnd.randrange(0, 2**40), -5])
        batch = rnd.choice([1, 4, 16])
        ldl = rnd.random() < 0.5
        shared = trial % 2 == 0
        start = rnd.choice([0, 0, 3])
        g = torch.Generator()
        g.manual_seed(seed)
        if shared:
            loader = DataLoader(range(n), batch_size=batch, shuffle=True, generator=g, drop_last=ldl)
        else:
            loader = DataLoader(range(n), batch_size=batch, sampler=RandomSampler(range(n), generator=g), drop_last=ldl)
        for epoch in range(start, start + 4):
            want = [int(i) for b in loader for i in b]
            got = oracle.ask("rank", "torch-random", n, 1, 0, seed, epoch, 0, batch, ldl, 0, int(shared), 0, start)
            cases += 1
            if want != got:
                bad += 1
                if bad <= 3:
                    print("torch-random differs: n=%d seed=%d epoch=%d shared=%d start=%d" % (n, seed, epoch, shared, start))
    h.check(bad == 0, "RandomSampler with a seeded generator: %d/%d epochs bit-exact (shared and not)" % (cases - bad, cases))

    g = torch.Generator()
    g.manual_seed(99)
    loader = DataLoader(range(300), batch_size=8, shuffle=True, generator=g, num_workers=2, persistent_workers=True)
    ok = all([int(i) for b in loader for i in b] ==
             oracle.ask("rank", "torch-random", 300, 1, 0, 99, epoch, 0, 8, 0, 2, 1, 1, 0) for epoch in range(3))
    h.check(ok, "RandomSampler with persistent workers: 3 epochs bit-exact")
    del loader  # stops the persistent workers now; left to interpreter exit, their shutdown can hang


def test_shuffle_without_a_generator(oracle):
    # DataLoader(shuffle=True) without a generator: RandomSampler seeds its own from torch's global one,
    # after the script's torch.manual_seed and whatever it drew before (torch.rand(k) takes k).
    rnd = random.Random(1236)
    bad = cases = 0
    for trial in range(16):
        n = rnd.choice([2, 5, 100, 1000, rnd.randrange(2, 3000)])
        seed, draws = rnd.choice([0, 42, rnd.randrange(0, 2**40), -5]), rnd.choice([0, 1, 100, rnd.randrange(1000)])
        batch, ldl, persistent = rnd.choice([1, 4, 16]), rnd.random() < 0.5, trial % 4 == 0
        torch.manual_seed(seed)
        torch.rand(draws)
        loader = DataLoader(range(n), batch_size=batch, shuffle=True, drop_last=ldl, num_workers=2 if persistent else 0,
                            persistent_workers=persistent)
        for epoch in range(3):
            want = [int(i) for b in loader for i in b]
            got = oracle.ask("rank", "torch-global", n, 1, 0, seed, epoch, 0, batch, ldl, 0, 1, int(persistent), 0,
                             draws=draws)
            cases += 1
            if want != got:
                bad += 1
                if bad <= 3:
                    print("torch-global differs: n=%d seed=%d draws=%d epoch=%d" % (n, seed, draws, epoch))
        del loader
    h.check(bad == 0, "DataLoader(shuffle=True) after torch.manual_seed and k draws: %d/%d epochs bit-exact" % (
        cases - bad, cases))


def test_which_worker_loads_what(oracle):
    # torch's own get_worker_info().
    rnd = random.Random(1237)
    bad = cases = 0
    for _ in range(6):
        n = rnd.randrange(50, 400)
        world = rnd.choice([1, 2, 3])
        rank = rnd.randrange(world)
        workers = rnd.choice([2, 3])
        batch = rnd.choice([1, 5, 8])
        ldl = rnd.random() < 0.5
        seed = rnd.randrange(1000)
        epoch = rnd.randrange(5)
        s = DistributedSampler(WhoLoads(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        per_worker = [[] for _ in range(workers)]
        for idx, wid in DataLoader(WhoLoads(n), batch_size=batch, sampler=s, num_workers=workers, drop_last=ldl):
            for i, w in zip(idx.tolist(), wid.tolist()):
                per_worker[w].append(i)
        got = oracle.ask("workers", "torch", n, world, rank, seed, epoch, 0, batch, ldl, workers)
        cases += 1
        bad += per_worker != got
    h.check(bad == 0, "DataLoader workers: %d/%d cases load exactly the predicted samples per worker" % (cases - bad, cases))


def test_the_published_order_through_a_mount():
    # On awkward trees.
    rnd = random.Random(1238)
    with h.tempdir() as tmp:
        mnt = tmp + "/mnt"
        os.makedirs(mnt)
        bad = cases = 0
        for t in range(5):
            root = os.path.join(tmp, "t%d" % t)
            build(root, random.Random(100 + t))
            samples = [p for _, p in torch_samples(root)]
            for _ in range(4):
                world = rnd.choice([1, 2, 3, 5])
                seed = random_seed(rnd, 50)
                drop_last = rnd.random() < 0.5
                batch = rnd.choice([1, 2, 4])
                ldl = rnd.random() < 0.5
                opts = "seed=%d,world_size=%d,ranks=0-%d,batch_size=%d,drop_last=%d,loader_drop_last=%d" % (
                    seed, world, world - 1, batch, drop_last, ldl)
                with h.mounted(root, mnt, opts):
                    for _ in range(3):
                        epoch, rank = rnd.randrange(0, 50), rnd.randrange(world)
                        with open("%s/.clairfs/order/epoch-%d/rank-%d" % (mnt, epoch, rank)) as f:
                            got = f.read().splitlines()
                        want = [samples[i] for i in torch_rank_sequence(len(samples), world, rank, seed, epoch, drop_last,
                                                                       True, batch, ldl)]
                        cases += 1
                        if got != want:
                            bad += 1
                            print("published order differs: tree %d %s epoch %d rank %d" % (t, opts, epoch, rank))
                    listing = os.listdir(mnt)
                    if ".clairfs" in listing:
                        bad += 1
                        print(".clairfs listed in the root")
        h.check(bad == 0, "published .clairfs/order files: %d/%d (tree, options, epoch, rank) cases equal torch" % (
            cases - bad, cases))


def test_root_a_subfolder():
    # root=: a job that reads ImageFolder(MOUNTPOINT/train) where SOURCE holds train/ and val/ (and a
    # symlink to train/): the order is ImageFolder's of that folder, its names from the mount's root.
    with h.tempdir() as tmp:
        src, mnt = tmp + "/src", tmp + "/mnt"
        os.makedirs(mnt)
        build(src + "/train", random.Random(7))
        build(src + "/val", random.Random(8))
        os.symlink("train", src + "/current")
        bad = cases = 0
        for folder in ("train", "current", "./train/"):
            samples = [os.path.normpath(os.path.join(folder, p)) for _, p in torch_samples(os.path.join(src, folder))]
            with h.mounted(src, mnt, "seed=3,batch_size=2,root=" + folder):
                for epoch in (0, 5):
                    with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, epoch)) as f:
                        got = f.read().splitlines()
                    cases += 1
                    if got != [samples[i] for i in torch_rank_sequence(len(samples), 1, 0, 3, epoch, False, True, 2, False)]:
                        bad += 1
                        print("root=%s epoch %d differs: %s" % (folder, epoch, got[:3]))
        h.check(bad == 0, "root=train, root=current (a symlink to it), "
                "root=./train/: %d/%d published orders equal ImageFolder(MOUNTPOINT/...)'s" % (cases - bad, cases))
        for folder, words in (("nope", "root=nope is no folder in SOURCE"), ("/abs", "relative to it"),
                              ("train/../val", "without '..'")):
            r = h.run_clairfs([src, mnt, "-o", "seed=3,root=" + folder])
            h.check(r.returncode != 0 and words in r.stderr and not h.is_mounted(mnt),
                    "root=%s refused: %s" % (folder, r.stderr.strip()[-200:]))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
