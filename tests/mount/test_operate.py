"""What an operator meets: the log (where it goes without syslog, log=FILE, log_level=, timestamps,
repeated lines folded, the daemon's last words), the metrics at .clairfs/metrics and metrics_file=
(checked with python3-prometheus-client's parser against the stats, with `promtool check metrics`, and
through a real node_exporter's textfile collector), and clairfs status naming the log. This machine has
no syslog (/dev/log), as many compute nodes have none.
"""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import harness as h
import pytest
from prometheus_client.parser import text_string_to_metric_families

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z clairfs: ")


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family, sample, **labels):
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def node_exporter(textfile_dir):
    """What a real node_exporter (Debian's) exports with its textfile collector reading `textfile_dir`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    p = subprocess.Popen(["prometheus-node-exporter", "--collector.disable-defaults", "--collector.textfile",
                          "--collector.textfile.directory=" + textfile_dir, "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
                    return r.read().decode()
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    return ""
                time.sleep(0.2)
    finally:
        p.terminate()
        p.wait()


def read_in_two(path, meanwhile):
    """A reader that takes the file in two reads, calling meanwhile() between them (another reader of
    it, who may be given a newer rendering): (text, the size the open file has, its inode)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        first = os.read(fd, 100)
        meanwhile()
        text = first
        while True:
            more = os.read(fd, 1 << 20)
            if not more:
                break
            text += more
        st = os.fstat(fd)
        return text.decode(), st.st_size, st.st_ino
    finally:
        os.close(fd)


def padded(text, parsed):
    """What in a control file's text is padding: lines ending in spaces, strings that begin or end with
    one, runs of spaces inside a line (stats' indentation aside)."""
    found = [line for line in text.splitlines() if line.endswith(" ") or "  " in line.lstrip(" ")]

    def strings(v):
        if isinstance(v, dict):
            return [x for k, w in v.items() for x in [k] + strings(w)]
        return [x for w in v for x in strings(w)] if isinstance(v, list) else [v] if isinstance(v, str) else []
    return found + [v for v in strings(parsed) if v != v.strip(" ")]


def codename():
    with open("/etc/os-release") as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line).get("VERSION_CODENAME", "").strip('"')


def status(mnt):
    return subprocess.run([h.CLAIRFS, "status", mnt], capture_output=True, text=True, timeout=30).stdout
class Tree:
    """200 files in SOURCE and a mount point."""

    def __init__(self, tmp):
        self.tmp, self.data, self.mnt = tmp, tmp + "/data", tmp + "/mnt"
        os.mkdir(self.mnt)
        h.make_dataset(self.data, 200, 4, 8, 5)
        self.files = sorted(os.path.join(r, f) for r, _, fs in os.walk(self.data) for f in fs)
        self.rel = [os.path.relpath(p, self.data) for p in self.files]
        self.have_syslog = os.path.exists("/dev/log")


@pytest.fixture(scope="module")
def t():
    with h.tempdir() as tmp:
        yield Tree(tmp)


def test_the_default_log_without_syslog(t):
    data, mnt, have_syslog = t.data, t.mnt, t.have_syslog
    # No log= on a node without syslog: the documented file, named by status, with the daemon's life.
    # (root's folder, where no other user can make it first; a user's is ~/.local/state/clairfs)
    default = "/var/log/clairfs/%s.log" % mnt.strip("/").replace("/", "-")
    if have_syslog:
        pytest.skip("this node has syslog; the default file is not used")
    if os.path.exists(default):
        os.unlink(default)
    with h.mounted(data, mnt, "seed=1,ram=16M"):
        text = status(mnt)
        h.check("log           " + default in text, "status names the log: %s" % text.splitlines()[-1:])
    got = lines(default) if os.path.exists(default) else []
    h.check(any("clairfs: mounted %s at %s" % (data, mnt) in l for l in got) and all(STAMP.match(l) for l in got)
            and got and got[-1].endswith("the mount ended; the daemon exits"),
            "no syslog: %s holds the daemon's life, timestamped: %s" % (default, got[:1] + got[-1:]))
    if os.path.exists(default):
        os.unlink(default)


def test_a_log_file_and_a_changed_file(t):
    tmp, data, mnt, files, rel = t.tmp, t.data, t.mnt, t.files, t.rel
    # log=FILE; a file changed in SOURCE read five times: one warning and a count; the last words after
    # SIGTERM. A plain mount (ram=0): every read goes to SOURCE, where the change shows.
    log = tmp + "/clairfs.log"
    changed = files[3]
    with h.mounted(data, mnt, "seed=1,ram=0,log=" + log):
        # (The mount is up before the files' attributes are read: changed before, it is the file the mount
        # found. Beside another test file, the fill came after the change once.)
        read = h.attributes_read(mnt)
        with open(changed, "ab") as f:
            f.write(b"more")  # its size no longer matches the scan: reads fail (EIO), each with the same warning
        eio = [h.expect_errno(lambda: open(os.path.join(mnt, rel[3]), "rb").read(), 5) for _ in range(5)]
        h.check(read and all(eio), "a changed file reads EIO, five times (attributes read first: %s)" % read)
        for p in h.daemon_pids(mnt):
            os.kill(p, signal.SIGTERM)
        h.wait_until(lambda: not h.is_mounted(mnt), timeout=10, step=0.1)
    got = lines(log)
    warned = [l for l in got if rel[3] in l]
    h.check(len(warned) == 1 and any("the last line came 4 more times" in l for l in got),
            "the same warning five times: written once, then counted: %s" % [l[25:] for l in got])
    h.check(all(STAMP.match(l) for l in got) and any("stopped by SIGTERM" in l for l in got)
            and got[-1].endswith("the mount ended; the daemon exits"), "the last words name the signal: %s" % got[-2:])
    os.truncate(changed, os.path.getsize(changed) - 4)  # (as it was)


def test_log_level_error(t):
    tmp, data, mnt, files, rel = t.tmp, t.data, t.mnt, t.files, t.rel
    # log_level=error: no warnings, but the daemon's life is still there.
    log = tmp + "/quiet.log"
    changed = files[3]
    with h.mounted(data, mnt, "seed=1,ram=0,log_level=error,log=" + log):
        read = h.attributes_read(mnt)
        with open(changed, "ab") as f:
            f.write(b"more")
        h.check(read and h.expect_errno(lambda: open(os.path.join(mnt, rel[3]), "rb").read(), 5),
                "a changed file reads EIO (attributes read first: %s)" % read)
    got = lines(log)
    h.check(not [l for l in got if "warning" in l] and any("clairfs: mounted" in l for l in got),
            "log_level=error: no warning, the mount and its end still said: %s" % [l[25:] for l in got])
    os.truncate(changed, os.path.getsize(changed) - 4)


def test_log_level_debug(t):
    tmp, data, mnt, files, rel = t.tmp, t.data, t.mnt, t.files, t.rel
    # log_level=debug: lines that say why (staging waiting, RAM letting files go, opens off the plan) —
    # none at the default level. RAM for a tenth of the data; the planned order for an epoch and a half,
    # then a few files in reverse.
    small = sum(os.path.getsize(f) for f in files) // 10
    for level in ("debug", "info"):
        log = tmp + "/%s.log" % level
        with h.mounted(data, mnt, "seed=1,batch_size=4,ram=%d,log_level=%s,log=%s" % (small, level, log)):
            planned = []
            for e in range(2):
                with open("%s/.clairfs/order/epoch-%d/rank-0" % (mnt, e)) as f:
                    planned += f.read().splitlines()
            for r in planned[:len(planned) * 3 // 4] + rel[::-1][:20]:
                time.sleep(0.002)
                with open(os.path.join(mnt, r), "rb") as f:
                    f.read()
        debug = [l for l in lines(log) if "clairfs: debug: " in l]
        said = {what for what in ("not near", "let go", "staging waits") if any(what in l for l in debug)}
        h.check(len(said) == 3 if level == "debug" else not debug,
                "log_level=%s: %d debug lines (%s)%s" % (level, len(debug), sorted(said), [l[25:] for l in debug[:3]]))


def test_a_start_up_warning_goes_to_the_log(t):
    tmp, data, mnt = t.tmp, t.data, t.mnt
    # A warning said at start-up, on the terminal, goes to the log too (an nvme_size= beyond the disk).
    log = tmp + "/early.log"
    fs = os.statvfs(tmp)
    os.mkdir(tmp + "/nvme")
    with h.mounted(data, mnt, "seed=1,ram=16M,nvme=%s/nvme,nvme_size=%d,log=%s" % (tmp, fs.f_bavail * fs.f_frsize * 2, log)):
        pass
    got = [l for l in lines(log) if "said at start-up" in l and "nvme_size=" in l]
    h.check(len(got) == 1 and "warning: said at start-up: nvme_size=" in got[0],
            "a warning before the daemon detached is in its log too: %s" % [l[25:] for l in got])


def test_a_second_mount_of_the_same_source(t):
    tmp, data, mnt = t.tmp, t.data, t.mnt
    # A second mount of the same SOURCE on the node is warned of (each stages it for itself); the first
    # mount is not, nor one of another SOURCE.
    os.mkdir(tmp + "/mnt2")
    first_log, second_log = tmp + "/first.log", tmp + "/second.log"
    with h.mounted(data, mnt, "seed=1,ram=16M,log=" + first_log):
        with h.mounted(data, tmp + "/mnt2", "seed=1,ram=16M,log=" + second_log):
            pass
    said = [l[25:] for l in lines(second_log) if "too:" in l]
    h.check(len(said) == 1 and ("is mounted by clairfs at %s too" % mnt) in said[0]
            and not [l for l in lines(first_log) if "too:" in l],
            "a second mount of one SOURCE is warned of, the first is not: %s" % said)


def test_idle_gives_memory_back(t):
    tmp, data, mnt, rel = t.tmp, t.data, t.mnt, t.rel
    # idle=: a mount nobody reads gives RAM and its pushed pages back (said in the log and by status), and
    # the next read stages again; every byte right throughout. What RAM held is the log's count of what
    # went: read at once after the reads, the stats may show nothing staged yet (the reads are in sample
    # order, so what comes is read-ahead, and no file already read is staged again).
    log = tmp + "/idle.log"
    with h.mounted(data, mnt, "seed=1,batch_size=4,ram=16M,idle=1,log=" + log):
        right = all(h.digest(os.path.join(mnt, r)) == h.digest(os.path.join(data, r)) for r in rel[:20])
        s = h.stats_when(mnt, lambda s: s["idle"]["now"], timeout=15)
        text = status(mnt)
        given_back = s["idle"]["now"] and s["ram"]["used"] == 0 and s["pagecache"]["used"] == 0
        right = right and all(h.digest(os.path.join(mnt, r)) == h.digest(os.path.join(data, r)) for r in rel[20:40])
        again = h.stats_when(mnt, lambda s: s["ram"]["files"] != 0, timeout=15)
    said = [l[25:] for l in lines(log) if "idle=" in l]
    went = re.search(r"\(idle=\): (\d+) files", said[0]) if said else None
    held = int(went.group(1)) if went else 0
    h.check(right and held > 0 and given_back and "idle: nothing read for 1 s" in text and s["idle"]["releases"] >= 1,
            "idle=1: %d files held, then RAM and pushed pages given back (%s); status: %s" % (
                held, s["idle"], [l.strip() for l in text.splitlines() if "idle" in l]))
    h.check(again["ram"]["files"] > 0 and len(said) >= 2 and "given back" in said[0] and "staging again" in said[1],
            "the next read stages again (%d files in RAM), every byte right %s; the log: %s" % (
                again["ram"]["files"], right, said[:2]))


def test_log_rotation(t):
    tmp, data, mnt, rel = t.tmp, t.data, t.mnt, t.rel
    # Log rotation: docs/operating.md's logrotate entry, run by Debian's logrotate (forced) while the mount is
    # read. SIGHUP opens the log file again at its path and never unmounts: the old lines stay in the
    # rotated file, the new ones (and the reopening) go to the new one, every byte still right.
    log = tmp + "/rotate/clairfs.log"
    os.mkdir(tmp + "/rotate")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "operating.md")) as f:
        doc = f.read()
    entry = doc[doc.index("/var/log/clairfs/*.log {"):]
    entry = entry[:entry.index("```")].replace("/var/log/clairfs/*.log", tmp + "/rotate/*.log")
    with open(tmp + "/rotate.conf", "w") as f:
        f.write(entry)
    with h.mounted(data, mnt, "seed=1,ram=16M,log=" + log):
        before = [h.digest(os.path.join(mnt, r)) == h.digest(os.path.join(data, r)) for r in rel[:20]]
        r = subprocess.run(["logrotate", "-f", "-s", tmp + "/rotate.state", tmp + "/rotate.conf"],
                           capture_output=True, text=True, timeout=60)
        for _ in range(50):
            if os.path.exists(log) and any("opened again" in l for l in lines(log)):
                break
            time.sleep(0.1)
        after = [h.digest(os.path.join(mnt, r)) == h.digest(os.path.join(data, r)) for r in rel[20:40]]
        still = h.is_mounted(mnt)
    old, new = lines(log + ".1"), lines(log) if os.path.exists(log) else []
    h.check(r.returncode == 0 and all(before + after) and still and any("clairfs: mounted" in l for l in old)
            and any("SIGHUP: the log file opened again" in l for l in new)
            and new[-1:] and new[-1].endswith("the mount ended; the daemon exits"),
            "logrotate with docs/operating.md's entry: mount kept serving %s, the rotated file starts %s, the new one "
            "holds %s %s" % (still and all(before + after), [l[25:] for l in old[:1]], [l[25:] for l in new],
                             r.stderr.strip()))


def test_bad_logs_are_refused(t):
    data, mnt, have_syslog = t.data, t.mnt, t.have_syslog
    # Bad logs are refused at mount, with one line.
    for options, words in (("log=relative.log", "log=relative.log"), ("log=/nonexistent-dir/x.log", "cannot log to"),
                           ("log_level=loud", "log_level"), ("metrics_file=/nonexistent-dir/m.prom", "metrics_file")):
        r = h.run_clairfs([data, mnt, "-o", "seed=1," + options])
        h.check(r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1
                and not h.is_mounted(mnt), "%s refused: %s" % (options, r.stderr.strip()))
    if not have_syslog:
        r = h.run_clairfs([data, mnt, "-o", "seed=1,log=syslog"])
        h.check(r.returncode == 2 and "no syslog" in r.stderr, "log=syslog without syslog refused: %s" % r.stderr.strip())


def test_metrics(t):
    tmp, data, mnt, rel = t.tmp, t.data, t.mnt, t.rel
    # Metrics: parsed, the numbers the stats have; metrics_file written, read by node_exporter, removed.
    prom = tmp + "/clairfs.prom"
    with h.mounted(data, mnt, "seed=1,ram=16M,metrics_file=" + prom):
        # (The mount is up before its plan: the ranks' numbers come with it. Under ASan, beside another
        # test file, the metrics were read before it once.)
        planned = bool(h.wait_until(lambda: h.stats(mnt).get("ranks"), timeout=60))
        for r in rel[:50]:
            with open(os.path.join(mnt, r), "rb") as f:
                f.read()
        text = open(mnt + "/.clairfs/metrics").read()
        stats = h.stats(mnt)
        try:
            fams = families(text)
        except Exception as e:  # noqa: BLE001 - what the parser says is the finding
            fams = {}
            h.check(False, "metrics parse: %s" % e)
        want = ("clairfs_build_info", "clairfs_rank_epoch", "clairfs_rank_verdict", "clairfs_served_files", "clairfs_served_bytes",
                "clairfs_source_read_bytes", "clairfs_source_opens", "clairfs_stall_seconds", "clairfs_mispredicted_opens",
                "clairfs_ram_used_bytes", "clairfs_resident_memory_bytes")
        h.check(planned and all(f in fams for f in want), "metrics has %s (missing: %s; planned first: %s)" % (
            len(want), [f for f in want if f not in fams], planned))
        if fams:
            served = sum(value(fams, "clairfs_served_files", "clairfs_served_files_total", tier=t) or 0
                         for t in ("page_cache", "ram", "nvme", "peer", "source"))
            in_stats = sum(stats["tiers"][t]["files"] for t in ("pagecache", "ram", "nvme", "peer", "source"))
            h.check(served > 0 and abs(served - in_stats) <= 2, "files served: metrics %d, stats %d" % (served, in_stats))
            h.check(value(fams, "clairfs_rank_verdict", "clairfs_rank_verdict", rank="0",
                          verdict=stats["ranks"][0]["verdict"]) == 1,
                    "the rank's verdict is set: %s" % stats["ranks"][0]["verdict"])
            h.check(value(fams, "clairfs_resident_memory_bytes", "clairfs_resident_memory_bytes") > 1e6, "resident memory given")
        # Read while they change (a reader of the data set in another thread), each in two reads with
        # another reader of the file between them: each open reads one rendering whole, of the size the
        # open file says, without padding (issue 35), and renderings the kernel let go are not kept.
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                for r in rel:
                    with open(os.path.join(mnt, r), "rb") as f:
                        f.read()

        t = threading.Thread(target=busy)
        t.start()
        torn = {"stats": 0, "metrics": 0}
        sized = {"stats": 0, "metrics": 0}
        inodes = {"stats": set(), "metrics": set()}
        pads = []
        for _ in range(300):
            for name, parse in (("stats", json.loads), ("metrics", lambda t: [
                    (n, [(x.name, x.labels, x.value) for x in f.samples]) for n, f in families(t).items()])):
                path = mnt + "/.clairfs/" + name
                text, size, ino = read_in_two(path, lambda: open(path).read())
                sized[name] += len(text.encode()) == size
                inodes[name].add(ino)
                try:
                    pads += padded(text, parse(text))[:3]
                except ValueError:
                    torn[name] += 1
        stop.set()
        t.join()
        h.check(torn == {"stats": 0, "metrics": 0}, "300 reads each of stats and metrics in two parts while a reader "
                "reads and another reads them between the parts: none torn %s" % torn)
        h.check(sized == {"stats": 300, "metrics": 300} and min(len(v) for v in inodes.values()) > 10,
                "each read is as long as its open file says (%s), over %s renderings" % (
                    sized, {k: len(v) for k, v in inodes.items()}))
        h.check(not pads, "nothing in them is padding: %s" % pads[:5])
        time.sleep(0.2)
        held = h.stats(mnt)["memory"]["control_renderings"]
        h.check(held["files"] <= 4, "renderings held once their readers are gone: %s (of %d made)" % (
            held, sum(len(v) for v in inodes.values())))
        time.sleep(0.5)
        first = os.stat(prom).st_mtime if os.path.exists(prom) else 0
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline and os.path.exists(prom) and os.stat(prom).st_mtime == first:
            time.sleep(0.5)
        ok = os.path.exists(prom) and os.stat(prom).st_mtime != first
        h.check(ok and "clairfs_served_files_total" in open(prom).read() and families(open(prom).read()),
                "metrics_file written and rewritten within 12 s")
        h.check(not [n for n in os.listdir(tmp) if ".tmp" in n], "no temporary file left beside it")
        for name, path in ((".clairfs/metrics", mnt + "/.clairfs/metrics"), ("metrics_file=", prom)):
            with open(path) as f:
                r = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True, text=True, timeout=30)
            h.check(r.returncode == 0, "promtool check metrics accepts %s: exit %d %s" % (
                name, r.returncode, (r.stdout + r.stderr).strip()[:300]))
        exported = node_exporter(tmp)
        h.check("node_textfile_scrape_error 0" in exported and "clairfs_served_files_total{" in exported
                and 'clairfs_rank_verdict{rank="0",verdict="' in exported,
                "node_exporter's textfile collector exports clairfs_* from metrics_file= with no scrape error: %s" % [
                    line for line in exported.splitlines() if "scrape_error" in line or "textfile" in line and "#" not in line])
    h.check(not os.path.exists(prom), "metrics_file removed when the mount ended")


def test_metrics_of_a_plain_mount(t):
    data, mnt, rel = t.data, t.mnt, t.rel
    # A plain mount: SOURCE's numbers only, still valid.
    with h.mounted(data, mnt, "seed=1,ram=0"):
        with open(os.path.join(mnt, rel[0]), "rb") as f:
            f.read()
        fams = families(open(mnt + "/.clairfs/metrics").read())
        h.check("clairfs_rank_epoch" not in fams and value(fams, "clairfs_served_files", "clairfs_served_files_total",
                                                          tier="source") >= 1, "ram=0: SOURCE's numbers, no ranks")


def test_a_sites_own_debian_mirror(t):
    tmp = t.tmp
    # A site with its own Debian mirror: scripts/torch2-chroot takes it from apt's sources (deb822 or
    # one-line, as apt reads them) for this machine's release, or from CLAIRFS_DEBIAN_MIRROR.
    os.mkdir(tmp + "/apt")
    with open(tmp + "/apt/sources.list", "w") as f:
        f.write("deb http://mirror.site.example/debian-security %s-security main\n" % codename()
                + "deb http://mirror.site.example/debian %s main\n" % codename())
    with open(tmp + "/apt/apt.conf", "w") as f:
        f.write('Dir::Etc::sourcelist "%s/apt/sources.list";\nDir::Etc::sourceparts "%s/apt";\n' % (tmp, tmp))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "torch2-chroot")
    got = [subprocess.run([script, "--print-mirror"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **extra)).stdout.strip()
           for extra in ({"APT_CONFIG": tmp + "/apt/apt.conf"},
                         {"APT_CONFIG": tmp + "/apt/apt.conf", "CLAIRFS_DEBIAN_MIRROR": "http://other.example/debian"})]
    h.check(got == ["http://mirror.site.example/debian", "http://other.example/debian"],
            "scripts/torch2-chroot takes the mirror from apt's sources, or CLAIRFS_DEBIAN_MIRROR: %s" % got)


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
