"""cocod-plan: every method's step time from a performance model, and the period to use.

    cocod-plan --workers 64 --bandwidth 10gbit --latency 50us --model resnet18 --step-ms 60
    cocod-plan --workers 16,32,64,128,256 --bandwidth 1gbit --model vgg16 --step-ms 45 --jitter 0.05
    cocod-plan --validate runs/bench-.../bench.json   # predicted against measured, every run
    cocod-plan --workers 64 --bandwidth 1gbit --step-ms 60 --tau-max 64   # tau="auto" bounded by 64
    cocod-plan --workers 2 --bandwidth 100mbit --step-ms 1900 --topology loopback --device cpu \
        --compression bf16,int8 --codec-ns int8=40,bf16=20    # compressed rounds, and their codec's cost

The model, per optimizer step (t_c: compute time per step; S: model bytes; N workers):

* all-reduce (ring): T(S) = 2 (N-1) (alpha + S / (N B)), B = efficiency x the per-node rate in
  bytes/s each way, alpha the one-way latency of a message. On one shared link (``--topology
  loopback``) all N workers' traffic crosses the same pipe: T(S) = 2 (N-1) (alpha + S / B), N
  times as long. A link that idled keeps a bucket of ``--burst`` bytes it sends at once:
  T(S) - burst / B. A tiny all-reduce (flags, figures) costs t_0 = 2 (N-1) alpha.
* S-SGD: t_c + max(0, T(S) - overlap t_c) + t_0: DDP's gradient buckets go out while backward
  still runs, hiding up to ``overlap`` of a step; a model in one bucket hides nothing.
* Pipe-SGD: max(t_c + t_round, T(S) + t_0): step t's gradients travel during step t+1.
* Local-SGD tau: t_c + (t_0 + T(S) + t_round) / tau: a blocking average every tau steps.
* CoCoD-SGD tau: (t_round + max(tau t_c, T(S) + t_0)) / tau: the round-start model travels
  while tau steps compute; t_round is the round's own work (snapshot, checks, merge).
* tau="auto": the period the strategy's own rule picks (``core.adapt.AdaptivePeriod``: smallest
  tau with tau t_c >= 1.2 (T(S) + t_0) and t_round <= 1% of tau t_c) given these figures, at most
  the strategy's tau_max: ``SAFE_TAU_MAX`` (2) by default, ``--tau-max`` to raise it. The
  recommendation gives the period that hides communication whatever the bound.
* ``--compression bf16,int8``: rows for Local-SGD and CoCoD-SGD rounds sent in that codec: the
  all-reduce carries ``BYTES_PER_ELEMENT`` bytes an element (fp32 4, bf16 2, int8 1 and a 4-byte
  scale per 2,048) instead of 4, in the same 2 (N-1) / N of the model each rank sends, and the
  round takes the codec's own time too (``--codec-ns``, nanoseconds per element of the model a
  round, encoding and decoding; with ``--validate``, what the run itself measured).
* ``--jitter c``: each worker's step time i.i.d. with coefficient of variation c. A barrier
  every step (S-SGD, Pipe-SGD) waits for the slowest of N: t_c (1 + c e_N), e_N the expected
  maximum of N standard normals; a barrier once a round of tau steps (Local-SGD, CoCoD-SGD)
  for the slowest sum of tau: t_c (1 + c e_N / sqrt(tau)) per step.

Assumed: communication takes no compute from the steps (a GPU's copy engines and NIC, not a
CPU's cores); the links are the only bottleneck (a non-blocking switch); every worker is as fast
as every other apart from the jitter. ``--validate`` calibrates the model on a cocod-bench run
(t_c from its bound, alpha from its measured round trip, the efficiency from one all-reduce
timing) and prints its prediction of every step time measured there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from lightning_cocod.core.adapt import SAFE_TAU_MAX, AdaptivePeriod
from lightning_cocod.figures import markdown_table
from lightning_cocod.launch.cluster import TOPOLOGIES, burst_of
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

# fp32 parameters, plus floating-point buffers (BatchNorm statistics), which the periodic
# methods average with them; classes of CIFAR-10 unless named.
MODEL_BYTES = {
    "resnet18": 4 * (11_173_962 + 9_600),
    "vgg16": 4 * (14_728_266 + 8_448),
    "vgg16_c100": 4 * (14_774_436 + 8_448),
    "small_cnn": 4 * (147_994 + 576),
}
# Share of a step during which S-SGD's gradient buckets travel while backward still runs.
# ResNet18: calibrated on this project's 2-worker ResNet18 benchmark (README: 1.34 s bound, 3.02 s
# S-SGD on a 300 Mbit/s loopback, whose all-reduce takes 2.49 s by this model); VGG16 is assumed
# alike; SmallCNN's gradients fit DDP's first bucket, sent only when backward ends.
OVERLAP = {"resnet18": 0.6, "vgg16": 0.6, "vgg16_c100": 0.6, "small_cnn": 0.0}
# Bytes of model per second of a CoCoD round's own work (snapshot, finite check, launch, merge:
# about six passes over the model through memory). cpu: measured here (ResNet18: ~0.03 s a round,
# README); gpu: assumed, six passes at ~300 GB/s of a GTX 1080Ti-class GPU's 484 GB/s.
ROUND_BYTES_PER_SECOND = {"cpu": 1.5e9, "gpu": 50e9}
# Bytes on the wire per element of the model: fp32, and the codecs of compressed rounds
# (``core.compress``: int8 keeps one fp32 scale per 2,048 elements) and of DDP's hooks (S-SGD).
BYTES_PER_ELEMENT = {None: 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1 + 4 / 2048}
# TCP/IP over Ethernet: 1448 bytes of payload in a 1514-byte frame (what tbf counts).
EFFICIENCY = 1448 / 1514
# The rule's own ceiling, without the accuracy study's cap: where the recommendation looks for the
# period that hides communication.
RULE_TAU_MAX = AdaptivePeriod().tau_max


@dataclass(frozen=True)
class Setting:
    step_seconds: float  # t_c: compute of one step, no communication
    model_bytes: int
    workers: int
    bandwidth_bps: int  # per node, each way
    latency_seconds: float  # alpha: one message, one way
    round_seconds: float = 0.0
    overlap: float = 0.0
    jitter: float = 0.0  # coefficient of variation of one worker's step time
    efficiency: float = EFFICIENCY
    burst_bytes: int = 0
    topology: str = "pernode"
    element_bytes: float = 4.0  # on the wire, per element of the fp32 model (``BYTES_PER_ELEMENT``)
    codec_seconds: float = 0.0  # encoding and decoding one round, on its communication path

    @property
    def bytes_per_second(self) -> float:
        return self.efficiency * self.bandwidth_bps / 8

    @property
    def wire_bytes(self) -> float:
        """What one all-reduce of the model carries in this setting's codec."""
        return self.model_bytes * self.element_bytes / 4


def with_codec(s: Setting, codec: str | None, codec_seconds_per_element: float = 0.0) -> Setting:
    """``s`` with the model's averages sent in ``codec`` (None: fp32), at that codec's cost."""
    if codec not in BYTES_PER_ELEMENT:
        accepted = ", ".join(str(c) for c in BYTES_PER_ELEMENT)
        raise ValueError(f"codec {codec!r} is not modelled; accepted: {accepted}")
    return replace(
        s, element_bytes=BYTES_PER_ELEMENT[codec], codec_seconds=codec_seconds_per_element * s.model_bytes / 4
    )


def allreduce_seconds(s: Setting, nbytes: float | None = None) -> float:
    """A ring all-reduce of `nbytes` (default: the model, in the setting's codec) on these links."""
    nbytes = s.wire_bytes if nbytes is None else nbytes
    n = s.workers
    if n < 2:
        return 0.0
    hops = 2 * (n - 1)
    chunk = nbytes if s.topology == "loopback" else nbytes / n
    wire = hops * chunk / s.bytes_per_second
    return hops * s.latency_seconds + max(0.0, wire - s.burst_bytes / s.bytes_per_second)


@cache
def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals] (0 for n=1), by Simpson's rule over [-9, 9]."""
    if n <= 1:
        return 0.0
    normal, h = statistics.NormalDist(), 18 / 3600
    f = [x * n * normal.pdf(x) * normal.cdf(x) ** (n - 1) for x in (-9 + i * h for i in range(3601))]
    return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))


def _compute(s: Setting, barrier_every: int) -> float:
    """Compute per step when the workers wait for each other every `barrier_every` steps."""
    return s.step_seconds * (1 + s.jitter * expected_max_of_normals(s.workers) / math.sqrt(barrier_every))


def step_seconds(s: Setting, method: str, tau: int = 1) -> float:
    """The model's time per optimizer step of `method` ("bound" is compute only)."""
    # A compressed round's codec runs on its communication path, as the strategy measures it.
    t_ar, t_0 = allreduce_seconds(s) + s.codec_seconds, allreduce_seconds(s, 0)
    if method == BOUND:
        return s.step_seconds
    if method == "ssgd":
        return _compute(s, 1) + max(0.0, t_ar - s.overlap * s.step_seconds) + t_0
    if method == "pipe_sgd":
        return max(_compute(s, 1) + s.round_seconds, t_ar + t_0)
    if method == "local_sgd":
        return _compute(s, tau) + (t_0 + t_ar + s.round_seconds) / tau
    if method == "cocod":
        return (s.round_seconds + max(tau * _compute(s, tau), t_ar + t_0)) / tau
    raise ValueError(f"method {method!r} is not one of {BOUND}, {', '.join(METHODS)}")


def auto_period(s: Setting, tau_max: int = SAFE_TAU_MAX) -> int:
    """The period CoCoDStrategy(tau="auto", tau_max=tau_max) settles on when it measures these
    figures (the default is the strategy's)."""
    rule = AdaptivePeriod(tau_max=tau_max)
    for _ in range(rule.patience + 1):  # a shorter period is taken after `patience` rounds ask for it
        tau = rule.update(
            allreduce_seconds(s) + s.codec_seconds + allreduce_seconds(s, 0), s.step_seconds, s.round_seconds
        )
    return tau


def predict(
    s: Setting, method: str, tau: int | str = 4, tau_max: int = SAFE_TAU_MAX
) -> tuple[float, int | None]:
    """(seconds per step, the period used) of a method; tau "auto" is resolved by the rule, at
    most ``tau_max``."""
    if method in PERIODIC:
        period = auto_period(s, tau_max=tau_max) if tau == "auto" else int(tau)
        return step_seconds(s, method, period), period
    return step_seconds(s, method), None


def plan_table(s: Setting, tau: int, tau_max: int, codecs: dict[str, float]) -> tuple[str, str]:
    """The table of every method at one setting (tau="auto" within ``tau_max``), and the
    recommendation: the period that hides communication, and what tau="auto" does about it.
    ``codecs`` (name: the codec's seconds per element of a round) adds the periodic methods with
    rounds in each codec, and a recommendation for each."""
    ssgd = step_seconds(s, "ssgd")
    entries = [(BOUND, None, None)]
    entries += [(name, tau if m.periodic else None, None) for name, m in METHODS.items()]
    entries += [(name, "auto", None) for name in ADAPTIVE]
    for codec in codecs:
        entries += [(name, tau, codec) for name in PERIODIC] + [(name, "auto", codec) for name in ADAPTIVE]
    rows = []
    for method, period, codec in entries:
        setting = with_codec(s, codec, codecs[codec]) if codec else s
        seconds, used = predict(setting, method, period if period is not None else 1, tau_max)
        bounded = f" ({used}, tau_max {tau_max})" if period == "auto" else ""
        name = (
            (BOUND_LABEL if method == BOUND else label(method, period))
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
        table, advice = plan_table(s, args.tau, tau_max, args.codecs)
        print(f"\n{workers} workers\n\n{table}\n\n{advice}")
    return 0


def calibrate(figures: dict[str, Any]) -> tuple[float, float, str]:
    """(latency, efficiency, how) from a cocod-bench output: half the measured round trip, and
    the efficiency that makes the model's all-reduce last as long as one Local-SGD round's did
    (fewest workers, first shaped rate); the nominal efficiency when no such round was measured."""
    latency = (figures["link"].get("round_trip_seconds") or 0.0) / 2
    fewest = min(figures["workers"], key=int)
    for bps in filter(None, figures["args"]["rate_bps"]):
        for name, by_rate in figures["workers"][fewest]["methods"].items():
            measured = by_rate[str(bps)].get("comm_seconds_per_round")
            # fp32 rounds only: a compressed one's time holds its codec's and fewer bytes.
            if (
                by_rate[str(bps)].get("method") != "local_sgd"
                or by_rate[str(bps)].get("compression")
                or not measured
            ):
                continue
            s = _setting(figures, int(fewest), bps, latency, efficiency=1.0)
            fixed = allreduce_seconds(s, 0)  # the latency part, which the efficiency does not scale
            if measured <= fixed:
                break
            return (
                latency,
                (allreduce_seconds(s) - fixed) / (measured - fixed),
                (f"one {name} all-reduce at {fewest} workers, {format_rate(bps)}: {1e3 * measured:.0f} ms"),
            )
    return latency, EFFICIENCY, "nominal: no Local-SGD all-reduce was measured"


def _setting(figures: dict[str, Any], workers: int, bps: int, latency: float, efficiency: float) -> Setting:
    args = figures["args"]
    bound = figures["workers"][str(workers)]["bound"]
    model_bytes = bound["model_bytes"]
    return Setting(
        step_seconds=bound["step_seconds"],
        model_bytes=model_bytes,
        workers=workers,
        bandwidth_bps=bps,
        latency_seconds=latency,
        round_seconds=model_bytes / ROUND_BYTES_PER_SECOND["cpu"],
        overlap=OVERLAP.get(args["model"], 0.0),
        efficiency=efficiency,
        burst_bytes=burst_of(args["topology"], bps),
        topology=args["topology"],
    )


def run_tau_max(name: str, f: dict[str, Any], given: int | None) -> int:
    """The tau_max a tau="auto" run ran with: the one cocod-bench recorded, else ``given``, else
    the strategy's default. Runs from before cocod-bench recorded it had the old default: give 64."""
    recorded = f.get("tau_max")
    if recorded is None:
        return SAFE_TAU_MAX if given is None else given
    recorded = int(recorded)  # combine() takes the median over passes, which may be a float
    if given is not None and given != recorded:
        raise ValueError(
            f"run {name!r} recorded tau_max {recorded}, --tau-max {given} contradicts it: leave --tau-max out"
        )
    return recorded


def validate(figures: dict[str, Any], tau_max: int | None = None) -> list[dict[str, Any]]:
    """The model's step time for every method, rate and worker count a cocod-bench run measured:
    from the median of the worker count's bound runs, and from the fastest and the slowest of
    them (how far the machine's own drift alone moves the prediction). tau="auto" is bounded
    as the run was (``run_tau_max``; ``tau_max`` for runs that did not record it). A compressed
    run is predicted in its codec's bytes, at the codec time per round the run itself measured;
    DDP's PowerSGD hook is not modelled (its bytes follow the layers' shapes): its row says so."""
    latency, efficiency, how = calibrate(figures)
    rows = []
    for workers, by_workers in sorted(figures["workers"].items(), key=lambda kv: int(kv[0])):
        bound = by_workers["bound"]
        spread = bound.get("step_seconds_runs") or [bound["step_seconds"]]
        for bps in filter(None, figures["args"]["rate_bps"]):
            s = _setting(figures, int(workers), bps, latency, efficiency)
            for name, by_rate in by_workers["methods"].items():
                f = by_rate[str(bps)]
                row = {
                    "workers": int(workers),
                    "rate_bps": bps,
                    "method": name,
                    "measured": f["step_seconds"],
                    "measured_periods": f.get("taus"),
                    "latency_seconds": latency,
                    "efficiency": efficiency,
                    "calibrated_on": how,
                }
                codec = f.get("compression") or f.get("comm_hook")
                if codec not in BYTES_PER_ELEMENT:
                    rows.append({**row, "predicted": None, "not_modelled": codec})
                    continue
                codec_seconds = f.get("codec_seconds_per_round") if f.get("compression") else None
                run = with_codec(s, codec, (codec_seconds or 0.0) / (s.model_bytes / 4))
                tau = f.get("tau") or 1
                bounded = {"tau_max": run_tau_max(name, f, tau_max)} if tau == "auto" else {}
                predicted, period = predict(run, f["method"], tau, **bounded)
                low, high = (
                    predict(replace(run, step_seconds=t), f["method"], tau, **bounded)[0]
                    for t in (min(spread), max(spread))
                )
                rows.append(
                    {
                        **row,
                        "predicted": predicted,
                        "predicted_range": [low, high],
                        "error": predicted / f["step_seconds"] - 1,
                        "period": period,
                        # The model's round, launch to completion (codec included), against the run's (median).
                        "allreduce": [
                            f.get("comm_seconds_per_round"),
                            allreduce_seconds(run) + run.codec_seconds,
                        ],
                        # What one rank sends a round: 2 (N-1) / N of the model in its codec, run against model.
                        "bytes_sent": [
                            f.get("bytes_sent_per_round"),
                            2 * (run.workers - 1) / run.workers * run.wire_bytes,
                        ],
                    }
                )
    return rows


def validation_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no shaped run to predict)"
    modelled = [r for r in rows if r["predicted"] is not None]

    def cells(r: dict[str, Any]) -> list[str]:
        head = [str(r["workers"]), format_rate(r["rate_bps"]), r["method"], f"{r['measured']:.3f}"]
        if r["predicted"] is None:
            return [
                *head,
                f"not modelled ({r['not_modelled']}: its bytes follow the layers' shapes)",
                *[""] * 5,
            ]
        low, high = r["predicted_range"]
        sent = r.get("bytes_sent") or [None, None]
        return [
            *head,
            f"{r['predicted']:.3f}",
            f"{100 * r['error']:+.0f}%",
            f"{low:.3f}-{high:.3f}" + (" (holds it)" if low <= r["measured"] <= high else ""),
            f"{r['period']} / {', '.join(map(str, r['measured_periods'] or []))}" if r["period"] else "",
            "{:.3f} / {:.3f}".format(*r["allreduce"]) if r["allreduce"][0] else "",
            f"{sent[0] / 1e6:.2f} / {sent[1] / 1e6:.2f}" if sent[0] else "",
        ]

    table = markdown_table(
        [
            "workers",
            "link",
            "method",
            "measured s",
            "predicted s",
            "error",
            "predicted, bound's min-max",
            "tau (model / run)",
            "round s (run / model)",
            "MB sent/round (run / model)",
        ],
        [cells(r) for r in rows],
    )
    if not modelled:
        return f"{table}\n\nno run the model covers"
    errors = [abs(r["error"]) for r in modelled]
    within = sum(e <= 0.15 for e in errors)
    held = sum(r["predicted_range"][0] <= r["measured"] <= r["predicted_range"][1] for r in modelled)
    summary = (
        f"calibration: latency {1e6 * rows[0]['latency_seconds']:.0f} us (half the measured round trip), "
        f"link efficiency {rows[0]['efficiency']:.3f} ({rows[0]['calibrated_on']}), compute per step from "
        f"each worker count's bound runs (median), a compressed round's codec time from its run; {within} of "
        f"{len(modelled)} step times within 15%, {held} within the range the bound runs' spread gives; median "
        f"error {100 * statistics.median(errors):.0f}%, largest {100 * max(errors):.0f}%"
    )
    return f"{table}\n\n{summary}"


if __name__ == "__main__":
    sys.exit(main())
