#!/usr/bin/python3
"""One training task of a Slurm job, as a PyTorch user writes it: rank and world size from Slurm's
environment, ImageFolder + DistributedSampler + DataLoader, set_epoch each epoch. The ImageFolder's
loader returns each file's SHA-256 instead of a decoded image, so every byte read is checked against
SOURCE's digests (a JSON file: relative path -> hex digest). Prints one line per epoch; rank 0 also
prints the mount's .clairfs/stats source_traffic at the end.

    slurm_reader.py --data DIR --digests FILE [--seed 42] [--batch-size 256] [--workers 2] [--epochs 2]
                    [--sleep-per-batch 0]
"""
import argparse
import hashlib
import json
import os
import time

import torch  # noqa: F401  (the job imports torch as any training script does)
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets


ROOT = None


def digest_of(path):
    """ImageFolder's loader: (path below the root, SHA-256 of the whole file) in place of an image."""
    with open(path, "rb") as f:
        return os.path.relpath(path, ROOT), hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--digests", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--sleep-per-batch", type=float, default=0.0)
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])

    with open(args.digests) as f:
        want = json.load(f)
    global ROOT
    ROOT = args.data
    dataset = datasets.ImageFolder(args.data, loader=digest_of)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen = wrong = 0
        for (rels, digests), _labels in loader:
            for rel, digest in zip(rels, digests):
                seen += 1
                wrong += digest != want[rel]
            time.sleep(args.sleep_per_batch)
        print("rank %d epoch %d: %d files, %d wrong" % (rank, epoch, seen, wrong), flush=True)
    if rank == 0:
        with open(os.path.join(args.data, ".clairfs", "stats")) as f:
            stats = json.load(f)
        print("rank 0 stats: source_traffic %d bytes" % stats["source_traffic"]["bytes"], flush=True)


if __name__ == "__main__":
    main()
