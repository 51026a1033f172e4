"""A real cluster on one machine, for the tests that run clairfs the way a site does.

SlurmCluster starts Debian's munged, slurmctld and slurmd (no systemd: each as a plain daemon with its
files in a temporary folder and ports of its own) with this host as one node of 2 CPUs, Slurm's default
MpiDefault=none, no accounting, ProctrackType=proctrack/linuxproc and TaskPlugin=task/none; `env`
gives what the Slurm commands need (SLURM_CONF). Everything it started is stopped on exit.

leftovers() says what clairfs left on this host below a folder: mounts, daemons, cache folders.
"""
import os
import shutil
import signal
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def have(*programs):
    return all(shutil.which(p) for p in programs)


def _pid(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop(pid, timeout=10):
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class SlurmCluster:
    def __init__(self, where):
        self.dir = where
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(where, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def __enter__(self):
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(d, sub), mode=0o700, exist_ok=True)
        key = os.path.join(d, "munge", "key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(d, "munge", "socket")
        subprocess.run(["munged", "--force", "--key-file=" + key, "--socket=" + self.munge_socket,
                        "--pid-file=" + os.path.join(d, "munge", "pid"),
                        "--log-file=" + os.path.join(d, "munge", "log"),
                        "--seed-file=" + os.path.join(d, "munge", "seed")], check=True, timeout=30)
        with open(self.conf, "w") as f:
            f.write("\n".join([
                "ClusterName=clairfs-test",
                "SlurmctldHost=%s(127.0.0.1)" % self.host,
                "SlurmctldPort=%d" % free_port(),
                "SlurmdPort=%d" % free_port(),
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "AuthInfo=socket=" + self.munge_socket,
                "CredType=cred/munge",
                "StateSaveLocation=" + os.path.join(d, "state"),
                "SlurmdSpoolDir=" + os.path.join(d, "spool"),
                "SlurmctldPidFile=" + os.path.join(d, "slurmctld.pid"),
                "SlurmdPidFile=" + os.path.join(d, "slurmd.pid"),
                "SlurmctldLogFile=" + os.path.join(d, "log", "slurmctld.log"),
                "SlurmdLogFile=" + os.path.join(d, "log", "slurmd.log"),
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "MpiDefault=none",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "MinJobAge=600",
                "NodeName=%s NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN" % self.host,
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                ""]))
        subprocess.run(["slurmctld", "-c", "-f", self.conf], check=True, env=self.env, timeout=30)
        subprocess.run(["slurmd", "-f", self.conf], check=True, env=self.env, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = self.run(["sinfo", "-h", "-o", "%t"])
            if r.stdout.strip() == "idle":
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError("slurmd did not come up: %s" % self.log_tail())

    def __exit__(self, *exc):
        self.run(["scancel", "--full", "--user=root"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.run(["squeue", "-h"]).stdout.strip():
            time.sleep(0.5)
        _stop(_pid(os.path.join(self.dir, "slurmd.pid")))
        _stop(_pid(os.path.join(self.dir, "slurmctld.pid")))
        _stop(_pid(os.path.join(self.dir, "munge", "pid")))

    def run(self, argv, timeout=60, **kw):
        return subprocess.run(argv, capture_output=True, text=True, env=kw.pop("env", self.env), timeout=timeout, **kw)

    def job_state(self, job):
        r = self.run(["scontrol", "-o", "show", "job", str(job)])
        for field in r.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return None

    def wait_done(self, job, timeout):
        """Waits until the job has left the running states; returns its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.5)
        return self.job_state(job)

    def log_tail(self, lines=15):
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            try:
                with open(os.path.join(self.dir, "log", name), errors="replace") as f:
                    out.append(name + ": " + " | ".join(f.read().splitlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)


def leftovers(below, nvme_dirs=()):
    """What clairfs left on this host: mounts of type fuse.clairfs whose mount point is below `below`,
    clairfs processes whose command line names something below it, cache folders in `nvme_dirs`."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "fuse.clairfs" and parts[1].startswith(below):
                found.append("mount " + parts[1])
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and argv and os.path.basename(argv[0]) == b"clairfs" and any(below.encode() in a for a in argv):
            found.append("daemon %s" % pid)
    for d in nvme_dirs:
        if os.path.isdir(d):
            found += ["cache folder " + os.path.join(d, n) for n in os.listdir(d) if n.startswith("clairfs-cache.")]
    return found


def wait_clean(below, nvme_dirs=(), timeout=30):
    """leftovers(), after waiting up to `timeout` s for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(below, nvme_dirs)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)
