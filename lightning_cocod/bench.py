"""Step time of every method against the compute-only bound, over shaped links.

    cocod-bench                                   # ResNet18, 2 workers, 300 Mbit/s, tau=4
    cocod-bench --rates 100mbit,300mbit,1gbit,10gbit --methods cocod:auto --steps 48
    cocod-bench --slowdown 1,2 --methods ssgd,cocod,cocod:ps     # rank 1 twice as slow
    cocod-bench --repeats 3                       # three passes: medians and ranges of the ratios

A method is a name with options after colons: ``cocod:8`` (tau 8), ``cocod:auto``, ``cocod:ps``
(proportional sampling; with --slowdown), e.g. ``local_sgd:8:ps``.

Each method runs through the real strategies and a real Lightning Trainer on the same model,
batch and number of steps. The bound is the same steps on single-process Trainers, one per
worker, side by side, with no process group at all, measured before the first run and after
every run; ratios are to the median of those. Step time is the mean over whole rounds
after a warm-up, so the waits at round boundaries count, of the run's joint timeline: step k
is done when the last worker has finished it. The strategy's own overhead is CoCoD on an
unshaped link with a period longer than the run (no round completes) against the bound. With
``--repeats`` the table gives the median of each ratio over passes and its range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lightning_cocod.compare import (
    label,
    markdown_table,
    new_axes,
    run_method,
    save_plot,
    steady_step_seconds,
)
from lightning_cocod.launch import format_rate, parse_rate

METHODS = ("ssgd", "local_sgd", "pipe_sgd", "cocod")
PERIODIC = ("local_sgd", "cocod")


def parse_method(token: str, default_tau: int) -> dict[str, Any]:
    """'cocod:auto:ps' -> {"method": "cocod", "tau": "auto", "proportional": True}."""
    name, *options = token.split(":")
    if name not in METHODS:
        raise ValueError(f"method {token!r} not understood; accepted: {', '.join(METHODS)} with :TAU, :auto, :ps")
    spec: dict[str, Any] = {"method": name, "tau": default_tau, "proportional": False}
    for option in options:
        if option == "ps" and name in PERIODIC:
            spec["proportional"] = True
        elif option == "auto" and name == "cocod":
            spec["tau"] = "auto"
        elif option.isdigit() and int(option) >= 1 and name in PERIODIC:
            spec["tau"] = int(option)
        else:
            raise ValueError(f"option {option!r} of method {token!r} not understood (accepted: TAU, auto for cocod, ps)")
    return spec


def method_label(spec: dict[str, Any]) -> str:
    text = label(spec["method"], spec["tau"] if spec["method"] in PERIODIC else None)
    return text + (" +PS" if spec["proportional"] else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cocod-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "vgg16", "small_cnn"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rates", default="300mbit", help="comma-separated link rates, e.g. 100mbit,1gbit,10gbit")
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="steps discarded first (default: tau)")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--methods", default=",".join(METHODS), help="e.g. ssgd,cocod,cocod:auto,cocod:ps")
    parser.add_argument("--slowdown", default=None, help="per-rank slowdown factors, e.g. 1,2 (rank 1 twice as slow)")
    parser.add_argument("--epoch-steps", type=int, default=None, help="steps per epoch (default: the whole run)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="passes over all runs; medians of per-pass ratios are reported"
    )
    parser.add_argument("--no-overhead", action="store_true", help="skip the strategy-overhead run")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-<time>)")
    args = parser.parse_args(argv)
    try:
        args.method_specs = [parse_method(m.strip(), args.tau) for m in args.methods.split(",") if m.strip()]
        if not args.method_specs:
            raise ValueError(f"--methods is empty; accepted: {', '.join(METHODS)}")
        args.slowdown_factors = None
        if args.slowdown:
            from lightning_cocod.hetero import check_slowdowns

            args.slowdown_factors = check_slowdowns([float(f) for f in args.slowdown.split(",")], args.workers)
        args.rate_list = [r.strip() for r in args.rates.split(",") if r.strip()]
        args.rate_bps = [parse_rate(r) for r in args.rate_list]
    except ValueError as err:
        parser.error(str(err).replace("could not convert string to float", "--slowdown: not a number"))
    if any(m["proportional"] for m in args.method_specs) and args.epoch_steps is None:
        args.epoch_steps = 2 * args.tau  # proportional sampling re-splits at epoch boundaries
    if not args.rate_list:
        parser.error("--rates is empty; give at least one rate, e.g. 300mbit")
    args.warmup = args.tau if args.warmup is None else args.warmup
    for name, low in (("workers", 2), ("tau", 1), ("batch_size", 1), ("warmup", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")
    if args.steps < args.warmup + 2 * args.tau:
        parser.error(f"--steps {args.steps} is too few: need warm-up ({args.warmup}) plus two rounds of {args.tau}")
    return args


def round_ends(result: dict[str, Any]) -> list[int]:
    """Steps at which a full round ended inside a step (a partial last round, merged when fit
    ends, is not one); a round of tau="auto" has the period in force when it was launched."""
    history = result.get("tau_history") or []
    ends = []
    for launch, finish, *_ in result["rounds"]:
        taus = [tau for step, tau in history if step <= launch]
        if not taus or finish - launch == taus[-1]:
            ends.append(finish)
    return sorted(set(ends))


def steady_over_rounds(result: dict[str, Any], warmup: int) -> float:
    """Mean step time between the first and the last round end after the warm-up."""
    ends = [e for e in round_ends(result) if e >= warmup]
    if len(ends) < 2:
        raise ValueError(f"fewer than two round ends after {warmup} warm-up steps ({ends}): run more steps")
    t = result["step_ends"]
    return (t[ends[-1] - 1] - t[ends[0] - 1]) / (ends[-1] - ends[0])


def joint_timeline(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's own timeline: step k is done when every rank has finished it. The workers share
    the machine's monotonic clock (``perf_counter``), and all ranks run the same rounds."""
    return {**results[0], "step_ends": [max(ends) for ends in zip(*(r["step_ends"] for r in results))]}


def summarize(results: list[dict[str, Any]], warmup: int, periodic: bool) -> dict[str, Any]:
    """Figures of one run. Its step time is the pace at which all its workers complete steps: a
    run is done when its last worker is, and the cores of a shared machine differ in speed (up to
    35% between the two side-by-side workers of one bound run here), so the bound is what the
    slowest worker alone achieves. One rank's own pace would charge it, after the warm-up, for
    the wait its peer's lag during the warm-up forces on it. Communication figures are averaged
    over ranks; peak memory is the largest."""

    def pace(result: dict[str, Any]) -> float:
        if periodic:
            return steady_over_rounds(result, warmup)
        return steady_step_seconds(result["step_ends"], warmup, 1)

    comm = [r["comm"] for r in results if r.get("comm")]
    return {
        "step_seconds": pace(joint_timeline(results)),
        "step_seconds_per_rank": [pace(r) for r in results],
        "exposed_seconds_per_step": (
            sum(c["exposed_seconds"] for c in comm) / len(comm) / len(results[0]["step_ends"]) if comm else None
        ),
        "hidden_fraction": sum(c["hidden_fraction"] for c in comm) / len(comm) if comm else None,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
        "buffer_copies": max(r.get("buffer_bytes", 0) for r in results) / results[0]["model_bytes"],
        "tau_history": results[0].get("tau_history"),
        "batch_split_history": results[0].get("batch_split_history"),
        "model_bytes": results[0]["model_bytes"],
    }


def plot(figures: dict[str, Any], rates: list[int], path: Path, title: str) -> None:
    rates = [r for r in rates if r]  # an unshaped run has no place on a rate axis
    fig, ax = new_axes()
    for name, by_rate in figures["methods"].items():
        ax.plot(rates, [by_rate[str(r)]["step_seconds"] for r in rates], marker="o", label=name)
    ax.axhline(figures["bound"]["step_seconds"], color="k", ls="--", label="compute only (bound)")
    ax.set_xscale("log")
    save_plot(fig, ax, path, "link rate (bit/s)", "step time (s)", title)


def measure(args: argparse.Namespace, spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """One pass: the bound before the first run and again after every run (the overhead run,
    every method at every rate); every ratio is to the median of the pass's bounds. Measured
    once, the bound of this machine ranges over 1.2-2.0 s per step for ResNet18 within ten
    minutes; interleaved and medianed, neither drift nor one slow run decides a ratio."""
    total, warmup = f"/{args.steps}", args.warmup

    def run_bound(index: int) -> dict[str, Any]:
        runs = run_method({**spec, "method": "bound"}, args.workers, None, out, total, suffix=f"-{index}")
        return summarize(runs, warmup, False)

    bounds = [run_bound(1)]
    figures: dict[str, Any] = {"methods": {}}
    runs: list[dict[str, Any]] = []

    def run(run_spec: dict[str, Any], rate: str | None, periodic: bool) -> dict[str, Any]:
        runs.append(summarize(run_method(run_spec, args.workers, rate, out, total), warmup, periodic))
        bounds.append(run_bound(len(bounds) + 1))
        return runs[-1]

    if not args.no_overhead:
        figures["overhead"] = run({**spec, "method": "cocod", "tau": args.steps + 1}, None, periodic=False)
    for rate, bps in zip(args.rate_list, args.rate_bps):
        for method in args.method_specs:
            result = run({**spec, **method}, rate, method["method"] in PERIODIC)
            figures["methods"].setdefault(method_label(method), {})[str(bps)] = result
    bound_seconds = statistics.median(b["step_seconds"] for b in bounds)
    for result in runs:
        result["vs_bound"] = result["step_seconds"] / bound_seconds
    for bps in map(str, args.rate_bps):
        ssgd = figures["methods"].get(label("ssgd"), {}).get(bps)
        for by_rate in figures["methods"].values():
            by_rate[bps]["vs_ssgd"] = ssgd["step_seconds"] / by_rate[bps]["step_seconds"] if ssgd else None
    figures["bound"] = {
        **bounds[0],
        "step_seconds": bound_seconds,
        "step_seconds_runs": [b["step_seconds"] for b in bounds],
        "peak_rss_bytes": max(b["peak_rss_bytes"] for b in bounds),
    }
    return figures


def combine(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over passes of every figure; the spread of a ratio is kept as its range.

    On a shared machine speed drifts by more than the effects measured, so a ratio is formed
    within a pass (against that pass's bounds) and only then summarized across passes."""

    def merge(items: list[dict[str, Any]]) -> dict[str, Any]:
        merged = dict(items[-1])
        for key, value in items[0].items():
            values = [item[key] for item in items]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and None not in values:
                merged[key] = statistics.median(values)
                if key.startswith("vs_") and len(items) > 1:
                    merged[key + "_range"] = [min(values), max(values)]
        return merged

    figures = {"bound": merge([p["bound"] for p in passes]), "methods": {}}
    if "overhead" in passes[0]:
        figures["overhead"] = merge([p["overhead"] for p in passes])
    for name, by_rate in passes[0]["methods"].items():
        figures["methods"][name] = {bps: merge([p["methods"][name][bps] for p in passes]) for bps in by_rate}
    return figures


def ratio(figure: dict[str, Any], key: str) -> str:
    value, spread = figure.get(key), figure.get(key + "_range")
    if value is None:
        return "n/a"
    return f"{value:.2f}x" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and spread[0] != spread[1] else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": args.model, "data": "synthetic", "batch_size": args.batch_size, "lr": 0.05,
        "seed": 0, "steps": args.steps, "evaluate": False, "tau": args.tau, "slowdown": args.slowdown_factors,
    }
    if args.epoch_steps:
        spec["epoch_steps"] = args.epoch_steps
    print(
        f"cocod-bench: {args.model}, {args.workers} CPU workers x 1 thread, batch {args.batch_size}/worker, "
        f"{args.steps} steps (first {args.warmup} discarded), tau={args.tau}, rates {', '.join(args.rate_list)}"
        + (f", slowdown {args.slowdown_factors}" if args.slowdown_factors else "")
        + (f", {args.repeats} passes (medians; ranges in brackets)" if args.repeats > 1 else "")
        + "\n"
    )
    passes = []
    for index in range(args.repeats):
        if args.repeats > 1:
            print(f"pass {index + 1}/{args.repeats}")
        passes.append(measure(args, spec, out / f"pass{index + 1}" if args.repeats > 1 else out))
    figures = {"args": {k: v for k, v in vars(args).items()}, **combine(passes), "passes": passes}
    (out / "bench.json").write_text(json.dumps(figures, indent=1))

    bound = figures["bound"]
    rows = []
    for rate, bps in zip(args.rate_list, args.rate_bps):
        for name, by_rate in figures["methods"].items():
            f = by_rate[str(bps)]
            extra = (f["peak_rss_bytes"] - bound["peak_rss_bytes"]) / bound["model_bytes"]
            rows.append([
                format_rate(bps) if bps else "unshaped", name, f"{f['step_seconds']:.3f}",
                ratio(f, "vs_bound"), ratio(f, "vs_ssgd"),
                f"{f['exposed_seconds_per_step']:.3f}" if f["exposed_seconds_per_step"] is not None else "n/a",
                f"{100 * f['hidden_fraction']:.0f}%" if f["hidden_fraction"] is not None else "n/a",
                f"{f['peak_rss_bytes'] / 2**20:.0f} MiB ({extra:+.1f} models)",
                f"{f['buffer_copies']:.1f}",
            ])
    headers = [
        "link", "method", "step s", "vs bound", "vs S-SGD", "exposed s/step", "hidden",
        "peak RSS/worker (vs bound)", "flat copies",
    ]
    table = markdown_table(headers, rows)
    lines = [
        (
            f"bound (compute only): {bound['step_seconds']:.3f} s/step, peak RSS "
            f"{bound['peak_rss_bytes'] / 2**20:.0f} MiB; model {bound['model_bytes'] / 1e6:.1f} MB"
        ),
    ]
    if "overhead" in figures:
        o = figures["overhead"]
        spread = o.get("vs_bound_range")
        lines.append(
            f"strategy overhead (CoCoD, unshaped, no round completes): {o['step_seconds']:.3f} s/step = "
            f"{100 * (o['vs_bound'] - 1):+.1f}% vs the bound"
            + (f" (passes: {100 * (spread[0] - 1):+.1f}% to {100 * (spread[1] - 1):+.1f}%)" if spread else "")
        )
    report = "\n".join([table, "", *lines])
    print("\n" + report)
    (out / "table.md").write_text(report + "\n")
    plot(figures, args.rate_bps, out / "step_time_vs_rate.png", f"{args.model}, {args.workers} workers, tau={args.tau}")
    print(f"\njson: {out / 'bench.json'}\nplot: {out / 'step_time_vs_rate.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
