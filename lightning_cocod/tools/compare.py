"""What the measurement tools share: the bound's name, the options they read alike (link rates as
people write them, worker counts, least values), one method's workers run with a progress line,
and the plot files.

Imports no torch and no Lightning (``cocod-plan`` reads its options here); matplotlib only to plot.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_cocod import methods
from lightning_cocod.launch import launch_workers, parse_rate
from lightning_cocod.launch.progress import ProgressRelay

# The tools' own row: the same steps on single-process Trainers, no process group at all.
BOUND = "bound"
BOUND_LABEL = "compute only (bound)"
_RATE = re.compile(r"(\d+(?:\.\d+)?)([kmg])(?:bit|bps)", re.IGNORECASE)


def option_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: its ValueError becomes the option's one-line error, where
    argparse would say only "invalid value"."""

    @functools.wraps(parse)
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def read_rate(text: str) -> int | None:
    """Bits per second of a link rate as people write it, in any case: 100mbit, 100Mbps, 1.5gbit,
    10Gbps (bit and bps both mean bits per second); None for 'none' or 'unshaped'."""
    match = _RATE.fullmatch(text.strip())
    if match is None and text.strip().lower() not in ("none", "unshaped"):
        raise ValueError(
            f"rate {text!r} is not understood; accepted: a number and kbit, mbit, gbit (or kbps, Mbps, Gbps: "
            "bits per second), e.g. 100mbit, 100Mbps, 1.5gbit, 10Gbps, or 'none'"
        )
    return parse_rate(f"{match[1]}{match[2].lower()}bit" if match else None)


def parse_worker_counts(text: str) -> list[int]:
    """'8,2,4' -> [2, 4, 8]; each count at least 2 (a run with one worker has nothing to communicate)."""
    tokens = [t.strip() for t in str(text).split(",") if t.strip()]
    if not tokens or not all(t.isdigit() and int(t) >= 2 for t in tokens):
        raise ValueError(f"--workers {text!r} is not understood: give counts of at least 2, e.g. 2 or 2,4,8")
    return sorted(set(map(int, tokens)))


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, **least: int) -> None:
    """The parser's one-line error for the first of these options below its least value."""
    for name, low in least.items():
        if getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")


def method_label(spec: dict[str, Any]) -> str:
    """The table's label of a run's spec: the method and its period ("CoCoD-SGD tau=4"), a raised
    bound of tau="auto" (its runs are not the default's: the bound changes what tau="auto" may
    choose), proportional sampling; or the bound's label."""
    if spec["method"] == BOUND:
        return BOUND_LABEL
    text = methods.label(spec["method"], spec.get("tau"))
    text += f" (tau_max {spec['tau_max']})" if "tau_max" in spec else ""
    return text + (" +PS" if spec.get("proportional") else "")


def run_method(
    spec: dict[str, Any], workers: int, rate: str | None, out_dir: Path, timeout_s: float = 1800,
    suffix: str = "", topology: str = "loopback", latency: float | None = None,
) -> list[dict[str, Any]]:
    """Run ``spec`` on ``workers`` ranks over links shaped to ``rate`` (one shared loopback, or
    with ``topology="pernode"`` a link per worker); returns each rank's result. ``suffix`` tells
    apart the folders of repeated runs of one method."""
    name = spec["method"] + (f"-tau{spec['tau']}" if spec["method"] in methods.PERIODIC else "")
    name += "-ps" if spec.get("proportional") else ""
    run_dir = out_dir / f"{name}-{rate or 'unshaped'}{suffix}"
    run_dir.mkdir(parents=True, exist_ok=True)
    title = f"{method_label(spec):<30} @ {rate or 'unshaped'}"
    show = functools.partial(print, flush=True)
    relay = ProgressRelay(run_dir / "progress.txt", title, every_s=5.0, show=show)
    spec = {**spec, "progress_path": str(relay.path), "title": title}
    results = launch_workers(
        "lightning_cocod.tools.worker", workers, rate, [json.dumps(spec)], timeout_s=timeout_s,
        output_dir=run_dir, name_prefix="cocod-cmp", on_tick=relay.tick, topology=topology, latency=latency,
    )
    (run_dir / "results.json").write_text(json.dumps(results))
    show(f"{title}: done in {time.monotonic() - relay.started:.0f} s")
    return results


@contextlib.contextmanager
def plot_file(path: Path, xlabel: str, ylabel: str, title: str) -> Iterator[Any]:
    """The axes to draw on; on leaving, labelled, with a grid and a legend, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        yield ax
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
