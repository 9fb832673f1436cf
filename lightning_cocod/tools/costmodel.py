"""The performance model of ``cocod-plan``: every method's time per optimizer step from figures of
the compute, the model and the links, and the period ``tau="auto"`` settles on at those figures.

The model, per optimizer step (t_c: compute time per step; S: model bytes; N workers):

* all-reduce (ring): T(S) = 2 (N-1) (alpha + S / (N B)), B = efficiency x the per-node rate in
  bytes/s each way, alpha the one-way latency of a message. On one shared link (``--topology
  loopback``) all N workers' traffic crosses the same pipe: T(S) = 2 (N-1) (alpha + S / B), N
  times as long. A link that idled keeps a bucket of ``burst_bytes`` it sends at once:
  T(S) - burst / B. A tiny all-reduce (flags, figures) costs t_0 = 2 (N-1) alpha.
* S-SGD: t_c + max(0, T(S) - overlap t_c) + t_0: DDP's gradient buckets go out while backward
  still runs, hiding up to ``overlap`` of a step; a model in one bucket hides nothing.
* Pipe-SGD: max(t_c + t_round, T(S) + t_0): step t's gradients travel during step t+1.
* Local-SGD tau: t_c + (t_0 + T(S) + t_round) / tau: a blocking average every tau steps.
* CoCoD-SGD tau: (t_round + max(tau t_c, T(S) + t_0)) / tau: the round-start model travels
  while tau steps compute; t_round is the round's own work (snapshot, checks, merge).
* The outer round with overlap d (``core.outer``; DiLoCo, default d = 0, and CoCoD-SGD with
  ``overlap``, default d = tau): (tau t_c + t_round + max(0, T(S) + t_0 - d t_c)) / tau: the
  all-reduce runs alongside the round's last d steps and what they do not hide is waited for. At
  d = 0 it blocks as Local-SGD's does, t_c + (t_0 + T(S) + t_round) / tau; at d = tau it is
  CoCoD-SGD's; the outer step is part of t_round.
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
  maximum of N standard normals; a barrier once a round of tau steps (Local-SGD, CoCoD-SGD,
  DiLoCo) for the slowest sum of tau: t_c (1 + c e_N / sqrt(tau)) per step.

Assumed: communication takes no compute from the steps (a GPU's copy engines and NIC, not a
CPU's cores); the links are the only bottleneck (a non-blocking switch); every worker is as fast
as every other apart from the jitter. Arithmetic only, no torch: the command answers at once.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from functools import cache

from lightning_cocod.core.adapt import SAFE_TAU_MAX, AdaptivePeriod
from lightning_cocod.methods import METHODS, OVERLAPPED, PERIODIC, overlap_in_force
from lightning_cocod.tools.compare import BOUND

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


def step_seconds(s: Setting, method: str, tau: int = 1, overlap: int | None = None) -> float:
    """The model's time per optimizer step of `method` ("bound" is compute only); ``overlap`` is
    d of an outer round (``OVERLAPPED``; None: the method's own default)."""
    d = check_overlap(method, tau, overlap)
    # A compressed round's codec runs on its communication path, as the strategy measures it.
    t_ar, t_0 = allreduce_seconds(s) + s.codec_seconds, allreduce_seconds(s, 0)
    if method == BOUND:
        return s.step_seconds
    if method == "ssgd":
        return _compute(s, 1) + max(0.0, t_ar - s.overlap * s.step_seconds) + t_0
    if method == "pipe_sgd":
        return max(_compute(s, 1) + s.round_seconds, t_ar + t_0)
    if method == "local_sgd" or method in OVERLAPPED:
        # Local-SGD's blocking average is the outer round at d = 0.
        compute, d = _compute(s, tau), d or 0
        return (tau * compute + s.round_seconds + max(0.0, t_ar + t_0 - d * compute)) / tau
    raise ValueError(f"method {method!r} is not one of {BOUND}, {', '.join(METHODS)}")


def check_overlap(method: str, tau: int, overlap: int | None) -> int | None:
    """d in force for ``method`` (None for a method without an overlapped round); ValueError
    for an ``overlap`` it does not take or outside 0 to ``tau``."""
    if method not in OVERLAPPED:
        if overlap is not None:
            raise ValueError(
                f"overlap={overlap!r} is the overlap of {', '.join(OVERLAPPED)}'s rounds; {method!r} takes none"
            )
        return None
    if overlap is not None and not (isinstance(overlap, int) and 0 <= overlap <= tau):
        raise ValueError(f"overlap={overlap!r} is not understood; accepted: an integer from 0 to tau={tau}")
    return overlap_in_force(method, tau, overlap)


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
    s: Setting, method: str, tau: int | str = 4, tau_max: int = SAFE_TAU_MAX, overlap: int | None = None
) -> tuple[float, int | None]:
    """(seconds per step, the period used) of a method; tau "auto" is resolved by the rule, at
    most ``tau_max``; ``overlap`` as ``step_seconds``'s (tau "auto" takes none, as the strategy)."""
    if method in PERIODIC:
        if tau == "auto" and overlap is not None:
            raise ValueError(
                f"overlap={overlap!r} needs a fixed period: tau='auto' chooses the paper's round's"
            )
        period = auto_period(s, tau_max=tau_max) if tau == "auto" else int(tau)
        return step_seconds(s, method, period, overlap), period
    return step_seconds(s, method, overlap=overlap), None
