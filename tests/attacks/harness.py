"""The corpus's harness: a payload (data an outsider wrote) handed to one of the zoo's loaders or commands, in this
process under a SIGALRM deadline (``inline``), or for a payload that may hang or allocate without bound in a forked
copy of this process under a deadline and a memory cap (``bounded``), and what came back judged.

Forked where it matters: a payload that hangs in native code (a regex in the tokenizers library, a decompressor)
ignores signals, so only a process that can be killed bounds it; a fork has everything this process imported (a
fresh interpreter costs tens of seconds of imports on a loaded machine), but costs ~0.2 s here, so the payloads that
cannot hang stay in process. The child's address space is capped a little above what the parent maps, so a memory
bomb fails as MemoryError instead of taking the machine.

What must hold for every payload and every loader it reaches (``judge``):
  - no marker: nothing the payload names ran (the marker file in ``outside`` is absent, the marker text unprinted);
  - no write outside the run's folder: ``outside`` (a folder beside the run's, holding a victim file) is unchanged;
  - no hang past the deadline: the child returned or raised within ``deadline`` seconds;
  - one line: a refusal is an error of the zoo's kinds (or ValueError/OSError) whose message is one line; a command
    exits non-zero with exactly one ``error:`` line and no traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKER_TEXT = "ZOO-ATTACK-MARKER"  # what a payload prints if it runs
MARKER_NAME = "MARKER"  # the file a payload writes in ``outside`` if it runs
DEADLINE = 8.0  # seconds a load may take before it counts as a hang (the loads here take well under one)
# Seconds a payload that hangs today is given: past the zoo's own deadlines once issue 52 lands (a few seconds, so
# that an XPASS says the fix works), short enough that the corpus stays fast while it still hangs.
HANG = 2.5
MEMORY_HEADROOM = 3 * 2**30  # bytes a child may map beyond what this process maps
# What a clean refusal raises: the zoo's own errors (InputError is a ValueError, CheckpointError a RuntimeError:
# TripwireError, UntrustedConfigError, DownloadRefused...), or a ValueError/OSError naming a file. Never TypeError,
# KeyError, RecursionError, MemoryError: those are a loader crashing on the payload, not refusing it.
REFUSALS = ("InputError", "CheckpointError", "ValueError", "OSError", "MlflowException")


@dataclasses.dataclass
class Outcome:
    """What one load did: ``kind`` is returned, raised, exited or hung; ``errors``: the raised exception's class and
    its bases' names; ``output``: what it printed (stdout and stderr together)."""

    kind: str
    errors: list[str] = dataclasses.field(default_factory=list)
    message: str = ""
    code: Any = None
    output: str = ""
    seconds: float = 0.0

    def shown(self) -> str:
        head = f"{self.kind} after {self.seconds:.1f} s"
        if self.errors:
            head += f": {self.errors[0]}: {self.message[:1500]}"
        if self.code is not None:
            head += f" (exit {self.code})"
        return f"{head}\n--- output ---\n{self.output[-3000:]}"


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def bounded(fn: Callable[[], Any], deadline: float = DEADLINE, log: Path | None = None) -> Outcome:
    """``fn()`` in a forked child, killed past ``deadline`` seconds; what it returned, raised or printed."""
    log = log or Path(f".attack-{os.getpid()}-{time.monotonic_ns()}.log")
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            _child(fn, write, log)
        finally:
            os._exit(0)
    os.close(write)
    status = None
    while time.monotonic() - start < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.killpg(pid, signal.SIGKILL) if _own_group(pid) else os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    seconds = time.monotonic() - start
    with os.fdopen(read, "rb") as f:
        raw = f.read()
    output = log.read_text(errors="replace") if log.exists() else ""
    log.unlink(missing_ok=True)
    if status is None:
        return Outcome("hung", output=output, seconds=seconds)
    if not raw:
        return Outcome("crashed", message=f"wait status {status}", output=output, seconds=seconds)
    return Outcome(**json.loads(raw), output=output, seconds=seconds)


def _own_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _child(fn: Callable[[], Any], write: int, log: Path) -> None:
    os.setpgid(0, 0)  # its own group: killed with whatever it started
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)
    limit = _vm_bytes() + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(1)  # no OpenMP pool after a fork
    result = _result(fn)
    os.write(write, json.dumps(result).encode())


def _result(fn: Callable[[], Any]) -> dict:
    """What ``fn()`` did, as ``Outcome``'s fields; what it printed is flushed to the log."""
    try:
        value = fn()
        result = {"kind": "returned", "message": repr(value)[:300]}
    except SystemExit as exit_:
        if exit_.code is not None and not isinstance(exit_.code, int):  # what the interpreter prints on exit
            print(exit_.code, file=sys.stderr)
        result = {"kind": "exited", "code": exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)}
    except PastDeadline:
        result = {"kind": "hung"}
    except BaseException as err:  # whatever the payload makes a loader raise is the result
        names = [c.__name__ for c in type(err).__mro__]
        result = {"kind": "raised", "errors": names, "message": str(err)[:8000]}
    for stream in (sys.stdout, sys.__stdout__, sys.__stderr__):
        stream.flush()
    return result


class PastDeadline(BaseException):
    """Raised into an in-process load at its deadline: a BaseException, so that a loader's ``except Exception``
    does not take it for the payload's error."""


def inline(fn: Callable[[], Any], deadline: float = DEADLINE, log: Path | None = None) -> Outcome:
    """``fn()`` in this process (for payloads that cannot hang in native code nor allocate without bound), its
    output captured and a SIGALRM deadline set; sys.argv, the environment and the streams put back after."""
    log = log or Path(f".attack-{os.getpid()}-{time.monotonic_ns()}.log")
    saved_fds, saved = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr, list(sys.argv), dict(os.environ))
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    stream = open(fd, "w", buffering=1, closefd=False)
    sys.stdout = sys.stderr = stream

    def alarm(signum, frame):
        raise PastDeadline

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    start = time.monotonic()
    try:
        result = _result(fn)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        stream.close()
        os.close(fd)
        for target, source in zip((1, 2), saved_fds, strict=True):
            os.dup2(source, target)
            os.close(source)
        sys.stdout, sys.stderr, sys.argv[:] = saved[0], saved[1], saved[2]
        os.environ.clear()
        os.environ.update(saved[3])
    output = log.read_text(errors="replace")
    log.unlink(missing_ok=True)
    return Outcome(**result, output=output, seconds=time.monotonic() - start)


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under ``folder`` with its mode and (for a file) first bytes: what a write would change."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mode, p.read_bytes()[:64] if p.is_file() and not p.is_symlink() else b"")
    return out


def judge(outcome: Outcome, outside: Path, before: dict, refuse: bool, named: tuple[str, ...] = ()) -> None:
    """The corpus's four checks (module docstring); ``refuse``: the load must refuse (else it may also load);
    ``named``: text the refusal must hold (what was wrong)."""
    assert not (outside / MARKER_NAME).exists(), f"the payload ran: {outside / MARKER_NAME} was written"
    assert MARKER_TEXT not in outcome.output + outcome.message, f"the payload ran: it printed\n{outcome.shown()}"
    assert snapshot(outside) == before, f"a write outside the run's folder: {sorted(snapshot(outside))}"
    assert outcome.kind != "hung", f"no answer within its deadline\n{outcome.shown()}"
    assert outcome.kind != "crashed", outcome.shown()
    if outcome.kind == "exited":  # a command: one error: line, no traceback
        lines = [line for line in outcome.output.splitlines() if line.startswith("error:")]
        assert outcome.code != 0 and len(lines) == 1 and "Traceback" not in outcome.output, outcome.shown()
        message = lines[0]
    elif outcome.kind == "raised":
        assert any(name in REFUSALS for name in outcome.errors), f"a crash, not a refusal\n{outcome.shown()}"
        assert "\n" not in outcome.message.strip(), f"a refusal of more than one line\n{outcome.shown()}"
        message = outcome.message
    else:
        assert not refuse, f"loaded where it must be refused\n{outcome.shown()}"
        return
    for text in named:
        assert text.lower() in message.lower(), f"the refusal does not name {text!r}\n{outcome.shown()}"


class Refused(ValueError):
    """A verdict a loader returns (``verify``'s "differ") as the refusal it is."""


class Accepted(AssertionError):
    """What a loader did with a payload that it must not do (loaded swapped weights, sent a credential, built an
    unbounded value): judged as a failure, never as a refusal."""


@dataclasses.dataclass(frozen=True)
class Payload:
    """One payload: ``make(folder, outside)`` writes it into ``folder`` (a payload that runs writes
    ``outside/MARKER``) and returns what the loaders are handed; ``reaches``: the names of the loaders it reaches
    (its test file's table); ``refuse``: every loader must refuse it (else loading is fine too, so long as nothing
    it names runs); ``named``: text each refusal holds; ``xfail``: why it fails today (a gap issue 52 names and the
    branch fixing it), for every loader or ``{loader: why}``."""

    id: str
    shaped_after: str
    make: Callable[[Path, Path], Any]
    reaches: tuple[str, ...]
    refuse: bool = True
    named: tuple[str, ...] = ()
    xfail: str | dict[str, str] | None = None
    deadline: float = DEADLINE
    isolate: bool = False  # load it in a forked child: it may hang in native code or allocate without bound


def cases(payloads: list[Payload], loaders: dict[str, Callable]) -> list:
    """``(payload, loader name)`` for every loader each payload reaches, as pytest ids ``<payload>-<loader>``."""
    import pytest

    out = []
    for p in payloads:
        assert p.shaped_after, f"{p.id} names no CVE, advisory or public technique"
        assert isinstance(p.reaches, tuple) and isinstance(p.named, tuple), f"{p.id}: reaches and named are tuples"
        for name in p.reaches:
            assert name in loaders, f"{p.id}: no loader {name!r}"
            why = p.xfail.get(name) if isinstance(p.xfail, dict) else p.xfail
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            out.append(pytest.param(p, name, id=f"{p.id}-{name}", marks=marks))
    return out


def replay(payload: Payload, load: Callable[[Any], Any], tmp_path: Path) -> None:
    """Build ``payload`` under ``tmp_path`` (the run's folder), hand it to ``load`` in a bounded child, judge."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("precious")
    folder = tmp_path / "in"
    folder.mkdir()
    built = payload.make(folder, outside)
    before = snapshot(outside)
    run = bounded if payload.isolate else inline
    outcome = run(lambda: load(built), payload.deadline, tmp_path / "load.log")
    judge(outcome, outside, before, payload.refuse, payload.named)


def warm_up() -> None:
    """What the loaders import and cache, done once in this process before any child forks, so that each child
    starts in milliseconds instead of importing and listing packages again."""
    import cli  # noqa: F401
    import datamodules  # noqa: F401
    import zoo.app.pretrained
    import zoo.app.stored_config
    import zoo.cnn
    import zoo.gpt
    import zoo.rl
    import zoo.tracking.models  # noqa: F401
    from zoo.io import tripwire, trust

    tripwire.dependency_modules()
    for package in trust.FAMILY_PACKAGES:
        trust._module_names(package)
