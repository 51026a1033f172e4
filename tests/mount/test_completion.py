"""Bash completion as a user meets it: an interactive bash on a pseudo-terminal, scripts/clairfs-completion.bash
sourced (with Debian's bash-completion loaded, and without it), a line typed, Tab pressed, Enter: the line
that runs is what completion made of it. Option names after commas, values from a list (progress=,
order=, log=, log_level=), folders for nvme=, files for manifest=; the text before the cursor is never
repeated (with bash-completion, `-o seed=1,wo<Tab>` became `-o seed=seed=1,wor`).
"""
import os
import pty
import select
import time

import harness as h
import pytest

SCRIPT = os.path.join(os.environ.get("CLAIRFS_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "scripts", "clairfs-completion.bash")
BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"


class Shell:
    """An interactive bash on a pseudo-terminal; `clairfs` in it prints the words it is run with (but
    answers --help as the real one, which completion asks for the option names)."""

    def __init__(self, with_bash_completion):
        env = {"PATH": os.path.dirname(h.CLAIRFS) + ":/usr/bin:/bin", "HOME": "/tmp", "TERM": "dumb",
               "INPUTRC": "/dev/null"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], env)
        setup = ["PS1='$ '", "bind 'set bell-style none'"]
        if with_bash_completion:
            setup.append(". " + BASH_COMPLETION)
        setup += [". " + SCRIPT,
                  "clairfs() { if [[ $1 == --help ]]; then command clairfs \"$@\"; else printf 'RAN<%s>\\n' \"$*\"; fi; }",
                  "echo READY"]
        self.send("; ".join(setup) + "\n")
        self.wait_for("READY\r\n")

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait_for(self, marker, timeout=20):
        out = ""
        deadline = time.monotonic() + timeout
        while marker not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                out += os.read(self.fd, 65536).decode(errors="replace")
        return out

    def complete(self, typed):
        """What runs when `typed` is typed, Tab pressed, then Enter."""
        self.send(typed + "\t")
        time.sleep(0.5)
        self.send("\n")
        out = self.wait_for(">\r\n")
        start = out.rfind("RAN<")
        return out[start + 4:out.index(">\r\n", start)] if start >= 0 else "(nothing ran: %r)" % out[-200:]

    def close(self):
        os.close(self.fd)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)


CASES = [
    ("src mnt -o seed=1,wo", "src mnt -o seed=1,wor"),            # two names start with "wor"
    ("src mnt -o seed=1,pagec", "src mnt -o seed=1,pagecache="),
    ("src mnt -o ram=4G,progress=w", "src mnt -o ram=4G,progress=watch "),
    ("src mnt -o order=torch-r", "src mnt -o order=torch-random "),
    ("src mnt -o seed=2,log=sys", "src mnt -o seed=2,log=syslog "),
    ("src mnt -o log_level=warn", "src mnt -o log_level=warning "),
    ("src mnt -o nvme=TMP/nvme-d", "src mnt -o nvme=TMP/nvme-disk/"),
    ("src mnt -o seed=1,manifest=TMP/manif", "src mnt -o seed=1,manifest=TMP/manifest.idx "),
    ("stat", "status "),
    ("status --wa", "status --watch "),
]


@pytest.mark.parametrize("with_bc", [False, True], ids=["bash alone", "with bash-completion"])
def test_tab_completes_the_line(with_bc):
    if with_bc:
        h.check(os.path.exists(BASH_COMPLETION),
                "Debian's bash-completion is installed (scripts/install-deps): %s" % BASH_COMPLETION)
        if not os.path.exists(BASH_COMPLETION):
            return
    with h.tempdir() as tmp:
        os.mkdir(tmp + "/nvme-disk")
        open(tmp + "/manifest.idx", "w").close()
        shell = Shell(with_bc)
        try:
            for typed, want in CASES:
                typed, want = typed.replace("TMP", tmp), want.replace("TMP", tmp)
                got = shell.complete("clairfs " + typed)
                h.check(got == want.rstrip(), "%s: 'clairfs %s<Tab>' runs 'clairfs %s'" % (
                    "with bash-completion" if with_bc else "bash alone", typed, got))
        finally:
            shell.close()


if __name__ == "__main__":  # (run as a script: the same tests, under pytest)
    raise SystemExit(pytest.main([__file__]))
