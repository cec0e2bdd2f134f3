"""Ctrl-C and SIGTERM always end a command (``zoo.watchdog``): a process whose handler only notes SIGTERM (as
Lightning's does) and then stays stuck, in a Python loop or in native code that holds the GIL (``re`` backtracking,
as a stored regex in ``tokenizers`` does in Rust), is ended with one line soon after the grace; a forked worker's
signal is not the command's; the watchdog leaves with its command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRACE, MARGIN = 0.3, 0.3
STUCK = r"""
import os, re, signal, sys, time
from zoo import watchdog
if sys.argv[1] == "fork":  # a worker signalled the moment it exists, before the watchdog's own fork hook has run
    os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
watchdog.start(lambda signum: print("ended runs", signum, file=sys.stderr, flush=True), margin=float(sys.argv[2]))
signal.signal(signal.SIGTERM, lambda *a: None)  # as Lightning's handler: notes the signal, carries on
end = time.monotonic() + 60  # stuck for a minute at most, should a test be stopped before it ends the process
if sys.argv[1] == "fork":
    signal.signal(signal.SIGALRM, lambda *a: None)  # a caught signal that is no stop (an answer rule's deadline)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    child = os.fork()
    if child == 0:
        while time.monotonic() < end:
            pass
        os._exit(0)
    print(child, flush=True)
    time.sleep(30)
print(watchdog._started.pid, flush=True)
if sys.argv[1] == "python":
    while time.monotonic() < end:
        pass
if sys.argv[1] == "native":
    re.match(r"(a+)+$", "a" * 27 + "b")  # 2^27 steps in C (a minute), the GIL held all along
sys.exit(0)
"""


def stuck(kind: str) -> subprocess.Popen:
    env = dict(os.environ, ZOO_STOP_GRACE=str(GRACE), PYTHONPATH=str(ROOT))
    args = [sys.executable, "-c", STUCK, kind, str(MARGIN)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


@pytest.mark.parametrize(("kind", "status"), [("python", 128 + signal.SIGTERM), ("native", -signal.SIGKILL)])
def test_a_command_stuck_after_sigterm_ends_with_one_line_after_the_grace(kind, status):
    proc = stuck(kind)
    int(proc.stdout.readline())  # started, and stuck from here
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    took = time.monotonic() - start
    assert proc.returncode == status, err
    assert GRACE <= took < GRACE + MARGIN + 1.5
    lines = err.splitlines()
    assert lines[0].startswith("error: the command had not stopped 0.3 s after SIGTERM"), err
    # the command's own thread ends its runs where it can run; where the GIL is held, the watchdog alone speaks
    assert lines[1:] == (["ended runs 15"] if kind == "python" else []), err


def test_a_forked_workers_signal_is_not_the_commands_nor_is_an_alarm():
    proc = stuck("fork")
    worker = int(proc.stdout.readline())
    try:
        os.kill(worker, signal.SIGTERM)  # the worker notes it and stays: its own business
        time.sleep(GRACE + MARGIN + 0.5)
        assert proc.poll() is None
    finally:
        os.kill(worker, signal.SIGKILL)
        proc.kill()
        proc.communicate(timeout=30)


def test_the_watchdog_leaves_with_its_command():
    proc = stuck("exit")
    watchdog = int(proc.stdout.readline())
    assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 5
    while _running(watchdog) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(watchdog)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_grace_that_is_not_seconds_is_one_line():
    env = dict(os.environ, ZOO_STOP_GRACE="soon", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", STUCK, "exit", "1"], capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stderr == "error: ZOO_STOP_GRACE='soon' is not a number of seconds above 0: give one, e.g. 10\n"
