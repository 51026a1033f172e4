#!/usr/bin/python3
"""The training script the job examples run (examples/slurm_job.sh, pbs_job.sh, slurm_prolog.sh's job):
one task per rank, its rank and world size from the launcher (srun's SLURM_PROCID/SLURM_NTASKS, MPICH's
PMI_RANK/PMI_SIZE, torchrun's RANK/WORLD_SIZE), ImageFolder + DistributedSampler + DataLoader, set_epoch
each epoch, images decoded and resized as a vision model's input pipeline does. A model would train where
the loop counts samples. Nothing in it knows about clairfs: --data is the mount.

    train.py --data DIR [--seed 42] [--batch-size 256] [--workers 8] [--epochs 90] [--step-ms 0]
"""
import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


def rank_and_world():
    for rank, world in (("SLURM_PROCID", "SLURM_NTASKS"), ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE")):
        if rank in os.environ and world in os.environ:
            return int(os.environ[rank]), int(os.environ[world])
    return 0, 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--step-ms", type=float, default=0, help="time the model's step takes per batch")
    args = ap.parse_args()
    rank, world = rank_and_world()
    torch.manual_seed(args.seed)  # (a real script would also init_process_group and wrap its model)

    dataset = datasets.ImageFolder(args.data, transform=transforms.Compose(
        [transforms.Resize((64, 64)), transforms.ToTensor()]))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        t0, seen, waited = time.perf_counter(), 0, 0.0
        batches = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                _images, labels = next(batches)
            except StopIteration:
                break
            waited += time.perf_counter() - w0
            seen += len(labels)
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        print("rank %d/%d epoch %d: %d samples in %.2f s, %.2f s waiting for data" % (
            rank, world, epoch, seen, time.perf_counter() - t0, waited), flush=True)


if __name__ == "__main__":
    main()
