"""The command line's own code, which ``cli.py`` reads as a few one-line hooks: the families table (``families``),
the parser and its one-line errors (``parser``), what each hook does (``hooks``), and the run at a terminal
(``terminal``). Application code, with ``callbacks/``, ``datamodules/`` and ``zoo.tracking``: no family imports it."""
