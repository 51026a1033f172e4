#!/usr/bin/python3
"""A plain Python loop that takes its order from the mount: it reads the files rank R loads in epoch E,
in exactly the order clairfs predicts (and stages) them. No framework needed.

    order_plain_loop.py MOUNTPOINT [--epoch 0] [--rank 0]
"""
import argparse
import os


def unescape(line):
    """Names holding a backslash or a newline are written with \\\\ and \\n; undo that."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            out.append("\n" if line[i + 1] == "n" else line[i + 1])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def order(mnt, epoch, rank):
    """Paths (relative to the mount) in the order rank `rank` loads them in `epoch`."""
    path = os.path.join(mnt, ".clairfs", "order", "epoch-%d" % epoch, "rank-%d" % rank)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            yield unescape(line[:-1] if line.endswith("\n") else line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()
    files = total = 0
    for rel in order(args.mount, args.epoch, args.rank):
        with open(os.path.join(args.mount, rel), "rb") as f:
            total += len(f.read())  # decode and train here
        files += 1
    print("read %d files, %d bytes" % (files, total))


if __name__ == "__main__":
    main()
