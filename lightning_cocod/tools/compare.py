"""What the measurement tools share: the bound's name, the options they read alike (link rates as
people write them, worker counts, least values), the per-round figures and their table cells,
one method's workers run with a progress line, and the plot files.

Imports no torch and no Lightning (``cocod-plan`` reads its options here); matplotlib only to plot.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import statistics
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
# A round's codecs (``core.compress.CODECS``) and DDP's hooks (``strategies.ssgd.COMM_HOOKS``),
# spelled out here because this module imports no torch; a test checks that the lists agree.
COMPRESSIONS = ("bf16", "int8")
COMM_HOOKS = ("bf16", "fp16", "powersgd")
_POWERSGD = re.compile(r"powersgd(\d*)")
_OVERLAP = re.compile(r"d(\d+)")


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


def parse_method(token: str, default_tau: int) -> dict[str, Any]:
    """A method as the tools' --methods write it: a name, then options after colons.
    'cocod:auto:ps' -> {"method": "cocod", "tau": "auto", "proportional": True}; 'cocod:int8'
    compresses the rounds (``compression="int8"``); 'diloco:8:d1' overlaps the round's
    all-reduce with its last step (``overlap=1``, 0 to tau); 'ssgd:powersgd2' is DDP with torch's
    PowerSGD hook of rank 2 (``comm_hook="powersgd"``, ``powersgd_rank=2``)."""
    name, *options = token.split(":")
    accepted = (
        f"TAU and ps ({', '.join(methods.PERIODIC)}), auto ({', '.join(methods.ADAPTIVE)}), "
        f"overlap dN, 0 <= N <= TAU ({', '.join(methods.OVERLAPPED)}), "
        f"compression {' or '.join(COMPRESSIONS)} ({', '.join(methods.PERIODIC)}), "
        f"DDP hook {', '.join(COMM_HOOKS[:-1])} or powersgd[RANK] (ssgd)"
    )
    if name not in methods.METHODS:
        raise ValueError(
            f"method {token!r} not understood; accepted: {', '.join(methods.METHODS)}, options {accepted}"
        )
    spec: dict[str, Any] = {"method": name, "tau": default_tau, "proportional": False}
    for option in options:
        powersgd = _POWERSGD.fullmatch(option)
        codec = spec.get("compression") or spec.get("comm_hook")
        if codec and (option in COMPRESSIONS or option in COMM_HOOKS or powersgd):
            raise ValueError(f"method {token!r} names two codecs, {codec!r} and {option!r}: give one")
        if option == "ps" and name in methods.PERIODIC:
            spec["proportional"] = True
        elif option == "auto" and name in methods.ADAPTIVE:
            spec["tau"] = "auto"
        elif option.isdigit() and int(option) >= 1 and name in methods.PERIODIC:
            spec["tau"] = int(option)
        elif option in COMPRESSIONS and name in methods.PERIODIC:
            spec["compression"] = option
        elif _OVERLAP.fullmatch(option) and name in methods.OVERLAPPED:
            spec["overlap"] = int(option[1:])
        elif name == "ssgd" and (option in COMM_HOOKS or powersgd):
            spec["comm_hook"] = "powersgd" if powersgd else option
            if powersgd and powersgd[1]:
                if int(powersgd[1]) < 1:
                    raise ValueError(
                        f"method {token!r}: PowerSGD's rank must be at least 1, got {powersgd[1]}"
                    )
                spec["powersgd_rank"] = int(powersgd[1])
        else:
            raise ValueError(f"option {option!r} of method {token!r} not understood; accepted: {accepted}")
    if "overlap" in spec:  # against the period, which may come after it
        if spec["tau"] == "auto":
            raise ValueError(
                f"method {token!r}: overlap d{spec['overlap']} needs a fixed period (auto chooses the paper's round's)"
            )
        if spec["overlap"] > spec["tau"]:
            raise ValueError(
                f"method {token!r}: overlap d{spec['overlap']} is above the period; accepted: d0 to d{spec['tau']}"
            )
    return spec


def method_label(spec: dict[str, Any]) -> str:
    """The table's label of a run's spec: the method, its period and an overlap it was given
    ("CoCoD-SGD tau=4", "DiLoCo tau=8 overlap 1"), a raised bound of tau="auto" (its runs are not
    the default's: the bound changes what tau="auto" may choose), its codec ("CoCoD-SGD tau=4
    int8", "S-SGD +PowerSGD rank 1"), proportional sampling; or the bound's label."""
    if spec["method"] == BOUND:
        return BOUND_LABEL
    text = methods.label(spec["method"], spec.get("tau"), spec.get("overlap"))
    text += f" (tau_max {spec['tau_max']})" if "tau_max" in spec else ""
    text += f" {spec['compression']}" if spec.get("compression") else ""
    if spec.get("comm_hook") == "powersgd":
        text += f" +PowerSGD rank {spec.get('powersgd_rank', 1)}"
    elif spec.get("comm_hook"):
        text += f" +{spec['comm_hook']} hook"
    return text + (" +PS" if spec.get("proportional") else "")


def round_figures(results: list[dict[str, Any]], from_step: int = 0) -> dict[str, float | None]:
    """Medians over every rank's rounds launched at ``from_step`` or later of what a worker
    records per round: seconds launch to completion, bytes this rank sent and received, codec
    seconds (part of the first). None where no round recorded it (DDP's buckets, older runs).
    The median keeps a fit's first round, exact fp32 in a compressed run, from counting."""
    rounds = [r for result in results for r in result.get("rounds", []) if r[0] >= from_step]
    # The columns of a worker's "rounds" (index 3, the exposed seconds, is summed elsewhere).
    columns = {"comm_seconds": 2, "bytes_sent": 4, "bytes_received": 5, "codec_seconds": 6}
    figures: dict[str, float | None] = {}
    for key, index in columns.items():
        values = [r[index] for r in rounds if len(r) > index]
        figures[f"{key}_per_round"] = statistics.median(values) if values else None
    return figures


def round_cells(run: dict[str, Any], figures: dict[str, Any], share: float | None, digits: int) -> list[str]:
    """A table's "MB sent/round" and "codec s/round" cells of ``run`` (its ``method`` and
    ``compression``) from ``round_figures``: what one rank sent per round, and the codec's seconds
    per round with ``share``, its part of the round's compute, when known. "-" where the figure
    does not apply: S-SGD and Pipe-SGD have no rounds (they all-reduce gradients every step), and
    rounds sent uncompressed have no codec; n/a where it applies but was not recorded."""
    if run["method"] not in methods.PERIODIC:
        return ["-", "-"]
    sent, codec = figures.get("bytes_sent_per_round"), figures.get("codec_seconds_per_round")
    sent_cell = "n/a" if sent is None else f"{sent / 1e6:.{digits}f}"
    if not run.get("compression"):
        return [sent_cell, "-"]
    share_text = f" ({100 * share:.1f}%)" if share is not None else ""
    return [sent_cell, "n/a" if codec is None else f"{codec:.{digits + 1}f}{share_text}"]


def run_method(
    spec: dict[str, Any],
    workers: int,
    rate: str | None,
    out_dir: Path,
    suffix: str = "",
    topology: str = "loopback",
    latency: float | None = None,
) -> list[dict[str, Any]]:
    """Run ``spec`` on ``workers`` ranks over links shaped to ``rate`` (one shared loopback, or
    with ``topology="pernode"`` a link per worker); returns each rank's result. ``suffix`` tells
    apart the folders of repeated runs of one method."""
    name = spec["method"] + (f"-tau{spec['tau']}" if spec["method"] in methods.PERIODIC else "")
    name += f"-d{spec['overlap']}" if spec.get("overlap") is not None else ""
    name += "".join(f"-{spec[key]}" for key in ("compression", "comm_hook", "powersgd_rank") if spec.get(key))
    name += "-ps" if spec.get("proportional") else ""
    run_dir = out_dir / f"{name}-{rate or 'unshaped'}{suffix}"
    run_dir.mkdir(parents=True, exist_ok=True)
    title = f"{method_label(spec):<30} @ {rate or 'unshaped'}"
    show = functools.partial(print, flush=True)
    relay = ProgressRelay(run_dir / "progress.txt", title, every_s=5.0, show=show)
    spec = {**spec, "progress_path": str(relay.path), "title": title}
    results = launch_workers(
        "lightning_cocod.tools.worker",
        workers,
        rate,
        [json.dumps(spec)],
        timeout_s=1800,
        output_dir=run_dir,
        name_prefix="cocod-cmp",
        on_tick=relay.tick,
        topology=topology,
        latency=latency,
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
