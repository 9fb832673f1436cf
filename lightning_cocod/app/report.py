"""``cocod-report``: a markdown comparison table and PNG plots for the runs of a group.

    cocod-report outputs/smoke/sweep1                # every run under the folder
    cocod-report outputs --group resnet18_cifar10 --out report/

Runs are read from run.json files, wandb run folders and CSV logs (lightning_cocod.app.runs); a
file that cannot be read is named on stderr and passed over. A row is one method at one tau under one condition (model, data,
batch, workers, link, device, threads, precision: ``app.condition``), over its seeds. Each run's
speedup is recomputed from the records by the rule the runs themselves used (``app.speedup``):
S-SGD's steady step time at the same condition and seed over the run's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning_cocod.app.condition import flat
from lightning_cocod.app.identity import code_of
from lightning_cocod.app.runs import Record, load_runs
from lightning_cocod.app.speedup import speedup

METHOD_ORDER = {"ssgd": 0, "pipe_sgd": 1, "local_sgd": 2, "cocod": 3}
LABELS = {"ssgd": "S-SGD", "pipe_sgd": "Pipe-SGD", "local_sgd": "Local-SGD", "cocod": "CoCoD-SGD"}
ACCURACY = "test acc (%)"  # validation runs on the test split: the table and the plot name it alike
# Shown in columns of their own, so left out of the "condition" column.
_OWN_COLUMNS = (
    "config.launcher.devices",
    "config.launcher.num_nodes",
    "measured.world_size",
    "measured.link",
)


def _spread(values: list[float]) -> tuple[float | None, float]:
    if not values:
        return None, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _values(runs: list[Record], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def condition_labels(runs: list[Record]) -> dict[str | None, str]:
    """condition_id -> what sets it apart from the group's other conditions ("" when nothing
    beyond the workers and the link, which have columns of their own)."""
    conditions = {r["condition_id"]: flat(r.get("condition") or {}) for r in runs if r.get("condition_id")}
    keys = sorted({k for c in conditions.values() for k in c} - set(_OWN_COLUMNS))
    differing = [k for k in keys if len({repr(c.get(k)) for c in conditions.values()}) > 1]
    labels: dict[str | None, str] = {
        cid: "; ".join(f"{k.partition('.')[2]}={c.get(k)}" for k in differing)
        for cid, c in conditions.items()
    }
    if any(not r.get("condition_id") for r in runs):
        labels[None] = "not recorded"
    return labels


def progress_of(run: Record) -> float | None:
    """CoCoD's merge share (``CoCoDStrategy(progress=...)``); records from before the option
    existed ran the paper's rule, 1."""
    if run["method"] != "cocod":
        return None
    return run.get("progress", 1.0)


def method_label(method: str, progress: float | None) -> str:
    from lightning_cocod.core.averaging import DEFAULT_PROGRESS

    variant = f" (progress {progress:g})" if progress is not None and progress != DEFAULT_PROGRESS else ""
    return LABELS.get(method, method) + variant


def summarise(runs: list[Record]) -> list[dict[str, Any]]:
    """One row per (condition, method and its variant, tau) over seeds, S-SGD first within a condition."""
    labels = condition_labels(runs)
    cells: dict[tuple, list[Record]] = defaultdict(list)
    for run in runs:
        cells[(run.get("condition_id"), run["method"], progress_of(run), run.get("tau"))].append(run)
    rows = []
    for (cid, method, progress, tau), members in cells.items():
        speedups, late = [], 0
        for member in members:
            value, _ = speedup(member, runs)
            if value is not None:
                speedups.append(value)
                late += member.get("speedup_vs_ssgd") is None  # its baseline finished after it
        acc = _spread([100 * a for a in _values(members, "test_acc")])
        step = _spread(_values(members, "steady_step_seconds"))
        reached = _values(members, "time_to_target_seconds")
        rows.append(
            {
                "method": method,
                "progress": progress,
                "label": method_label(method, progress),
                "tau": tau,
                "workers": members[0]["workers"],
                "link": members[0].get("link") or "–",
                "condition_id": cid,
                "condition": labels.get(cid, ""),
                "seeds": sorted({r["seed"] for r in members}),
                "n": len(members),
                "acc_mean": acc[0],
                "acc_std": acc[1],
                "step": step[0],
                "step_std": step[1],
                "speedup": _spread(speedups)[0],
                "speedup_std": _spread(speedups)[1],
                "speedup_n": len(speedups),
                "late": late,
                "hidden": _spread(_values(members, "hidden_fraction"))[0],
                "to_target": _spread(reached)[0],
                "reached": len(reached),
                "target": next((r["target_accuracy"] for r in members if r.get("target_accuracy")), None),
            }
        )
    rows.sort(
        key=lambda r: (
            r["workers"],
            r["link"],
            r["condition"],
            METHOD_ORDER.get(r["method"], 9),
            -(r["progress"] or 0),
            _tau_order(r),
        )
    )
    return rows


def _tau_order(row: dict[str, Any]) -> tuple[int, float, str]:
    tau = row["tau"]
    return (0, 0, "") if tau is None else (1, tau, "") if isinstance(tau, (int, float)) else (2, 0, str(tau))


def _mean_spread(mean: float | None, std: float, n: int, fmt: str, total: int | None = None) -> str:
    if mean is None:
        return "–"
    of = f" of {total}" if total is not None and total != n else ""
    return f"{mean:{fmt}}" if n == 1 and not of else f"{mean:{fmt}} ± {std:{fmt}} (n={n}{of})"


def _row(r: dict[str, Any], with_condition: bool) -> str:
    if r["target"] is None:
        to_target = "–"
    elif r["reached"]:
        to_target = f"{r['to_target']:.1f} ({r['reached']}/{r['n']})"
    else:
        to_target = f"not reached (0/{r['n']})"
    speed = _mean_spread(r["speedup"], r["speedup_std"], r["speedup_n"], ".3f", r["n"])
    cells = [
        r["label"],
        "–" if r["tau"] is None else str(r["tau"]),
        str(r["workers"]),
        str(r["link"]),
        *([r["condition"] or "–"] if with_condition else []),
        ",".join(map(str, r["seeds"])),
        _mean_spread(r["acc_mean"], r["acc_std"], r["n"], ".2f"),
        _mean_spread(r["step"], r["step_std"], r["n"], ".4f"),
        speed + (" *" if r["late"] else ""),
        "–" if r["hidden"] is None else f"{100 * r['hidden']:.1f}%",
        to_target,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(
    group: str, runs: list[Record], rows: list[dict[str, Any]], plots: list[str], notes: list[str]
) -> str:
    target = next((r["target"] for r in rows if r["target"]), None)
    with_condition = any(r["condition"] for r in rows)
    headers = [
        *("method", "tau", "workers", "link"),
        *(["condition"] if with_condition else []),
        *("seeds", ACCURACY, "steady step (s)", "speedup vs S-SGD", "hidden share"),
        f"time to {f'{100 * target:.1f}%' if target else 'target'} (s)",
    ]
    lines = [
        f"# {group}: {len(runs)} run(s)",
        "",
        (
            "Mean ± sample std over seeds (n runs). Test accuracy: the test split. Steady step time: mean "
            "over whole rounds after the warm-up, rank 0. Speedup: S-SGD's steady step time at the same "
            "condition and seed over the run's; a run without such an S-SGD run has none."
        ),
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *(_row(r, with_condition) for r in rows),
    ]
    codes = sorted({code_of(r) for r in runs})
    lines += ["", f"Code: {', '.join(codes)}.", *(f"\n{n}" for n in notes), ""]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _save(fig: Any, path: Path) -> bool:
    """Grid and legend on every panel, then the PNG; the figure is closed (matplotlib keeps open ones)."""
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _mean_timeline(members: list[Record]) -> tuple[list[float], list[float]]:
    """The seeds' timelines averaged point by point (the k-th validation of every seed), over the
    points all of them reached."""
    timelines = [r.get("timeline") or [] for r in members]
    length = min(len(t) for t in timelines)
    seconds = [statistics.fmean(t[k]["seconds"] for t in timelines) for k in range(length)]
    accuracy = [100 * statistics.fmean(t[k]["accuracy"] for t in timelines) for k in range(length)]
    return seconds, accuracy


def plot_accuracy(runs: list[Record], path: Path) -> bool:
    """Validation accuracy against wall time, one line per row of the table (mean over its seeds),
    one panel per number of workers."""
    import matplotlib.pyplot as plt

    labels = condition_labels(runs)
    cells: dict[tuple, list[Record]] = defaultdict(list)
    for run in runs:
        if run.get("timeline"):
            cells[(run["workers"], run.get("condition_id"), run["method"], progress_of(run), run.get("tau"))].append(run)
    if not cells:
        return False
    workers = sorted({key[0] for key in cells})
    fig, axes = plt.subplots(1, len(workers), figsize=(6.5 * len(workers), 4.5), squeeze=False)
    for ax, count in zip(axes[0], workers):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # a study has more rows than the default 10 colours
        mine = [(k, v) for k, v in cells.items() if k[0] == count]
        mine.sort(key=lambda kv: (METHOD_ORDER.get(kv[0][2], 9), -(kv[0][3] or 0), _tau_order({"tau": kv[0][4]})))
        for (_, cid, method, progress, tau), members in mine:
            extra = labels.get(cid, "")
            label = f"{method_label(method, progress)}{f' tau={tau}' if tau is not None else ''}"
            ax.plot(*_mean_timeline(members), marker=".", label=f"{label}{f' ({extra})' if extra else ''}")
        ax.set(
            xlabel="wall time since the first step (s)",
            ylabel="validation accuracy (%)",
            title=f"{count} workers: accuracy against wall time (mean over seeds)",
        )
    return _save(fig, path)


def plot_accuracy_vs_tau(rows: list[dict[str, Any]], path: Path) -> bool:
    """Final test accuracy (mean ± std over seeds) against tau for the methods with a period, S-SGD
    as a dashed line at each number of workers; not drawn with fewer than two values of tau."""
    import matplotlib.pyplot as plt

    lines: dict[tuple, list[tuple[float, float, float]]] = defaultdict(list)
    for r in rows:
        if isinstance(r["tau"], int) and r["acc_mean"] is not None:
            lines[(r["label"], r["method"], r["workers"], r["link"], r["condition"])].append(
                (r["tau"], r["acc_mean"], r["acc_std"])
            )
    taus = sorted({p[0] for points in lines.values() for p in points})
    if len(taus) < 2:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for key, points in sorted(lines.items(), key=lambda kv: (kv[0][2], METHOD_ORDER.get(kv[0][1], 9), kv[0][0])):
        points.sort()
        label, _, workers, link, condition = key
        ax.errorbar(
            [p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
            marker="o", capsize=3, label=" ".join(filter(None, [label, f"w={workers}", condition])),
        )
    for r in rows:
        if r["method"] == "ssgd" and r["acc_mean"] is not None:
            ax.axhline(r["acc_mean"], linestyle="--", linewidth=1, color="grey")
            ax.annotate(f"S-SGD w={r['workers']}", (taus[-1], r["acc_mean"]), fontsize=7, ha="right", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xticks(taus, [str(t) for t in taus])
    ax.set(xlabel="tau (optimizer steps per round)", ylabel=ACCURACY, title="Final accuracy against tau")
    return _save(fig, path)


def plot_speedup(rows: list[dict[str, Any]], x: str, path: Path, xlabel: str) -> bool:
    """Speedup against ``x`` (tau or workers), one line per method and everything else; not drawn
    when ``x`` takes fewer than two values (an axis with one value says nothing)."""
    import matplotlib.pyplot as plt

    lines: dict[tuple, list[tuple[float, float, float]]] = defaultdict(list)
    others = [k for k in ("tau", "workers") if k != x]
    for r in rows:
        if r["speedup"] is not None and isinstance(r[x], (int, float)) and r["method"] != "ssgd":
            key = (r["label"], *(r[k] for k in others), r["link"], r["condition"])
            lines[key].append((r[x], r["speedup"], r["speedup_std"]))
    xs = sorted({p[0] for points in lines.values() for p in points})
    if len(xs) < 2:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, points in sorted(lines.items(), key=lambda kv: str(kv[0])):
        points.sort()
        fixed = [f"{k}={v}" for k, v in zip(others, key[1:]) if v is not None]
        label = " ".join([key[0], *fixed, f"link={key[-2]}", key[-1]]).strip()
        ax.errorbar(
            [p[0] for p in points],
            [p[1] for p in points],
            yerr=[p[2] for p in points],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="S-SGD")
    ax.set_xticks(xs)
    ax.set(xlabel=xlabel, ylabel="speedup vs S-SGD (step time)", title=f"Speedup against {x}")
    return _save(fig, path)


def write_report(group: str, runs: list[Record], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(runs)
    plots, notes = [], []
    stem = group.replace("/", "_")
    if plot_accuracy(runs, out / f"{stem}_accuracy_vs_time.png"):
        plots.append(f"{stem}_accuracy_vs_time.png")
    if plot_accuracy_vs_tau(rows, out / f"{stem}_accuracy_vs_tau.png"):
        plots.append(f"{stem}_accuracy_vs_tau.png")
    for x, label in (("tau", "tau (optimizer steps per round)"), ("workers", "workers")):
        if plot_speedup(rows, x, out / f"{stem}_speedup_vs_{x}.png", label):
            plots.append(f"{stem}_speedup_vs_{x}.png")
    if not any(r["method"] == "ssgd" for r in rows):
        notes.append("No S-SGD run in this group: speedups and their plots need one (strategy=ssgd).")
    late = sum(r["late"] for r in rows)
    if late:
        notes.append(
            f"\\* {late} run(s) finished before their S-SGD run: their own records and console lines say "
            "the speedup was unknown; the figure here applies the same rule to all records."
        )
    legacy = sum(1 for r in runs if not r.get("condition_id"))
    if legacy:
        notes.append(f"{legacy} run(s) were recorded without their condition: no speedup is given for them.")
    path = out / f"{stem}.md"
    path.write_text(markdown(group, runs, rows, plots, notes))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cocod-report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="run folders, sweep folders, output roots or run.json files"
    )
    parser.add_argument("--group", help="only this group (default: one report per group found)")
    parser.add_argument(
        "--out", type=Path, help="where the .md and .png files go (default: <first path>/report)"
    )
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    runs = load_runs(
        args.paths, lambda path, why: print(f"cocod-report: skipped {path}: {why}", file=sys.stderr)
    )
    if args.group:
        runs = [r for r in runs if r.get("group") == args.group]
    if not runs:
        where = ", ".join(map(str, args.paths)) + (f" in group {args.group!r}" if args.group else "")
        print(
            f"cocod-report: error: no finished runs under {where} (looked for run.json, "
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
