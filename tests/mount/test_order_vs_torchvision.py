"""The manifest's sample order equals what Debian's real torchvision ImageFolder lists, on random
awkward trees: sorted classes with hidden and upper-case names, '-' against '/', extension case, hidden
files, symlinked directories and files, dangling links, absolute links into SOURCE."""
import os
import random
import subprocess

import harness as h
import pytest
from trees import build, torch_order

LIST = os.environ["CLAIRFS_LIST_SAMPLES"]


def clairfs_order(root, manifest=None):
    r = subprocess.run([LIST, root] + ([manifest] if manifest else []), capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


@pytest.fixture(scope="module")
def tmp():
    with h.tempdir() as tmp:
        yield tmp


def test_random_trees_in_torchvisions_order(tmp):
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


def test_a_manifest_lists_as_a_scan(tmp):
    # A manifest written by `clairfs index` gives the same order as a scan.
    root = os.path.join(tmp, "m")
    build(root, random.Random(3))
    manifest = os.path.join(tmp, "m.manifest")
    subprocess.run([h.CLAIRFS, "index", root, manifest], check=True, capture_output=True)
    h.check(clairfs_order(root, manifest) == clairfs_order(root), "a loaded manifest lists the same order as a scan")


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
