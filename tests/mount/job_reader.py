#!/usr/bin/python3
"""One training task of a Slurm or PBS job, as a PyTorch user writes it: rank and world size from the
launcher's environment (srun's SLURM_PROCID/SLURM_NTASKS, or MPICH's PMI_RANK/PMI_SIZE), ImageFolder + DistributedSampler + DataLoader, set_epoch each epoch. The ImageFolder's
loader returns each file's SHA-256 instead of a decoded image, so every byte read is checked against
SOURCE's digests (a JSON file: relative path -> hex digest). Prints one line per epoch; the first task
on each node also prints its mount's SOURCE traffic and peer fetches (.clairfs/stats) at the end.

    job_reader.py --data DIR --digests FILE [--seed 42] [--batch-size 256] [--workers 2] [--epochs 2]
                    [--sleep-per-batch 0] [--barrier-dir DIR]
"""
import argparse
import hashlib
import json
import os
import socket
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
    ap.add_argument("--barrier-dir", help="ranks wait for each other after each epoch (a folder they all see), "
                    "as DDP keeps them in step")
    args = ap.parse_args()
    if "SLURM_PROCID" in os.environ:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    else:
        rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])

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
        if args.barrier_dir:
            open(os.path.join(args.barrier_dir, "epoch-%d-rank-%d" % (epoch, rank)), "w").close()
            while len([n for n in os.listdir(args.barrier_dir) if n.startswith("epoch-%d-" % epoch)]) < world:
                time.sleep(0.05)
    # The first task on each node reports its node's mount.
    if os.environ.get("SLURM_LOCALID", os.environ.get("MPI_LOCALRANKID", "0")) == "0":
        with open(os.path.join(args.data, ".clairfs", "stats")) as f:
            stats = json.load(f)
        print("rank %d on %s stats: source_traffic %d bytes, fetched from peers %d" % (
            rank, socket.gethostname(), stats["source_traffic"]["bytes"],
            stats["peers"]["staged_files"] + stats["peers"]["demand_files"] if "peers" in stats else 0), flush=True)


if __name__ == "__main__":
    main()
