"""Helpers shared by the benchmark scripts: waiting for a FUSE mount to appear and taking it down."""
import subprocess
import time


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
