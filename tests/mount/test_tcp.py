"""Three daemons on three "hosts" that talk real TCP: a network namespace each, joined by a bridge,
every host sending through `tc tbf` (tests/mount/cluster.py NetnsHosts), hydra's mpiexec starting its
proxies through an ssh stand-in, MPI over TCP only (UCX_TLS=tcp,self: left to itself UCX finds shared
memory even across network namespaces). Started and stopped with clairfs-job-mount / -umount.

1. Two epochs, the three ranks in step: every byte right, nodes fetch from each other over the
   bridge (stats, tc's byte counts, connections between the hosts), SOURCE read about once; at the end
   each node's status shows its rank's last epoch complete, and its opens seen (the watch on the mount)
   and files served by tier equal the opens its reader made.
   1b. Caches that together just hold the data set, in RAM alone and split between RAM and NVMe in three
   ways, on these hosts and on a set of 4 made for it: SOURCE read at most 1.03× over 3 epochs, and
   bench/cluster_sim's prediction within 0.05 of it; caches holding half the data set: within 0.05 of
   the ideal 2.00.
2. Ten clean ends in a row: each umount exits 0 within seconds, no mount, daemon or cache folder stays.
3. One node's daemon SIGKILLed mid-read: its mount goes with it (auto_unmount), the others read on with
   right bytes, and at the end they still stop cleanly; only the dead node's cache folder is named (and
   removed).
   With room to spare on the survivors (3b), SOURCE reads the dead node's share at most once more.
4. examples/pbs_job.sh under a PBS-like environment, each host with its own files and host name."""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import harness as h
import pytest
from cluster import SLOWFS, NetnsHosts, SlowSource, have, leftovers, read_in_step, wait_clean

ALONE = True  # (conftest.py) it makes network namespaces and shapes their links; its checks count stalls

if os.geteuid() != 0 or not have("ip", "tc", "nsenter", "mpiexec", "ss"):
    pytest.skip("needs root, iproute2 (ip, tc, ss), nsenter and mpiexec", allow_module_level=True)
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NODES = 3
EPOCHS = 2
CLEAN_RUNS = 10
ENV = dict(os.environ, UCX_TLS="tcp,self")


def launch(net, tmp, src, total, extra="", ram=0.2, nvme=0.4, epochs=EPOCHS, nodes=NODES):
    """The daemons with each node's RAM and NVMe a fraction of the data set (no NVMe tier for 0)."""
    mnts = ["%s/mnt%d" % (tmp, n) for n in range(nodes)]
    nvmes = ["%s/nvme%d" % (tmp, n) for n in range(nodes)]
    cmd = net.mpiexec()
    for n in range(nodes):
        os.makedirs(mnts[n], exist_ok=True)
        os.makedirs(nvmes[n], exist_ok=True)
        tier = ",nvme=%s,nvme_size=%d" % (nvmes[n], int(total * nvme)) if nvme else ""
        opts = ("seed=7,batch_size=8,world_size=%d,ranks=%d,epochs=%d,ram=%d%s%s" %
                (nodes, n, epochs, int(total * ram), tier, extra))
        cmd += ([":"] if n else []) + ["-n", "1", h.CLAIRFS, src, mnts[n], "-o", opts]
    state = tmp + "/job.state"
    r = subprocess.run([ROOT + "/scripts/clairfs-job-mount", "--timeout", "120", "--state", state, "--"] + cmd,
                       capture_output=True, text=True, timeout=180, env=ENV)
    return mnts, nvmes, state, r


def umount(state):
    t0 = time.monotonic()
    with open(state[:-len(".state")] + ".log", errors="replace") as f:
        f.seek(0, os.SEEK_END)
        start = f.tell()
    r = subprocess.run([ROOT + "/scripts/clairfs-job-umount", "--timeout", "60", "--state", state],
                       capture_output=True, text=True, timeout=180, env=ENV)
    with open(state[:-len(".state")] + ".log", errors="replace") as f:
        f.seek(start)
        log = f.read()
    return r, time.monotonic() - t0, log


def kill_mid_epoch(mnts, want, victim):
    """Reads epoch 0 on every node, then epochs 1 and 2 with `victim`'s daemon SIGKILLed 0.3 s into epoch 1
    (its reader stops there). Returns epoch 0's (wrong, opened, errors), the later epochs' (wrong, opened,
    errors), each node's slowest read in them, and the SOURCE bytes the victim had read by the kill."""
    vpids = h.daemon_pids(mnts[victim])
    threads, wrong, opened, errors = read_in_step(mnts, want, 1)
    join(threads)
    slowest = []
    threads, wrong2, opened2, errors2 = read_in_step(mnts, want, 3, kill_at=1, victim=victim, first=1,
                                                     slowest=slowest)
    time.sleep(0.3)
    before = h.stats(mnts[victim])["source_traffic"]["bytes"]
    for p in vpids:
        os.kill(p, signal.SIGKILL)
    join(threads)
    return (wrong, opened, errors), (wrong2, opened2, errors2), slowest, before


def peer_news(state, slowest, bound=1.0):
    """When a survivor's read took `bound` or longer: the job log's lines of peers given up or back (how long
    each ping was given), to tell a slow death notice from a wait elsewhere; else nothing."""
    if max(slowest) < bound:
        return ""
    with open(state[:-len(".state")] + ".log", errors="replace") as f:
        return "; log: %s" % [line.strip()[:200] for line in f if "peer node" in line]


def join(threads):
    for t in threads:
        t.join(timeout=300)
class Hosts:
    """Three hosts in network namespaces, and 600 files behind a slow SOURCE (as a parallel file system is:
    slower than a peer's cache over the network)."""

    def __init__(self, tmp, stack):
        self.tmp = tmp
        self.net = stack.enter_context(NetnsHosts(NODES, tmp))
        self.data = tmp + "/data"
        self.want, self.total = h.dataset(self.data, 600, 6, 16, 9)
        self.slow = SlowSource(self.data, tmp + "/slow")
        stack.callback(self.slow.close)
        self.src = self.slow.mnt


@pytest.fixture(scope="module")
def c():
    with h.tempdir() as tmp, contextlib.ExitStack() as stack:
        yield Hosts(tmp, stack)


def test_two_epochs_over_tcp(c):
    net, tmp, src, want, total = c.net, c.tmp, c.src, c.want, c.total
    mnts, nvmes, state, r = launch(net, tmp, src, total)
    h.check(r.returncode == 0 and "all 3 nodes mounted" in r.stdout,
            "3 daemons on 3 network namespaces mounted: %s %s" % (r.stdout.strip(), r.stderr.strip()[-500:]))
    if r.returncode == 0:
        sent0 = [net.sent_bytes(n) for n in range(NODES)]
        threads, wrong, opened, errors = read_in_step(mnts, want, EPOCHS)
        join(threads)
        s = [h.settled_stats(m, opened[n]) for n, m in enumerate(mnts)]
        ends = [[(x["rank"], x["epoch"], x["done"], x["total"], x["verdict"]) for x in y["ranks"]] for y in s]
        h.check(all(len(e) == 1 and e[0][1] == EPOCHS - 1 and e[0][2] == e[0][3] and e[0][4] == "following" for e in ends),
                "each node's rank ends with its last epoch complete: %s" % ends)
        by_tier = [sum(t["files"] for t in x["tiers"].values()) for x in s]
        seen = [x["progress"]["opens_seen"] for x in s]
        h.check(by_tier == opened and seen == opened,
                "each node's opens seen %s and files served by tier %s equal the opens made %s (progress: %s)" % (
                    seen, by_tier, opened, [x["progress"] for x in s]))
        conns = [net.peer_connections(n) for n in range(NODES)]
        sent = [net.sent_bytes(n) - sent0[n] for n in range(NODES)]
        h.check(not errors and sum(wrong) == 0 and sum(opened) == EPOCHS * len(want),
                "3 ranks × %d epochs: every byte right (%d files, %s)" % (EPOCHS, sum(opened), errors[:2]))
        fetched = sum(x["peers"]["staged_files"] + x["peers"]["demand_files"] for x in s)
        served = [x["peers"]["served_bytes"] for x in s]
        h.check(fetched > len(want) // 2 and all(b > 0 for b in served),
                "nodes fetched %d files from each other; bytes served by each: %s" % (fetched, served))
        h.check(all(sent[n] >= served[n] for n in range(NODES)) and all(c > 0 for c in conns),
                "over the bridge: each host sent at least what it served (tc: %s bytes) on TCP connections "
                "between the hosts (%s)" % (sent, conns))
        traffic = sum(x["source_traffic"]["bytes"] for x in s) / total
        h.check(traffic <= 1.05, "SOURCE read %.3f× the data set over %d epochs, with 60%% of it per node: %s" % (
            traffic, EPOCHS, [(x["peers"]["requests"], x["peers"]["hits"], x["peers"]["refused"], x["peers"]["timeouts"],
                               x["source_traffic"]) for x in s]))
        said = subprocess.run([h.CLAIRFS, "status", mnts[0]], capture_output=True, text=True, timeout=30).stdout
        h.check("node 0 of 3; 2 of the 2 others asked; linked to 2" in said and "to peers" in said and
                "no longer asked" not in said and [x["peers"]["links"] for x in s] == [2] * NODES,
                "status tells what the peers do, every node linked to the 2 others (%s): %s" % (
                    [x["peers"]["links"] for x in s], [line for line in said.splitlines() if "peers" in line]))
        print(said)
        r2, took, log = umount(state)
        h.check(r2.returncode == 0 and not wait_clean(tmp, nvmes, timeout=10),
                "clairfs-job-umount: exit %d in %.1f s, nothing left: %s" % (r2.returncode, took, r2.stderr.strip()[-300:]))


def split_runs(net, tmp, src, want, total, nodes, splits):
    """The job over 3 epochs on `nodes` hosts for each (RAM, NVMe) split of the data set per node. Where
    the caches together hold less than the data set, each file's pages are dropped once read."""
    for ram, nvme in splits:
        held = min(1.0, nodes * (ram + nvme))  # of the data set, in all the caches
        ideal = 1 + 2 * (1 - held)
        mnts, nvmes, state, r = launch(net, tmp, src, total, ram=ram, nvme=nvme, epochs=3, nodes=nodes)
        if r.returncode != 0:
            h.check(False, "%d hosts, RAM %.3f + NVMe %.3f: mounted: %s" % (nodes, ram, nvme, r.stderr.strip()[-300:]))
            continue
        over = 0
        for n in range(nodes):
            with open("%s/.clairfs/order/epoch-0/rank-%d" % (mnts[n], n)) as f:
                kept = sum(os.path.getsize(os.path.join(tmp, "big", rel)) for rel in f.read().splitlines())
            over += max(0, kept - int(total * ram) - int(total * nvme))
        threads, wrong, opened, errors = read_in_step(mnts, want, 3, drop_pages=held < 0.99)
        join(threads)
        s = [h.settled_stats(m, opened[n]) for n, m in enumerate(mnts)]
        traffic = sum(x["source_traffic"]["bytes"] for x in s) / total
        # Files needed soon go to SOURCE when their keeper answers far slower (PeerModel; counted): on this
        # shared machine, with the daemons short of CPU. Not what this checks: allowed, and said.
        instead = sum(x["peers"]["source_instead_bytes"] for x in s) / total
        bound = (1.03 if held >= 0.99 else ideal + 0.05) + instead
        h.check(not errors and sum(wrong) == 0 and traffic <= bound,
                "%d hosts, RAM %.3f + NVMe %.3f of the data set per node: every byte right (%s), SOURCE read %.3f× "
                "over 3 epochs (bound %.3f, the ideal %.2f; %.3f of the data set over its keepers' room, %.3f from "
                "SOURCE instead of a slow peer); per node (requests, refused, timeouts and failures, refused to peers, files staged "
                "from SOURCE, opens served by SOURCE): %s" % (
                    nodes, ram, nvme, errors[:1], traffic, bound, ideal, over / total, instead,
                    [(x["peers"]["requests"], x["peers"]["refused"], x["peers"]["timeouts"] + x["peers"]["failures"],
                      x["peers"]["refused_to_peers"], x["staged"]["files"] - x["staged"]["from_peer"] -
                      x["staged"]["from_nvme"], x["tiers"]["source"]["files"]) for x in s]))
        # bench/cluster_sim over the same tree, job and budgets predicts this figure (no page cache in it,
        # so a little above; docs/benchmarks.md).
        sim = subprocess.run([os.path.join(os.path.dirname(SLOWFS), "cluster_sim"), "--tree", tmp + "/big", "--nodes",
                              str(nodes), "--ranks-per-node", "1", "--batch", "8", "--seed", "7", "--epochs", "3",
                              "--loader-window", "16", "--cache", "%g+%g" % (nodes * ram, nodes * nvme)],
                             capture_output=True, text=True, timeout=60)
        predicted = json.loads(sim.stdout)["source"] if sim.returncode == 0 else float("nan")
        h.check(abs(traffic - predicted) <= 0.05 + instead,
                "bench/cluster_sim predicted SOURCE %.3f× for this run, measured %.3f× %s" % (
                    predicted, traffic, sim.stderr.strip()[-200:] if sim.returncode else ""))
        if over and held >= 0.99:
            handed = [(x["peers"]["handed"], x["peers"]["handed_staged"]) for x in s]
            h.check(sum(a for a, _ in handed) > 0 and sum(b for _, b in handed) > 0,
                    "the files past their first reader's room were kept by nodes with room left, which staged them "
                    "(handed, staged per node): %s" % handed)
        with open(state[:-len(".state")] + ".log", errors="replace") as f:
            given_up = [line for line in f if "not asked any more" in line]
        h.check(not given_up, "no node was given up: %s" % given_up)
        r2, took, log = umount(state)
        h.check(r2.returncode == 0 and not wait_clean(tmp, nvmes, timeout=10), "and ended clean")


def test_caches_split_between_ram_and_nvme(c):
    # The nodes' caches together just hold the data set, in RAM alone or split between RAM and NVMe: each
    # node keeps the files its rank reads first in one of the two, so SOURCE is read once over 3 epochs —
    # but for what does not fit. Files of ~100 KB, as images are. A node's share of the bytes varies with
    # the sizes (here up to ~1.05× its room): what is over its room goes to a node with room left, which
    # reads it from SOURCE at the start (1.007× for both NVMe splits of 3 hosts with NVMe's copies packed;
    # 1.024× and 1.028× when each took whole 4 KiB blocks, 1.031–1.061× when the files over were read
    # again in each later epoch instead, 1.45–1.8× before the kept-copy rules). The bound is issue 31's,
    # 1.03, on 3 hosts and on 4 (a set of hosts of its own); and with half the data set in all the caches,
    # 0.05 over the ideal 2.00 (its files past every node's room read from SOURCE each epoch).
    big_want, big_total = h.dataset(c.tmp + "/big", 600, 6, 100, 11)
    big = SlowSource(c.tmp + "/big", c.tmp + "/slow-big")
    try:
        split_runs(c.net, c.tmp, big.mnt, big_want, big_total, NODES,
                   ((1 / 3, 0), (1 / 6, 1 / 6), (1 / 4, 1 / 12), (1 / 12, 1 / 4), (1 / 12, 1 / 12)))
        four = c.tmp + "/four"
        os.makedirs(four)
        with NetnsHosts(4, four) as net:
            split_runs(net, c.tmp, big.mnt, big_want, big_total, 4,
                       ((1 / 4, 0), (1 / 8, 1 / 8), (1 / 16, 3 / 16), (1 / 16, 1 / 16)))
    finally:
        big.close()


def test_clean_ends_in_a_row(c):
    # Each run reads a little, as a short job would.
    net, tmp, src, want, total = c.net, c.tmp, c.src, c.want, c.total
    clean, times, bounded, deaths = 0, [], 0, []
    for k in range(CLEAN_RUNS):
        mnts, nvmes, state, r = launch(net, tmp, src, total)
        if r.returncode != 0:
            print("run %d did not mount: %s" % (k, r.stderr.strip()[-300:]))
            subprocess.run([ROOT + "/scripts/clairfs-job-umount", "--state", state], capture_output=True, timeout=180)
            continue
        threads, wrong, opened, errors = read_in_step(mnts, want, 1, limit=40)
        join(threads)
        r2, took, log = umount(state)
        left = wait_clean(tmp, nvmes, timeout=5)
        bounded += log.count("not every node reached the end")
        # (Each daemon says goodbye on its links as it leaves: none is taken for dead by the others.)
        deaths += [line.strip()[:160] for line in log.splitlines() if "closed its link" in line]
        ok = r2.returncode == 0 and not left and not errors and sum(wrong) == 0 and took < 30
        clean += ok
        times.append(took)
        if not ok:
            print("run %d: exit %d in %.1f s, left %s, %s %s" % (k, r2.returncode, took, left, errors[:1], r2.stderr[-300:]))
            subprocess.run(["fusermount3", "-u", "-z"] + [m for m in mnts if h.is_mounted(m)], capture_output=True)
    h.check(clean == CLEAN_RUNS, "%d of %d jobs ended clean (umount %.1f-%.1f s; a node left before the others %d times)" % (
        clean, CLEAN_RUNS, min(times or [0]), max(times or [0]), bounded))
    h.check(not deaths, "no node leaving on purpose was taken for dead by its links: %s" % deaths[:3])


def test_a_node_killed_mid_epoch(c):
    net, tmp, src, want, total = c.net, c.tmp, c.src, c.want, c.total
    # Node 2's daemon SIGKILLed in the middle of epoch 1, the others staging from it (peer_timeout left
    # at its 5 s): its kernel closes its links to the survivors, which give it up at once (peer/links.hpp),
    # and no read waits the timeout — nor 1 s (the bound; 0.00-0.02 s with the links, 0.32-0.86 s
    # and 1.24 s beside a CPU hog when the pings alone found it: 250 ms of silence and 600 ms for the
    # ping; 2.6 s in CI once, when the ping's wait was 4 × the slowest answer to a request). Each node's RAM holds
    # a tenth of the data set, so the survivors still fetch from node 2 after it dies (with room for most
    # of the data set they had fetched all they needed before it, once in CI).
    mnts, nvmes, state, r = launch(net, tmp, src, total, ram=0.1, nvme=0.05, epochs=3)
    h.check(r.returncode == 0, "started again: %s" % r.stderr.strip()[-300:])
    if r.returncode == 0:
        victim = 2
        _, (wrong, opened, errors), slowest, _ = kill_mid_epoch(mnts, want, victim)
        s = [h.stats(mnts[n]) for n in range(NODES) if n != victim]
        traffic = sum(x["source_traffic"]["bytes"] for x in s) / total
        survivors = [slowest[n] for n in range(NODES) if n != victim]
        h.check(not errors and sum(wrong) == 0 and sum(opened) == 2 * len(want) * (NODES - 1) // NODES,
                "node 2 killed mid-epoch: the others read epochs 1 and 2, every byte right (wrong %d, opened %d of "
                "%d; %s)" % (sum(wrong), sum(opened), 2 * len(want) * (NODES - 1) // NODES, errors[:2]))
        # (Given up when its link closed, a fetch of it under way or not: failures then, or none.)
        met = [x["peers"]["gone"] == [victim] for x in s]
        h.check(all(met) and max(survivors) < 1.0,
                "both survivors gave the dead node up; no read waited out peer_timeout (5 s), nor 1 s: the "
                "slowest took %s s; SOURCE %.3f× the data set by the survivors over the job; (failures, timeouts) %s%s" % (
                    ["%.2f" % x for x in survivors], traffic,
                    [(x["peers"]["failures"], x["peers"]["timeouts"]) for x in s], peer_news(state, survivors)))
        with open(state[:-len(".state")] + ".log", errors="replace") as f:
            closed = [line.strip()[:160] for line in f if "peer node %d closed its link" % victim in line]
        h.check(len(closed) == NODES - 1, "each survivor saw the dead node's link close: %s" % closed)
        h.check(not h.is_mounted(mnts[victim]), "the killed daemon's mount went with it (auto_unmount under a launcher)")
        said = [subprocess.run([h.CLAIRFS, "status", mnts[n]], capture_output=True, text=True, timeout=30).stdout
                for n in range(NODES) if n != victim]
        h.check(all("of the 2 others asked; linked to 1" in t and "no longer asked (left, failed or silent): node %d;" % victim in t
                    for t in said),
                "the survivors' status names the dead node: %s" % [
                    [line for line in t.splitlines() if "asked" in line or "peers" in line] for t in said])
        # The caches hold 0.45 of the data set in all: the files past every node's room are no node's.
        unkept = [x["peers"]["unkept"] for x in s]
        h.check(all(u > len(want) // 3 for u in unkept) and all("past every node's room" in t for t in said),
                "files no node has room to keep, in the stats %s and the status: %s" % (
                    unkept, [[line for line in t.splitlines() if "unkept" in line] for t in said]))
        r2, took, log = umount(state)
        named = re.findall(r"clairfs cleanup on \S+: (.*)", r2.stderr)
        h.check(r2.returncode == 1 and len(named) == 1 and "nvme%d/" % victim in named[0],
                "at the end the survivors stop cleanly; only node 2's cache folder is named: %s" % named)
        left = wait_clean(tmp, nvmes, timeout=10)
        h.check(not left, "nothing left on any node; umount took %.1f s: %s" % (took, left))


def test_a_node_killed_mid_epoch_with_room_for_its_share(c):
    net, tmp, src, want, total = c.net, c.tmp, c.src, c.want, c.total
    # Node 2 SIGKILLed mid-epoch 1 again, each node's RAM now half the data set: the survivors have room
    # for its third, and keep what they fetched of it or read again from SOURCE for their readers' next
    # uses, so a dead node costs at most its share once more (the bound of issue 31: SOURCE over the job no
    # more than the data set plus that share, +0.03). The victim's own SOURCE reads, up to the kill, count.
    mnts, nvmes, state, r = launch(net, tmp, src, total, ram=0.5, nvme=0.05, epochs=3)
    h.check(r.returncode == 0, "started with room to spare: %s" % r.stderr.strip()[-300:])
    if r.returncode == 0:
        victim = 2
        (wrong, _, errors), (wrong2, _, errors2), slowest, before = kill_mid_epoch(mnts, want, victim)
        s = [h.stats(mnts[n]) for n in range(NODES) if n != victim]
        traffic = (before + sum(x["source_traffic"]["bytes"] for x in s)) / total
        survivors = [slowest[n] for n in range(NODES) if n != victim]
        h.check(not errors + errors2 and sum(wrong) + sum(wrong2) == 0,
                "node 2 killed with room to spare: every byte right (%s; peers no longer asked: %s)" % (
                    (errors + errors2)[:2], [x["peers"]["gone"] for x in s]))
        h.check(traffic <= 1 + 1 / NODES + 0.03 and max(survivors) < 1.0,
                "SOURCE %.3f× the data set over the job (bound: once, and the dead node's share once more: %.3f); "
                "the slowest survivor's read %s s%s" % (traffic, 1 + 1 / NODES + 0.03, ["%.2f" % x for x in survivors],
                                                          peer_news(state, survivors)))
        r2, took, log = umount(state)
        left = wait_clean(tmp, nvmes, timeout=10)
        h.check(not left, "nothing left on any node: %s" % left)


def test_the_pbs_job_script(c):
    tmp, src, want, total = c.tmp, c.src, c.want, c.total
    # examples/pbs_job.sh, changed only in its paths and training line, run as PBS runs a job: the
    # environment PBS gives it (PBS_NODEFILE with 2 slots per host, PBS_JOBID, PBS_O_WORKDIR), hydra
    # reaching the hosts through the ssh stand-in (HYDRA_LAUNCHER_EXEC). Here each host also has its own
    # files (mount namespace, its own /tmp-like folder and host name), as real nodes do, so every daemon
    # mounts the same path.
    node_dir = tmp + "/node"
    with NetnsHosts(NODES, tmp, private_dir=node_dir) as pnet:
        bin_dir = tmp + "/bin"
        os.makedirs(bin_dir)
        for tool in (h.CLAIRFS, ROOT + "/scripts/clairfs-job-mount", ROOT + "/scripts/clairfs-job-umount"):
            os.symlink(os.path.abspath(tool), os.path.join(bin_dir, os.path.basename(tool)))
        with open(tmp + "/digests.json", "w") as f:
            json.dump(want, f)
        with open(tmp + "/pbs_nodefile", "w") as f:
            f.writelines("%s\n%s\n" % (a, a) for a in pnet.addrs)
        nvme = node_dir + "/scratch"
        for i in range(NODES):
            pnet.run(i, ["mkdir", "-p", nvme])
        with open(os.path.join(ROOT, "examples", "pbs_job.sh")) as f:
            text = f.read()
        changes = [(r"(?m)^DATA=.*$", "DATA=" + src), (r"(?m)^MNT=.*$", "MNT=%s/$PBS_JOBID-train" % node_dir),
                   (r"(?m)^NVME=.*$", "NVME=" + nvme),
                   (r"(?ms)^mpiexec -n \"\$WORLD\".*?--epochs 90$",
                    "mpiexec -n \"$WORLD\" -ppn $((WORLD / NODES)) /usr/bin/python3 %s/job_reader.py --data \"$MNT\" "
                    "--digests %s/digests.json --epochs 2 --batch-size 16 --workers 1 --barrier-dir %s/barrier" % (
                        os.path.dirname(os.path.abspath(__file__)), tmp, tmp))]
        for pattern, line in changes:
            text, n = re.subn(pattern, line.replace("\\", "\\\\"), text)
            assert n == 1, "examples/pbs_job.sh changed shape: %s" % pattern
        os.makedirs(tmp + "/barrier")
        script = tmp + "/pbs_job.sh"
        with open(script, "w") as f:
            f.write(text)
        env = dict(ENV, PBS_NODEFILE=tmp + "/pbs_nodefile", PBS_JOBID="42.pbs", PBS_O_WORKDIR=tmp, TMPDIR=tmp,
                   HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=pnet.ssh, HYDRA_IFACE="br0",
                   PATH=bin_dir + ":" + os.environ["PATH"])
        t0 = time.monotonic()
        r = subprocess.run(["nsenter", "--net=/run/netns/" + pnet.switch, "bash", script], capture_output=True,
                           text=True, timeout=600, env=env, cwd=tmp)
        out = r.stdout + r.stderr
        epochs = re.findall(r"rank (\d) epoch (\d): (\d+) files, (\d+) wrong", out)
        nodes = dict(re.findall(r"on (host\d) stats: source_traffic (\d+) bytes", out))
        fetched = re.findall(r"fetched from peers (\d+)", out)
        h.check(r.returncode == 0 and "all 3 nodes mounted" in out,
                "examples/pbs_job.sh ran to its end in %.1f s (exit %d): %s" % (time.monotonic() - t0, r.returncode,
                                                                               "" if r.returncode == 0 else out[-1500:]))
        h.check(len(epochs) == 12 and all(int(n) == len(want) // 6 and w == "0" for _, _, n, w in epochs),
                "6 ranks (2 per host) × 2 epochs through torchvision: every file right")
        traffic = sum(int(b) for b in nodes.values()) / total
        # The shipped options give each node the default RAM, more than the data set, and loaders that hold
        # more than an epoch ahead (batch_size=256, workers=8): a node stages every planned epoch at once,
        # and asks keepers for files they have not read yet. Those wait for their keeper (docs/peers.md);
        # files needed soon go where the model says is quicker, and on this busy machine that is often
        # SOURCE. A node that never asked a peer would read about 5/3× here (its own third in epoch 0,
        # then two thirds of its new third); four runs read 1.21-1.26× (before the epoch limit on
        # "soon", up to 2.09×). Under a sanitizer the daemons answer their peers several times slower:
        # there only about a plain mount's 2× is asked (one ASan run read 2.002× before these changes).
        ceiling = EPOCHS * 1.02 if os.environ.get("CLAIRFS_SANITIZED") else 5 / 3
        h.check(len(nodes) == 3 and traffic <= ceiling and all(int(x) > 0 for x in fetched),
                "SOURCE read %.3f× over the job (a plain mount: %d×; the ceiling here %.2f×); each host fetched from "
                "the others %s" % (traffic, EPOCHS, ceiling, fetched))
        left = [x for i in range(NODES) for x in pnet.leftovers(i, node_dir, [nvme])] + leftovers(tmp)
        h.check("clairfs-job-umount:" not in out and not left, "nothing left on any host: %s" % left)


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
