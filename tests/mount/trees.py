"""Random awkward ImageFolder trees, and torchvision's own view of them, shared by the order tests."""
import os

from torchvision.datasets import ImageFolder

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
        open(os.path.join(d, "keep.png"), "wb").close()  # a class linked here is never empty
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


def torch_samples(root):
    """ImageFolder(root).samples as (class index, path relative to root), exactly as it yields them:
    through symlinked directories, and a linked file by its link."""
    return [(cls, os.path.relpath(path, root)) for path, cls in ImageFolder(root).samples]


def torch_order(root):
    return ["%d\t%s" % (cls, path) for cls, path in torch_samples(root)]
