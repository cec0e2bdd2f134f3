"""Errors that mean "the input you gave cannot work", which the CLI prints as one line instead of a traceback."""


class InputError(ValueError):
    """Data, a file or a setting the user gave that cannot work (too little text for a split, say); the message
    names it and the fix."""


class CheckpointError(RuntimeError):
    """A file that is not a loadable checkpoint (truncated, another format); the message names it and says why."""


class MissingBaseError(CheckpointError):
    """A LoRA checkpoint that left its frozen base out, loaded without the ``init_weights`` it was trained on."""


class TruncatedCheckpointError(CheckpointError):
    """A checkpoint whose end is missing (an interrupted copy, download or save)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint asked to unpickle something other than tensors and plain containers."""


def one_line(err: BaseException) -> str:
    """``err``'s message; for one raised in a DataLoader worker, which torch re-raises with the worker's traceback as
    its message, the original message only."""
    text = str(err)
    if "Original Traceback" in text:
        text = text.rstrip().splitlines()[-1].split(": ", 1)[-1]  # "zoo.errors.InputError: <message>"
    return " ".join(text.split()) if "\n" in text else text
