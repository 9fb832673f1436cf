"""Step time of every method against the compute-only bound, over shaped links.

    cocod-bench                                   # ResNet18, 2 workers, 300 Mbit/s, tau=4
    cocod-bench --rates 100mbit,300mbit,1gbit,10gbit --methods cocod:auto --steps 48
    cocod-bench --methods cocod:auto --tau-max 64    # let tau="auto" go past its default bound, 1
    cocod-bench --slowdown 1,2 --methods ssgd,cocod,cocod:ps     # rank 1 twice as slow
    cocod-bench --rates 100mbit --methods cocod,cocod:int8,cocod:bf16,ssgd:powersgd   # compressed
    cocod-bench --model small_cnn --rates 50mbit --methods ssgd,diloco:8,diloco:8:d1,diloco:8:d1:int8
                                                  # DiLoCo's round, blocking and overlapped
    cocod-bench --repeats 3                       # three passes: medians and ranges of the ratios
    cocod-bench --topology pernode --workers 2,4,8 --model small_cnn --rates 10mbit,50mbit
                                                  # a link per worker: speedup against workers

A method is a name with options after colons: ``cocod:8`` (tau 8), ``cocod:auto``, ``cocod:ps``
(proportional sampling; with --slowdown), e.g. ``local_sgd:8:ps``; ``cocod:int8`` and
``local_sgd:bf16`` send their rounds compressed (``compression=``), ``ssgd:bf16``, ``ssgd:fp16``
and ``ssgd:powersgd`` (rank 1; ``ssgd:powersgd4``: rank 4) are DDP with torch's gradient
compression hooks (``comm_hook=``). ``diloco:8:d1`` runs the outer round's all-reduce alongside
the round's last step (``overlap=1``; ``dN``, 0 <= N <= tau, for diloco, default d0, and cocod,
default the whole period), labelled "DiLoCo tau=8 overlap 1". ``cocod:auto`` is
``CoCoDStrategy(tau="auto")`` with its default bound (``SAFE_TAU_MAX``, 2: longer periods cost
accuracy); ``--tau-max N`` gives every ``cocod:auto`` method ``tau_max=N`` and its label says so.

Each method runs through the real strategies and a real Lightning Trainer on the same model,
batch and number of steps. The bound is the same steps on single-process Trainers, one per
worker, side by side, with no process group at all, measured before the first run and after
every run; ratios are to the median of those. Step time is the mean over whole rounds
after a warm-up, so the waits at round boundaries count, of the run's joint timeline: step k
is done when the last worker has finished it. The strategy's own overhead is CoCoD on an
unshaped link with a period longer than the run (no round completes) against the bound. With
``--repeats`` the table gives the median of each ratio over passes and its range.

``--topology pernode`` gives every worker a namespace and a link of its own, shaped to the rate
both ways, on a common bridge (``launch/cluster.py``); the default, ``loopback``, sends all of a
run's traffic through one shaped loopback. ``--workers 2,4,8`` repeats everything at each count
(each with its own bound: N single-process runs side by side, so oversubscribing the machine
cancels in the ratios) and adds a table and a plot of the speedup over S-SGD against workers.
Every run ends with the performance model's prediction of every step time (``cocod-plan``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lightning_cocod.core.adapt import SAFE_TAU_MAX
from lightning_cocod.figures import markdown_table, steady_step_seconds
from lightning_cocod.launch import TOPOLOGIES, LatencyUnsupported, format_latency, format_rate, parse_latency
from lightning_cocod.launch.cluster import measured_round_trip
from lightning_cocod.methods import METHODS, OVERLAPPED, PERIODIC
from lightning_cocod.tools.compare import (
    BOUND,
    BOUND_LABEL,
    method_label,
    option_type,
    parse_method,
    parse_worker_counts,
    plot_file,
    read_rate,
    require_at_least,
    round_cells,
    round_figures,
    run_method,
)
from lightning_cocod.tools.plan_check import validate, validation_table

SSGD = METHODS["ssgd"].label


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cocod-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "vgg16", "small_cnn"])
    parser.add_argument(
        "--workers",
        dest="worker_counts",
        metavar="WORKERS",
        default="2",
        type=option_type(parse_worker_counts),
        help="worker count, or several, e.g. 2,4,8",
    )
    parser.add_argument(
        "--rates",
        default=None,
        help="comma-separated link rates, e.g. 100mbit,1Gbps,10gbit, or none (default 300mbit on CPU, none on GPU)",
    )
    parser.add_argument(
        "--accelerator",
        default="cpu",
        choices=["cpu", "gpu"],
        help="gpu: NCCL with a GPU per rank, or gloo on CUDA tensors when ranks share one (the header says which)",
    )
    parser.add_argument(
        "--one-device", action="store_true", help="with --accelerator gpu: every rank on cuda:0"
    )
    parser.add_argument(
        "--precision", default=None, help="Lightning precision, e.g. bf16-mixed (default 32-true)"
    )
    parser.add_argument("--channels-last", action="store_true", help="channels_last memory format (GPU)")
    parser.add_argument(
        "--topology",
        default="loopback",
        choices=TOPOLOGIES,
        help="loopback: one shaped link shared by all workers; pernode: a shaped link per worker, on a bridge",
    )
    parser.add_argument(
        "--latency",
        default=None,
        type=option_type(parse_latency),
        help="one-way delay added to every link, e.g. 50us (needs netem)",
    )
    parser.add_argument("--width", type=int, default=None, help="small_cnn width (default 48)")
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument(
        "--tau-max",
        type=int,
        default=None,
        help=f"longest period of every cocod:auto method (default: the strategy's, {SAFE_TAU_MAX})",
    )
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="steps discarded first (default: tau)")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="e.g. ssgd,cocod,cocod:auto,cocod:ps,cocod:int8,local_sgd:bf16,ssgd:powersgd,diloco:8:d1 "
        "(see the module's doc)",
    )
    parser.add_argument(
        "--slowdown", default=None, help="per-rank slowdown factors, e.g. 1,2 (rank 1 twice as slow)"
    )
    parser.add_argument(
        "--epoch-steps", type=int, default=None, help="steps per epoch (default: the whole run)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="passes over all runs; medians of per-pass ratios are reported"
    )
    parser.add_argument(
        "--bound-every", type=int, default=1, help="runs between two bound runs (default 1: after every run)"
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
            from lightning_cocod.callbacks import check_slowdowns

            if len(args.worker_counts) > 1:
                raise ValueError("--slowdown gives one factor per rank: use it with a single --workers count")
            factors = [float(f) for f in args.slowdown.split(",")]
            args.slowdown_factors = check_slowdowns(factors, args.worker_counts[0])
        if args.rates is None:  # NCCL between GPUs of one machine never crosses a shaped loopback.
            args.rates = "none" if args.accelerator == "gpu" else "300mbit"
        args.rate_bps = [read_rate(r) for r in args.rates.split(",") if r.strip()]
        if not args.rate_bps:
            raise ValueError("--rates is empty; give at least one rate, e.g. 300mbit")
    except ValueError as err:
        parser.error(str(err).replace("could not convert string to float", "--slowdown: not a number"))
    if args.accelerator == "gpu" and args.topology != "loopback":
        parser.error("--topology pernode shapes CPU workers' links; with --accelerator gpu use the default")
    if args.one_device and args.accelerator != "gpu":
        parser.error("--one-device puts GPU ranks on one device: use it with --accelerator gpu")
    if args.width is not None and (args.model != "small_cnn" or args.width < 1):
        parser.error(f"--width {args.width} is not understood: a positive width of --model small_cnn only")
    # As the launchers read them: tc's own spelling.
    args.rate_list = [format_rate(bps) if bps else "none" for bps in args.rate_bps]
    if any(m["proportional"] for m in args.method_specs) and args.epoch_steps is None:
        args.epoch_steps = 2 * args.tau  # proportional sampling re-splits at epoch boundaries
    args.warmup = args.tau if args.warmup is None else args.warmup
    require_at_least(parser, args, tau=1, batch_size=1, warmup=1, repeats=1, bound_every=1)
    if args.tau_max is not None:
        auto = [m for m in args.method_specs if m["tau"] == "auto"]
        if args.tau_max < 1:
            parser.error(f"--tau-max must be at least 1 (cocod:auto's longest period), got {args.tau_max}")
        if not auto:
            parser.error(
                f"--tau-max bounds cocod:auto only, and --methods {args.methods!r} has none: add cocod:auto"
            )
        for method in auto:
            method["tau_max"] = args.tau_max
    if args.steps < args.warmup + 2 * args.tau:
        parser.error(
            f"--steps {args.steps} is too few: need warm-up ({args.warmup}) plus two rounds of {args.tau}"
        )
    return args


def round_ends(result: dict[str, Any], overlap: int | None = None) -> list[int]:
    """Steps at which a full round ended inside a step (a partial last round, merged when fit
    ends, is not one); a round of tau="auto" has the period in force when it was launched. A
    round with ``overlap`` d runs d steps from launch to merge (None: the whole period); DiLoCo
    keeps no history of its fixed period, which is then the result's ``tau``."""
    history = result.get("tau_history") or []
    if not history and overlap is not None and isinstance(result.get("tau"), int):
        history = [(0, result["tau"])]
    ends = []
    for launch, finish, *_ in result["rounds"]:
        taus = [tau for step, tau in history if step <= launch]
        if not taus or finish - launch == (taus[-1] if overlap is None else min(overlap, taus[-1])):
            ends.append(finish)
    return sorted(set(ends))


def steady_over_rounds(result: dict[str, Any], warmup: int, overlap: int | None = None) -> float:
    """Mean step time between the first and the last round end after the warm-up."""
    ends = [e for e in round_ends(result, overlap) if e >= warmup]
    if len(ends) < 2:
        raise ValueError(f"fewer than two round ends after {warmup} warm-up steps ({ends}): run more steps")
    return steady_step_seconds(result["step_ends"][: ends[-1]], ends[0], period=ends[-1] - ends[0])


def periods_after(history: list[list[int]] | None, warmup: int) -> list[int] | None:
    """The periods in force after the warm-up, in order (tau="auto" chooses its own): the one
    set last before the warm-up ended, then every later change."""
    if not history:
        return None
    before = [tau for step, tau in history if step <= warmup]
    return before[-1:] + [tau for step, tau in history if step > warmup]


def summarize(
    results: list[dict[str, Any]], warmup: int, periodic: bool, overlap: int | None = None
) -> dict[str, Any]:
    """Figures of one run. Its step time is the pace at which all its workers complete steps: a
    run is done when its last worker is, and the cores of a shared machine differ in speed (up to
    35% between the two side-by-side workers of one bound run here), so the bound is what the
    slowest worker alone achieves. One rank's own pace would charge it, after the warm-up, for
    the wait its peer's lag during the warm-up forces on it. Communication figures are averaged
    over ranks; peak memory is the largest. ``overlap`` is a periodic run's d, as ``round_ends``'s."""

    def pace(result: dict[str, Any]) -> float:
        return (
            steady_over_rounds(result, warmup, overlap)
            if periodic
            else steady_step_seconds(result["step_ends"], warmup)
        )

    comm = [r["comm"] for r in results if r.get("comm")]
    durations = [
        b - a for r in results for a, b in zip(r["step_ends"][warmup - 1 :], r["step_ends"][warmup:])
    ]
    mean = statistics.fmean(durations) if durations else 0.0
    # The run's own timeline: step k is done when every rank has finished it. The workers share
    # the machine's monotonic clock (``perf_counter``), and all ranks run the same rounds.
    joint = {**results[0], "step_ends": [max(ends) for ends in zip(*(r["step_ends"] for r in results))]}
    return {
        "step_seconds": pace(joint),
        "step_seconds_per_rank": [pace(r) for r in results],
        "exposed_seconds_per_step": (
            sum(c["exposed_seconds"] for c in comm) / len(comm) / len(results[0]["step_ends"])
            if comm
            else None
        ),
        "hidden_fraction": sum(c["hidden_fraction"] for c in comm) / len(comm) if comm else None,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
        "buffer_copies": max(r.get("buffer_bytes", 0) for r in results) / results[0]["model_bytes"],
        "tau_history": results[0].get("tau_history"),
        "batch_split_history": results[0].get("batch_split_history"),
        "model_bytes": results[0]["model_bytes"],
        # Spread of single steps across ranks and steps: the jitter a per-step barrier pays for.
        "step_cv": statistics.pstdev(durations) / mean if len(durations) > 1 and mean > 0 else None,
        # Each round of the model launched after the warm-up, over every rank.
        **round_figures(results, warmup),
        "taus": periods_after(results[0].get("tau_history"), warmup),
    }


def workers_line(args: argparse.Namespace) -> str:
    if args.accelerator == "cpu":
        return "CPU workers x 1 thread"
    import torch

    from lightning_cocod.tools.worker import describe_placement, placement

    layout = placement("gpu", "cocod", args.worker_counts[0], 0, torch.cuda.device_count(), args.one_device)
    return f"GPU ranks: {describe_placement(layout['record'])}"


def plot(figures: dict[str, Any], rates: list[int], path: Path, title: str) -> bool:
    rates = [r for r in rates if r]  # an unshaped run has no place on a rate axis
    if not rates:
        return False
    with plot_file(path, "link rate (bit/s)", "step time (s)", title) as ax:
        for name, by_rate in figures["methods"].items():
            ax.plot(rates, [by_rate[str(r)]["step_seconds"] for r in rates], marker="o", label=name)
        ax.axhline(figures["bound"]["step_seconds"], color="k", ls="--", label=BOUND_LABEL)
        ax.set_xscale("log")
    return True


def measure(
    args: argparse.Namespace, spec: dict[str, Any], out: Path, workers: int | None = None
) -> dict[str, Any]:
    """One pass at one worker count: the bound before the first run and again after every
    ``--bound-every`` runs (the overhead run, every method at every rate) and after the last;
    every ratio is to the median of the pass's bounds. Measured once, the bound of this machine
    ranges over 1.2-2.0 s per step for ResNet18 within ten minutes; interleaved and medianed,
    neither drift nor one slow run decides a ratio."""
    workers = workers or args.worker_counts[0]
    planned = (0 if args.no_overhead else 1) + len(args.rate_list) * len(args.method_specs)
    bounds: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []

    def run_bound() -> None:
        results = run_method({**spec, "method": BOUND}, workers, None, out, suffix=f"-{len(bounds) + 1}")
        bounds.append(summarize(results, args.warmup, False))

    def run(
        run_spec: dict[str, Any], rate: str | None, periodic: bool, overlap: int | None = None
    ) -> dict[str, Any]:
        results = run_method(run_spec, workers, rate, out, topology=args.topology, latency=args.latency)
        runs.append(summarize(results, args.warmup, periodic, overlap))
        if len(runs) % args.bound_every == 0 or len(runs) == planned:
            run_bound()
        return runs[-1]

    run_bound()
    figures: dict[str, Any] = {"methods": {}}
    if not args.no_overhead:
        figures["overhead"] = run({**spec, "method": "cocod", "tau": args.steps + 1}, None, periodic=False)
    for rate, bps in zip(args.rate_list, args.rate_bps):
        for method in args.method_specs:
            periodic = method["method"] in PERIODIC
            # The method's own default when none was given (DiLoCo's d = 0), to tell its rounds' ends.
            overlap = method.get("overlap", OVERLAPPED.get(method["method"]))
            result = run({**spec, **method}, rate, periodic, overlap)
            # What the run was, for the performance model (plan_check.validate) to predict it.
            result.update(
                method=method["method"],
                tau=method["tau"] if periodic else None,
                overlap=method.get("overlap"),
                compression=method.get("compression"),
                comm_hook=method.get("comm_hook"),
            )
            if method["tau"] == "auto":
                result["tau_max"] = method.get("tau_max", SAFE_TAU_MAX)
            if result["taus"] is None and isinstance(result["tau"], int):
                result["taus"] = [result["tau"]]  # a fixed period (only CoCoD keeps a history)
            figures["methods"].setdefault(method_label(method), {})[str(bps)] = result
    bound_seconds = statistics.median(b["step_seconds"] for b in bounds)
    for result in runs:
        result["vs_bound"] = result["step_seconds"] / bound_seconds
        if result.get("compression") and result["codec_seconds_per_round"] is not None:
            # The codec against the compute it hides behind: a round's steps, at the bound's pace.
            steps = statistics.median(result["taus"]) if result.get("taus") else result["tau"]
            result["codec_share"] = result["codec_seconds_per_round"] / (steps * bound_seconds)
    for bps in map(str, args.rate_bps):
        ssgd = figures["methods"].get(SSGD, {}).get(bps)
        for by_rate in figures["methods"].values():
            by_rate[bps]["vs_ssgd"] = ssgd["step_seconds"] / by_rate[bps]["step_seconds"] if ssgd else None
    figures["bound"] = {
        **bounds[0],
        "step_seconds": bound_seconds,
        "step_seconds_runs": [b["step_seconds"] for b in bounds],
        "peak_rss_bytes": max(b["peak_rss_bytes"] for b in bounds),
        "step_cv": statistics.median(b["step_cv"] for b in bounds)
        if all(b["step_cv"] for b in bounds)
        else None,
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
    return f"{value:.2f}x" + (
        f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and spread[0] != spread[1] else ""
    )


def results_table(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    """Every run's figures; a workers column when there are several counts."""
    several = len(args.worker_counts) > 1
    rows = []
    for workers, by_workers in figures["workers"].items():
        bound = by_workers["bound"]
        for bps in args.rate_bps:
            for name, by_rate in by_workers["methods"].items():
                f = by_rate[str(bps)]
                extra = (f["peak_rss_bytes"] - bound["peak_rss_bytes"]) / bound["model_bytes"]
                exposed, hidden = f["exposed_seconds_per_step"], f["hidden_fraction"]
                rows.append(
                    [
                        *([workers] if several else []),
                        format_rate(bps),
                        name,
                        ", ".join(map(str, f["taus"])) if f.get("taus") else "",
                        f"{f['step_seconds']:.3f}",
                        ratio(f, "vs_bound"),
                        ratio(f, "vs_ssgd"),
                        f"{exposed:.3f}" if exposed is not None else "n/a",
                        f"{100 * hidden:.0f}%" if hidden is not None else "n/a",
                        f"{f['peak_rss_bytes'] / 2**20:.0f} MiB ({extra:+.1f} models)",
                        f"{f['buffer_copies']:.1f}",
                        *round_cells(f, f, f.get("codec_share"), digits=2),
                    ]
                )
    headers = [
        *(["workers"] if several else []),
        "link",
        "method",
        "tau",
        "step s",
        "vs bound",
        "vs S-SGD",
        "exposed s/step",
        "hidden",
        "peak RSS/worker (vs bound)",
        "flat copies",
        "MB sent/round",
        "codec s/round (of compute)",
    ]
    return markdown_table(headers, rows)


def scaling_table(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    """Speedup over S-SGD (and the step against the bound) at each worker count."""
    by_workers = figures["workers"]
    rows = [
        [
            format_rate(bps),
            name,
            *(
                f"{ratio(f, 'vs_ssgd')} ({f['vs_bound']:.2f}x bound)"
                for f in (by_workers[n]["methods"][name][str(bps)] for n in by_workers)
            ),
        ]
        for bps in args.rate_bps
        for name in next(iter(by_workers.values()))["methods"]
    ]
    headers = ["link", "method", *(f"{n} workers: vs S-SGD (vs bound)" for n in by_workers)]
    return markdown_table(headers, rows)


def plot_scaling(args: argparse.Namespace, figures: dict[str, Any], path: Path, title: str) -> None:
    """Speedup over S-SGD against workers: a colour per method, a line style per rate."""
    counts = [int(n) for n in figures["workers"]]
    names = [n for n in figures["workers"][str(counts[0])]["methods"] if n != SSGD]
    styles = ["-", "--", ":", "-."]
    with plot_file(path, "workers", "speedup over S-SGD (step time ratio)", title) as ax:
        for index, bps in enumerate(args.rate_bps):
            for colour, name in enumerate(names):
                speedups = [figures["workers"][str(n)]["methods"][name][str(bps)]["vs_ssgd"] for n in counts]
                if None not in speedups:
                    ax.plot(
                        counts,
                        speedups,
                        marker="o",
                        color=f"C{colour}",
                        ls=styles[index % len(styles)],
                        label=f"{name} @ {format_rate(bps)}",
                    )
        ax.axhline(1.0, color="k", lw=1, label=SSGD)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])


def bound_lines(workers: str, f: dict[str, Any]) -> list[str]:
    """The bound of one worker count, and the strategy's overhead when it was measured."""
    bound = f["bound"]
    lines = [
        (
            f"{workers} workers: bound (compute only) {bound['step_seconds']:.3f} s/step, peak RSS "
            f"{bound['peak_rss_bytes'] / 2**20:.0f} MiB; model {bound['model_bytes'] / 1e6:.2f} MB"
        )
    ]
    if "overhead" in f:
        o, spread = f["overhead"], f["overhead"].get("vs_bound_range")
        lines.append(
            f"strategy overhead (CoCoD, unshaped, no round completes): {o['step_seconds']:.3f} s/step = "
            f"{100 * (o['vs_bound'] - 1):+.1f}% vs the bound"
            + (f" (passes: {100 * (spread[0] - 1):+.1f}% to {100 * (spread[1] - 1):+.1f}%)" if spread else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    spec = {
        "model": args.model,
        "data": "synthetic",
        "batch_size": args.batch_size,
        "lr": 0.05,
        "seed": 0,
        "steps": args.steps,
        "evaluate": False,
        "tau": args.tau,
        "slowdown": args.slowdown_factors,
        "epoch_steps": args.epoch_steps,
        "model_kwargs": {"width": args.width} if args.width else {},
        "accelerator": args.accelerator,
        "one_device": args.one_device,
        "channels_last": args.channels_last,
        "precision": args.precision,
    }
    links = (
        "one shared loopback" if args.topology == "loopback" else "a link per worker (both ways) on a bridge"
    ) + (f", {format_latency(args.latency)} one-way delay added" if args.latency else "")
    print(
        f"cocod-bench: {args.model}, {', '.join(map(str, args.worker_counts))} {workers_line(args)}, "
        f"batch {args.batch_size}/worker, {args.steps} steps (first {args.warmup} discarded), tau={args.tau}, "
        f"rates {', '.join(args.rate_list)} over {links}"
        + (f", slowdown {args.slowdown_factors}" if args.slowdown_factors else "")
        + (f", tau=auto within tau_max {args.tau_max}" if args.tau_max is not None else "")
        + (f", {args.repeats} passes (medians; ranges in brackets)" if args.repeats > 1 else "")
    )
    try:
        # The latency of the links as built (a delay this kernel cannot add fails here, first).
        rtt = measured_round_trip(args.topology, args.rate_list[0], args.latency)
    except LatencyUnsupported as err:
        raise SystemExit(f"cocod-bench: {err}") from None
    print(
        f"measured round trip between two workers (TCP, 1 byte): {rtt * 1e6:.0f} us\n"
        if rtt is not None
        else "round trip not measured (no private network: links unshaped)\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    several = len(args.worker_counts) > 1
    by_workers = {}
    for workers in args.worker_counts:
        base = out / f"workers{workers}" if several else out
        passes = []
        for index in range(args.repeats):
            if args.repeats > 1 or several:
                print(f"{workers} workers, pass {index + 1}/{args.repeats}")
            passes.append(
                measure(args, spec, base / f"pass{index + 1}" if args.repeats > 1 else base, workers)
            )
        by_workers[str(workers)] = {**combine(passes), "passes": passes}
    figures = {
        "args": dict(vars(args)),
        "link": {"topology": args.topology, "latency_seconds": args.latency, "round_trip_seconds": rtt},
        "workers": by_workers,
    }
    figures["model"] = validate(figures)
    (out / "bench.json").write_text(json.dumps(figures, indent=1))

    sections = [results_table(args, figures), ""]
    sections += [line for workers, f in by_workers.items() for line in bound_lines(workers, f)]
    if several:
        sections += ["", scaling_table(args, figures)]
    sections += ["", "performance model (cocod-plan) against the measurements:", ""]
    sections.append(validation_table(figures["model"]))
    report = "\n".join(sections)
    print("\n" + report)
    (out / "table.md").write_text(report + "\n")
    title = f"{args.model}, tau={args.tau}, {args.topology} links"
    plots = []
    for workers, f in by_workers.items():
        path = out / (f"step_time_vs_rate_{workers}workers.png" if several else "step_time_vs_rate.png")
        if plot(f, args.rate_bps, path, f"{title}, {workers} workers"):
            plots.append(path)
    if several:
        plot_scaling(args, figures, out / "speedup_vs_workers.png", title)
        plots.append(out / "speedup_vs_workers.png")
    shown = ", ".join(map(str, plots)) or "none (no shaped rate, one worker count)"
    print(f"\njson: {out / 'bench.json'}\nplots: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
