"""The mount tests as pytest sees them: each scenario a test function, run and reported alone, e.g.

    /usr/bin/python3 -m pytest tests/mount/test_mount.py::test_writes_are_refused

(or `/usr/bin/python3 tests/mount/test_mount.py`) from a checkout built in build/ (harness.py's defaults;
meson test runs each file with its own). A scenario's h.check lines are printed as they are made; it goes
on past a failed check and fails at its end, naming them all. Skipped when /dev/fuse is missing; a file
whose every scenario was skipped (no Slurm, say) exits 77, meson's "skipped".

Files run two at a time in the plain pass (scripts/test: `meson test --num-processes 2`). A file that
changes what every mount on the machine meets (a sysctl, the page cache, network namespaces) or whose
checks lean on the machine's time and load says `ALONE = True` (with why): it holds the build's lock file
(mount-tests.lock) alone, the others hold it shared (flock), so it runs with no other file beside it,
however its files are started. (test_torch2 shares the torch 2 chroot with test_readers, which is alone.)
"""
import fcntl
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if not os.path.exists("/dev/fuse"):
        for item in items:
            item.add_marker(pytest.mark.skip(reason="/dev/fuse is missing"))


@pytest.fixture(scope="session", autouse=True)
def _the_machine(request):
    alone = any(getattr(item.module, "ALONE", False) for item in request.session.items)
    fd = os.open(os.path.join(os.environ["CLAIRFS_BUILD"], "mount-tests.lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


_ran = []  # whether each scenario's call ran (not skipped)


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _ran.append(not report.skipped)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _ran and not any(_ran):
        session.exitstatus = 77


def _judge(failed_before):
    failed = h.FAILURES[failed_before:]
    if failed:
        pytest.fail("%d check(s) failed:\n%s" % (len(failed), "\n".join("  - " + f for f in failed)), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    h.FAILURES.clear()  # (a scenario's own checks, and those of the fixtures it sets up)
    print()  # (its lines below its name)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    if outcome.excinfo is None:
        _judge(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    before = len(h.FAILURES)
    outcome = yield
    if outcome.excinfo is None:
        _judge(before)
