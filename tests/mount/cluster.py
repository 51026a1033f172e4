"""A real cluster on one machine, for the tests that run clairfs the way a site does.

SlurmCluster starts Debian's munged, slurmctld and slurmd (no systemd: each as a plain daemon with its
files in a temporary folder and ports of its own) with this host as one node of 2 CPUs (or more, told), Slurm's default
MpiDefault=none, no accounting, ProctrackType=proctrack/linuxproc and TaskPlugin=task/none; `env`
gives what the Slurm commands need (SLURM_CONF). Everything it started is stopped on exit.

NetnsHosts makes several hosts of one machine, joined by a bridge (real TCP between them). SlowSource
puts bench/slowfs (a slow parallel file system's stand-in that counts what it serves) in front of SOURCE.
read_in_step plays one training rank per node, the ranks in step as DDP keeps them. leftovers() says
what clairfs left on this host below a folder: mounts, daemons, cache folders.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import harness as h


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
    def __init__(self, where, extra=(), cpus=2):
        """`extra`: more slurm.conf lines (Prolog=..., say). `cpus`: the CPUs the node offers; more than the
        host's lets jobs that mostly wait run side by side (slurmd takes the configured count)."""
        self.dir = where
        self.extra = list(extra) + (["SlurmdParameters=config_overrides"] if cpus > 2 else [])
        self.cpus = cpus
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
                "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN" % (self.host, self.cpus),
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"] + self.extra + [""]))
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
    found += ["daemon %d" % pid for pid in h.live_processes(
        lambda argv: os.path.basename(argv[0]) == b"clairfs" and any(below.encode() in a for a in argv))]
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


SLOWFS = os.path.join(os.environ.get("CLAIRFS_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build")),
                      "bench", "slowfs")


class SlowSource:
    """SOURCE behind bench/slowfs: 1 ms per open, 200 MB/s unless told; counts what it served."""

    def __init__(self, data, where, open_ms=1, mb_per_s=200):
        self.mnt, self.stats_file = where, where + ".json"
        os.makedirs(where, exist_ok=True)
        self.proc = subprocess.Popen([SLOWFS, data, where, "--open-latency-ms", str(open_ms), "--bandwidth-mbps", str(mb_per_s),
                                      "--max-inflight", "16", "--stats", self.stats_file],
                                     stdout=subprocess.PIPE, text=True)
        self.proc.stdout.readline()
        deadline = time.monotonic() + 10
        while not h.is_mounted(where) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self):
        subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)
        self.proc.wait(timeout=20)
        with open(self.stats_file) as f:
            return json.load(f)


def read_in_step(mnts, want, epochs, kill_at=None, victim=None, limit=None, first=0, slowest=None, drop_pages=False):
    """One reader per node reads its rank's order (node n plays rank n) for epochs first .. epochs-1, the
    first `limit` files of each if given, all ranks in step as DDP keeps them (a barrier per epoch). The
    victim's reader stops at epoch `kill_at`. Returns the threads (started) and per-node lists wrong,
    opened, and the errors met; `slowest`, a list, gets per node the longest one file took (s). With
    `drop_pages`, each file's pages are dropped once it is read, as on a node whose memory its job takes
    (the hosts here share one page cache, which would keep what the nodes' budgets do not)."""
    nodes = len(mnts)
    barrier = threading.Barrier(nodes if victim is None else nodes - 1)
    wrong, opened, errors = [0] * nodes, [0] * nodes, []
    base = [0] * nodes  # each node's opens heard before
    if slowest is not None:
        slowest[:] = [0.0] * nodes

    def heard(n):
        """Waits (5 s at most) until node n's watch has told its engine of every open its reader made: the
        kernel merges a thread's open into its queued open of the same file (fanotify), so one reading
        the end of an epoch and the start of the next while the watch runs behind could be heard to open
        a file once where it opened it twice. (A DataLoader's workers are new processes each epoch.)"""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                p = h.stats(mnts[n])["progress"]
            except (OSError, ValueError):  # a node killed by the test
                return
            if p["from"] != "watched opens" or p["opens_seen"] - base[n] >= opened[n]:
                return
            time.sleep(0.01)

    def reader(n):
        try:
            base[n] = h.stats(mnts[n])["progress"].get("opens_seen", 0)
        except (OSError, ValueError):  # a node killed by the test
            pass
        try:
            for e in range(first, epochs):
                if e == kill_at and n == victim:
                    return
                with open("%s/.clairfs/order/epoch-%d/rank-%d" % (mnts[n], e, n)) as f:
                    rels = f.read().splitlines()[:limit]
                for rel in rels:
                    time.sleep(0.0005)  # a little compute
                    t0 = time.monotonic()
                    wrong[n] += h.digest(os.path.join(mnts[n], rel)) != want[rel]
                    if drop_pages:
                        h.forget_pages(mnts[n], [rel])
                    if slowest is not None:
                        slowest[n] = max(slowest[n], time.monotonic() - t0)
                    opened[n] += 1
                heard(n)
                if victim is None or n != victim:
                    barrier.wait(timeout=120)
        except Exception as ex:  # noqa: BLE001
            errors.append("node %d: %r" % (n, ex))

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(nodes)]
    for t in threads:
        t.start()
    return threads, wrong, opened, errors


class NetnsHosts:
    """`n` hosts on one machine: a network namespace each (its own eth0 and address 10.77.0.i/24, sending
    through `tc tbf` at `rate`), joined by a bridge in a namespace of its own, which also runs mpiexec.
    By default only the network is separate: every host sees the same files and mounts, so the test reads
    each node's mount from here. With `private_dir`, each host also has its own mount namespace, where
    that folder is a tmpfs of its own (node-local storage: /tmp, the NVMe disk), and its own host name
    (host1, host2, ...); `run(i, argv)` runs a command on host i. `mpiexec()` gives the launcher's words:
    hydra starting its proxies through an ssh stand-in that enters the host's namespaces (nsenter)."""

    made = 0  # sets of hosts made by this process: each gets names of its own

    def __init__(self, n, where, rate="400mbit", private_dir=None):
        self.n, self.dir, self.rate, self.private_dir = n, where, rate, private_dir
        self.ns_dir = os.path.join(where, "host-namespaces-%d" % (NetnsHosts.made + 1))
        NetnsHosts.made += 1
        tag = "cfs%d-%d" % (os.getpid(), NetnsHosts.made)
        self.switch = tag + "sw"
        self.names = ["%sh%d" % (tag, i + 1) for i in range(n)]
        self.addrs = ["10.77.0.%d" % (i + 1) for i in range(n)]

    def _ip(self, *args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=30)

    def __enter__(self):
        try:
            self._ip("netns", "add", self.switch)
            self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.switch, "addr", "add", "10.77.0.254/24", "dev", "br0")
            for dev in ("br0", "lo"):
                self._ip("-n", self.switch, "link", "set", dev, "up")
            for i, (ns, addr) in enumerate(zip(self.names, self.addrs)):
                self._ip("netns", "add", ns)
                self._ip("link", "add", "veth%d" % i, "netns", ns, "type", "veth", "peer", "name", "port%d" % i,
                         "netns", self.switch)
                self._ip("-n", ns, "link", "set", "veth%d" % i, "name", "eth0")
                self._ip("-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
                for dev in ("eth0", "lo"):
                    self._ip("-n", ns, "link", "set", dev, "up")
                self._ip("-n", self.switch, "link", "set", "port%d" % i, "master", "br0")
                self._ip("-n", self.switch, "link", "set", "port%d" % i, "up")
                subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", self.rate,
                                "burst", "256kb", "latency", "50ms"], check=True, capture_output=True, timeout=30)
            if self.private_dir:
                self._make_private_hosts()
        except Exception:
            self.__exit__(None, None, None)
            raise
        self.hosts_file = os.path.join(self.dir, "netns-hosts")
        with open(self.hosts_file, "w") as f:
            f.writelines("%s %s\n" % pair for pair in zip(self.addrs, self.names))
        self.ssh = os.path.join(self.dir, "netns-ssh")
        with open(self.ssh, "w") as f:
            f.write("#!/bin/bash\n"
                    "# ssh for hydra: runs the command in the network namespace that holds the host's address.\n"
                    "while [[ \"$1\" == -* ]]; do shift; done\n"
                    "ns=\"$(awk -v h=\"$1\" '$1 == h { print $2 }' %s)\"; shift\n"
                    "[[ -n \"$ns\" ]] || { echo \"netns-ssh: unknown host\" >&2; exit 255; }\n"
                    "exec nsenter --net=/run/netns/\"$ns\" %s /bin/sh -c \"$*\"\n" % (
                        self.hosts_file, self._enter_private('"$ns"')))
        os.chmod(self.ssh, 0o755)
        return self

    def _make_private_hosts(self):
        # unshare --mount=FILE keeps a namespace alive at FILE, which must sit on a private mount.
        os.makedirs(self.ns_dir)
        subprocess.run(["mount", "--bind", self.ns_dir, self.ns_dir], check=True, timeout=30)
        subprocess.run(["mount", "--make-private", self.ns_dir], check=True, timeout=30)
        os.makedirs(self.private_dir, exist_ok=True)
        for i, ns in enumerate(self.names):
            for kind in ("mnt", "uts"):
                open(os.path.join(self.ns_dir, "%s.%s" % (ns, kind)), "w").close()
            subprocess.run(["unshare", "--mount=%s/%s.mnt" % (self.ns_dir, ns), "--uts=%s/%s.uts" % (self.ns_dir, ns),
                            "--propagation", "slave", "sh", "-c",
                            "hostname host%d && mount -t tmpfs -o size=256m tmpfs %s" % (i + 1, self.private_dir)],
                           check=True, timeout=30)

    def _enter_private(self, ns):
        if not self.private_dir:
            return ""
        return "--mount=%s/%s.mnt --uts=%s/%s.uts" % (self.ns_dir, ns, self.ns_dir, ns)

    def run(self, i, argv, timeout=60):
        """Runs argv on host i (its network, and its files if private), as the ssh stand-in would."""
        enter = ["nsenter", "--net=/run/netns/" + self.names[i]] + self._enter_private(self.names[i]).split()
        return subprocess.run(enter + list(argv), capture_output=True, text=True, timeout=timeout)

    def leftovers(self, i, below, nvme_dirs=()):
        """What clairfs left on host i (private files): mounts below `below`, cache folders in nvme_dirs."""
        found = []
        for line in self.run(i, ["cat", "/proc/self/mounts"]).stdout.splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "fuse.clairfs" and parts[1].startswith(below):
                found.append("host%d: mount %s" % (i + 1, parts[1]))
        for d in nvme_dirs:
            names = self.run(i, ["ls", "-A", d]).stdout.split()
            found += ["host%d: cache folder %s/%s" % (i + 1, d, n) for n in names if n.startswith("clairfs-cache.")]
        return found

    def __exit__(self, *exc):
        for ns in self.names + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.private_dir and os.path.isdir(self.ns_dir):
            for ns in self.names:
                for kind in ("mnt", "uts"):
                    subprocess.run(["umount", "%s/%s.%s" % (self.ns_dir, ns, kind)], capture_output=True, timeout=30)
            subprocess.run(["umount", self.ns_dir], capture_output=True, timeout=30)

    def mpiexec(self):
        return ["nsenter", "--net=/run/netns/" + self.switch, "mpiexec", "-disable-auto-cleanup", "-launcher", "ssh",
                "-launcher-exec", self.ssh, "-iface", "br0", "-hosts", ",".join(self.addrs), "-ppn", "1"]

    def sent_bytes(self, i):
        """Bytes host i has sent through its eth0 (tc's count)."""
        r = subprocess.run(["tc", "-n", self.names[i], "-s", "qdisc", "show", "dev", "eth0"], capture_output=True,
                           text=True, timeout=30)
        words = r.stdout.split()
        return int(words[words.index("Sent") + 1]) if "Sent" in words else 0

    def peer_connections(self, i):
        """TCP connections host i holds to the other hosts (not to mpiexec's side of the bridge)."""
        r = subprocess.run(["nsenter", "--net=/run/netns/" + self.names[i], "ss", "-Htn", "state", "established"],
                           capture_output=True, text=True, timeout=30)
        others = set(self.addrs) - {self.addrs[i]}
        return sum(1 for line in r.stdout.splitlines() if any(" %s:" % a in " " + line for a in others))
