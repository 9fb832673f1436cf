"""Pure arithmetic and text of measured figures, shared by the app and the measurement tools.

Imports nothing beyond the standard library: ``cocod-plan`` uses it without loading torch or Lightning.
"""

from __future__ import annotations

from collections.abc import Sequence


def steady_step_seconds(step_ends: Sequence[float], warmup_steps: int, period: int = 1) -> float:
    """Mean step time over whole periods after the warm-up, so round-boundary waits count in full."""
    usable = (len(step_ends) - warmup_steps) // period * period
    if warmup_steps < 1 or usable < 1:
        raise ValueError(
            f"{len(step_ends)} steps leave no whole period of {period} after {warmup_steps} warm-up steps: "
            "run more steps"
        )
    return (step_ends[warmup_steps - 1 + usable] - step_ends[warmup_steps - 1]) / usable


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table whose columns line up in a terminal as well."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
