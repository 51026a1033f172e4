"""The shipped Slurm job script on a real Slurm: Debian's slurmctld, slurmd and munged, started here
(tests/mount/cluster.py) with this host as one node of 2 CPUs and Slurm's default MpiDefault=none.

examples/slurm_job.sh is submitted with sbatch --nodes=1 --ntasks-per-node=2, changed only in its three
paths and its training line, which runs tests/mount/job_reader.py: unmodified torchvision ImageFolder
+ DistributedSampler + DataLoader on each task, checking every file's bytes. Then: scancel mid-job, the
time limit, a bad option, the launch line users used to write (srun without --mpi, several tasks on one
node), two daemons that form one MPI world through srun --mpi=pmi2 and serve each other, and the
shipped prolog/epilog pair (examples/slurm_prolog.sh, slurm_epilog.sh: the mount made before the job,
examples/train.py reading it, a wrong option told to the job). After each job no clairfs mount, daemon
or cache folder may stay."""
import contextlib
import os
import re
import shutil
import threading
import time

import harness as h
import pytest
from cluster import SlowSource, SlurmCluster, have, leftovers, read_in_step, wait_clean

if not have("slurmctld", "slurmd", "munged", "sbatch"):
    pytest.skip("Slurm (slurm-wlm, munge) is not installed; scripts/install-deps installs it", allow_module_level=True)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
READER = os.path.join(HERE, "job_reader.py")
FILES = 600


def job_script(tmp, data, nvme, reader_args, opts_extra=""):
    """examples/slurm_job.sh with its paths and training line replaced (and, for the bad-option case,
    one more option)."""
    with open(os.path.join(ROOT, "examples", "slurm_job.sh")) as f:
        text = f.read()
    text, n1 = re.subn(r"(?m)^DATA=.*$", "DATA=" + data, text)
    text, n2 = re.subn(r"(?m)^MNT=.*$", "MNT=%s/mnt-$SLURM_JOB_ID" % tmp, text)
    text, n3 = re.subn(r"(?m)^NVME=.*$", "NVME=" + nvme, text)
    text, n4 = re.subn(r"(?m)^srun python train\.py.*$",
                       "srun /usr/bin/python3 %s --data \"$MNT\" --digests %s/digests.json %s" % (READER, tmp, reader_args), text)
    assert (n1, n2, n3, n4) == (1, 1, 1, 1), "examples/slurm_job.sh changed shape: %s" % ((n1, n2, n3, n4),)
    if opts_extra:
        text = text.replace('OPTS="$OPTS,nvme=', 'OPTS="$OPTS,%s,nvme=' % opts_extra)
    path = "%s/job-%d.sh" % (tmp, time.monotonic_ns())
    with open(path, "w") as f:
        f.write(text)
    return path


def submit(slurm, tmp, script, *sbatch_args, wait=False):
    out = tmp + "/out-%j.txt"
    r = slurm.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--output=" + out]
                  + (["--wait"] if wait else []) + list(sbatch_args) + [script], timeout=600)
    job = r.stdout.strip().split(";")[0]
    return job, r


def output(tmp, job):
    try:
        with open("%s/out-%s.txt" % (tmp, job), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def make_images(root, classes, per_class):
    """An ImageFolder tree of real PNGs (train.py decodes them)."""
    from PIL import Image
    for c in range(classes):
        os.makedirs("%s/class%d" % (root, c))
        for i in range(per_class):
            Image.new("RGB", (24, 24), (40 * c, 5 * i, 100)).save("%s/class%d/%03d.png" % (root, c, i))


def prolog_job(tmp, name):
    """examples/slurm_prolog_job.sh for this one node: its training line runs examples/train.py, and it
    says what it found first (the mount, its planned ranks)."""
    with open(os.path.join(ROOT, "examples", "slurm_prolog_job.sh")) as f:
        text = f.read()
    text, n = re.subn(r"(?m)^srun python3 train\.py.*$",
                      'echo "mounted before the job: $(grep -o " $MNT fuse" /proc/mounts | cut -d" " -f2)"\n'
                      'echo "ranks $(/usr/bin/python3 -c \'import json,sys; print("-".join(str(r["rank"]) for r in '
                      'json.load(open(sys.argv[1]))["ranks"]))\' "$MNT/.clairfs/stats" 2>&1) served"\n'
                      "srun /usr/bin/python3 %s/examples/train.py --data \"$MNT\" --seed 42 --batch-size 4 "
                      "--workers 2 --epochs 2" % ROOT, text)
    assert n == 1, "examples/slurm_prolog_job.sh changed shape"
    path = "%s/%s.sh" % (tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False
class Site:
    """A Slurm of one node started for the file (4 CPUs on this 2-core host), with what a site installs: on
    PATH clairfs and the two helpers (this build's); the shipped prolog and epilog, told where clairfs is
    (Slurm gives them no PATH of the test's) — every job runs them, those without the comment left alone.
    600 files in SOURCE. The time-limit job (which waits out its minute, reading slowly) is submitted first
    and runs beside the others, in folders of its own so that their checks of what is left do not see it;
    once it is mounted its end is brought forward (Slurm ends it at its next look at time limits, every
    30 s, as when its minute runs out)."""

    def __init__(self, tmp, apart, stack):
        self.tmp, self.apart = tmp, apart
        self.data, self.nvme, self.bin_dir = data, nvme, bin_dir = tmp + "/data", tmp + "/nvme", tmp + "/bin"
        self.want, self.total = h.dataset(data, FILES, 6, 8, 11)
        h.write_digests(tmp + "/digests.json", self.want)
        os.makedirs(nvme)
        os.makedirs(bin_dir)
        for src in (h.CLAIRFS, ROOT + "/scripts/clairfs-job-mount", ROOT + "/scripts/clairfs-job-umount"):
            os.symlink(os.path.abspath(src), os.path.join(bin_dir, os.path.basename(src)))
        for name in ("prolog", "epilog"):
            with open("%s/%s.sh" % (tmp, name), "w") as f:
                f.write("#!/bin/sh\nCLAIRFS=%s exec %s/examples/slurm_%s.sh\n" % (os.path.abspath(h.CLAIRFS), ROOT, name))
            os.chmod("%s/%s.sh" % (tmp, name), 0o755)
        self.slurm = slurm = stack.enter_context(SlurmCluster(tmp + "/slurm", [
            "Prolog=%s/prolog.sh" % tmp, "Epilog=%s/epilog.sh" % tmp, "PrologFlags=Alloc"], cpus=4))
        slurm.env["PATH"] = bin_dir + ":" + slurm.env["PATH"]

        shutil.copytree(data, apart + "/data")
        shutil.copytree(bin_dir, apart + "/bin", symlinks=True)  # (its daemon's command line names nothing of tmp)
        shutil.copy(tmp + "/digests.json", apart + "/digests.json")
        os.makedirs(apart + "/nvme")
        script = job_script(apart, apart + "/data", apart + "/nvme", "--epochs 1000 --batch-size 8 --sleep-per-batch 0.5")
        with open(script) as f:
            first, rest = f.read().split("\n", 1)
        with open(script, "w") as f:
            f.write("%s\nexport PATH=%s/bin:$PATH\n%s" % (first, apart, rest))
        self.limited, _ = submit(slurm, apart, script, "--time=1")
        self.ended = None
        self.ender = threading.Thread(target=self.end_the_limited_job)
        self.ender.start()

    def end_the_limited_job(self):
        wait_for(lambda: "all 1 nodes mounted" in output(self.apart, self.limited), 120)
        self.ended = self.slurm.run(["scontrol", "update", "JobId=" + self.limited,
                                     "EndTime=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 1))])


@pytest.fixture(scope="module")
def s():
    with h.tempdir() as tmp, h.tempdir() as apart, contextlib.ExitStack() as stack:
        s = Site(tmp, apart, stack)
        try:
            yield s
        finally:
            s.ender.join()


def test_the_shipped_job(s):
    # It completes, every task reads every file of its share right, SOURCE is read about once, nothing
    # stays.
    slurm, tmp, data, nvme, total = s.slurm, s.tmp, s.data, s.nvme, s.total
    t0 = time.monotonic()
    job, r = submit(slurm, tmp, job_script(tmp, data, nvme, "--epochs 2"), wait=True)
    took = time.monotonic() - t0
    out = output(tmp, job)
    epochs = re.findall(r"rank (\d) epoch (\d): (\d+) files, (\d+) wrong", out)
    traffic = [int(x) for x in re.findall(r"source_traffic (\d+) bytes", out)]  # one line per node
    h.check(r.returncode == 0 and slurm.job_state(job) == "COMPLETED",
            "the shipped job script completed under sbatch --nodes=1 --ntasks-per-node=2 in %.1f s (exit %d)%s"
            % (took, r.returncode, "" if r.returncode == 0 else ": " + out[-1500:] + slurm.log_tail()))
    h.check("all 1 nodes mounted" in out, "clairfs-job-mount: one daemon on the one node, mounted")
    h.check(len(epochs) == 4 and all(int(n) == FILES // 2 and w == "0" for _, _, n, w in epochs),
            "2 ranks × 2 epochs through torchvision: every file right %s" % epochs)
    h.check(len(traffic) == 1 and traffic[0] / total <= 1.05,
            "SOURCE read %.3f× the data set over 2 epochs" % (traffic[0] / total if traffic else -1))
    h.check("clairfs-job-umount:" not in out, "clairfs-job-umount found nothing to report")
    left = wait_clean(tmp, [nvme], timeout=10)
    h.check(not left, "nothing left after the job: %s" % left)


def test_scancel_mid_job(s):
    # Every daemon gets SIGTERM from Slurm and cleans up by itself.
    slurm, tmp, data, nvme = s.slurm, s.tmp, s.data, s.nvme
    job, r = submit(slurm, tmp, job_script(tmp, data, nvme, "--epochs 50 --batch-size 8 --sleep-per-batch 0.5"))
    mounted = wait_for(lambda: "all 1 nodes mounted" in output(tmp, job) and "epoch" not in output(tmp, job)
                       and any(l.startswith("mount ") for l in leftovers(tmp)), 120)
    time.sleep(2)  # reading
    slurm.run(["scancel", job])
    state = slurm.wait_done(job, 60)
    left = wait_clean(tmp, [nvme], timeout=20)
    h.check(mounted and state == "CANCELLED" and not left,
            "scancel mid-job: %s, nothing left %s" % (state, left))


def test_a_bad_option(s):
    # The job fails at once, with clairfs's line naming it.
    slurm, tmp, data, nvme = s.slurm, s.tmp, s.data, s.nvme
    job, r = submit(slurm, tmp, job_script(tmp, data, nvme, "--epochs 1", opts_extra="bogus_option=1"), wait=True)
    out = output(tmp, job)
    left = wait_clean(tmp, [nvme], timeout=20)
    h.check(r.returncode != 0 and "bogus_option" in out and "clairfs-job-mount:" in out and "epoch" not in out
            and not left, "a bad option: the job fails before training (exit %d), nothing left %s: %s"
            % (r.returncode, left, [l for l in out.splitlines() if "bogus" in l][:2]))


def test_srun_without_mpi(s):
    # The launch line users used to write: srun with several daemon tasks and no --mpi. Each task refuses
    # with one line naming --mpi=pmi2; nothing is mounted.
    slurm, tmp, data, nvme = s.slurm, s.tmp, s.data, s.nvme
    script = tmp + "/singleton.sh"
    os.makedirs(tmp + "/mnt-single")
    with open(script, "w") as f:
        f.write("#!/bin/bash\nsrun --overlap -n 2 clairfs %s %s/mnt-single -o seed=42,batch_size=8,world_size=2,"
                "ranks_per_node=1\necho srun-exit=$?\n" % (data, tmp))
    job, r = submit(slurm, tmp, script, wait=True)
    out = output(tmp, job)
    h.check(out.count("--mpi=pmi2") == 2 and "srun-exit=0" not in out and not leftovers(tmp, [nvme]),
            "two daemon tasks without --mpi: both refuse, naming --mpi=pmi2: %s" % out.strip().splitlines()[:1])


def test_two_daemons_under_srun_mpi_pmi2(s):
    slurm, tmp, data, want, total = s.slurm, s.tmp, s.data, s.want, s.total
    # Two daemons under srun --mpi=pmi2 form one MPI world (one host plays two nodes: srun's
    # --multi-prog gives each its own mount point and cache): they fetch from each other, and at the
    # job's end clairfs-job-umount stops the step with scancel --signal=TERM, leaving nothing.
    # SOURCE slower than a peer, as a parallel file system is (bench/slowfs in front of the data).
    slow = SlowSource(data, tmp + "/slow")
    mnts = ["%s/mnt-pmi%d" % (tmp, n) for n in range(2)]
    nvmes = ["%s/nvme-pmi%d" % (tmp, n) for n in range(2)]
    for d in mnts + nvmes:
        os.makedirs(d)
    with open(tmp + "/multi.conf", "w") as f:
        for n in range(2):
            f.write("%d clairfs %s %s -o seed=7,batch_size=8,world_size=2,ranks=%d,epochs=2,ram=%d,nvme=%s,"
                    "nvme_size=%d\n" % (n, slow.mnt, mnts[n], n, int(total * 0.2), nvmes[n], int(total * 0.6)))
    flag = tmp + "/training-done"
    with open(tmp + "/pmi2.sh", "w") as f:
        f.write("#!/bin/bash\nset -euo pipefail\n"
                "clairfs-job-mount -- srun -n 2 --overlap --mpi=pmi2 --kill-on-bad-exit=0 --multi-prog %s/multi.conf\n"
                "trap clairfs-job-umount EXIT\n"
                "while [ ! -e %s ]; do sleep 0.2; done  # training, played by the test\n" % (tmp, flag))
    job, r = submit(slurm, tmp, tmp + "/pmi2.sh")
    up = wait_for(lambda: "all 2 nodes mounted" in output(tmp, job), 120)
    h.check(up, "two daemons under srun --mpi=pmi2: %s" % output(tmp, job).strip()[-300:])
    if up:
        threads, wrong, opened, errors = read_in_step(mnts, want, 2)
        for t in threads:
            t.join(timeout=300)
        s = [h.stats(m) for m in mnts]
        fetched = [x["peers"]["staged_files"] + x["peers"]["demand_files"] for x in s]
        traffic = sum(x["source_traffic"]["bytes"] for x in s) / total
        h.check(not errors and sum(wrong) == 0 and all(f > 0 for f in fetched) and traffic <= 1.05,
                "2 ranks × 2 epochs, every byte right; fetched from each other %s; SOURCE %.3f×" % (fetched, traffic))
    open(flag, "w").close()
    state = slurm.wait_done(job, 120)
    left = wait_clean(tmp, nvmes, timeout=20)
    out = output(tmp, job)
    h.check(state == "COMPLETED" and "clairfs-job-umount:" not in out and not left,
            "the job ended, clairfs-job-umount stopped both daemons cleanly: %s, nothing left %s %s" % (
                state, left, out.strip()[-300:]))
    slow.close()


@pytest.mark.parametrize("name", ["prolog-job", "prolog-bad"])
def test_the_prolog_and_epilog(s, name):
    slurm, tmp = s.slurm, s.tmp
    # A job whose comment asks for clairfs finds its mount made before it started (ranks_per_node=2 made
    # ranks=0-1 on this node), runs the shipped train.py (real PNGs decoded) through it, and after it
    # nothing is left; a wrong option in the comment reaches the job as one line in .../error and leaves
    # the node up.
    images = tmp + "/images"
    if not os.path.exists(images):
        make_images(images, 3, 20)
    comment = {"prolog-job": "clairfs:%s:seed=42,batch_size=4,workers=2,world_size=2,ranks_per_node=2,epochs=2",
               "prolog-bad": "clairfs:%s:seed=42,bogus_option=1"}[name] % images
    script = prolog_job(tmp, name)
    job, r = submit(slurm, tmp, script, "--comment=" + comment, wait=True)
    out = output(tmp, job)
    where = "/run/clairfs-jobs/" + job
    gone = wait_for(lambda: not os.path.exists(where), 20)
    left = leftovers(tmp)
    node = slurm.run(["sinfo", "-h", "-o", "%t"]).stdout.strip()
    if name == "prolog-job":
        epochs = re.findall(r"rank (\d)/2 epoch (\d): (\d+) samples", out)
        h.check(r.returncode == 0 and "mounted before the job: " + where + "/mnt" in out
                and sorted(epochs) == [(str(k), str(e), "30") for k in range(2) for e in range(2)]
                and "ranks 0-1 served" in out and gone and not left,
                "the prolog mounted before the job, train.py read 2 ranks × 2 epochs through it, the epilog "
                "removed it: exit %d, epochs %s, %s gone %s, nothing left %s%s" % (
                    r.returncode, epochs, where, gone, left, "" if r.returncode == 0 else ": " + out[-800:]))
    else:
        h.check(r.returncode != 0 and "clairfs prolog on" in out and "bogus_option" in out and gone
                # (mix: the time-limit job runs; plnd: idle, and the backfill scheduler planned
                # it for a job waiting — the time-limit job, once in CI)
                and not left and node in ("idle", "mix", "plnd"),
                "a wrong option in the comment: the job is told (%s), the node stays up (%s), nothing left %s"
                % ([l for l in out.splitlines() if "bogus" in l][:1], node, left))


def test_the_time_limit(s):
    # Hit mid-job: as scancel, from Slurm's own SIGTERM.
    slurm, apart, limited = s.slurm, s.apart, s.limited
    s.ender.join()
    ended = s.ended
    state = slurm.wait_done(limited, 240)
    left = wait_clean(apart, [apart + "/nvme"], timeout=20)
    h.check("all 1 nodes mounted" in output(apart, limited) and state == "TIMEOUT" and not left,
            "time limit hit mid-job: %s, nothing left %s %s" % (
                state, left, ended.stderr.strip() if ended else "(never mounted: its end not brought forward)"))


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
