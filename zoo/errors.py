"""Errors that mean "the input you gave cannot work", which the CLI prints as one line instead of a traceback."""


class InputError(ValueError):
    """Data, a file or a setting the user gave that cannot work (too little text for a split, say); the message
    names it and the fix."""
