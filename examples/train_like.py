#!/usr/bin/python3
"""A training loop's data side, written as any PyTorch user writes it: ImageFolder + DistributedSampler
+ DataLoader, set_epoch each epoch. Nothing in it knows about clairfs; point --data at the mount.

    train_like.py --data DIR [--seed 0] [--world-size 1] [--rank 0] [--batch-size 32] [--workers 2]
                  [--epochs 2] [--drop-last] [--loader-drop-last]
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--start-epoch", type=int, default=0)
    ap.add_argument("--drop-last", action="store_true")
    ap.add_argument("--loader-drop-last", action="store_true")
    args = ap.parse_args()

    dataset = datasets.ImageFolder(args.data, transform=transforms.ToTensor())
    sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank, shuffle=True,
                                 seed=args.seed, drop_last=args.drop_last)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        drop_last=args.loader_drop_last)
    for epoch in range(args.start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        t0, seen = time.perf_counter(), 0
        for images, labels in loader:
            seen += len(labels)  # a model would train here
        print("rank %d epoch %d: %d samples in %.2f s" % (args.rank, epoch, seen, time.perf_counter() - t0),
              flush=True)


if __name__ == "__main__":
    main()
