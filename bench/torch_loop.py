#!/usr/bin/python3
"""The PyTorch side of the harness: an unmodified ImageFolder + DistributedSampler + DataLoader loop that
spends a fixed compute time per batch and records how long each step waited for its batch (the stall).
The files are raw bytes (the harness's data sets are not decodable images), so ImageFolder is given a
loader that reads them; nothing else differs from a training script.

    torch_loop.py ROOT [--seed 0] [--world-size 1] [--rank 0] [--batch-size 32] [--workers 4]
                  [--prefetch-factor 2] [--epochs 3] [--compute-ms 10]

Prints one JSON line per epoch, like train_loop.
"""
import argparse
import json
import time

from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets


def read_bytes(path):
    with open(path, "rb") as f:
        return len(f.read())


def count(batch):
    return [(size, label) for size, label in batch]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefetch-factor", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=10)
    args = ap.parse_args()

    dataset = datasets.ImageFolder(args.root, loader=read_bytes)
    sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        prefetch_factor=args.prefetch_factor, collate_fn=count)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        stall = 0.0
        files = nbytes = batches = 0
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            stall += time.perf_counter() - w0
            files += len(batch)
            nbytes += sum(size for size, _ in batch)
            batches += 1
            time.sleep(args.compute_ms / 1000)  # the model's step
        print(json.dumps({"epoch": epoch, "wall_s": round(time.perf_counter() - t0, 4), "stall_s": round(stall, 4),
                          "files": files, "bytes": nbytes, "batches": batches}), flush=True)


if __name__ == "__main__":
    main()
