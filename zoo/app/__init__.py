"""The command line's own code, which ``cli.py`` reads as a few one-line hooks: the parser and its one-line errors
(``parser``), what each hook does (``hooks``), the net's sizes (``sizes``) and a pretrained source's architecture
(``pretrained``) set before the net is built, the model and data configs a ``--ckpt_path`` carries
(``stored_config``), and the run at a terminal (``terminal``). The second floor of the application wing: it imports
``callbacks/``, ``datamodules/`` and ``zoo.tracking``, none of which imports it; no family imports it."""
