"""cocod-plan: every method's step time from a performance model, and the period to use.

    cocod-plan --workers 64 --bandwidth 10gbit --latency 50us --model resnet18 --step-ms 60
    cocod-plan --workers 16,32,64,128,256 --bandwidth 1gbit --model vgg16 --step-ms 45 --jitter 0.05
    cocod-plan --validate runs/bench-.../bench.json   # predicted against measured, every run
    cocod-plan --workers 64 --bandwidth 1gbit --step-ms 60 --tau-max 64   # tau="auto" bounded by 64
    cocod-plan --workers 2 --bandwidth 100mbit --step-ms 1900 --topology loopback --device cpu \
        --compression bf16,int8 --codec-ns int8=40,bf16=20    # compressed rounds, and their codec's cost
    cocod-plan --workers 64 --bandwidth 1gbit --step-ms 60 --tau 8 --overlap-steps 1,2,4   # DiLoCo's
                                                  # round overlapped with its last 1, 2, 4 steps

The model and its assumptions: ``costmodel``; ``--validate``, the model against the step times a
cocod-bench run measured: ``plan_check``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from lightning_cocod.core.adapt import SAFE_TAU_MAX
from lightning_cocod.figures import markdown_table
from lightning_cocod.launch.cluster import TOPOLOGIES
from lightning_cocod.launch.netns import format_latency, format_rate, parse_latency
from lightning_cocod.methods import ADAPTIVE, METHODS, PERIODIC, label
from lightning_cocod.tools.compare import (
    BOUND,
    BOUND_LABEL,
    COMPRESSIONS,
    option_type,
    parse_worker_counts,
    read_rate,
)
from lightning_cocod.tools.costmodel import (
    BYTES_PER_ELEMENT,
    EFFICIENCY,
    MODEL_BYTES,
    OVERLAP,
    ROUND_BYTES_PER_SECOND,
    RULE_TAU_MAX,
    Setting,
    allreduce_seconds,
    auto_period,
    predict,
    step_seconds,
    with_codec,
)
from lightning_cocod.tools.plan_check import validate, validation_table


def plan_table(
    s: Setting, tau: int, tau_max: int, codecs: dict[str, float], overlaps: tuple[int, ...] = ()
) -> tuple[str, str]:
    """The table of every method at one setting (tau="auto" within ``tau_max``), and the
    recommendation: the period that hides communication, and what tau="auto" does about it.
    ``codecs`` (name: the codec's seconds per element of a round) adds the periodic methods with
    rounds in each codec, and a recommendation for each; ``overlaps`` adds DiLoCo's round
    overlapped with that many of its last steps, in fp32 and in each codec."""
    ssgd = step_seconds(s, "ssgd")
    entries = [(BOUND, None, None, None)]
    entries += [(name, tau if m.periodic else None, None, None) for name, m in METHODS.items()]
    entries += [("diloco", tau, None, d) for d in overlaps]
    entries += [(name, "auto", None, None) for name in ADAPTIVE]
    for codec in codecs:
        entries += [(name, tau, codec, None) for name in PERIODIC]
        entries += [("diloco", tau, codec, d) for d in overlaps]
        entries += [(name, "auto", codec, None) for name in ADAPTIVE]
    rows = []
    for method, period, codec, overlap in entries:
        setting = with_codec(s, codec, codecs[codec]) if codec else s
        seconds, used = predict(setting, method, period if period is not None else 1, tau_max, overlap)
        bounded = f" ({used}, tau_max {tau_max})" if period == "auto" else ""
        name = (
            (BOUND_LABEL if method == BOUND else label(method, period, overlap))
            + (f" {codec}" if codec else "")
            + bounded
        )
        rows.append(
            [name, f"{1e3 * seconds:.1f}", f"{seconds / s.step_seconds:.2f}x", f"{ssgd / seconds:.2f}x"]
        )
    table = markdown_table(["method", "step ms", "vs compute", "speedup vs S-SGD"], rows)
    best, seconds, auto = _hiding_period(s, tau_max)
    advice = (
        f"recommended: CoCoD-SGD tau={best} (the smallest period that hides the all-reduce): "
        f"{ssgd / seconds:.2f}x faster than S-SGD, {seconds / s.step_seconds:.2f}x of compute only; "
        f"the all-reduce takes {1e3 * allreduce_seconds(s):.1f} ms, "
        f"{allreduce_seconds(s) / s.step_seconds:.2f} steps of compute. "
        f"A longer period saves little time and averages the models less often. {auto}"
    )
    for codec, per_element in codecs.items():
        setting = with_codec(s, codec, per_element)
        best, seconds, auto = _hiding_period(setting, tau_max)
        wire = allreduce_seconds(setting)
        advice += (
            f"\nwith {codec} rounds ({setting.element_bytes:g} bytes an element, against fp32's 4): CoCoD-SGD "
            f"tau={best} hides the round: {ssgd / seconds:.2f}x faster than S-SGD, "
            f"{seconds / s.step_seconds:.2f}x of compute only; the round takes {1e3 * wire:.1f} ms on the wire and "
            f"{1e3 * setting.codec_seconds:.1f} ms in the codec "
            f"({100 * setting.codec_seconds / (best * s.step_seconds):.1f}% of the period's compute). {auto}"
        )
    return table, advice


def _hiding_period(s: Setting, tau_max: int) -> tuple[int, float, str]:
    """The smallest period that hides a round in this setting, its step time, and what
    tau="auto" within ``tau_max`` does about it."""
    best = auto_period(s, tau_max=max(tau_max, RULE_TAU_MAX))
    if best <= tau_max:
        auto = f'tau="auto" with tau_max {tau_max} settles there'
    else:
        auto = f'tau="auto" stays at or below {tau_max} unless strategy.tau_max is raised to {best}'
    if best > SAFE_TAU_MAX:
        auto += (
            f"; the accuracy studies (docs/accuracy/) show what periods above {SAFE_TAU_MAX} cost in accuracy"
        )
    return best, step_seconds(s, "cocod", best), auto


def parse_codecs(text: str) -> list[str]:
    """'bf16,int8' -> ["bf16", "int8"]: codecs of compressed rounds."""
    codecs = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in codecs if c not in COMPRESSIONS]
    if bad or not codecs:
        raise ValueError(
            f"--compression {text!r} is not understood; accepted: {', '.join(COMPRESSIONS)}, comma-separated"
        )
    return list(dict.fromkeys(codecs))


def parse_overlap_steps(text: str) -> tuple[int, ...]:
    """'1,2' -> (1, 2): overlaps d of DiLoCo's round, in steps; 'none' -> () (no such row)."""
    if text.strip().lower() == "none":
        return ()
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    if not tokens or not all(t.isdigit() for t in tokens):
        raise ValueError(
            f"--overlap-steps {text!r} is not understood; accepted: steps from 0 to --tau, comma-separated "
            "(e.g. 1 or 1,2,4), or none"
        )
    return tuple(sorted(set(map(int, tokens))))


def parse_codec_costs(text: str) -> dict[str | None, float]:
    """'40' -> {None: 40.0} (every codec); 'int8=40,bf16=20' -> one each; ns per element >= 0."""
    costs: dict[str | None, float] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, _, value = item.rpartition("=")
        try:
            cost = float(value)
        except ValueError:
            cost = -1.0
        if (name and name not in COMPRESSIONS) or cost < 0 or not math.isfinite(cost):
            raise ValueError(
                f"--codec-ns {text!r} is not understood; accepted: ns per element >= 0, for every codec (e.g. 40) or "
                f"per codec (e.g. int8=40,bf16=20; codecs: {', '.join(COMPRESSIONS)})"
            )
        costs[name or None] = cost
    if not costs:
        raise ValueError("--codec-ns is empty; accepted: e.g. 40 or int8=40,bf16=20")
    return costs


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help; an option whose default is worked out later (None here)
    says what it is in its own help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="cocod-plan", description=__doc__.split("\n\n")[0], formatter_class=_ShowDefaults
    )
    # Not argparse's required=True: --validate reads every figure from the benchmark instead.
    parser.add_argument_group("required, unless --validate").add_argument(
        "--step-ms", type=float, help="compute time of one step, ms"
    )
    parser.add_argument("--validate", metavar="BENCH_JSON", help="predict every run of a cocod-bench output")
    parser.add_argument(
        "--workers",
        dest="worker_counts",
        metavar="WORKERS",
        default="16",
        type=option_type(parse_worker_counts),
        help="worker count(s), e.g. 64 or 16,32,64,128,256",
    )
    parser.add_argument(
        "--bandwidth",
        dest="bandwidth_bps",
        metavar="RATE",
        default="10gbit",
        type=option_type(read_rate),
        help="per-node rate each way, e.g. 10Gbps, 100mbit, 1.5gbit",
    )
    parser.add_argument(
        "--latency",
        dest="latency_seconds",
        metavar="LATENCY",
        default="50us",
        type=option_type(parse_latency),
        help="one-way latency of a message, e.g. 50us",
    )
    parser.add_argument("--model", default="resnet18", choices=sorted(MODEL_BYTES), help="model preset")
    parser.add_argument("--model-bytes", type=int, default=None, help="bytes all-reduced (overrides --model)")
    parser.add_argument("--tau", type=int, default=4, help="period of Local-SGD and fixed-period CoCoD-SGD")
    parser.add_argument(
        "--tau-max",
        type=int,
        default=None,
        help=f'longest period of tau="auto" (default: the strategy\'s, {SAFE_TAU_MAX}); with --validate, '
        "for runs whose bench.json does not record theirs (cocod-bench before --tau-max ran with 64)",
    )
    parser.add_argument("--jitter", type=float, default=0.0, help="coefficient of variation of a step's time")
    parser.add_argument(
        "--overlap", type=float, default=None, help="share of a step S-SGD overlaps (default: preset)"
    )
    parser.add_argument(
        "--overlap-steps",
        default="1",
        type=option_type(parse_overlap_steps),
        help="rows for DiLoCo's round with its all-reduce alongside its last D steps (overlap=D), "
        "e.g. 1 or 1,2,4 (0 to --tau), or none",
    )
    parser.add_argument(
        "--round-ms", type=float, default=None, help="a CoCoD round's own work, ms (default: --device)"
    )
    parser.add_argument(
        "--device",
        default="gpu",
        choices=sorted(ROUND_BYTES_PER_SECOND),
        help="what the round's own work runs on",
    )
    parser.add_argument(
        "--efficiency",
        type=float,
        default=EFFICIENCY,
        help="payload share of the link rate (default: %(default).3f, TCP/IP over Ethernet)",
    )
    parser.add_argument(
        "--topology",
        default="pernode",
        choices=TOPOLOGIES,
        help="pernode: a link per node; loopback: every worker's traffic over one shared link",
    )
    parser.add_argument(
        "--compression",
        default=None,
        type=option_type(parse_codecs),
        help=f"rows for rounds compressed in these codecs, e.g. {','.join(COMPRESSIONS)}",
    )
    parser.add_argument(
        "--codec-ns",
        default=None,
        type=option_type(parse_codec_costs),
        help="the codec's time a round, ns per element of the model (encode and decode): one figure for "
        "every codec, or one each, e.g. int8=40,bf16=20 (default 0: not modelled)",
    )
    args = parser.parse_args(argv)
    if args.tau_max is not None and args.tau_max < 1:
        parser.error(f'--tau-max must be at least 1 (the longest period of tau="auto"), got {args.tau_max}')
    if args.validate:
        if args.compression or args.codec_ns:
            parser.error(
                "--compression and --codec-ns are read from the benchmark with --validate: leave them out"
            )
        return args
    costs = args.codec_ns or {}
    if args.codec_ns is not None and not args.compression:
        parser.error("--codec-ns prices a codec's rounds: give --compression too, e.g. --compression int8")
    unknown = sorted(set(costs) - set(args.compression or []) - {None})
    if unknown:
        parser.error(
            f"--codec-ns names {', '.join(unknown)}, not in --compression {','.join(args.compression)}"
        )
    # One figure for every codec, or one each (a codec not named costs nothing).
    args.codecs = {c: costs.get(c, costs.get(None, 0.0)) * 1e-9 for c in args.compression or []}
    checks = [
        (
            args.step_ms is not None and args.step_ms > 0,
            "--step-ms (compute per step, ms) is required and > 0",
        ),
        (args.bandwidth_bps is not None, "--bandwidth: a plan needs a finite rate (e.g. 10gbit), not none"),
        (args.tau >= 1, f"--tau must be at least 1, got {args.tau}"),
        (
            all(d <= args.tau for d in args.overlap_steps),
            f"--overlap-steps {','.join(map(str, args.overlap_steps))} is not understood; accepted: steps "
            f"from 0 to --tau ({args.tau}), comma-separated",
        ),
        (0 <= args.jitter < 1, f"--jitter is a coefficient of variation in [0, 1), got {args.jitter}"),
        (
            args.overlap is None or 0 <= args.overlap <= 1,
            f"--overlap is a share of a step in [0, 1], got {args.overlap}",
        ),
        (args.round_ms is None or args.round_ms >= 0, f"--round-ms must be >= 0, got {args.round_ms}"),
        (0 < args.efficiency <= 1, f"--efficiency is a share in (0, 1], got {args.efficiency}"),
        (
            args.model_bytes is None or args.model_bytes > 0,
            f"--model-bytes must be positive, got {args.model_bytes}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.validate:
        try:
            figures = json.loads(Path(args.validate).read_text())
            rows = validate(figures, args.tau_max)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SystemExit(
                f"cocod-plan: cannot validate against {args.validate}: {type(err).__name__}: {err}"
            ) from None
        print(validation_table(rows))
        return 0
    model_bytes = args.model_bytes or MODEL_BYTES[args.model]
    tau_max = SAFE_TAU_MAX if args.tau_max is None else args.tau_max
    overlap = args.overlap if args.overlap is not None else (0.0 if args.model_bytes else OVERLAP[args.model])
    round_seconds = (
        args.round_ms / 1e3
        if args.round_ms is not None
        else model_bytes / ROUND_BYTES_PER_SECOND[args.device]
    )
    print(
        f"cocod-plan: {args.model_bytes and 'a model' or args.model} of {model_bytes / 1e6:.1f} MB, "
        f"{args.step_ms:g} ms of compute per step, {format_rate(args.bandwidth_bps)} per node "
        f"({args.topology}), {format_latency(args.latency_seconds)} latency, jitter {args.jitter:g}, "
        f"S-SGD overlap {overlap:g} of a step, round's own work {1e3 * round_seconds:.2f} ms, "
        f'link efficiency {args.efficiency:.3f}, tau="auto" within tau_max {tau_max}'
    )
    if args.codecs:
        print(
            "compressed rounds: "
            + ", ".join(
                f"{codec} ({BYTES_PER_ELEMENT[codec]:g} bytes an element, codec {1e9 * cost:g} ns an element a round)"
                for codec, cost in args.codecs.items()
            )
        )
    for workers in args.worker_counts:
        s = Setting(
            step_seconds=args.step_ms / 1e3,
            model_bytes=model_bytes,
            workers=workers,
            bandwidth_bps=args.bandwidth_bps,
            latency_seconds=args.latency_seconds or 0.0,
            round_seconds=round_seconds,
            overlap=overlap,
            jitter=args.jitter,
            efficiency=args.efficiency,
            topology=args.topology,
        )
        table, advice = plan_table(s, args.tau, tau_max, args.codecs, args.overlap_steps)
        print(f"\n{workers} workers\n\n{table}\n\n{advice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
