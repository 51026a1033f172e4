#!/usr/bin/python3
"""Reads one epoch of an ImageFolder tree the way a training job does: unmodified torchvision
ImageFolder + DistributedSampler + DataLoader with worker processes. Prints files/s and, with
--checksums FILE, writes one checksum per sample index so two runs can be compared bit for bit.

    read_epoch.py ROOT [--seed 0] [--batch-size 256] [--workers 2] [--checksums FILE]
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


class Indexed(torch.utils.data.Dataset):
    """Wraps a dataset so each item carries its index (for comparing runs); the ImageFolder is untouched."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        x, y = self.inner[i]
        return i, x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--checksums")
    args = ap.parse_args()

    t0 = time.perf_counter()
    dataset = datasets.ImageFolder(args.root, transform=transforms.PILToTensor())
    listed = time.perf_counter() - t0
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    sampler.set_epoch(args.epoch)
    loader = DataLoader(Indexed(dataset), batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    sums = torch.zeros(len(dataset), dtype=torch.int64)
    files = 0
    t1 = time.perf_counter()
    for idx, x, y in loader:
        flat = x.reshape(x.shape[0], -1).to(torch.int64)
        weights = torch.arange(1, flat.shape[1] + 1, dtype=torch.int64)
        sums[idx] = (flat * weights).sum(dim=1) * 16 + y
        files += len(idx)
    took = time.perf_counter() - t1
    print("%s: %d files in %.2f s: %.0f files/s (listing %.2f s)" % (args.root, files, took, files / took, listed))
    if args.checksums:
        torch.save(sums, args.checksums)


if __name__ == "__main__":
    main()
