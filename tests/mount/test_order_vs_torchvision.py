"""The manifest's sample order equals what Debian's real torchvision ImageFolder lists, on random
awkward trees: sorted classes with hidden and upper-case names, '-' against '/', extension case, hidden
files, symlinked directories and files, dangling links, absolute links into SOURCE."""
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

from torchvision.datasets import ImageFolder  # noqa: E402

LIST = os.environ["CLAIRFS_LIST_SAMPLES"]
NAMES = ["a", "B", "b", "x", "x-y", "x.y", "x_y", ".hid", "Ü", "ü", "sp ace", "z9", "9z", "-", "a-", "a.b"]
EXTS = [".png", ".PNG", ".jpg", ".JPEG", ".txt", ".webp", ".tif", ".Tiff", "", ".png.bak", ".bmp", ".pgm"]


def name(rnd):
    return rnd.choice(NAMES) + rnd.choice(["", "", "1", "-2", "/"[:0]])


def build(root, rnd):
    dirs_in_pool = []
    pool = os.path.join(root, "pool")
    os.makedirs(pool)
    for i in range(rnd.randrange(1, 4)):
        d = os.path.join(pool, "p%d" % i, name(rnd))
        os.makedirs(d, exist_ok=True)
        dirs_in_pool.append(d)
        for _ in range(rnd.randrange(1, 5)):
            open(os.path.join(d, name(rnd) + rnd.choice(EXTS)), "wb").close()
    open(os.path.join(pool, "keep.png"), "wb").close()
    for _ in range(rnd.randrange(1, 6)):
        cls = os.path.join(root, name(rnd))
        if cls == pool:
            continue
        dirs = [cls]
        os.makedirs(cls, exist_ok=True)
        open(os.path.join(cls, "keep.png"), "wb").close()  # ImageFolder refuses empty classes
        for _ in range(rnd.randrange(0, 5)):
            d = os.path.join(rnd.choice(dirs), name(rnd))
            if os.path.lexists(d):
                continue
            os.makedirs(d)
            dirs.append(d)
        for _ in range(rnd.randrange(1, 15)):
            f = os.path.join(rnd.choice(dirs), name(rnd) + rnd.choice(EXTS))
            if not os.path.lexists(f):
                open(f, "wb").close()
        for _ in range(rnd.randrange(0, 3)):
            where = os.path.join(rnd.choice(dirs), "ln-" + name(rnd))
            if os.path.lexists(where):
                continue
            kind = rnd.randrange(4)
            if kind == 0:
                os.symlink(os.path.relpath(rnd.choice(dirs_in_pool), os.path.dirname(where)), where)
            elif kind == 1:
                os.symlink(rnd.choice(dirs_in_pool), where)  # absolute, inside SOURCE
            elif kind == 2:
                os.symlink("/nonexistent/dangling", where + ".png")
            else:
                os.symlink(os.path.join(pool, "keep.png"), where + ".jpg")
    if rnd.random() < 0.5:
        os.symlink(dirs_in_pool[0], os.path.join(root, "zz-linked-class"))


def torch_order(root):
    real_root = os.path.realpath(root)
    out = []
    for path, cls in ImageFolder(root).samples:
        real = os.path.realpath(path)
        if not (real.startswith(real_root + "/") and os.path.exists(real)):
            real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        out.append("%d\t%s" % (cls, os.path.relpath(real, real_root)))
    return out


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
