#!/usr/bin/python3
"""A PyTorch job that may disagree with its mount, as users' jobs do: ImageFolder + DistributedSampler +
DataLoader over the mount, with the seed, world size, rank and epochs given here (not the mount's), and
optionally the mistakes people make: no sampler.set_epoch(e), shuffle=False. Reads every file whole and
checks it against SOURCE's digests. After each epoch it prints the mount's stats (once the mount's watch has
caught up) as one JSON line: "STATS {...}".

    mismatch_job.py --data DIR [--mount MNT] --digests FILE [--seed 42] [--world-size 1] [--rank 0] [--epochs 1]
                    [--first-epoch 0] [--no-set-epoch] [--no-shuffle] [--batch-size 16] [--workers 2]
                    [--watch-batches N] [--start-barrier DIR] [--start-after FILE] [--compute SECONDS]
                    [--global-seed [--draws K]] [--skip-batches N]
                    [--dataset imagefolder|skip|by-name|glob] [--write-samples FILE [--as-lines]]

--global-seed: the usual single-GPU script instead: torch.manual_seed(SEED), K outputs drawn from torch's
generator (torch.rand(K), as a model's initialisation would), then DataLoader(shuffle=True) with no
sampler and no generator (RandomSampler seeds its own from torch's each epoch).

--mount MNT: the mount point, where --data is a folder under it (ImageFolder(MNT/train)).
--watch-batches N: after each of the first N batches, the first rank's verdict ("VERDICT batch files v").
--compute SECONDS: the time a training step takes, after each batch (a sleep: the CPU is left to the
mount's background work, as a GPU's step leaves it).
--skip-batches N: the first epoch starts at batch N, the batches before it skipped by the sampler (not
loaded), as a checkpoint taken mid-epoch is resumed.
--dataset: the job's Dataset. `imagefolder` (default); `skip`: ImageFolder with an is_valid_file that
leaves out the files whose number (the name) is 3 modulo 7 (a seventh); `by-name`: a list of its own,
every file of the tree sorted by its name alone (a custom Dataset over a glob); `glob`: the .jpg files a
sorted glob lists (sorted(glob(f"{root}/**/*.jpg", recursive=True))).
--write-samples FILE: the one line a job adds for samples=FILE: its Dataset's samples written as JSON
(json.dump(ds.samples, f): [path, label] pairs), or one path a line with --as-lines.
--start-barrier DIR: the ranks start reading together (each leaves its mark in DIR and waits for the
world's), as torch.distributed's rendezvous makes DDP ranks do.
--start-after FILE: the first read waits until FILE exists (a job started beside another at a given point
of it, its start-up already done).
"""
import argparse
import glob
import hashlib
import itertools
import json
import os
import time

import torch  # noqa: F401
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets

ROOT = None


def digest_of(path):
    with open(path, "rb") as f:
        return os.path.relpath(path, ROOT), hashlib.sha256(f.read()).hexdigest()


class SkipFirst(torch.utils.data.Sampler):
    """The sampler's indices from the `skip`th on, in its first pass only (a mid-epoch resume)."""

    def __init__(self, sampler, skip):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        skip, self.skip = self.skip, 0
        return itertools.islice(iter(self.sampler), skip, None)

    def __len__(self):
        return len(self.sampler)


class ByName(torch.utils.data.Dataset):
    """Every file of the tree, sorted by its name alone: a job's list of its own."""

    def __init__(self, root):
        paths = glob.glob(os.path.join(root, "*", "*"))
        self.samples = [(p, 0) for p in sorted(paths, key=lambda p: (os.path.basename(p), p))]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return digest_of(self.samples[i][0]), 0


class Globbed(ByName):
    """The files a sorted glob lists: sorted(glob(f"{root}/**/*.jpg", recursive=True))."""

    def __init__(self, root):
        self.samples = [(p, 0) for p in sorted(glob.glob(os.path.join(root, "**", "*.jpg"), recursive=True))]


def make_dataset(kind, root):
    if kind == "by-name":
        return ByName(root)
    if kind == "glob":
        return Globbed(root)
    valid = None
    if kind == "skip":
        def valid(path):
            return int(os.path.splitext(os.path.basename(path))[0]) % 7 != 3
    return datasets.ImageFolder(root, loader=digest_of, is_valid_file=valid)


def stats(root):
    with open(os.path.join(root, ".clairfs", "stats")) as f:
        return json.load(f)


def settled_stats(root):
    """The mount's stats once its watch has caught up with the job: the opens it told the same for 100 ms
    (at most 5 s). The watch's thread may run behind the job (a sanitized daemon: 28 opens behind at an
    epoch's end, once)."""
    deadline = time.monotonic() + 5
    s = stats(root)
    while True:
        time.sleep(0.1)
        t = stats(root)
        if t.get("progress", {}).get("opens_seen") == s.get("progress", {}).get("opens_seen") \
                or time.monotonic() > deadline:
            return t
        s = t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--mount")
    ap.add_argument("--digests", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--first-epoch", type=int, default=0)
    ap.add_argument("--no-set-epoch", action="store_true")
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--watch-batches", type=int, default=0)
    ap.add_argument("--start-barrier")
    ap.add_argument("--compute", type=float, default=0)
    ap.add_argument("--start-after")
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--prefetch-factor", type=int, default=2)
    ap.add_argument("--global-seed", action="store_true")
    ap.add_argument("--draws", type=int, default=0)
    ap.add_argument("--skip-batches", type=int, default=0)
    ap.add_argument("--dataset", choices=("imagefolder", "skip", "by-name", "glob"), default="imagefolder")
    ap.add_argument("--write-samples")
    ap.add_argument("--as-lines", action="store_true")
    args = ap.parse_args()
    global ROOT
    ROOT = args.data
    with open(args.digests) as f:
        want = json.load(f)
    dataset = make_dataset(args.dataset, args.data)
    if args.write_samples:
        with open(args.write_samples, "w") as f:
            if args.as_lines:
                f.write("".join(p + "\n" for p, _ in dataset.samples))
            else:
                json.dump(dataset.samples, f)
    with_workers = {"persistent_workers": args.persistent_workers, "prefetch_factor": args.prefetch_factor}
    if args.global_seed:
        torch.manual_seed(args.seed)
        torch.rand(args.draws)
        sampler = None
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                            **(with_workers if args.workers > 0 else {}))
    else:
        sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank,
                                     shuffle=not args.no_shuffle, seed=args.seed)
        skipping = SkipFirst(sampler, args.skip_batches * args.batch_size)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=skipping, num_workers=args.workers,
                            **(with_workers if args.workers > 0 else {}))
    if args.start_barrier:
        open(os.path.join(args.start_barrier, "rank-%d" % args.rank), "w").close()
        deadline = time.monotonic() + 300
        while len(os.listdir(args.start_barrier)) < args.world_size and time.monotonic() < deadline:
            time.sleep(0.01)
    if args.start_after:
        deadline = time.monotonic() + 300
        while not os.path.exists(args.start_after) and time.monotonic() < deadline:
            time.sleep(0.01)
    read = wrong = batches = size = 0
    for epoch in range(args.first_epoch, args.first_epoch + args.epochs):
        if sampler and not args.no_set_epoch:
            sampler.set_epoch(epoch)
        for (rels, digests), _labels in loader:
            for rel, digest in zip(rels, digests):
                read += 1
                wrong += digest != want[rel]
                size += os.path.getsize(os.path.join(args.data, rel))
            batches += 1
            if args.compute:
                time.sleep(args.compute)
            if batches <= args.watch_batches:
                ranks = stats(args.mount or args.data).get("ranks")  # none with ram=0
                if ranks:
                    print("VERDICT %d %d %s" % (batches, read, ranks[0]["verdict"]), flush=True)
        print("STATS " + json.dumps({"epoch": epoch, "after": read, "stats": settled_stats(args.mount or args.data)}), flush=True)
    print("DONE %d files, %d wrong, %d bytes" % (read, wrong, size), flush=True)


if __name__ == "__main__":
    main()
