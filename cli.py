"""The zoo's one command line: ``python cli.py {fit,validate,test,predict} --config <yaml>``.

Any family is chosen by ``class_path`` in YAML (subclass mode for model and data). Every run gets,
unless its config replaces them: the MLflow logger, checkpoints (last + best on the family's
metric), learning-rate, grad-norm and precision monitors, a checkpoint on exception, a seed, and the
family's own callbacks (``zoo.tracking.families``). What each hook does is in ``zoo.app.hooks``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

if __name__ == "__main__" and sys.argv[1:] in (["-h"], ["--help"]):  # before torch and Lightning load
    from zoo.app.usage import USAGE

    sys.exit(print(USAGE, end=""))

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from zoo.app import hooks, sizes, terminal
from zoo.app.parser import DEFAULT_CALLBACKS, TRAINER_DEFAULTS, ZooArgumentParser, add_zoo_arguments
from zoo.app.pretrained import hand_over
from zoo.app.stored_config import from_checkpoint
from zoo.app.usage import EPILOG
from zoo.compat import CheckpointHyperparametersLeftToCaller, dump_config_again
from zoo.tracking import LogConfigToMLflow
from zoo.tracking.families import family_of

__all__ = ["DEFAULT_CALLBACKS", "TRAINER_DEFAULTS", "ZooCLI", "main", "run"]


class ZooCLI(CheckpointHyperparametersLeftToCaller, LightningCLI):
    def __init__(self, *args, stored_data: Callable[[], LightningDataModule] | None = None, **kwargs) -> None:
        self.stored_data = stored_data  # the DataModule a --ckpt_path carries (zoo.app.stored_config)
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        hooks.check_seed(self.config[self.config.subcommand] if self.config.get("subcommand") else self.config)

    def add_arguments_to_parser(self, parser) -> None:
        add_zoo_arguments(parser)

    def before_instantiate_classes(self) -> None:
        stated = self.parser.stated  # what the user's config states (zoo.app.parser)
        stated = stated[self.subcommand] if self.subcommand else stated
        self.opened = hooks.prepare_config(self._config(), self.subcommand, stated)

    def instantiate_classes(self) -> None:
        # The data first, then the net's sizes from it (zoo.app.sizes), then the model: the net is built once, sized.
        self.config_init = sizes.instantiate_data_first(
            self.parser,
            self.config,
            self.subcommand,
            family_of,
            lambda: dump_config_again(self),
            self.stored_data,
            lambda part: hand_over(self.opened, part),  # the init_weights folder, read once (zoo.app.pretrained)
        )
        cfg = self.config_init[self.subcommand] if self.subcommand else self.config_init
        self.datamodule, self.model = cfg.get("data"), cfg.get("model")
        self.trainer = hooks.build_trainer(self.instantiate_trainer, cfg.trainer)

    def after_instantiate_classes(self) -> None:
        hooks.wire(self.trainer, self.model, self.subcommand, self._config().get("ckpt_path"))

    def before_fit(self) -> None:
        hooks.fit_folders(self.trainer)

    def before_validate(self) -> None:
        hooks.evaluation_folder(self.trainer, self.subcommand)

    before_test = before_predict = before_validate

    def after_fit(self) -> None:
        hooks.after_fit(self.trainer, self.model, self.datamodule, self.config.fit.test_after_fit)

    def after_test(self) -> None:
        hooks.after_evaluation(self.trainer)

    after_validate = after_test

    def _config(self):
        return self.config[self.subcommand] if self.subcommand else self.config


def main(args: list[str] | None = None, run: bool = True) -> ZooCLI:
    terminal.quiet_uninformative_messages()
    # validate/test/predict --ckpt_path: the checkpoint's own model and data, built by the zoo's rules, never parsed
    # (against the stored-config allowlist, made only then). sys.argv stays as typed: the ranks Lightning launches
    # re-run it, and split it the same way.
    stored = from_checkpoint(sys.argv[1:] if args is None else list(args))
    return ZooCLI(
        stored.model or LightningModule,
        None if stored.data else LightningDataModule,  # None: the data is optional to the parser (the stored one)
        parser_class=ZooArgumentParser,
        parser_kwargs={sub: {"epilog": EPILOG} for sub in ("fit", "validate", "test", "predict")},
        subclass_mode_model=stored.model is None,
        subclass_mode_data=True,
        stored_data=stored.data,
        save_config_callback=LogConfigToMLflow,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        auto_configure_optimizers=False,
        args=None if args is None and stored.argv == sys.argv[1:] else stored.argv,
        run=run,
    )


def run() -> None:
    """``main()`` for a person at a terminal: bad input is one ``error:`` line and its fix (``zoo.app.terminal``)."""
    terminal.run(main)


if __name__ == "__main__":
    terminal.start_watchdog()  # Ctrl-C and SIGTERM end the command, whatever it is stuck in (zoo.watchdog)
    run()
    # Close a DDP/FSDP process group before the interpreter exits: left to exit-time destructors, gloo's
    # threads can abort a finished run ("terminate called without an active exception").
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
