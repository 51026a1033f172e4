"""seed=auto: the mount learns the job's seed from its first reads and stages by it. A real PyTorch job
(Debian's torch 1.13: ImageFolder, DistributedSampler, DataLoader with 2 workers, batch 16) over a mount
told only seed=auto: the seed is found within a few batches, the plan follows the job into its next epoch,
the published order is the one a mount told the seed publishes, and SOURCE is read no more than by that
mount. A job whose seed is no likely one is read as on a plain mount (ram=0), and says so. Bytes are
checked by the job against SOURCE's digests. Another user's reads do not choose the seed (learn_from=); a
seed learned from the job's user's reads in another order is learned again once the job reads its own.
Also: what seed=auto cannot go with is refused.
"""
import json
import os
import subprocess
import sys
import time

import harness as h
import pytest

JOB = os.path.join(os.path.dirname(__file__), "mismatch_job.py")
BASE = "batch_size=16,workers=2,ram=%d"


def run_job(mnt, digests, args):
    r = subprocess.run([sys.executable, JOB, "--data", mnt, "--digests", digests] + args,
                       capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    epochs = [json.loads(line[6:]) for line in lines if line.startswith("STATS ")]
    ok = r.returncode == 0 and any(", 0 wrong," in line for line in lines if line.startswith("DONE "))
    return ok, epochs, r.stderr.strip()[-400:]


def niced_threads(mnt):
    """The daemon's threads that run below normal priority (nice above 0)."""
    return sum(1 for _, fields in h.thread_stats(h.daemon_pids(mnt)[0]) if int(fields[16]) > 0)
def settled(mnt):
    """The stats once the rank's last reads have reached the engine (the kernel sends a file's release
    after the job's close returns)."""
    return h.stats_when(mnt, lambda s: not s.get("ranks") or s["ranks"][0]["done"] >= s["ranks"][0]["total"])

def read(path):
    with open(path) as f:
        return f.read()
class Data:
    """3,000 files in SOURCE and their digests; RAM for all of them (SOURCE once, for the told mount and
    the learning one alike)."""

    def __init__(self, tmp):
        self.tmp, self.data, self.mnt = tmp, tmp + "/data", tmp + "/mnt"
        os.mkdir(self.mnt)
        self.want, self.total = h.dataset(self.data, 3000, 10, 8, 21)
        self.digests = h.write_digests(tmp + "/digests.json", self.want)
        self.ram = 2 * self.total
        self._seed5 = None

    def seed5(self):
        """The first 64 files of seed 5's order (a likely seed), as a mount told it publishes them."""
        if self._seed5 is None:
            with h.mounted(self.data, self.mnt, "seed=5"):
                self._seed5 = read(self.mnt + "/.clairfs/order/epoch-0/rank-0").splitlines()[:64]
        return self._seed5


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        yield Data(tmp)


def test_the_seed_learned_against_told_and_plain(t):
    data, mnt, digests, ram, total = t.data, t.mnt, t.digests, t.ram, t.total
    # The job takes 5 ms a training step (10 ms under a sanitizer): the epoch-0 stalls compared below are a
    # race between the stager and the job, and a job reading a local tree at full speed (2,000 files/s)
    # won it by chance beside a daemon slowed 5-15x (after the engine was there: 9-44 stalls in quiet
    # runs here, 160 once in CI; with the step, 1-10), and once in CI's release pass too (44, where 32
    # were allowed).
    job = ["--seed", "7", "--epochs", "2", "--compute", "0.01" if os.environ.get("CLAIRFS_SANITIZED") else "0.005"]

    # Told the seed: what the learning mount is measured against.
    with h.mounted(data, mnt, (BASE % ram) + ",seed=7"):
        ok, told, err = run_job(mnt, digests, job)
        h.check(ok, "told seed=7: the job read every file right %s" % err)
        told_order = read(mnt + "/.clairfs/order/epoch-1/rank-0")
        told_niced = niced_threads(mnt)
    with h.mounted(data, mnt, "seed=7,ram=0"):
        ok, plain, err = run_job(mnt, digests, job)
        h.check(ok, "plain mount: the job read every file right %s" % err)

    with h.mounted(data, mnt, (BASE % ram) + ",seed=auto"):
        readme = read(mnt + "/.clairfs/README")
        learning_size = os.stat(mnt + "/.clairfs/stats").st_size
        h.check("seed auto" in readme, "the README says the seed is learned: %s" % [
            line for line in readme.splitlines() if line.startswith("Order")])
        ok, auto, err = run_job(mnt, digests, job)
        h.check(ok, "seed=auto: the job read every file right %s" % err)
        s = settled(mnt)  # (seen under TSan: 2,990 of 3,000 counted at the job's end)
        learned = s["learned"]
        # stats grows when the seed is learned and the ranks appear, and each open reads one rendering
        # whole at its own size (a reader that met the change read two renderings in one, "Extra data",
        # when one inode held them all).
        with open(mnt + "/.clairfs/stats", "rb") as f:
            size, got = os.fstat(f.fileno()).st_size, len(f.read())
        h.check(size == got and size > learning_size,
                "stats grows once the seed is learned and the ranks appear: %d, then %d bytes, read whole (%d)" % (
                    learning_size, size, got))
        # The seeds are tried at low priority on a thread of their own; the engine built after it runs at
        # the daemon's (it was started from the niced thread once, and its stager fell behind the job).
        h.check(niced_threads(mnt) <= told_niced, "the learned engine's threads run at normal priority: %d niced, "
                "told mount %d" % (niced_threads(mnt), told_niced))
        # (By its tries, at 16, 24, 32... opens: how many opens it took is the machine's speed, see below.)
        h.check(learned["state"] == "found" and learned["seed"] == "seed=7" and learned["tries"] <= 2,
                "seed=auto: learned %s at try %d, after %d opens (%s)" % (learned["seed"], learned["tries"],
                                                                          learned["after_opens"], learned["state"]))
        # The plan is with the job within epoch 0. How soon is not asserted here: it is a race between the
        # learning (at nice 10, below the job) and a job reading a local tree at full speed — 16 to 35 of
        # its opens in a quiet run, 174 in CI with another test beside it. What learning costs in SOURCE
        # reads is checked below, against the files read before the engine was there.
        early = auto[0]["stats"]
        h.check("ranks" in early and early["ranks"][0]["verdict"] == "following",
                "after epoch 0 the rank is followed: %s (the engine there after %d opens)" % (
                    early.get("ranks", [{}])[0].get("verdict"), learned["source_files"]))
        r = s["ranks"][0]
        h.check((r["epoch"], r["done"], r["total"], r["verdict"]) == (1, 3000, 3000, "following"),
                "the plan followed the job into epoch 1: epoch %d, %d / %d, %s" % (
                    r["epoch"], r["done"], r["total"], r["verdict"]))
        h.check(read(mnt + "/.clairfs/order/epoch-1/rank-0") == told_order,
                "the published order of epoch 1 is the told mount's")
        text = subprocess.run([h.CLAIRFS, "status", mnt], capture_output=True, text=True, timeout=30).stdout
        h.check("seed=auto: the job reads as seed=7 (found after" in text, "clairfs status says it: %s" % text.splitlines()[1:2])
    # What learning costs: the files read before the engine was there (16 opens to decide, and those the
    # job reads while the engine is built: a few in a release build, hundreds under a sanitizer) are read
    # from SOURCE for the job and staged again for their next use. No more than that.
    a, t, p = h.source_bytes(auto[-1]["stats"]), h.source_bytes(told[-1]["stats"]), h.source_bytes(plain[-1]["stats"])
    before, before_files = learned["source_bytes"], learned["source_files"]
    h.check(a <= t + before + total // 50,
            "SOURCE over 2 epochs: seed=auto %.2fx the data set (%.3fx read before the engine was there), told %.2fx, "
            "plain %.2fx" % (a / total, before / total, t / total, p / total))
    # Epoch 0's opens served from SOURCE (a stall each, for a job that waits on them): those before the
    # engine was there, and the few the job reads while staging gets ahead of it (this job reads a local
    # tree at full speed; under a sanitizer, paced by its step, above).
    a0, t0 = auto[0]["stats"]["stalls"]["opens"], told[0]["stats"]["stalls"]["opens"]
    p0 = plain[0]["stats"]["tiers"]["source"]["files"]
    slack = 64 if os.environ.get("CLAIRFS_SANITIZED") else 32
    h.check(a0 <= t0 + before_files + slack, "epoch 0's opens served by SOURCE: seed=auto %d (%d before the engine was "
            "there), told %d, plain %d" % (a0, before_files, t0, p0))
    print("seed=auto: found after %d opens; epoch 0 opens from SOURCE %d (told: %d, plain: %d); "
          "SOURCE ÷ data set over 2 epochs %.2f (told %.2f, plain %.2f)" % (
              learned["after_opens"], a0, t0, p0, a / total, t / total, p / total))


def test_the_global_seed_script(t):
    data, mnt, digests, ram, total = t.data, t.mnt, t.digests, t.ram, t.total
    # The usual single-GPU script: torch.manual_seed(5), 100 outputs drawn (torch.rand), then
    # DataLoader(shuffle=True) without a generator. Told (order=torch-global,draws=100): every open as
    # planned. Learned: the seed and the draws, from the first opens; followed into epoch 1.
    glob = ["--seed", "5", "--global-seed", "--draws", "100", "--epochs", "2"]
    with h.mounted(data, mnt, (BASE % ram) + ",order=torch-global,seed=5,draws=100"):
        ok, told_g, err = run_job(mnt, digests, glob)
        s = h.stats(mnt)
        h.check(ok and s["ranks"][0]["epoch"] == 1 and s["ranks"][0]["verdict"] == "following"
                and s["mispredicted_opens"] == 0,
                "order=torch-global,seed=5,draws=100: the job followed, no open mispredicted (%s, %s) %s" % (
                    s["ranks"][0]["verdict"], s["mispredicted_opens"], err))
    with h.mounted(data, mnt, (BASE % ram) + ",seed=auto"):
        ok, auto_g, err = run_job(mnt, digests, glob)
        s = settled(mnt)
        learned_g = s["learned"]
        # Tries come at 16, 24, 32, 48... opens, each with every open kept by then; 32 of the loader's opens
        # suffice (diagnosis_test), so it is found by the third try. How many opens the job made by then is
        # the machine's speed, not the learner's (each try runs at nice 10 beside a job at full speed: once
        # 67 failed a bound of 64 on opens here).
        h.check(ok and learned_g["seed"] == "seed=5,order=torch-global,draws=100" and learned_g["tries"] <= 3
                and s["ranks"][0]["epoch"] == 1 and s["ranks"][0]["verdict"] == "following",
                "seed=auto: learned %s at try %d, after %d opens; epoch %d %s %s" % (
                    learned_g["seed"], learned_g["tries"], learned_g["after_opens"], s["ranks"][0]["epoch"],
                    s["ranks"][0]["verdict"], err))
        a, t = h.source_bytes(auto_g[-1]["stats"]), h.source_bytes(told_g[-1]["stats"])
        h.check(a <= t + learned_g["source_bytes"] + total // 50,
                "SOURCE over 2 epochs: learned %.2fx the data set (%.3fx before the engine was there), told %.2fx" % (
                    a / total, learned_g["source_bytes"] / total, t / total))


def test_a_seed_no_likely_one(t):
    data, mnt, digests, ram, total = t.data, t.mnt, t.digests, t.ram, t.total
    # A seed no likely one: reads as on a plain mount, and it is said.
    with h.mounted(data, mnt, (BASE % ram) + ",seed=auto"):
        ok, epochs, err = run_job(mnt, digests, ["--seed", "987654321"])
        h.check(ok, "an unlikely seed: the job read every file right %s" % err)
        s = h.stats(mnt)
        h.check(s["learned"]["state"] == "learning" and "ranks" not in s,
                "an unlikely seed: still learning after %d opens, nothing staged" % s["learned"]["opens_seen"])
        h.check(h.source_bytes(s) <= total, "an unlikely seed: SOURCE %.2fx the data set (plain: 1.00x)" % (h.source_bytes(s) / total))
        h.check(os.listdir(mnt + "/.clairfs/order/epoch-0") == [], "no order files while the seed is unknown")
        text = subprocess.run([h.CLAIRFS, "status", mnt], capture_output=True, text=True, timeout=30).stdout
        h.check("learning the job's seed (3000 opens seen)" in text and "generator=torch.Generator()" in text,
                "clairfs status: %s" % text.splitlines()[1:4])


def test_another_users_reads_do_not_choose(t):
    data, mnt, ram, tmp = t.data, t.mnt, t.ram, t.tmp
    # Another user's reads, in the order of a likely seed, do not choose the seed: only the job's users
    # (the daemon's, here root) are learned from. (Before, 16 such reads locked the mount onto seed 5.)
    seed5 = t.seed5()
    os.chmod(tmp, 0o755)
    with h.other_user() as run_as, h.mounted(data, mnt, (BASE % ram) + ",seed=auto,allow_other,default_permissions"):
        got = run_as(["sh", "-c", "cd %s && cat -- %s >/dev/null" % (mnt, " ".join("'%s'" % p for p in seed5))])
        time.sleep(1)  # the learning thread's try at 64 opens
        s = h.stats(mnt)["learned"]
        h.check(got.returncode == 0 and s["state"] == "learning" and s["other_users_opens"] >= 64,
                "another user's 64 reads in seed 5's order teach nothing: %s, %d of theirs not learned from %s" % (
                    s["state"] + " " + s["seed"], s["other_users_opens"], got.stderr.strip()))
        r = h.run_clairfs(["status", mnt])
        h.check("other users' opens" in r.stdout, "clairfs status says so: %s" % r.stdout.splitlines()[1:2])


def test_learned_again(t):
    data, mnt, digests, ram, total, tmp = t.data, t.mnt, t.digests, t.ram, t.total, t.tmp
    # Learned again (security finding 9): the job's own user first reads 64 files in seed 5's order (a
    # quick check, or something planted as that user), and the mount learns seed 5; then the job runs with
    # seed 42. Its workers are judged to read another order; once no rank of the seed-5 plan is followed,
    # the seed is learned again from their opens and the mount plans for seed 42 — said in the log and
    # status, the files staged kept, the job followed to the end, SOURCE read about once. (Not seed 7:
    # its epoch 0 is seed 5's epoch 2, in the plan already — a job at another epoch, issue 32.)
    log = tmp + "/relearn.log"
    seed5 = t.seed5()
    with h.mounted(data, mnt, (BASE % ram) + ",seed=auto,log=" + log):
        subprocess.run(["sh", "-c", "cd %s && cat -- %s >/dev/null" % (mnt, " ".join("'%s'" % p for p in seed5))],
                       check=True)
        h.wait_until(lambda: h.stats(mnt)["learned"]["seed"] == "seed=5", timeout=10, step=0.1)
        first = h.stats(mnt)["learned"]["seed"]
        # (A training step of 5 ms after each batch: the learning runs at nice 10, and beside a job using
        # both cores in full it came after the job's end, now and then in CI.)
        ok, epochs, err = run_job(mnt, digests, ["--seed", "42", "--epochs", "2", "--compute", "0.005"])
        s = h.settled_stats(mnt, 2 * 3000)
        text = subprocess.run([h.CLAIRFS, "status", mnt], capture_output=True, text=True, timeout=30).stdout
    said = read(log)
    ranks = [(r["epoch"], r["done"], r["total"], r["verdict"]) for r in s["ranks"]]
    # Learned in epoch 0 of the job: seed 42 from epoch 0; in its epoch 1 (its epoch-0 readers still counted
    # the seed-5 rank as followed): seed 43, whose epoch 0 is seed 42's epoch 1 — the same orders on.
    again = s["learned"]["seed"]
    shift = {"seed=42": 0, "seed=43": 1}.get(again)
    h.check(ok and first == "seed=5" and shift is not None and s["learned"]["relearned"] == 1
            and ("the job reads as %s from epoch 0, not as seed=5 learned before" % again) in said
            and "learned again 1 time" in text,
            "learned seed 5 from 64 reads, then the job of seed 42: read right %s, learned %s, then %s (%d time(s)); "
            "the log %s; status %s" % (ok, first, again, s["learned"]["relearned"],
                                        [line[25:] for line in said.splitlines() if "seed=" in line][-1:],
                                        [line.strip() for line in text.splitlines() if "seed=auto" in line]))
    h.check(ranks == [(1 - (shift or 0), 3000, 3000, "following")],
            "learned again: the job followed to the end of its last epoch: %s" % ranks)
    h.check(h.source_bytes(s) <= 1.05 * total,
            "learned again: SOURCE read %.3f× the data set over the job" % (h.source_bytes(s) / total))


def test_what_it_cannot_go_with(t):
    data, mnt = t.data, t.mnt
    for options, words in (("seed=auto,order=torch-random", "not order=torch-random; give seed="),
                           ("seed=auto,ram=0", "seed=auto needs staging on")):
        r = h.run_clairfs([data, mnt, "-o", options])
        h.check(r.returncode == 2 and words in r.stderr and not h.is_mounted(mnt),
                "%s refused: %s" % (options, r.stderr.strip()))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
