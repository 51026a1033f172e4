"""When the job and the mount disagree: real PyTorch jobs (Debian's torch 1.13: ImageFolder,
DistributedSampler, DataLoader with 2 workers, batch 16) make the mistakes users make against a mount told
seed=42, world_size=1. For each, within a few batches the first rank's verdict in .clairfs/stats is right,
the diagnosis names the mistake, `clairfs status` says it — and a job at another epoch of the seed is
planned for from there and followed, as is the same job started again from scratch and a job of another
seed (learned from its opens) —, and SOURCE is read no more than by a plain mount
(ram=0) for the same job plus one staging window (the RAM budget and the pages pushed ahead; over two
epochs, than direct reads plus the window: a plain mount's pages all stay in the kernel's cache). Bytes are
checked by the job against SOURCE's digests. Also: a right job ends its epoch at 100%, an idle mount
changes no counter, and `clairfs status --watch` into a pipe writes no escape codes and refuses a zero
interval.
"""
import json
import os
import subprocess
import sys
import time

import harness as h
import pytest

JOB = os.path.join(os.path.dirname(__file__), "mismatch_job.py")
BASE = "seed=42,batch_size=16,workers=2,ram=%d"
BATCHES = 6  # the verdict must be right within this many batches (96 files)


def run_job(mnt, digests, args):
    r = subprocess.run([sys.executable, JOB, "--data", mnt, "--digests", digests, "--watch-batches", "12"] + args,
                       capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    verdicts = [(int(b), int(f), v) for b, f, v in (line.split()[1:] for line in lines if line.startswith("VERDICT "))]
    epochs = [json.loads(line[6:]) for line in lines if line.startswith("STATS ")]
    ok = r.returncode == 0 and any(", 0 wrong," in line for line in lines if line.startswith("DONE "))
    return ok, verdicts, epochs, r.stderr.strip()[-400:]


def status(mnt, *extra):
    return subprocess.run([h.CLAIRFS, "status", mnt] + list(extra), capture_output=True, text=True, timeout=30)
class Jobs:
    """3,000 files in SOURCE, their digests for the job to check, RAM for a third of them; what each case
    read from SOURCE against a plain mount and direct reads, printed in one line at the end."""

    def __init__(self, tmp):
        self.tmp, self.data, self.mnt = tmp, tmp + "/data", tmp + "/mnt"
        os.mkdir(self.mnt)
        self.want, self.total = h.dataset(self.data, 3000, 10, 8, 16)
        self.digests = h.write_digests(tmp + "/digests.json", self.want)
        self.ram = self.total // 3
        self.report = []

    def plain(self, args, tar=False):
        """SOURCE bytes a plain mount (ram=0) reads for the same job."""
        with h.mounted(self.data, self.mnt, "seed=42,ram=0"):
            if tar:
                subprocess.run("tar cf - . | cat > /dev/null", shell=True, cwd=self.mnt, check=True)
            else:
                ok, _, _, err = run_job(self.mnt, self.digests, args)
                h.check(ok, "the same job on a plain mount %s" % err)
            return h.source_bytes(h.stats(self.mnt))

    def case(self, name, options, args, verdict, reads_as, compare=False):
        with h.mounted(self.data, self.mnt, (BASE % self.ram) + ("," + options if options else "")):
            ok, verdicts, epochs, err = run_job(self.mnt, self.digests, args)
            s = h.stats(self.mnt)
            text = status(self.mnt).stdout
        h.check(ok, "%s: the job read every file right %s" % (name, err))
        if not ok:
            return None
        at = next((f for b, f, v in verdicts if v == verdict), None)
        r = s["ranks"][0]
        h.check(r["verdict"] == verdict and reads_as in r["reads_as"],
                "%s: rank 0 is '%s': %s" % (name, r["verdict"], r["reads_as"]))
        if args[:2] != ["--epochs", "2"]:  # a mistake from the first batch: said within a few
            h.check(at is not None and at <= 16 * BATCHES,
                    "%s: said after %s files (bound: %d batches of 16)" % (name, at, BATCHES))
        if verdict == "off":
            h.check("OFF THE PLAN" in text and reads_as in text, "%s: clairfs status says it: %s" % (
                name, [line.strip() for line in text.splitlines() if "rank" in line or "reads" in line][:3]))
        if compare:
            theirs = self.plain(args)
            window = s["ram"]["budget"] + s["pagecache"]["budget"]
            # Over several epochs a plain mount leaves every page in the kernel's cache (this self.data set fits
            # in it); clairfs keeps its pages within pagecache= by design, so there the ceiling is direct reads.
            base = theirs if len(epochs) == 1 else len(epochs) * self.total
            h.check(h.source_bytes(s) <= base + window,
                    "%s: SOURCE %.2fx the data set, plain mount %.2fx, direct %.2fx (ceiling: %s + one window of %.2fx)" % (
                        name, h.source_bytes(s) / self.total, theirs / self.total, len(epochs) * 1.0,
                        "plain" if len(epochs) == 1 else "direct", window / self.total))
            self.report.append((name, h.source_bytes(s) / self.total, theirs / self.total, float(len(epochs))))
        return s, epochs, text


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        t = Jobs(tmp)
        yield t
        print("\nSOURCE bytes / data set (clairfs, plain mount, direct): " +
              "; ".join("%s %.2f %.2f %.2f" % r for r in t.report))


def test_the_right_job(t):
    data, mnt, digests, ram = t.data, t.mnt, t.digests, t.ram
    # The right job: following within a few batches, the epoch ends at 100%, and an idle mount stays still.
    with h.mounted(data, mnt, BASE % ram):
        ok, verdicts, epochs, err = run_job(mnt, digests, [])
        at = next((f for b, f, v in verdicts if v == "following"), None)
        h.check(ok and at is not None and at <= 16 * BATCHES, "the right job: following after %s files %s" % (at, err))
        r = h.stats(mnt)["ranks"][0]
        h.check((r["epoch"], r["done"], r["total"]) == (0, 3000, 3000), "the right job's epoch ends at 100%%: epoch %d, %d / %d" % (
            r["epoch"], r["done"], r["total"]))
        a = h.stats(mnt)
        time.sleep(3)
        b = h.stats(mnt)
        moved = [k for k in ("pagecache", "staged", "tiers", "ranks", "plan") if a[k] != b[k]]
        h.check(not moved, "an idle mount changes nothing in 3 s (push_failures %d -> %d): %s" % (
            a["pagecache"]["push_failures"], b["pagecache"]["push_failures"], moved))
        text = status(mnt).stdout
        h.check("epoch 0" in text and "3000 / 3000" in text and "OFF" not in text, "clairfs status: %s" % text.splitlines()[1:2])
        r = subprocess.run("%s status %s --watch 0.2 | head -c 3000" % (h.CLAIRFS, mnt), shell=True, capture_output=True,
                           timeout=30)
        h.check(b"\033" not in r.stdout and r.stdout.count(b"clairfs at") >= 2,
                "status --watch into a pipe: %d screens, no escape codes" % r.stdout.count(b"clairfs at"))
        for bad in ("0", "-1", "x"):
            r = status(mnt, "--watch", bad)
            h.check(r.returncode == 2 and r.stderr.startswith("clairfs: "), "status --watch %s refused: %s" % (bad, r.stderr.strip()))


def test_seed_43_is_seed_42s_next_epoch(t):
    # Seed 43 at epoch 0 is seed 42's epoch 1 (torch seeds an epoch with seed + epoch): the plan serves it,
    # and says whose epoch it is.
    t.case("seed 43, which is seed 42's next epoch", "", ["--seed", "43"], "following", "reads as seed=43 (mounted seed=42)")


def test_another_world_size(t):
    t.case("another world size", "world_size=2,ranks=0", [], "off", "reads as world_size=1 (mounted world_size=2, rank 0)",
         compare=True)


STEP = ["--compute", "0.005"]


@pytest.mark.parametrize("name,options,args,first", [
    ("another start epoch", ",start_epoch=2,epochs=4", ["--epochs", "2"] + STEP, 0),
    ("resumed at epoch 5", "", ["--epochs", "2", "--first-epoch", "5"] + STEP, 5),
    ("another seed (7)", "", ["--epochs", "2", "--seed", "7"] + STEP, None),
    ("another seed, progress=opens", ",progress=opens", ["--seed", "7"] + STEP, None)])
def test_another_epoch_or_seed(t, name, options, args, first):
    data, mnt, digests, ram, total, tmp = t.data, t.mnt, t.digests, t.ram, t.total, t.tmp
    # A job at another epoch of the seed told (issue 32): started at epoch 0 on a mount told start_epoch=2,
    # or resumed at its epoch 5 on one told start_epoch=0. Named off the plan within a few batches, then
    # followed: planned again from the job's epoch (log, stats, status), the rank following to the end of
    # the job's last epoch, SOURCE no more than direct reads plus one window. (Each step takes 5 ms, as a
    # training step leaves the CPU to the mount: the diagnosis runs at nice 10, and beside a job using
    # both cores in full it came after the job's end in CI.)
    # A job of another seed than the mount's (issue 32: a restart with another seed), below it so that it is
    # no later epoch of the mounted one: named off the plan, its seed learned from its opens (the told seed
    # wins for the first batch, the evidence after it) and planned for, both in the log.
    log = tmp + "/epoch.log"
    with h.mounted(data, mnt, (BASE % ram) + options + ",log=" + log):
        ok, verdicts, epochs, err = run_job(mnt, digests, args)
        s = h.settled_stats(mnt, len(epochs) * 3000)
        text = status(mnt).stdout
    with open(log) as f:
        lines = [line[25:] for line in f.read().splitlines()]
    said = [line for line in lines if "planned again" in line]
    os.unlink(log)
    off_at = next((f for b, f, v in verdicts if v == "off"), None)
    r, plan = s["ranks"][0], s["plan"]["world"]
    # (Named off between two of the job's looks at its verdict, and followed again by the next, the rank
    # is seen off in the log alone: a plan for another seed came within the first batch once.)
    off_in_log = any("rank 0 does not read in the planned order" in line for line in lines)
    h.check(ok and ((off_at is not None and off_at <= 16 * BATCHES) or (off_at is None and off_in_log)),
            "%s: named off the plan after %s files (in the log: %s) %s" % (name, off_at, off_in_log, err))
    if first is None:  # the seed: learned and planned for from the mount's start epoch
        right = (plan["epoch"], plan["order"]) == (0, "seed=7") and "reads as seed=7 from epoch 0, not as seed=42 told" \
            in (said or [""])[0] and "from epoch 0 of seed=7" in text
    else:
        right = plan["epoch"] == first and ("planned again from epoch %d" % first) in (said or [""])[0] \
            and ("from epoch %d" % first) in text
    h.check(right and plan["replanned"] == 1 and len(said) == 1,
            "%s: planned again from epoch %s: %s; %s; status %s%s" % (name, first, plan, said, [
                line.strip() for line in text.splitlines() if "planned" in line],
                "" if said else "; the log: %s; progress %s" % (lines[2:], s["progress"])))
    h.check(r["epoch"] == (first or 0) + len(epochs) - 1 and r["done"] == 3000 and r["total"] == 3000
            and r["verdict"] == "following",
            "%s: followed to the end of the job's last epoch: %s" % (name, (r["epoch"], r["done"], r["total"], r["verdict"])))
    window = s["ram"]["budget"] + s["pagecache"]["budget"]
    h.check(h.source_bytes(s) <= len(epochs) * total + window, "%s: SOURCE %.2fx the data set over %d epoch(s) "
            "(ceiling: direct reads + one window of %.2fx)" % (name, h.source_bytes(s) / total, len(epochs), window / total))


def test_the_job_started_again_from_scratch(t):
    data, mnt, digests, ram, total, tmp = t.data, t.mnt, t.digests, t.ram, t.total, t.tmp
    step = STEP
    # The same job started again from scratch on a mount that followed it through epoch 1 (issue 32): its
    # new processes read epoch 0 where the plan is at epoch 2 — not a job without set_epoch (whose next
    # epoch's workers are of the same rank process) — so the mount plans again from epoch 0 and follows
    # it to the end of its last epoch.
    log = tmp + "/again.log"
    with h.mounted(data, mnt, (BASE % ram) + ",log=" + log):
        ok1 = run_job(mnt, digests, ["--epochs", "2"] + step)[0]
        ok2, _, epochs, err = run_job(mnt, digests, ["--epochs", "2"] + step)
        s = h.settled_stats(mnt, 4 * 3000)
    with open(log) as f:
        lines = [line[25:] for line in f.read().splitlines()]
    os.unlink(log)
    said = [line for line in lines if "planned again" in line]
    r = s["ranks"][0]
    h.check(ok1 and ok2 and s["plan"]["world"]["replanned"] == 1 and len(said) == 1
            and "planned again from epoch 0" in said[0] and (r["epoch"], r["done"], r["total"], r["verdict"]) ==
            (1, 3000, 3000, "following"),
            "the job started again from scratch: planned again from epoch 0 %s, followed to %s; SOURCE %.2fx the data "
            "set over both jobs' 4 epochs %s" % (said, (r["epoch"], r["done"], r["total"], r["verdict"]),
                                                h.source_bytes(s) / total, err or [x for x in lines if "warning" in x][:4]))


def test_no_set_epoch(t):
    got = t.case("no sampler.set_epoch", "", ["--epochs", "2", "--no-set-epoch"], "off", "repeats epoch 0's order in epoch 1",
               compare=True)
    if got:
        first = got[1][0]["stats"]["ranks"][0]
        h.check(first["verdict"] == "following" and first["done"] == first["total"],
                "no sampler.set_epoch: epoch 0 was right and followed to %d / %d" % (first["done"], first["total"]))


def test_shuffle_false(t):
    t.case("shuffle=False", "", ["--no-shuffle"], "off", "reads in sample order", compare=True)


def test_resumed_mid_epoch(t):
    data, mnt, digests, ram, total = t.data, t.mnt, t.digests, t.ram, t.total
    # A job resumed mid-epoch (issue 32): its epoch 1 from batch 20 on, the 320 files before skipped by its
    # sampler, as a checkpoint taken mid-epoch is resumed. Told start_batch=20 or not: followed to the
    # epoch's end with no open mispredicted. Told, nothing skipped is staged: SOURCE no more than a plain
    # mount's for the job. Not told, the mount stages a batch per worker (32 files) before the job's opens
    # show where it is, and nothing of the rest it skipped (RAM holds a third of the data set).
    resume = ["--first-epoch", "1", "--skip-batches", "20"]
    theirs = t.plain(resume)
    got = {}
    for told in (True, False):
        with h.mounted(data, mnt, (BASE % ram) + ",start_epoch=1,epochs=2" + (",start_batch=20" if told else "")):
            ok, verdicts, epochs, err = run_job(mnt, digests, resume)
            got[told] = s = h.settled_stats(mnt, 3000 - 320)
        r = s["ranks"][0]
        h.check(ok and (r["epoch"], r["done"], r["total"], r["verdict"]) == (1, 3000, 3000, "following")
                and s["mispredicted_opens"] == 0,
                "resumed at batch 20, start_batch %s: epoch %d, %d / %d, %s, %d mispredicted %s" % (
                    "told" if told else "not told", r["epoch"], r["done"], r["total"], r["verdict"],
                    s["mispredicted_opens"], err))
    told_b, untold_b = h.source_bytes(got[True]), h.source_bytes(got[False])
    h.check(told_b <= theirs + total // 100 and untold_b <= theirs + total * (32 + 8) // 3000,
            "resumed at batch 20: SOURCE %.3fx the data set told start_batch=20, %.3fx not told (bound: plain + 40 "
            "files), plain mount %.3fx" % (told_b / total, untold_b / total, theirs / total))
    t.report.append(("resumed at batch 20 (start_batch told)", told_b / total, theirs / total, (3000 - 320) / 3000))


def test_tar_over_the_mount(t):
    data, mnt, ram, total = t.data, t.mnt, t.ram, t.total
    # A walk over the mount (tar): no more SOURCE than a plain mount plus one window.
    with h.mounted(data, mnt, BASE % ram):
        subprocess.run("tar cf - . | cat > /dev/null", shell=True, cwd=mnt, check=True)
        s = h.stats(mnt)
    theirs = t.plain([], tar=True)
    window = s["ram"]["budget"] + s["pagecache"]["budget"]
    h.check(s["ranks"][0]["verdict"] == "off" and h.source_bytes(s) <= theirs + window,
            "tar over the mount: rank 0 '%s' (%s); SOURCE %.2fx, plain mount %.2fx, direct 1.00x" % (
                s["ranks"][0]["verdict"], s["ranks"][0]["reads_as"], h.source_bytes(s) / total, theirs / total))
    t.report.append(("tar cf - .", h.source_bytes(s) / total, theirs / total, 1.0))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
