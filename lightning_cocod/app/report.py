"""``cocod-report``: a markdown comparison table and PNG plots for the runs of a group.

    cocod-report outputs/smoke/sweep1                # every run under the folder
    cocod-report outputs --group resnet18_cifar10 --out report/

Runs are read from their run.json records (``app.runs``); a record that cannot be read is named on
stderr and passed over. A row is one method (and CoCoD merge variant) at one tau under one
condition (model, data, batch, workers, link, device, threads, precision: ``app.identity``) and
one goal (``judged_by``), over its seeds: runs judged apart share no row, target or speedup. Each run's speedup is recomputed from the records by the rule the runs themselves used
(``app.speedup``): S-SGD's steady step time at the same condition and seed over the run's.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning_cocod._errors import first_line
from lightning_cocod._files import atomic_write
from lightning_cocod.app.identity import code_of, variant_of
from lightning_cocod.app.runs import load_runs
from lightning_cocod.app.speedup import (
    GOALS,
    Record,
    final_value,
    goal_of,
    median_time,
    speedup,
    ssgd_final,
    ssgd_settings,
    time_to,
)
from lightning_cocod.methods import METHODS, label

ACCURACY = "test acc (%)"  # validation runs on the test split: the table and the plot name it alike
AXES = {"tau": "tau (optimizer steps per round)", "workers": "workers", "acc": ACCURACY}
AXES |= {"speedup": "speedup vs S-SGD (step time)", "seconds": "wall time since the first step (s)"}
# What a run is judged by (``judged_by``), as the table and the plots show it: scale, format, column, unit.
SHOWN = {"accuracy": (100, ".2f", "val acc", "%"), "loss": (1, ".3f", "val loss", "nats")}
_TARGET_RULE = {
    "accuracy": f"validation accuracy less {100 * GOALS['accuracy'].margin:g} points",
    "loss": f"validation loss plus {GOALS['loss'].margin:g} nats",
}
_IN_FILE_NAMES = {"acc": "accuracy", "seconds": "time"}
# Shown in columns of their own (workers, link), so left out of the "condition" column.
_IN_COLUMNS = {"config.launcher.devices", "config.launcher.num_nodes", "measured.world_size", "measured.link"}
Row = dict[str, Any]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config.data.batch_size": 32, ...}``: to name what differs between conditions."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        nested = isinstance(value, dict) and value
        out.update(_flat(value, f"{prefix}{key}.") if nested else {prefix + key: value})
    return out


def condition_labels(runs: list[Record]) -> dict[str | None, str]:
    """condition_id -> what sets it apart from the group's other conditions ("" when nothing
    beyond the workers and the link, which have columns of their own)."""
    conditions = {r["condition_id"]: _flat(r.get("condition") or {}) for r in runs if r.get("condition_id")}
    keys = sorted({k for c in conditions.values() for k in c} - _IN_COLUMNS)
    differing = [k for k in keys if len({repr(c.get(k)) for c in conditions.values()}) > 1]
    labels: dict[str | None, str] = {None: "not recorded"}
    for cid, c in conditions.items():
        labels[cid] = "; ".join(f"{k.partition('.')[2]}={c.get(k)}" for k in differing)
    return labels


def _stats(name: str, values: list[float | None], scale: float = 1) -> Row:
    """``name``: the mean of the known values (None without any); ``name_std``: their sample std;
    ``name_n``: how many."""
    known = [scale * v for v in values if v is not None]
    std = statistics.stdev(known) if len(known) > 1 else 0.0
    return {name: statistics.fmean(known) if known else None, f"{name}_std": std, f"{name}_n": len(known)}


def _per_round(record: Record, key: str) -> float | None:
    rounds = record.get("rounds")
    return record[key] / rounds if rounds and record.get(key) is not None else None


def summarise(runs: list[Record]) -> list[Row]:
    """One row per (condition, method and its merge variant, tau) over seeds, in the table's order:
    conditions apart; methods in the table of methods' order, the default merge first; tau: none,
    the periods, "auto"."""
    labels = condition_labels(runs)
    # A group whose runs are judged by several goals names each row's: two rows alike but for it.
    mixed = len({goal_of(r).key for r in runs}) > 1
    cells: dict[tuple, list[Record]] = defaultdict(list)
    for run in runs:
        # Records from before CoCoD's merge was an option ran the paper's rule, progress 1.
        progress = run.get("progress", 1.0) if run["method"] == "cocod" else None
        key = (run.get("condition_id"), goal_of(run).key, run["method"], progress, variant_of(run))
        cells[(*key, run.get("tau"))].append(run)
    rows = []
    for (cid, goal_key, method, progress, variant, tau), members in cells.items():
        speedups = [speedup(member, runs)[0] for member in members]
        goal = GOALS[goal_key]
        condition = "; ".join(filter(None, [labels[cid], f"judged_by={goal_key}" if mixed else ""]))
        scale = SHOWN[goal.key][0]
        level = ssgd_final(members[0], runs)  # the same for every seed: one condition
        target = goal.target(level) if level is not None else None
        reached = [time_to(m, target) for m in members] if target is not None else []
        timelines = [m["timeline"] for m in members if m.get("timeline")]
        # The runs whose own record said "unknown": their S-SGD run finished after them.
        late = sum(s is not None and m.get("speedup_vs_ssgd") is None for s, m in zip(speedups, members))
        row = {
            "cid": cid,
            "method": method,
            "progress": progress,
            "label": label(method) + (f" ({variant})" if variant else ""),
            "tau": tau,
            "workers": members[0]["workers"],
            "link": members[0].get("link") or "–",
            "condition": condition,
            "seeds": sorted({m["seed"] for m in members}),
            "n": len(members),
            # Its seeds' timelines averaged point by point, over the validations all of them reached.
            # (A diverged seed's loss ends its row's line.)
            "goal": goal.key,
            "timeline": [
                (statistics.fmean(p["seconds"] for p in k), scale * statistics.fmean(p[goal.key] for p in k))
                for k in itertools.takewhile(
                    lambda k, key=goal.key: all(p.get(key) is not None for p in k), zip(*timelines)
                )  # the k-th validation of every seed
            ],
            "late": late,
            "target": next((m["target_accuracy"] for m in members if m.get("target_accuracy")), None),
            **_stats("acc", [m.get("test_acc") for m in members], 100),
            **_stats("step", [m.get("steady_step_seconds") for m in members]),
            **_stats("speedup", speedups),
            **_stats("hidden", [m.get("hidden_fraction") for m in members]),
            **_stats("to_target", [m.get("time_to_target_seconds") for m in members]),
            **_stats("sent", [m.get("bytes_sent_per_round") for m in members], 1e-6),
            # Rounds sent uncompressed have no codec: no figure, not zero seconds.
            **_stats("codec", [_per_round(m, "codec_seconds") for m in members if m.get("compression")]),
            **_stats("final", [final_value(m) for m in members], scale),
            # Time to accuracy: S-SGD's final figure made worse by the goal's margin, and S-SGD's own.
            "level": level,
            "level_cid": ssgd_settings(members[0], runs),
            "goal_target": target,
            "tta": median_time(reached),
            "tta_reached": sum(t is not None for t in reached),
            "tt_final": median_time([time_to(m, level) for m in members]) if level is not None else None,
            # The period each seed's tau="auto" ran at when fit ended (a fixed tau: that tau).
            "settled": sorted({m["tau_history"][-1][1] for m in members if m.get("tau_history")}),
        }
        rows.append(row)
    # Speedup to target: plain S-SGD's median time to target over the row's, same condition and
    # goal, at the S-SGD settings that set the target.
    ssgd_tta = {
        (r["cid"], r["goal"]): r["tta"] for r in rows if r["method"] == "ssgd" and r["label"] == label("ssgd")
    }
    for r in rows:
        base = ssgd_tta.get((r["level_cid"], r["goal"]))
        r["tta_speedup"] = base / r["tta"] if base and r["tta"] else None

    def order(r: Row) -> tuple:
        tau = r["tau"]
        tau_order = (tau is not None, isinstance(tau, str), tau if isinstance(tau, int) else 0)
        method = (list(METHODS).index(r["method"]), -(r["progress"] or 0), r["label"])
        return (r["workers"], r["link"], r["condition"], *method, *tau_order)

    return sorted(rows, key=order)


def _spread(row: Row, name: str, fmt: str) -> str:
    """The mean alone for one run; else "mean ± std (n=k)", "(n=k of n)" when runs lack the figure."""
    mean, n, runs = row[name], row[f"{name}_n"], row["n"]
    if mean is None:
        return "–"
    if n == runs == 1:
        return f"{mean:{fmt}}"
    return f"{mean:{fmt}} ± {row[name + '_std']:{fmt}} (n={n}{f' of {runs}' if n != runs else ''})"


def markdown(group: str, runs: list[Record], rows: list[Row], plots: list[str]) -> str:
    target = next((r["target"] for r in rows if r["target"]), None)
    with_condition = any(r["condition"] for r in rows)
    with_codec = any(r["codec"] for r in rows)

    def to_target(r: Row) -> str:
        if r["target"] is None:
            return "–"
        reached = r["to_target_n"]
        return f"{r['to_target']:.1f} ({reached}/{r['n']})" if reached else f"not reached (0/{r['n']})"

    def median_seconds(r: Row, key: str) -> str:
        if r["level"] is None:
            return "–"
        reached = f" ({r['tta_reached']}/{r['n']})" if key == "tta" else ""
        return ("never" if r[key] is None else f"{r[key]:.1f}") + reached

    with_tta = any(r["level"] is not None for r in rows)
    goals = sorted({r["goal"] for r in rows})
    units = " or ".join(SHOWN[g][3] for g in goals)  # a group of a classifier and a language model has both
    figure = SHOWN[goals[0]][2] if len(goals) == 1 else "val"

    def shown(r: Row, value: float) -> str:
        scale, fmt, *_ = SHOWN[r["goal"]]
        return f"{scale * value:{fmt}}"

    time_to_accuracy = {
        f"final {figure} ({units})": lambda r: _spread(r, "final", SHOWN[r["goal"]][1]),
        f"target ({units})": lambda r: "–" if r["goal_target"] is None else shown(r, r["goal_target"]),
        "time to target (s)": lambda r: median_seconds(r, "tta"),
        "speedup to target": lambda r: "–" if r["tta_speedup"] is None else f"{r['tta_speedup']:.2f}x",
        "time to S-SGD's final (s)": lambda r: median_seconds(r, "tt_final"),
        "tau settled": lambda r: ", ".join(map(str, r["settled"])) if r["settled"] else "–",
    }

    columns = {
        "method": lambda r: r["label"],
        "tau": lambda r: "–" if r["tau"] is None else str(r["tau"]),
        "workers": lambda r: str(r["workers"]),
        "link": lambda r: str(r["link"]),
        **({"condition": lambda r: r["condition"] or "–"} if with_condition else {}),
        "seeds": lambda r: ",".join(map(str, r["seeds"])),
        ACCURACY: lambda r: _spread(r, "acc", ".2f"),
        "steady step (s)": lambda r: _spread(r, "step", ".4f"),
        "speedup vs S-SGD": lambda r: _spread(r, "speedup", ".3f") + (" *" if r["late"] else ""),
        "hidden share": lambda r: "–" if r["hidden"] is None else f"{100 * r['hidden']:.1f}%",
        **({f"time to {100 * target:.1f}% (s)": to_target} if target else {}),
        "sent per round (MB)": lambda r: "–" if r["sent"] is None else f"{r['sent']:.3g}",
        # Compressed rounds' own cost: encoding and decoding, on the rank's cores or GPU.
        **({"codec per round (s)": lambda r: _spread(r, "codec", ".4f")} if with_codec else {}),
        **(time_to_accuracy if with_tta else {}),
    }
    lines = [
        f"# {group}: {len(runs)} run(s)",
        "",
        "Mean ± sample std over seeds (n runs). Test accuracy: the test split. Steady step time: mean "
        "over whole rounds after the warm-up, rank 0. Speedup: S-SGD's steady step time at the same "
        "condition and seed over the run's (learning rate and length of run may differ: they set no "
        "step time); a run without such an S-SGD run has none."
        + (
            " Time to target: the target is S-SGD's final "
            + " and ".join(_TARGET_RULE[g] for g in goals)
            + " (mean over its seeds, same condition; where the group ran S-SGD at several learning rates "
            "or lengths, its best); a run's time to it is the wall time from its first "
            "step to its first validation at or past it: the median over seeds, a seed that never reached "
            "it counting as never (how many did, in brackets); speedup to target: S-SGD's median over "
            "the row's."
            if with_tta
            else ""
        ),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(r) for cell in columns.values()) + " |" for r in rows),
        "",
        f"Code: {', '.join(sorted({code_of(r) for r in runs}))}.",
    ]
    if not any(r["method"] == "ssgd" for r in rows):
        lines += ["", "No S-SGD run in this group: speedups and their plots need one (strategy=ssgd)."]
    if late := sum(r["late"] for r in rows):
        lines += [
            "",
            f"\\* {late} run(s) finished before their S-SGD run: their own records and console lines say "
            "the speedup was unknown; the figure here applies the same rule to all records.",
        ]
    if legacy := sum(not r.get("condition_id") for r in runs):
        lines += ["", f"{legacy} run(s) were recorded without their condition: no speedup is given for them."]
    return "\n".join([*lines, "", *(f"![{Path(p).stem}]({p})" for p in plots)]) + "\n"


def _line_name(r: Row, fixed: str, rows: list[Row]) -> str:
    """A line's legend: the row's label, what else is fixed along the line, the link when the rows
    have several, the condition."""
    link = f"link={r['link']}" if len({row["link"] for row in rows}) > 1 else ""
    return " ".join(filter(None, [r["label"], fixed, link, r["condition"]]))


def plot(rows: list[Row], x: str, y: str, path: Path) -> bool:
    """The PNG ``path`` of ``y`` against ``x``, or False when there is nothing to draw.

    "timeline" against "seconds": what the runs are judged by (validation accuracy or loss) against
    wall time, one line per row of the table (its seeds' timelines averaged), a panel per worker
    count and goal. "acc" or "speedup" (mean ± std over seeds) against "tau" or "workers": one
    line per method and all else, on a log scale ticked at the values run, S-SGD as a dashed line;
    not drawn when ``x`` takes fewer than two values (an axis with one value says nothing).
    """
    import matplotlib.pyplot as plt

    panels: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    targets: dict[str, set[float]] = defaultdict(set)  # a timeline panel's time-to-target targets
    ylabels: dict[str, str] = {}
    held = {"tau": "workers", "workers": "tau", "seconds": "tau"}[x]  # along a line, beside the method
    for r in rows:  # in the table's order, so the panels' and the legends' too
        fixed = "" if r[held] is None else f"{'w' if held == 'workers' else held}={r[held]}"
        if x == "seconds" and r["timeline"]:
            scale, _, _, unit = SHOWN[r["goal"]]
            title = f"{r['workers']} workers: {r['goal']} against wall time (mean over seeds)"
            panels[title][_line_name(r, fixed, rows)] += r["timeline"]
            ylabels[title] = f"validation {r['goal']} ({unit})"
            if r["goal_target"] is not None:
                targets[title].add(scale * r["goal_target"])
        elif r["method"] != "ssgd" and isinstance(r[x], int) and r[y] is not None:
            title = f"{'Final accuracy' if y == 'acc' else 'Speedup'} against {x}"
            panels[title][_line_name(r, fixed, rows)].append((r[x], r[y], r[f"{y}_std"]))
    xs = sorted({p[0] for lines in panels.values() for points in lines.values() for p in points})
    if len(xs) < (1 if x == "seconds" else 2):
        return False
    # S-SGD's speedup is 1 by definition; its accuracy depends on the workers.
    ssgd = [
        (r["acc"], f"S-SGD w={r['workers']}") for r in rows if r["method"] == "ssgd" and r["acc"] is not None
    ]
    levels = {"speedup": [(1.0, "S-SGD")], "acc": ssgd}.get(y, [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # a study has more rows than the default 10 colours
        for name, points in lines.items():
            at, mean, *std = zip(*sorted(points, key=lambda p: p[0]))  # a timeline's points carry no std
            bars = {"yerr": std[0], "marker": "o"} if std else {"marker": "."}
            # A tuned row's name runs long: wrapped, its legend stays inside the panel.
            ax.errorbar(at, mean, capsize=3, label=textwrap.fill(name, 60), **bars)
        for level, name in [
            *levels,
            *((t, "target (S-SGD's final, within the margin)") for t in sorted(targets[title])),
        ]:
            ax.axhline(level, linestyle="--", linewidth=1, color="grey")
            ax.annotate(name, (xs[-1], level), fontsize=7, ha="right", va="bottom")
        if targets[title]:  # the race to the target, not the first epochs, is what the panel is for
            if ylabels[title].endswith("(nats)"):
                ax.set_ylim(top=max(targets[title]) + 0.5)
            else:
                ax.set_ylim(bottom=min(targets[title]) - 10)
        if x != "seconds":
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(v) for v in xs])
        ax.set(xlabel=AXES[x], ylabel=ylabels.get(title, AXES.get(y)), title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)  # matplotlib keeps open figures
    return True


def write_report(group: str, runs: list[Record], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows, stem, plots = summarise(runs), group.replace("/", "_"), []
    # Drawn aside, then put in place whole (atomic_write): a report folder others can write may
    # hold a link under a report's name, and matplotlib would write through it to its target.
    # Every plot and the table are made before any is put in place, so a report that fails
    # half-way leaves the last one whole, never a new plot beside an old table.
    with tempfile.TemporaryDirectory(prefix="cocod-report-") as scratch:
        for y, x in (("timeline", "seconds"), ("acc", "tau"), ("speedup", "tau"), ("speedup", "workers")):
            shown = (
                "_".join(sorted({r["goal"] for r in rows})) if y == "timeline" else _IN_FILE_NAMES.get(y, y)
            )
            name = f"{stem}_{shown}_vs_{_IN_FILE_NAMES.get(x, x)}.png"
            if plot(rows, x, y, Path(scratch, name)):
                plots.append(name)
        table = markdown(group, runs, rows, plots)
        for name in plots:
            atomic_write(out / name, Path(scratch, name).read_bytes())
    path = out / f"{stem}.md"
    atomic_write(path, table)
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
    runs = [r for r in runs if args.group in (None, r.get("group"))]
    if not runs:
        where = ", ".join(map(str, args.paths)) + (f" in group {args.group!r}" if args.group else "")
        print(f"cocod-report: error: no finished runs under {where} (no readable run.json)", file=sys.stderr)
        return 1
    out = args.out or (args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent) / "report"
    groups: dict[str, list[Record]] = defaultdict(list)
    for run in runs:
        groups[run.get("group") or "ungrouped"].append(run)
    failed = False
    for group, members in sorted(groups.items()):
        try:  # one group's report that cannot be written costs that report alone
            print(write_report(group, members, out))
        except OSError as err:
            print(
                f"cocod-report: error: group {group!r}: cannot write its report ({first_line(err)})",
                file=sys.stderr,
            )
            failed = True
        # A record the checks let through that breaks a plot: the other groups' reports still come.
        except Exception as err:  # noqa: BLE001 - said in one line, and the exit status says it
            print(
                f"cocod-report: error: group {group!r}: its report failed, its earlier files are as they were "
                f"({type(err).__name__}: {first_line(err)})",
                file=sys.stderr,
            )
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
