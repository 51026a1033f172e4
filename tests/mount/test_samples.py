"""The job's own sample list (samples=FILE, issue 32): real PyTorch jobs (Debian's torch 1.13,
DistributedSampler, DataLoader with 2 workers, batch 16) whose Dataset is no ImageFolder walk of the mount —
a list of their own (every file sorted by its name), ImageFolder with an is_valid_file that leaves out a
seventh — written by the job's one added line and given to the mount. With the list: the job is followed from
its first batch, no open mispredicted, its epoch counted to the end, every byte right, and its opens served
by SOURCE (RAM holds a third of the data set) no more often than an ImageFolder job's on the same mount
(+0.02 of the opens); seed=auto learns the seed on the list. Without it the same job is off the plan and
most of its opens go to SOURCE. Bad lists are refused by line or element. A job reading a subfolder of the
mount (ImageFolder(MOUNTPOINT/train) where SOURCE holds val/ too), or a sorted glob of it, has its list learned
from its opens, told seed or seed=auto, and is followed; the is_valid_file job without its list has it
learned once its first epoch ended (the walk less the files it never opened), and is followed.
"""
import json
import os
import subprocess
import sys

import harness as h
import pytest

JOB = os.path.join(os.path.dirname(__file__), "mismatch_job.py")
FILES = 3000
BASE = "seed=42,batch_size=16,workers=2,ram=%d"


def run_job(mnt, digests, args):
    r = subprocess.run([sys.executable, JOB, "--data", mnt, "--digests", digests, "--watch-batches", "6",
                        "--compute", "0.005"] + args, capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    verdicts = [v for v in (line.split()[3] for line in lines if line.startswith("VERDICT "))]
    ok = r.returncode == 0 and any(", 0 wrong," in line for line in lines if line.startswith("DONE "))
    return ok, verdicts, r.stderr.strip()[-400:]


def said_in(log, words):
    """The lines of the mount's log (removed after) that hold `words`, their timestamps cut."""
    with open(log) as f:
        said = [line[25:].strip() for line in f if words in line]
    os.unlink(log)
    return said


def checked_epochs(name, r, epochs):
    """The stats the job printed after each epoch; checks that it read every file right, all `epochs`."""
    stats = [json.loads(line[6:])["stats"] for line in r.stdout.splitlines() if line.startswith("STATS ")]
    ok = r.returncode == 0 and ", 0 wrong," in r.stdout and len(stats) == epochs
    h.check(ok, "%s: the job read every file right %s" % (name, r.stderr.strip()[-400:]))
    return stats if ok else None
class Jobs:
    """3,000 files in SOURCE and their digests, RAM for a third of them (a job not followed reads most files
    from SOURCE), and the job's lists, as a job writes them: over a plain mount (paths under the mount point,
    [path, label] pairs); and one path a line, made beforehand over SOURCE itself (paths under SOURCE)."""

    def __init__(self, tmp):
        self.tmp, self.data, self.mnt = tmp, tmp + "/data", tmp + "/mnt"
        data, mnt = self.data, self.mnt
        os.mkdir(mnt)
        want, self.total = h.dataset(data, FILES, 10, 8, 16)
        self.digests = digests = h.write_digests(tmp + "/digests.json", want)
        self.ram = self.total // 3
        self.by_name, self.skipping = by_name, skipping = tmp + "/by-name.json", tmp + "/skip.txt"
        with h.mounted(data, mnt, "seed=42,ram=0"):
            subprocess.run([sys.executable, JOB, "--data", mnt, "--digests", digests, "--epochs", "0", "--dataset",
                            "by-name", "--write-samples", by_name], check=True, timeout=300)
        subprocess.run([sys.executable, JOB, "--data", data, "--digests", digests, "--epochs", "0", "--dataset", "skip",
                        "--write-samples", skipping, "--as-lines"], check=True, timeout=300)
        with open(by_name) as f:
            self.listed = json.load(f)
        with open(skipping) as f:
            self.kept = len(f.read().splitlines())
        self.served = {}  # per job of LIST_JOBS run: its opens served by SOURCE / its opens

    def list_job(self, name, options, args, files):
        """Runs one of LIST_JOBS and checks it followed (or, not told, off the plan); records what SOURCE served."""
        data, mnt, digests = self.data, self.mnt, self.digests
        options = (BASE % self.ram) + options
        if "seed=auto" in name:
            options = options.replace("seed=42", "seed=auto")
        with h.mounted(data, mnt, options):
            ok, verdicts, err = run_job(mnt, digests, args)
            # (with seed=auto the engine hears only the opens after the seed is found)
            s = h.quiet_stats(mnt) if "seed=auto" in options else h.settled_stats(mnt, files)
        r = s["ranks"][0]
        self.served[name] = s["stalls"]["opens"] / s["ranks"][0]["total"]
        h.check(ok, "%s: the job read every file right %s" % (name, err))
        if name.endswith("not told"):
            h.check(r["verdict"] == "off", "%s: rank 0 is off the plan: %s, %s" % (name, r["verdict"], r["reads_as"]))
            return
        learned = s.get("learned", {})
        h.check((r["epoch"], r["done"], r["total"], r["verdict"]) == (0, files, files, "following")
                and s["mispredicted_opens"] == 0 and ("seed=auto" not in name or learned.get("seed") == "seed=42"),
                "%s: followed to the epoch's end: %s, %d mispredicted, verdicts %s%s" % (
                    name, (r["epoch"], r["done"], r["total"], r["verdict"]), s["mispredicted_opens"], verdicts,
                    ", learned %s" % learned if "seed=auto" in name else ""))

    def list_jobs(self):
        return [("ImageFolder", "", [], FILES),
                ("a list of its own, samples= (JSON)", ",samples=" + self.by_name, ["--dataset", "by-name"], FILES),
                (GIVEN, ",samples=" + self.skipping, ["--dataset", "skip"], self.kept),
                ("a list of its own, not told", "", ["--dataset", "by-name"], FILES)]


GIVEN = "ImageFolder with is_valid_file, samples= (lines), seed=auto"


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        yield Jobs(tmp)


def test_a_list_of_its_own(t):
    mnt, listed = t.mnt, t.listed
    h.check(len(listed) == FILES and listed[0][0].startswith(mnt + "/"), "the job's list: %d samples, %s" % (
        len(listed), listed[:1]))
    for job in t.list_jobs():
        t.list_job(*job)
    # Opens served by SOURCE (each a stall for a job that waits on its reads): a followed list no more than
    # an ImageFolder job, against most of them when not told. (seed=auto reads its first batches from
    # SOURCE while it learns, as it does for any job.)
    served = t.served
    told, untold = served["a list of its own, samples= (JSON)"], served["a list of its own, not told"]
    h.check(told <= served["ImageFolder"] + 0.02 and untold > 0.3, "opens served by SOURCE: %.3f of the job's with "
            "samples=, %.3f not told, ImageFolder %.3f" % (told, untold, served["ImageFolder"]))
    print("opens served by SOURCE / the job's opens: " + "; ".join("%s %.3f" % item for item in served.items()))


def test_an_is_valid_file_list_learned(t):
    tmp, data, mnt, digests, ram, kept = t.tmp, t.data, t.mnt, t.digests, t.ram, t.kept
    # ImageFolder with that is_valid_file, its list not given: the mount's walk fits none of the job's
    # opens, until an epoch of the job ended — then its files are the list (the walk less those it never
    # opened). Told seed=42, or seed=auto, the mount plans again on that list (said in the log and the
    # stats), follows the job to the end of its epoch 1, and serves that epoch's opens from SOURCE no more
    # often than the job's epoch with the list given (above) + 0.02.
    if GIVEN not in t.served:  # (run alone: the job with its list given, for the comparison)
        t.list_job(*[job for job in t.list_jobs() if job[0] == GIVEN][0])
    given = t.served[GIVEN]
    served = {}
    for name, options in (("is_valid_file, told seed=42", BASE % ram),
                          ("is_valid_file, seed=auto", (BASE % ram).replace("seed=42", "seed=auto"))):
        log = tmp + "/skip.log"
        with h.mounted(data, mnt, options + ",log=" + log):
            r = subprocess.run([sys.executable, JOB, "--data", mnt, "--digests", digests, "--dataset", "skip",
                                "--epochs", "2", "--compute", "0.005"], capture_output=True, text=True, timeout=600)
            s = h.stats_when(mnt, lambda s: h.rank0(s)[:3] == (1, kept, kept))
        said = said_in(log, "never opened")
        epochs = checked_epochs(name, r, 2)
        if not epochs:
            continue
        # (seed=auto, still learning: no engine's stalls yet, each open SOURCE's)
        at = [0] + [e["stalls"]["opens"] if "stalls" in e else e["learned"]["source_files"] for e in epochs]
        served[name] = [(at[i + 1] - at[i]) / kept for i in range(2)]
        words = "ImageFolder(MOUNTPOINT) less the %d files it never opened (%d samples: is_valid_file?)" % (
            FILES - kept, kept)
        learned = s["plan"].get("world", {}).get("samples", "")
        h.check(h.rank0(s) == (1, kept, kept, "following") and learned == words and len(said) == 1
                and words in said[0],
                "%s: followed to the end of its epoch 1: %s, list %s, said %s" % (name, h.rank0(s), learned, said))
    if len(served) == 2:
        h.check(all(v[1] <= given + 0.02 for v in served.values()), "is_valid_file, list learned: opens served by "
                "SOURCE in epoch 1 no more than with the list given (%.3f) + 0.02" % given)
        print("is_valid_file: opens served by SOURCE / the job's, epochs 0 and 1: " + "; ".join(
            "%s %.3f %.3f" % (name, *v) for name, v in served.items()))


def test_bad_lists_are_refused(t):
    tmp, data, mnt, skipping = t.tmp, t.data, t.mnt, t.skipping
    # Bad lists: one line naming the file and where in it, nothing mounted.
    bad = tmp + "/bad.txt"
    for text, said in (("c0000/0000000.jpg\nc0000/nothing.jpg\n", "line 2: 'c0000/nothing.jpg' is no file in SOURCE"),
                       ("c0001\n", "line 1: 'c0001' is a folder, not a file"),
                       ('["c0000/0000000.jpg", 7]', "element 1 is neither a path nor a [path, label] pair"),
                       ("/elsewhere/c0000/0000000.jpg\n", "is under neither"),
                       ("# nothing\n", "names no samples")):
        with open(bad, "w") as f:
            f.write(text)
        r = h.run_clairfs([data, mnt, "-o", "seed=42,samples=" + bad])
        h.check(r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1 and not h.is_mounted(mnt),
                "a bad list refused in one line: %s" % r.stderr.strip())
    # Run as root (as here), the list is read with no symlink followed on its way: one a user swapped in
    # could send root's read to a file the user cannot read, and its lines into the error.
    os.symlink(skipping, tmp + "/link.txt")
    r = h.run_clairfs([data, mnt, "-o", "seed=42,samples=" + tmp + "/link.txt"])
    h.check(r.returncode == 2 and "a symlink in its path" in r.stderr and not h.is_mounted(mnt),
            "a symlinked list refused, as root: %s" % r.stderr.strip())
    r = h.run_clairfs([data, mnt, "-o", "seed=42,root=c0000,samples=" + skipping])
    h.check(r.returncode == 2 and "samples= or root=" in r.stderr, "samples= with root= refused: %s" % r.stderr.strip())


def test_a_subfolder_and_a_glob(t):
    tmp, mnt = t.tmp, t.mnt
    # A data set in a subfolder, and a sorted glob of it: SOURCE holds train/ (1,200 .jpg files and 120 .png
    # thumbnails) and val/, the mount is over SOURCE, and the job reads ImageFolder(MOUNTPOINT/train) (1,320
    # samples) or sorted(glob("MOUNTPOINT/train/**/*.jpg")) (1,200) for 2 epochs. Its opens all lie in train/
    # and are all .jpg, so that folder's walk and its glob are tried with the seed: told seed=42, the mount
    # plans again for the job's list (said in the log, the stats' plan.world.samples, clairfs status);
    # seed=auto learns the list with the seed; a job of the glob restarted at its epoch 1 is planned from that
    # epoch of the told seed (torch's epoch 1 of seed 42 is also seed 43's epoch 0: the told seed wins, and
    # the rank's epochs are counted right). Each follows the job to its last epoch's end, its opens served
    # by SOURCE no more than with the folder told (root=train) + 0.02 once followed (epoch 1), and fewer than
    # a plain mount's (every open) while it learns (epoch 0).
    split = tmp + "/split"
    h.make_dataset(split + "/train", 1200, 10, 8, 16)
    h.dataset(split + "/val", 240, 10, 8, 16)
    for i in range(0, 1200, 10):
        with open(split + "/train/c%04d/t%07d.png" % (i % 10, i), "wb") as f:
            f.write(os.urandom(2000 + i))
    digests = h.write_digests(tmp + "/split-digests.json", h.digests(split + "/train"))
    folder = "ImageFolder(MOUNTPOINT/train) (1320 samples)"
    globbed = "sorted(glob('MOUNTPOINT/train/**/*.jpg')) (1200 samples)"
    train_total = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(split + "/train") for n in names)
    told, auto = BASE % (train_total // 3), (BASE % (train_total // 3)).replace("seed=42", "seed=auto")
    served = {}
    for name, options, dataset, samples, learned, first in (
            ("ImageFolder, told the folder (root=train)", told + ",root=train", "imagefolder", 1320, "", 0),
            ("ImageFolder, told seed=42", told, "imagefolder", 1320, folder, 0),
            ("ImageFolder, seed=auto", auto, "imagefolder", 1320, folder, 0),
            ("sorted glob, told seed=42", told, "glob", 1200, globbed, 0),
            ("sorted glob, seed=auto", auto, "glob", 1200, globbed, 0),
            ("sorted glob, told seed=42, restarted at epoch 1", told, "glob", 1200, globbed, 1)):
        log = tmp + "/split.log"
        # (Steps of 5 ms: the list is found after the job's epoch 0 in some runs, and the plan is then
        # placed by the opens of both epochs — its next epoch planned before those are caught up on.)
        compute = "0.005"
        with h.mounted(split, mnt, options + ",log=" + log):
            r = subprocess.run([sys.executable, JOB, "--data", mnt + "/train", "--mount", mnt, "--digests", digests,
                                "--dataset", dataset, "--epochs", "2", "--first-epoch", str(first), "--compute",
                                compute], capture_output=True,
                               text=True, timeout=600)
            # (the opens and closes told while the seed was learned counted too: every one of the job's)
            s = h.settled_stats(mnt, 2 * samples)
            # (the job's list found from its last opens, its plan follows a moment after the job)
            s = h.stats_when(mnt, lambda s: h.rank0(s)[:2] == (first + 1, samples))
            status = subprocess.run([h.CLAIRFS, "status", mnt], capture_output=True, text=True, timeout=30).stdout
        said = said_in(log, "MOUNTPOINT/train")
        epochs = checked_epochs(name, r, 2)
        if not epochs:
            continue
        at = [e["stalls"]["opens"] for e in epochs]
        served[name] = (at[0] / samples, (at[1] - at[0]) / samples)
        rank, world = s["ranks"][0], s["plan"].get("world", {})
        right = (rank["epoch"], rank["done"], rank["total"], rank["verdict"]) == (first + 1, samples, samples,
                                                                                  "following") \
            and world.get("samples") == learned and ((learned + ", learned from the job's opens") in status) == bool(learned)
        if "told seed=42" in name:
            # (its list found in the job's first epoch, or, the job being quick, in its second)
            right = right and len(said) == 1 and any(
                "the job reads %s as seed=42 from epoch %d, not the 1560 of the plan's" % (learned, e) in said[0]
                for e in (first, first + 1)) and "planned again" in said[0]
        if "seed=auto" in name:
            right = right and s["learned"]["seed"] == "seed=42" and len(said) == 1 and "found after" in said[0] \
                and learned in said[0]
        h.check(right, "%s: followed to the end of its last epoch: %s, plan %s, said %s" % (
            name, (rank["epoch"], rank["done"], rank["total"], rank["verdict"]), world, said))
    if len(served) == 6:
        ideal = served["ImageFolder, told the folder (root=train)"][1]
        for name, (e0, e1) in served.items():
            h.check(e1 <= ideal + 0.02 and e0 < 1, "%s: opens served by SOURCE %.3f in epoch 0 (a plain mount: "
                    "1), %.3f in epoch 1 (the folder told %.3f)" % (name, e0, e1, ideal))
        print("a subfolder, a glob: opens served by SOURCE / the job's, epochs 0 and 1: " + "; ".join(
            "%s %.3f %.3f" % (name, a, b) for name, (a, b) in served.items()))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
