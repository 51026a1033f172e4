"""What the torch comparisons share: the oracle asked over a pipe (tests/tools/oracle_dump), and seeds of
every kind torch accepts."""
import os
import subprocess

DUMP = os.environ.get("CLAIRFS_ORACLE_DUMP")


class Oracle:
    """Talks to tests/tools/oracle_dump over a pipe."""

    def __init__(self):
        self.p = subprocess.Popen([DUMP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, cmd, order, n, world, rank, seed, epoch, drop_last=0, batch=1, loader_drop_last=0, workers=0,
            shared=1, persistent=0, start=0, kind="classic", draws=0):
        self.p.stdin.write("%s %s %d %d %d %d %d %d %d %d %d %d %d %d %s %d\n" % (
            cmd, order, n, world, rank, seed, epoch, drop_last, batch, loader_drop_last, workers, shared, persistent,
            start, kind, draws))
        self.p.stdin.flush()
        if cmd == "rank":
            return [int(x) for x in self.p.stdout.readline().split()]
        out = []
        while True:
            line = self.p.stdout.readline().strip()
            if line == ".":
                return out
            out.append([int(x) for x in line.split()])

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def random_seed(rnd, epoch):
    """A seed from `rnd`: small, negative, >= 2^32, or >= 2^63 (still within manual_seed's range after
    adding the epoch)."""
    kind = rnd.randrange(4)
    if kind == 0:
        return rnd.randrange(0, 1000)
    if kind == 1:
        return -rnd.randrange(1, 2**40)
    if kind == 2:
        return rnd.randrange(2**32, 2**63)
    return rnd.randrange(2**63, 2**64 - epoch)
