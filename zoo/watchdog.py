"""Ctrl-C and SIGTERM always end a command: a watchdog ends the process when it has not stopped ``grace`` seconds
after the signal (``ZOO_STOP_GRACE``, default 10 s), whatever its main thread is stuck in.

Lightning stops a fit gracefully on SIGTERM at the next batch (saving its checkpoint, ending the MLflow run); a
KeyboardInterrupt stops it where Python next runs. Neither happens while the main thread runs something that never
returns between two steps: a regex in the ``tokenizers`` library (Rust, holding the GIL), ``re`` on a pattern that
backtracks (it runs signal handlers, but Lightning's only notes the signal), a loop in a hook. A Python handler or
thread cannot help there (the handler runs on the main thread, a thread needs the GIL), so the watchdog is a small
process of its own, started with the command:
  1. ``signal.set_wakeup_fd`` makes CPython's C-level handler write each caught signal's number to a pipe, with no
     GIL and no Python code; the watchdog process reads it (a signal left at its default, such as SIGTERM before
     Lightning's fit, ends the process at once by itself);
  2. ``grace`` s after the first SIGTERM or SIGINT, it writes that number back to a thread of the command, which
     prints one ``error:`` line, runs the command's ``on_timeout`` (ending its MLflow run as KILLED) and exits with
     128 + the signal's number (143, 130), as a process ended by it would;
  3. when that thread cannot run either (the GIL held) and the process is still there ``MARGIN_S`` later, the
     watchdog prints the line and ends it with SIGKILL (exit status 137).
The watchdog leaves when the command's process is gone (the pipe's end closes). A process forked from the command
(a DataLoader worker) closes its copies before it takes a signal, so a worker's signal is not the command's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

GRACE_ENV = "ZOO_STOP_GRACE"
GRACE_S = 10.0  # Lightning's stop at the next batch, its checkpoint and the run's end fit in it on a small model
MARGIN_S = 2.0  # for the command's own thread to print its line and end the run, before SIGKILL
STOPPING = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}

# The watchdog process: stdin is the wakeup pipe, stdout the pipe back to the command; it ignores the signals that
# a process group or a terminal sends the command, so that it outlives them.
_WATCHDOG = """
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pid, grace, margin, line = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
names = {int(k): v for k, v in (pair.split(":", 1) for pair in sys.argv[5].split(","))}

def read(timeout):
    ready, _, _ = select.select([0], [], [], timeout)
    data = os.read(0, 512) if ready else b""
    if ready and not data:
        sys.exit(0)  # the command is gone
    return data

def wait(seconds):
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        read(left)

while not (caught := [b for b in read(None) if b in names]):
    pass
wait(grace)
os.write(1, bytes(caught[:1]))
wait(margin)
print(line.format(signal=names[caught[0]], grace=grace) + " (SIGKILL)", file=sys.stderr, flush=True)
os.kill(pid, signal.SIGKILL)
"""

LINE = (
    "error: the command had not stopped {grace:g} s after {signal} (stuck where no signal handler runs: native code "
    "such as a stored regex, or a loop between two steps): ended by the zoo's watchdog; "
    f"{GRACE_ENV}=<seconds> sets the wait"
)

_started: subprocess.Popen | None = None


def grace_seconds() -> float:
    """``ZOO_STOP_GRACE`` (seconds, > 0) or the default; a value that is not one is one line."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        sys.exit(f"error: {GRACE_ENV}={raw!r} is not a number of seconds above 0: give one, e.g. {GRACE_S:g}")
    return value


def start(on_timeout: Callable[[int], object] = lambda signum: None, margin: float = MARGIN_S) -> None:
    """The watchdog for this process (once; from the main thread, at a command's start, before anything it loads
    runs): ``on_timeout(signum)`` runs on the way out, on a thread of its own, when the grace has passed."""
    global _started
    if _started is not None or threading.current_thread() is not threading.main_thread():
        return
    grace = grace_seconds()
    wake_r, wake_w = os.pipe()
    back_r, back_w = os.pipe()
    os.set_blocking(wake_w, False)  # set_wakeup_fd's rule: a full pipe drops a byte, never blocks a handler
    names = ",".join(f"{int(s)}:{name}" for s, name in STOPPING.items())
    _started = subprocess.Popen(
        [sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(grace), str(margin), LINE, names],
        stdin=wake_r,
        stdout=back_w,
        close_fds=True,
    )
    os.close(wake_r)
    os.close(back_w)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    # A forked worker's signals are its own, and it must not hold the pipe open; SIGTERM and SIGINT wait while it
    # forks, so none reaches the child before it lets go of the pipe.
    held = threading.local()

    def before() -> None:
        held.mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)

    def parent() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held.mask)

    def child() -> None:
        with contextlib.suppress(OSError, ValueError):  # a fork of a fork: already done
            signal.set_wakeup_fd(-1)
            os.close(wake_w)
            os.close(back_r)
        signal.pthread_sigmask(signal.SIG_SETMASK, held.mask)

    os.register_at_fork(before=before, after_in_parent=parent, after_in_child=child)
    threading.Thread(target=_end_on_word, args=(back_r, grace, on_timeout), name="zoo-watchdog", daemon=True).start()


def _end_on_word(back_r: int, grace: float, on_timeout: Callable[[int], object]) -> None:
    """Waits (without the GIL) for the watchdog's word that the grace has passed; then ends the process."""
    word = os.read(back_r, 1)
    if not word:  # the watchdog is gone: nothing to do
        return
    signum = word[0]
    print(LINE.format(signal=STOPPING.get(signum, signum), grace=grace), file=sys.stderr, flush=True)
    try:
        on_timeout(signum)
    finally:
        os._exit(128 + signum)
