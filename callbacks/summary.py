"""The model summary at the start of fit, without a FLOPs column that only ever reads 0."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count


class ModelSummary(LightningModelSummary):
    """Lightning's layer table and parameter totals, printed as plain text.

    Lightning counts FLOPs only for a module that sets ``example_input_array``; for every other module its
    summary prints a column of zeros and ``Total FLOPs: 0``, which reads as a measurement. The column and
    the total are kept when Lightning did count them.
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        columns = [(name, [str(v) for v in values]) for name, values in summary_data if total_flops or name != "FLOPs"]
        totals = [
            (get_human_readable_count(trainable_parameters), "Trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
            (get_human_readable_count(total_parameters), "Total params"),
            (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
            (str(total_training_modes["train"]), "Modules in train mode"),
            (str(total_training_modes["eval"]), "Modules in eval mode"),
        ]
        if total_flops:
            totals.append((get_human_readable_count(total_flops), "Total FLOPs"))
        rank_zero_info("\n" + format_table(columns) + "\n" + "\n".join(f"{v:<10} {k}" for v, k in totals))


def format_table(columns: list[tuple[str, list[str]]]) -> str:
    """Columns of equal length as a text table: a header, a rule, one line per row."""
    widths = [max([len(name), *map(len, values)]) for name, values in columns]
    rows = [[name for name, _ in columns], *zip(*(values for _, values in columns))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    rule = "-" * max(map(len, lines))
    return "\n".join([lines[0], rule, *lines[1:], rule])
