"""``cocod-report``: a markdown comparison table and PNG plots for the runs of a group.

    cocod-report outputs/smoke/sweep1                # every run under the folder
    cocod-report outputs --group resnet18_cifar10 --out report/

Runs are read from run.json files, group ledgers, wandb run folders and CSV logs
(lightning_cocod.app.runs). Rows are (method, tau, workers) over seeds; speedup is S-SGD's mean
steady step time at the same number of workers divided by the row's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning_cocod.app.ledger import speedup, ssgd_step_seconds
from lightning_cocod.app.runs import Record, load_runs

METHOD_ORDER = {"ssgd": 0, "pipe_sgd": 1, "local_sgd": 2, "cocod": 3}
LABELS = {"ssgd": "S-SGD", "pipe_sgd": "Pipe-SGD", "local_sgd": "Local-SGD", "cocod": "CoCoD-SGD"}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _values(runs: list[Record], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def summarise(runs: list[Record]) -> list[dict[str, Any]]:
    """One row per (method, tau, workers), sorted S-SGD first."""
    cells: dict[tuple, list[Record]] = defaultdict(list)
    for run in runs:
        cells[(run["method"], run.get("tau"), run["workers"])].append(run)
    by_id = {r["id"]: r for r in runs}
    rows = []
    for (method, tau, workers), members in cells.items():
        acc = [100 * a for a in _values(members, "test_acc")]
        step = _mean(_values(members, "steady_step_seconds"))
        reached = _values(members, "time_to_target_seconds")
        rows.append(
            {
                "method": method,
                "tau": tau,
                "workers": workers,
                "seeds": sorted({r["seed"] for r in members}),
                "n": len(members),
                "acc_mean": _mean(acc),
                "acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "step": step,
                "speedup": speedup(ssgd_step_seconds(by_id, workers), step),
                "hidden": _mean(_values(members, "hidden_fraction")),
                "to_target": _mean(reached),
                "reached": len(reached),
                "target": next((r["target_accuracy"] for r in members if r.get("target_accuracy")), None),
            }
        )
    rows.sort(key=lambda r: (r["workers"], METHOD_ORDER.get(r["method"], 9), r["tau"] or 0))
    return rows


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _row(r: dict[str, Any]) -> str:
    acc = "–" if r["acc_mean"] is None else f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f} (n={r['n']})"
    if r["target"] is None:
        to_target = "–"
    elif r["reached"]:
        to_target = f"{r['to_target']:.1f} ({r['reached']}/{r['n']})"
    else:
        to_target = f"not reached (0/{r['n']})"
    cells = [
        LABELS.get(r["method"], r["method"]),
        "–" if r["tau"] is None else str(r["tau"]),
        str(r["workers"]),
        ",".join(map(str, r["seeds"])),
        acc,
        _f(r["step"], ".4f"),
        _f(r["speedup"], ".2f"),
        "–" if r["hidden"] is None else f"{100 * r['hidden']:.1f}%",
        to_target,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(
    group: str, runs: list[Record], rows: list[dict[str, Any]], plots: list[str], notes: list[str]
) -> str:
    target = next((r["target"] for r in rows if r["target"]), None)
    lines = [
        f"# {group}: {len(runs)} run(s)",
        "",
        "Test accuracy: mean ± sample std over seeds. Steady step time: mean over whole rounds after the "
        + "warm-up, rank 0. Speedup: S-SGD steady step time at the same number of workers / the row's.",
        "",
        "| method | tau | workers | seeds | test acc (%) | steady step (s) | speedup vs S-SGD | hidden share "
        + f"| time to {f'{100 * target:.1f}%' if target else 'target'} (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(r) for r in rows]
    commits = sorted(
        {f"{r.get('git_commit', 'unknown')}{'+dirty' if r.get('git_dirty') else ''}" for r in runs}
    )
    lines += ["", f"Code: {', '.join(commits)}.", *(f"\n{n}" for n in notes), ""]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def plot_accuracy(runs: list[Record], path: Path) -> bool:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for run in sorted(runs, key=lambda r: (METHOD_ORDER.get(r["method"], 9), r.get("tau") or 0, r["seed"])):
        points = run.get("timeline") or []
        if points:
            tau = f" tau={run['tau']}" if run.get("tau") else ""
            ax.plot(
                [p["seconds"] for p in points],
                [100 * p["accuracy"] for p in points],
                marker=".",
                label=f"{LABELS.get(run['method'], run['method'])}{tau} w={run['workers']} seed={run['seed']}",
            )
            drawn = True
    ax.set(
        xlabel="wall time since the first step (s)",
        ylabel="validation accuracy (%)",
        title="Accuracy against wall time",
    )
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def plot_speedup(rows: list[dict[str, Any]], x: str, series: str, path: Path, xlabel: str) -> bool:
    import matplotlib.pyplot as plt

    lines: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["speedup"] is not None and r[x] is not None and r["method"] != "ssgd":
            lines[(r["method"], r[series])].append((r[x], r["speedup"]))
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for (method, key), points in sorted(
        lines.items(), key=lambda kv: (METHOD_ORDER.get(kv[0][0], 9), str(kv[0][1]))
    ):
        points.sort()
        label = LABELS.get(method, method) + (f" {series}={key}" if key is not None else "")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="S-SGD")
    ax.set(xlabel=xlabel, ylabel="speedup vs S-SGD (step time)", title=f"Speedup against {x}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(group: str, runs: list[Record], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(runs)
    plots, notes = [], []
    stem = group.replace("/", "_")
    if plot_accuracy(runs, out / f"{stem}_accuracy_vs_time.png"):
        plots.append(f"{stem}_accuracy_vs_time.png")
    for x, series, label in (
        ("tau", "workers", "tau (optimizer steps per round)"),
        ("workers", "tau", "workers"),
    ):
        if plot_speedup(rows, x, series, out / f"{stem}_speedup_vs_{x}.png", label):
            plots.append(f"{stem}_speedup_vs_{x}.png")
    if not any(r["method"] == "ssgd" for r in rows):
        notes.append("No S-SGD run in this group: speedups and their plots need one (strategy=ssgd).")
    path = out / f"{stem}.md"
    path.write_text(markdown(group, runs, rows, plots, notes))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cocod-report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="run folders, sweep folders, output roots or ledger files"
    )
    parser.add_argument("--group", help="only this group (default: one report per group found)")
    parser.add_argument(
        "--out", type=Path, help="where the .md and .png files go (default: <first path>/report)"
    )
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    runs = load_runs(args.paths)
    if args.group:
        runs = [r for r in runs if r.get("group") == args.group]
    if not runs:
        where = ", ".join(map(str, args.paths)) + (f" in group {args.group!r}" if args.group else "")
        print(
            f"cocod-report: error: no finished runs under {where} (looked for run.json, groups/*.json, "
            f"wandb files/wandb-summary.json + config.yaml, CSV metrics.csv + hparams.yaml)",
            file=sys.stderr,
        )
        return 1
    out = args.out or (args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent) / "report"
    groups: dict[str, list[Record]] = defaultdict(list)
    for run in runs:
        groups[run.get("group", "ungrouped")].append(run)
    for group, members in sorted(groups.items()):
        print(write_report(group, members, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
