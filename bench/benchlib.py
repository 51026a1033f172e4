"""Helpers shared by the benchmark scripts: generated data sets kept between runs, waiting for a FUSE
mount to appear and taking it down, the peak memory of the daemon serving a mount, the slow-source
stand-in (bench/slowfs) mounted over a data set."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cached_dataset(path, *args):
    """Makes the tree at `path` with bench/make_dataset.py and `args`, unless a finished one is there
    already (a marker file is written last, so an interrupted run is made again)."""
    if os.path.exists(path + "/.complete"):
        return
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, HERE + "/make_dataset.py", path] + [str(a) for a in args], check=True,
                   stdout=subprocess.DEVNULL)
    open(path + "/.complete", "w").close()


def wait_mounted(mnt, timeout=30):
    """Returns once `mnt` is in /proc/self/mounts; exits the benchmark if it does not appear in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/self/mounts") as f:
            if any(line.split()[1] == mnt for line in f):
                return
        time.sleep(0.02)
    raise SystemExit("benchmark: %s did not mount" % mnt)


def unmount(mnt, proc=None, lazy=False):
    """Unmounts `mnt`, waits for its server process if given, and lets the kernel settle."""
    subprocess.run(["fusermount3", "-u"] + (["-z"] if lazy else []) + [mnt], check=not lazy,
                   stderr=subprocess.DEVNULL if lazy else None)
    if proc:
        proc.wait(timeout=60)
    time.sleep(0.2)


def daemon_pid(mnt):
    """The pid of the clairfs daemon serving `mnt` (a program named clairfs... with `mnt` among its
    arguments), or None if there is none."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(args[0]).startswith(b"clairfs") and mnt.encode() in args:
            return int(pid)
    return None


def daemon_peak(mnt):
    """Peak resident memory (VmHWM) of the clairfs daemon serving `mnt`, in bytes, or 0 if there is none."""
    pid = daemon_pid(mnt)
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        pass
    return 0


def cpu_seconds(pid):
    """CPU time (user and system) process `pid` has taken so far, all its threads (io_uring's workers
    among them) and those that ended."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SlowSource:
    """A fresh slowfs mount of the data set; stats() after close() gives what it served."""

    def __init__(self, build, data, work, p):
        self.mnt = tempfile.mkdtemp(prefix="slow-", dir=work)
        self.stats_file = self.mnt + ".json"
        self.proc = subprocess.Popen(
            [build + "/bench/slowfs", data, self.mnt, "--open-latency-ms", str(p.latency_ms), "--bandwidth-mbps",
             str(p.bandwidth_mbps), "--max-inflight", str(p.inflight), "--stats", self.stats_file],
            stdout=subprocess.PIPE, text=True)
        self.proc.stdout.readline()
        wait_mounted(self.mnt)

    def close(self):
        unmount(self.mnt, self.proc, lazy=True)
        with open(self.stats_file) as f:
            return json.load(f)


def write_section(out_dir, name, command, text):
    """Puts `command` (as a code block) and `text` between the markers <!-- NAME:begin --> and
    <!-- NAME:end --> of OUT_DIR/benchmarks.md, if it has them."""
    doc = os.path.join(out_dir, "benchmarks.md")
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    content = open(doc).read() if os.path.exists(doc) else ""
    if begin not in content or end not in content:
        return
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(doc, "w") as f:
        f.write(head + begin + "\n```\n" + command + "\n```\n\n" + text + "\n" + end + tail)
