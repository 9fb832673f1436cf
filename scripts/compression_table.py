"""The compression study's table (scripts/compression_study.sh): test accuracy per codec over seeds,
and whether each compressed CoCoD row is within tolerance of fp32 CoCoD at the same period.

    python scripts/compression_table.py outputs/mnist1d --group compression-<run id> --out table.md

A run's row is what its strategy was built with (its resolved.yaml): the codec, error feedback, the
raw-snapshot control (scripts/compression_control.py), DDP's comm hook. The records alone cannot
tell these apart, so cocod-report would merge them. Mean ± sample std and the seeds' timelines are
cocod-report's own (``app.report.summarise``); the plot is its accuracy against wall time.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lightning_cocod.app.identity import code_of
from lightning_cocod.app.report import Row, plot, summarise
from lightning_cocod.app.runs import load_runs
from lightning_cocod.app.speedup import Record
from lightning_cocod.methods import label

TOLERANCE_POINTS = 0.5  # the bar: 0.5 points, or the reference's std over seeds if larger
CONTROL_MODULE = "compression_control"


def variant(strategy: dict[str, Any]) -> tuple[int, str]:
    """(order in the table, label suffix) of a run's strategy options."""
    codec = strategy.get("compression")
    feedback = "error feedback" if strategy.get("error_feedback", True) else "no error feedback"
    if str(strategy.get("_target_", "")).startswith(CONTROL_MODULE + "."):
        return 3, f"{codec}, raw snapshots ({feedback}): control"
    if codec is not None:
        return {"bf16": 1, "int8": 2}.get(codec, 4), f"{codec} ({feedback})"
    hook = strategy.get("comm_hook")
    if hook == "powersgd":
        return 5, f"+ DDP PowerSGD (rank {strategy.get('powersgd_rank', 1)})"
    if hook is not None:
        return 6, f"+ DDP {hook} hook"
    return (0, "fp32") if strategy.get("_target_", "").endswith("CoCoDStrategy") else (7, "")


def read_runs(paths: list[Path], group: str | None) -> list[tuple[Record, dict[str, Any]]]:
    """(record, its resolved strategy config) of every finished run under ``paths`` in ``group``."""
    found = []
    for run_json in sorted({p.resolve() for root in paths for p in Path(root).rglob("run.json")}):
        records = load_runs([run_json], lambda path, why: print(f"skipped {path}: {why}", file=sys.stderr))
        resolved = run_json.parent / "resolved.yaml"
        if not records or group not in (None, records[0].get("group")):
            continue
        if not resolved.is_file():
            print(f"skipped {run_json}: no resolved.yaml beside it (its strategy's options)", file=sys.stderr)
            continue
        strategy = OmegaConf.to_container(OmegaConf.load(resolved).strategy)
        found.append((records[0], strategy))
    return found


def rows_of(runs: list[tuple[Record, dict[str, Any]]]) -> list[Row]:
    """One row per (workers, method, tau, variant), in the table's order, each with its seeds'
    accuracies and, for compressed CoCoD, its distance from fp32 CoCoD at the same tau."""
    cells: dict[tuple, list[Record]] = defaultdict(list)
    for record, strategy in runs:
        cells[(record["workers"], record["method"], record.get("tau"), *variant(strategy))].append(record)
    rows = []
    for (workers, method, tau, order, suffix), members in cells.items():
        summary = summarise(members)
        if len(summary) != 1:
            raise SystemExit(
                f"error: the {label(method, tau)} {suffix} runs at {workers} workers ran under "
                f"{len(summary)} conditions; accepted: one condition per row (one model, data and schedule)"
            )
        row = summary[0]
        by_seed = sorted(members, key=lambda m: m["seed"])
        row.update(
            label=" ".join(filter(None, [label(method), suffix])),
            order=order,
            per_seed=[100 * m["test_acc"] for m in by_seed if m.get("test_acc") is not None],
        )
        rows.append(row)
    rows.sort(key=lambda r: (r["workers"], r["order"], str(r["tau"])))
    for row in rows:
        reference = next(
            (r for r in rows if r["order"] == 0 and (r["workers"], r["tau"]) == (row["workers"], row["tau"])),
            None,
        )
        if (
            row["method"] != "cocod"
            or row["order"] == 0
            or reference is None
            or None in (row["acc"], reference["acc"])
        ):
            row["versus"] = None
            continue
        tolerance = max(TOLERANCE_POINTS, reference["acc_std"])
        difference = row["acc"] - reference["acc"]
        row["versus"] = (difference, tolerance, abs(difference) <= tolerance)
    return rows


def markdown(
    group: str | None, runs: list[tuple[Record, dict[str, Any]]], rows: list[Row], plot_name: str | None
) -> str:
    def accuracy(r: Row) -> str:
        if r["acc"] is None:
            return "–"
        return f"{r['acc']:.2f} ± {r['acc_std']:.2f} (n={r['acc_n']})"

    def versus(r: Row) -> str:
        if r["versus"] is None:
            return "–"
        difference, tolerance, within = r["versus"]
        return f"{difference:+.2f} ({'within' if within else 'outside'} ±{tolerance:.2f})"

    lines = [
        f"# {group or 'compression study'}: {len(runs)} run(s)",
        "",
        (
            "Test accuracy (%): mean ± sample std over seeds (n runs), then each seed's. Against fp32 CoCoD: "
            f"the difference of the means, within when at most {TOLERANCE_POINTS} points or fp32 CoCoD's std "
            "over seeds, whichever is larger. Steady step: rank 0's mean after the warm-up."
        ),
        "",
        "| method | tau | workers | seeds | test acc (%) | per seed | vs fp32 CoCoD (points) | steady step (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tau = "–" if r["tau"] is None else str(r["tau"])
        seeds = ",".join(map(str, r["seeds"]))
        per_seed = " / ".join(f"{a:.2f}" for a in r["per_seed"]) or "–"
        step = "–" if r["step"] is None else f"{r['step']:.4f}"
        lines.append(
            f"| {r['label']} | {tau} | {r['workers']} | {seeds} | {accuracy(r)} | {per_seed} | {versus(r)} | {step} |"
        )
    lines += ["", f"Code: {', '.join(sorted({code_of(record) for record, _ in runs}))}."]
    if plot_name:
        lines += ["", f"![accuracy against wall time]({plot_name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders holding the study's runs (run.json)")
    parser.add_argument("--group", help="only the runs of this group (default: all found)")
    parser.add_argument(
        "--out", type=Path, help="the markdown file; its plot goes beside it (default: stdout only)"
    )
    args = parser.parse_args(argv)
    runs = read_runs(args.paths, args.group)
    if not runs:
        where = ", ".join(map(str, args.paths)) + (f" in group {args.group!r}" if args.group else "")
        print(f"error: no finished runs under {where} (no readable run.json)", file=sys.stderr)
        return 1
    rows = rows_of(runs)
    plot_name = None
    if args.out is not None:
        import matplotlib

        matplotlib.use("Agg")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        png = args.out.with_name(args.out.stem + "_accuracy_vs_time.png")
        plot_name = png.name if plot(rows, "seconds", "timeline", png) else None
    text = markdown(args.group, runs, rows, plot_name)
    if args.out is not None:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
