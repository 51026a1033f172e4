"""Answers questions about what PyTorch yields, with whatever torch the interpreter running it has (the
torch 2.x of a Debian 13 chroot, for tests/mount/test_torch2.py). One JSON question a line on stdin, one
JSON answer a line on stdout:

    {"q": "version"}                                           -> [torch, torchvision]
    {"q": "dist", "n", "world", "rank", "seed", "epoch", "drop_last", "shuffle", "batch", "ldl"}
                                                               -> DistributedSampler + BatchSampler, flat
    {"q": "random", "n", "seed", "batch", "ldl", "shared", "epochs"}
                                                               -> DataLoader(shuffle=True, generator=g) (or
                                                                  a RandomSampler with g), one list per epoch
    {"q": "global", "n", "seed", "draws", "batch", "ldl", "persistent", "epochs"}
                                                               -> torch.manual_seed(seed), `draws` outputs
                                                                  taken (torch.rand), then DataLoader(
                                                                  shuffle=True) without a generator
    {"q": "workers", "n", "world", "rank", "seed", "epoch", "batch", "ldl", "workers"}
                                                               -> what each DataLoader worker loads
    {"q": "imagefolder", "root"}                               -> ImageFolder(root).samples' paths, relative
    {"q": "imagefolder", "root", "skip": K}                    -> the same with an is_valid_file that keeps the
                                                                  image files whose name's length is no
                                                                  multiple of K (a job's own choice of files)
"""
import json
import os
import sys

import torch
import torchvision
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler
from torchvision.datasets import ImageFolder


IMAGES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class WhoLoads(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, torch.utils.data.get_worker_info().id


def answer(q):
    if q["q"] == "version":
        return [torch.__version__, torchvision.__version__]
    if q["q"] == "dist":
        s = DistributedSampler(range(q["n"]), num_replicas=q["world"], rank=q["rank"], shuffle=q["shuffle"],
                               seed=q["seed"], drop_last=q["drop_last"])
        s.set_epoch(q["epoch"])
        return [i for b in BatchSampler(s, q["batch"], q["ldl"]) for i in b]
    if q["q"] == "random":
        g = torch.Generator()
        g.manual_seed(q["seed"])
        n = q["n"]
        if q["shared"]:
            loader = DataLoader(range(n), batch_size=q["batch"], shuffle=True, generator=g, drop_last=q["ldl"])
        else:
            loader = DataLoader(range(n), batch_size=q["batch"], sampler=RandomSampler(range(n), generator=g),
                                drop_last=q["ldl"])
        return [[int(i) for b in loader for i in b] for _ in range(q["epochs"])]
    if q["q"] == "global":
        torch.manual_seed(q["seed"])
        torch.rand(q["draws"])
        workers = 2 if q["persistent"] else 0
        loader = DataLoader(range(q["n"]), batch_size=q["batch"], shuffle=True, drop_last=q["ldl"], num_workers=workers,
                            persistent_workers=bool(q["persistent"]))
        epochs = [[int(i) for b in loader for i in b] for _ in range(q["epochs"])]
        del loader  # stops persistent workers now
        return epochs
    if q["q"] == "workers":
        s = DistributedSampler(WhoLoads(q["n"]), num_replicas=q["world"], rank=q["rank"], shuffle=True, seed=q["seed"])
        s.set_epoch(q["epoch"])
        per_worker = [[] for _ in range(q["workers"])]
        for idx, wid in DataLoader(WhoLoads(q["n"]), batch_size=q["batch"], sampler=s, num_workers=q["workers"],
                                   drop_last=q["ldl"]):
            for i, w in zip(idx.tolist(), wid.tolist()):
                per_worker[w].append(i)
        return per_worker
    if q["q"] == "imagefolder":
        if "skip" in q:
            def valid(path):
                name = os.path.basename(path)
                return name.lower().endswith(IMAGES) and len(name) % q["skip"] != 0
            found = ImageFolder(q["root"], is_valid_file=valid, allow_empty=True)
        else:
            found = ImageFolder(q["root"])
        return [os.path.relpath(p, q["root"]) for p, _ in found.samples]
    raise ValueError("unknown question %r" % q["q"])


if __name__ == "__main__":
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)
