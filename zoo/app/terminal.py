"""The command line at a terminal: bad input as one ``error:`` line and its fix (the traceback behind
``--verbose``), SIGTERM as exit status 143, and quiet about what no user can act on."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable

from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo import watchdog
from zoo.app.parser import VERBOSE_ENV
from zoo.errors import InputError, install_line, one_line
from zoo.tracking import end_open_runs


@functools.cache  # once a process: each call would add its filters again
def quiet_uninformative_messages() -> None:
    """Silence, by exact message, what Lightning and torch print on every run that no user can act on."""
    # Lightning announces its resume-from-OnExceptionCheckpoint search on every fit.
    warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=None\)` was called without a model")
    warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint")
    # Lightning 2.6's own _pytree helper builds the LeafSpec that torch 2.14 deprecates.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    # cli.py hands LightningCLI the command line with the checkpoint's parts taken out (zoo.app.stored_config).
    warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended to run from within Python")
    noise = (
        "💡 Tip: For seamless cloud logging",  # an advertisement for Lightning's hosted logger
        "Loading `train_dataloader` to estimate number of stepping batches",  # the schedules' horizon
        "Trainer already configured with model summary callbacks",  # callbacks.ModelSummary is the default
    )
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(lambda record: not str(record.msg).startswith(noise))
    # Said when OnExceptionCheckpoint saves a full checkpoint (optimizer state included); reads as if a file
    # were being loaded unsafely.
    logging.getLogger("lightning.pytorch.trainer.connectors.checkpoint_connector").addFilter(
        lambda record: not str(record.msg).startswith("`weights_only` was not set, defaulting to `False`")
    )


def bad_input(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain that names a missing input (a file, a refused file, an environment's
    optional package such as Box2D) and its fix, if any."""
    from gymnasium.error import DependencyNotInstalled
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from zoo.io.weights import CheckpointError
    from zoo.tracking import TrackingServerUnreachable

    while err is not None:
        # MisconfigurationException: Lightning's own one-line refusal of a Trainer setting (max_epochs=-5, devices=0)
        if isinstance(
            err,
            (
                FileNotFoundError,
                NotADirectoryError,
                CheckpointError,
                InputError,
                DependencyNotInstalled,
                TrackingServerUnreachable,
                MisconfigurationException,
            ),
        ):
            return err
        # models:/<name>@<alias> or a version that the registry does not have: the message names it
        if getattr(err, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            return err
        err = err.__cause__ or err.__context__
    return None


def install_hint(err: BaseException) -> str:
    """The zoo's own extra for an environment package gymnasium says is missing (its wheels need no compiler)."""
    from gymnasium.error import DependencyNotInstalled

    if isinstance(err, DependencyNotInstalled):
        return f"; or install the zoo's rl extra, which has Box2D and MuJoCo wheels: {install_line('rl')}"
    return ""


def start_watchdog() -> None:
    """``zoo.watchdog`` for this command: a run it ends is ended in MLflow as KILLED first."""

    def end_runs(signum: int) -> None:
        end_open_runs(SIGTERMException() if signum == signal.SIGTERM else KeyboardInterrupt())

    watchdog.start(end_runs)


def run(main: Callable[[], object]) -> None:
    """``main()`` for a person at a terminal: a missing dataset or file is one line and its fix; a killed or failed
    run ends in MLflow (FAILED, KILLED) whatever stopped it."""
    if "--verbose" in sys.argv:
        sys.argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"
    try:
        main()
    except SIGTERMException as err:  # Lightning stops at the next step and exits 0; a job script must see the kill
        end_open_runs(err)
        sys.exit(128 + signal.SIGTERM)
    except Exception as err:
        end_open_runs(err)  # Lightning ends a failed run, unless a callback raised on the way out or it failed outside
        cause = bad_input(err)
        if cause is None or os.environ.get(VERBOSE_ENV):
            raise
        print(
            f"error: {one_line(cause)}{install_hint(cause)}\n(the full traceback: rerun with --verbose or "
            f"{VERBOSE_ENV}=1)",
            file=sys.stderr,
        )
        sys.exit(1)
