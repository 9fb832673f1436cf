"""The main job: S-SGD, Local-SGD, Pipe-SGD and CoCoD-SGD side by side on real data over a
simulated slow link, then a table and a plot of test accuracy against wall time.

    cocod-demo                      # 2 CPU workers, digits, 100 Mbit/s shaped loopback
    cocod-demo --rate 1gbit --epochs 5 --out runs/demo
    cocod-demo --methods ssgd,ssgd:powersgd,cocod,cocod:int8   # compressed rounds and DDP's hooks

``--methods`` takes cocod-bench's spelling: ``cocod:8`` (tau 8), ``cocod:int8`` / ``cocod:bf16``
(compressed rounds), ``ssgd:bf16`` / ``ssgd:fp16`` / ``ssgd:powersgd[RANK]`` (DDP's hooks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from lightning_cocod.figures import markdown_table
from lightning_cocod.launch import format_rate
from lightning_cocod.methods import METHODS
from lightning_cocod.tools.compare import (
    method_label,
    option_type,
    parse_method,
    plot_file,
    read_rate,
    require_at_least,
    round_cells,
    round_figures,
    run_method,
)

# SmallCNN on 8x8 digits: ~30 ms per step per worker here (2 workers on 2 cores), 0.59 MB of
# parameters. On a 100 Mbit/s link shared by both directions an all-reduce moves about twice
# that (~100 ms): synchronous methods wait ~3 steps' worth every step, CoCoD hides it behind 4.
DEFAULT_RATE = "100mbit"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cocod-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rate",
        dest="rate_bps",
        metavar="RATE",
        default=DEFAULT_RATE,
        type=option_type(read_rate),
        help="link rate, e.g. 100mbit, 1Gbps, or 'none' (unshaped)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    # A fixed period, not the recommended tau="auto" (at most 2): the demo compares the methods at
    # one period on a slow link, where a round lasts about 3 steps (above), which 4 hides and 2
    # would not. What to train with is the README's advice, not this.
    parser.add_argument(
        "--tau",
        type=int,
        default=4,
        help="period of Local-SGD and CoCoD-SGD, fixed so that they compare at one period; 4 hides a round "
        'on the default link, where training would take the recommended tau="auto" (at most 2: longer '
        "periods cost accuracy)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--width", type=int, default=48, help="SmallCNN width (model size)")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {','.join(METHODS)}, with options as cocod-bench's: e.g. cocod:int8,ssgd:powersgd",
    )
    parser.add_argument("--out", default=None, help="output folder (default runs/demo-<time>)")
    args = parser.parse_args(argv)
    require_at_least(parser, args, workers=2, epochs=1, tau=1, batch_size=1, width=1)
    try:
        tokens = [m.strip() for m in args.methods.split(",") if m.strip()]
        args.specs = {m: parse_method(m, args.tau) for m in tokens}
    except ValueError as err:
        parser.error(f"--methods: {err}")
    if not args.specs:
        parser.error(f"--methods (empty) not understood; accepted: {', '.join(METHODS)}")
    if any(spec["tau"] == "auto" or spec["proportional"] for spec in args.specs.values()):
        parser.error(
            "--methods: the demo runs fixed periods without proportional sampling; use cocod-bench for auto, ps"
        )
    args.rate = format_rate(args.rate_bps) if args.rate_bps else None  # as the launchers read it
    return args


def wall_seconds(result: dict[str, Any]) -> float:
    """From the first step to the end of the last evaluation."""
    return result["timeline"][-1]["seconds"] if result["timeline"] else result["train_seconds"]


def hidden_share(results: list[dict[str, Any]]) -> str:
    # None from Lightning's DDP, which does not expose its bucket timings: n/a.
    comms = [r["comm"] for r in results if r.get("comm")]
    total = sum(c["comm_seconds"] for c in comms)
    exposed = sum(c["exposed_seconds"] for c in comms)
    return f"{100 * max(0.0, 1 - exposed / total):.0f}%" if total > 0 else "n/a"


def round_columns(spec: dict[str, Any], ranks: list[dict[str, Any]]) -> list[str]:
    """The run's ``round_cells``, the codec's share taken of the round's steps as the run took
    them (communication waits included)."""
    figures = round_figures(ranks)
    steps = len(ranks[0]["step_ends"])
    round_seconds = ranks[0]["tau"] * ranks[0]["train_seconds"] / steps if steps else 0.0
    codec = figures["codec_seconds_per_round"]
    return round_cells(
        spec, figures, codec / round_seconds if codec and round_seconds > 0 else None, digits=3
    )


def results_table(specs: dict[str, dict[str, Any]], results: dict[str, list[dict[str, Any]]]) -> str:
    """The demo's table: a row per method of ``specs`` from its ranks' ``results``."""
    base = wall_seconds(results["ssgd"][0]) if "ssgd" in results else None
    rows = [
        [
            method_label(specs[method]),
            f"{100 * ranks[0]['test_acc']:.1f}%",
            f"{wall_seconds(ranks[0]):.1f} s",
            f"{base / wall_seconds(ranks[0]):.2f}x" if base else "n/a",
            hidden_share(ranks),
            *round_columns(specs[method], ranks),
        ]
        for method, ranks in results.items()
    ]
    headers = [
        "method",
        "test accuracy",
        "wall time",
        "speedup vs S-SGD",
        "comm hidden",
        "MB sent/round",
        "codec s/round (of its steps)",
    ]
    return markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    from lightning_cocod.models import SmallCNN

    params = sum(p.numel() for p in SmallCNN(in_channels=1, num_classes=10, width=args.width).parameters())
    megabytes = params * 4 / 1e6
    link = args.rate or "unshaped loopback"
    print(f"CoCoD-SGD demo: {args.workers} CPU workers (gloo), handwritten digits (1,437 train / 360 test)")
    print(f"model: SmallCNN width {args.width}, {params:,} parameters = {megabytes:.2f} MB per all-reduce")
    if args.rate_bps:
        seconds = 2 * megabytes * 8e6 / args.rate_bps  # both directions share one shaped loopback
        print(f"link: {link} (tbf on a private loopback): ~{1000 * seconds:.0f} ms per model all-reduce")
    else:
        print("link: unshaped loopback: communication is nearly free, expect little difference")
    print(f"{args.epochs} epochs, batch {args.batch_size} per worker, tau={args.tau}; output in {out}\n")

    spec = {
        "model": "small_cnn",
        "model_kwargs": {"width": args.width},
        "data": "digits",
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": 0,
        "epochs": args.epochs,
        "evaluate": True,
        "tau": args.tau,
    }
    results = {m: run_method({**spec, **args.specs[m]}, args.workers, args.rate, out) for m in args.specs}
    table = results_table(args.specs, results)
    print("\n" + table)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(results))
    png = out / "accuracy_vs_time.png"
    title = f"{args.workers} workers, digits, {link}"
    with plot_file(png, "wall time (s)", "test accuracy (%)", title) as ax:
        for method, ranks in results.items():
            points = ranks[0]["timeline"]
            ax.plot(
                [p["seconds"] for p in points],
                [100 * p["accuracy"] for p in points],
                marker="o",
                ms=3,
                label=method_label(args.specs[method]),
            )
    print(f"\nplot: {png}\ntable: {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
