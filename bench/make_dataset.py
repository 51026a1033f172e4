#!/usr/bin/python3
"""Writes an ImageFolder-shaped tree with ImageNet-like file sizes: OUT/cNNNN/NNNNNNN.jpg, sizes drawn
from a lognormal with the given mean (default ~110 KB), deterministic from --seed. Contents are random
bytes (the file system does not care what a JPEG holds).

    make_dataset.py OUT --files N [--classes C] [--mean-kb 110] [--seed 0]
"""
import argparse
import os
import random
import math


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--mean-kb", type=float, default=110.0)
    ap.add_argument("--sigma", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    # lognormal mean = exp(mu + sigma^2/2)
    mu = math.log(args.mean_kb * 1024) - args.sigma ** 2 / 2
    block = os.urandom(4 << 20)
    total = 0
    for c in range(args.classes):
        os.makedirs(os.path.join(args.out, "c%04d" % c), exist_ok=True)
    for i in range(args.files):
        size = int(rnd.lognormvariate(mu, args.sigma))
        start = rnd.randrange(0, max(len(block) - size, 0) + 1)
        with open(os.path.join(args.out, "c%04d" % (i % args.classes), "%07d.jpg" % i), "wb") as f:
            # A file larger than the block (UNet3D-like sets of ~140 MB) is the block again and again.
            left = size
            while left > 0:
                piece = block[start:start + left] if start else block[:left]
                f.write(piece)
                left -= len(piece)
                start = 0
        total += size
    print("wrote %d files, %.1f MB, under %s" % (args.files, total / 1e6, args.out))


if __name__ == "__main__":
    main()
