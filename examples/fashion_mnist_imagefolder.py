#!/usr/bin/python3
"""Turns Debian's dataset-fashion-mnist (idx files) into an ImageFolder tree of 70,000 PNGs:
OUT/<class>/<split>-<index>.png, 10 class folders. Deterministic; skips work already done.

    fashion_mnist_imagefolder.py OUT [--source /usr/share/datasets/fashion-mnist]
"""
import argparse
import gzip
import os
import struct
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image

CLASSES = ["0-t-shirt", "1-trouser", "2-pullover", "3-dress", "4-coat",
           "5-sandal", "6-shirt", "7-sneaker", "8-bag", "9-ankle-boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit("%s: not an unsigned-byte idx file" % path)
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_chunk(job):
    out, split, start, images, labels = job
    for i, (img, label) in enumerate(zip(images, labels)):
        path = os.path.join(out, CLASSES[label], "%s-%05d.png" % (split, start + i))
        if not os.path.exists(path):
            tmp = path + ".tmp"
            Image.fromarray(img, mode="L").save(tmp, format="PNG")
            os.rename(tmp, path)
    return len(images)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    marker = os.path.join(args.out, ".complete")
    if os.path.exists(marker):
        return
    for c in CLASSES:
        os.makedirs(os.path.join(args.out, c), exist_ok=True)
    jobs = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(os.path.join(args.source, prefix + "-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(args.source, prefix + "-labels-idx1-ubyte.gz"))
        for start in range(0, len(images), 2000):
            jobs.append((args.out, split, start, images[start:start + 2000], labels[start:start + 2000]))
    with Pool(os.cpu_count() or 2) as pool:
        total = sum(pool.map(write_chunk, jobs))
    open(marker, "w").close()
    print("wrote %d PNGs in %d classes under %s" % (total, len(CLASSES), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
