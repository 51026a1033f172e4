"""fstab-style mounts through mount(8) and mount.fuse3: `mount -T FILE DIR` with an fstab line,
`mount -t fuse.clairfs SRC DIR -o ...`, and the mount.fuse.clairfs helper called as mount(8) calls it."""
import ctypes
import os
import subprocess

import harness as h
import pytest

build = os.environ["CLAIRFS_BUILD"]
env = dict(os.environ)


@pytest.fixture(scope="module", autouse=True)
def private_mounts():
    """mount(8) runs helpers with no PATH, so mount.fuse3's shell finds `clairfs` only in the standard
    directories. Rather than install into the system, this test process moves to a mount namespace of its
    own (private: nothing mounted in it is seen outside), where /usr/local/sbin shows a directory holding
    the built binary."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        pytest.fail("unshare(CLONE_NEWNS): %s" % os.strerror(ctypes.get_errno()))
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    with h.tempdir(prefix="clairfs-bin-") as bindir:
        os.symlink(os.path.abspath(h.CLAIRFS), bindir + "/clairfs")
        subprocess.run(["mount", "--bind", bindir, "/usr/local/sbin"], check=True)
        yield bindir
        subprocess.run(["umount", "/usr/local/sbin"])


@pytest.fixture
def tree():
    """SOURCE (its name with a space, as fstab escapes it) of one file, and a mount point: (tmp, src, mnt)."""
    with h.tempdir() as tmp:
        src, mnt = tmp + "/data set", tmp + "/mnt"
        os.makedirs(src + "/c")
        os.makedirs(mnt)
        with open(src + "/c/a.png", "wb") as f:
            f.write(b"fstab bytes")
        yield tmp, src, mnt


def ok_mount(mnt, what, cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    h.check(r.returncode == 0 and h.is_mounted(mnt), "%s mounts (rc=%d %s)" % (what, r.returncode, r.stderr.strip()))
    if h.is_mounted(mnt):
        h.check(open(mnt + "/c/a.png", "rb").read() == b"fstab bytes", what + ": bytes served")
        with open("/proc/self/mounts") as f:
            line = [l for l in f if os.path.realpath(mnt) in l][0]
        flags = line.split()[3].split(",")
        h.check(" fuse.clairfs ro," in line and "nosuid" in flags and "nodev" in flags,
                what + ": type fuse.clairfs, read-only, nosuid, nodev (%s)" % line.split()[3])
    h.unmount(mnt)


def write_fstab(tmp, src, mnt, options):
    with open(tmp + "/fstab", "w") as f:
        f.write("# an fstab line as a cluster admin writes it\n")
        f.write("%s %s fuse.clairfs %s 0 0\n" % (src.replace(" ", "\\040"), mnt, options))
    return tmp + "/fstab"


def test_mount_t_from_an_fstab_file(tree):
    tmp, src, mnt = tree
    fstab = write_fstab(tmp, src, mnt, "seed=1,batch_size=64,_netdev,nofail")
    ok_mount(mnt, "mount -T FILE DIR", ["mount", "-T", fstab, mnt])
    ok_mount(mnt, "mount -T FILE SOURCE", ["mount", "-T", fstab, src])


def test_mount_t_fuse_clairfs(tree):
    _, src, mnt = tree
    ok_mount(mnt, "mount -t fuse.clairfs", ["mount", "-t", "fuse.clairfs", src, mnt, "-o", "seed=1,batch-size=64"])


def test_the_helper_as_mount8_calls_it(tree):
    _, src, mnt = tree
    helper = os.path.join(build, "mount.fuse.clairfs")
    ok_mount(mnt, "mount.fuse.clairfs helper", ["/bin/sh", helper, src, mnt, "-o", "rw,seed=2,world_size=1,_netdev"])


def test_a_bad_fstab_option_fails_the_mount(tree):
    # With clairfs's own one-line message.
    tmp, src, mnt = tree
    fstab = write_fstab(tmp, src, mnt, "seed=abc,nofail")
    r = subprocess.run(["mount", "-T", fstab, mnt], capture_output=True, text=True, env=env, timeout=60)
    h.check(r.returncode != 0 and "seed=abc" in r.stderr and not h.is_mounted(mnt),
            "a bad fstab option fails the mount, naming it: " + r.stderr.strip())


def test_what_meson_install_puts_in_place(tree, private_mounts):
    # What `meson install` puts in place is what mount(8) uses: install into a staging directory, then
    # (in this private namespace) show its bin directory at /usr/local/bin and its helper in /usr/sbin.
    tmp, src, mnt = tree
    subprocess.run(["umount", "/usr/local/sbin"], check=True)
    try:
        installed_mounts(tmp, src, mnt)
    finally:
        subprocess.run(["umount", "/usr/sbin"], stderr=subprocess.DEVNULL)
        subprocess.run(["umount", "/usr/local/bin"], stderr=subprocess.DEVNULL)
        subprocess.run(["mount", "--bind", private_mounts, "/usr/local/sbin"], check=True)


def installed_mounts(tmp, src, mnt):
    stage = tmp + "/stage"
    r = subprocess.run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", stage],
                       capture_output=True, text=True)
    h.check(r.returncode == 0 and os.access(stage + "/usr/local/bin/clairfs", os.X_OK)
            and os.access(stage + "/sbin/mount.fuse.clairfs", os.X_OK),
            "meson install puts clairfs in bin and mount.fuse.clairfs in /sbin " + r.stderr.strip()[-200:])
    man = stage + "/usr/local/share/man/man1/clairfs.1"
    completion = stage + "/usr/local/share/bash-completion/completions/clairfs"
    h.check(os.path.exists(man) and os.path.exists(completion),
            "meson install puts the man page and bash completion in place")
    r = subprocess.run(["man", "--warnings", "-l", man], capture_output=True, text=True, env=dict(os.environ, MANWIDTH="100"))
    text = r.stdout.replace("\u2010", "-").replace("\u2212", "-")
    h.check(r.returncode == 0 and not r.stderr.strip() and all(w in text for w in ("seed=N|auto", "metrics_file=FILE",
                                                                                  "nosuid", "EXIT STATUS")),
            "man clairfs renders without warnings, the options in it: %s" % r.stderr.strip()[:300])
    subprocess.run(["mount", "--bind", stage + "/usr/local/bin", "/usr/local/bin"], check=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=%s/sbin:/usr/sbin" % stage, "/usr/sbin"],
                   check=True)
    r = subprocess.run(["mount", "-t", "fuse.clairfs", src, mnt, "-o", "seed=5"], capture_output=True, text=True,
                       timeout=60)
    exe = [os.readlink("/proc/%d/exe" % p) for p in h.daemon_pids(mnt)]
    h.check(r.returncode == 0 and exe == ["/usr/local/bin/clairfs"] and
            open(mnt + "/c/a.png", "rb").read() == b"fstab bytes",
            "the installed helper and binary mount it (daemon %s) %s" % (exe, r.stderr.strip()))
    h.unmount(mnt)


def test_the_docs_systemd_unit_verifies():
    # The systemd mount unit docs/mounting.md gives verifies (it once had an ordering cycle).
    with open(os.path.join(os.environ["CLAIRFS_SOURCE_ROOT"], "docs", "mounting.md")) as f:
        doc = f.read()
    unit = doc.split("# /etc/systemd/system/mnt-train.mount\n", 1)[1].split("```", 1)[0]
    with h.tempdir() as tmp:
        with open(tmp + "/mnt-train.mount", "w") as f:
            f.write(unit)
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", tmp + "/mnt-train.mount"], capture_output=True, text=True)
        h.check(r.returncode == 0 and "cycle" not in r.stderr, "systemd-analyze verify passes the docs' unit: %s" % r.stderr.strip()[:300])


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
