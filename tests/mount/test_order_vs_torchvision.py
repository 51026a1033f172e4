"""The manifest's sample order equals what Debian's real torchvision ImageFolder lists, on random
awkward trees: sorted classes with hidden and upper-case names, '-' against '/', extension case, hidden
files, symlinked directories and files, dangling links, absolute links into SOURCE."""
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

from trees import build, torch_order  # noqa: E402

LIST = os.environ["CLAIRFS_LIST_SAMPLES"]


def clairfs_order(root, manifest=None):
    r = subprocess.run([LIST, root] + ([manifest] if manifest else []), capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


with h.tempdir() as tmp:
    trees = 40
    same = 0
    total = 0
    for seed in range(trees):
        root = os.path.join(tmp, "t%d" % seed)
        build(root, random.Random(seed))
        want, got = torch_order(root), clairfs_order(root)
        total += len(want)
        if want == got:
            same += 1
        else:
            diff = next(i for i in range(min(len(want), len(got)) + 1) if i >= min(len(want), len(got)) or want[i] != got[i])
            print("tree %d differs at %d: torch %r, clairfs %r" % (seed, diff, want[diff:diff + 2], got[diff:diff + 2]))
    h.check(same == trees, "%d/%d random trees (%d samples) in torchvision's exact order" % (same, trees, total))

    # A manifest written by `clairfs index` gives the same order as a scan.
    root = os.path.join(tmp, "t3")
    manifest = os.path.join(tmp, "t3.manifest")
    subprocess.run([h.CLAIRFS, "index", root, manifest], check=True, capture_output=True)
    h.check(clairfs_order(root, manifest) == clairfs_order(root), "a loaded manifest lists the same order as a scan")

h.finish()
