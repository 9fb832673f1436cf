"""The performance model against measured runs (``cocod-plan --validate``, and cocod-bench's own
report): the model is calibrated on a cocod-bench output (t_c from its bound runs, alpha from its
measured round trip, the link efficiency from one all-reduce timing) and predicts every step time
measured there, with how far the bound runs' own spread moves the prediction.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from lightning_cocod.core.adapt import SAFE_TAU_MAX
from lightning_cocod.figures import markdown_table
from lightning_cocod.launch.cluster import burst_of
from lightning_cocod.launch.netns import format_rate
from lightning_cocod.tools.costmodel import (
    BYTES_PER_ELEMENT,
    EFFICIENCY,
    OVERLAP,
    ROUND_BYTES_PER_SECOND,
    Setting,
    allreduce_seconds,
    predict,
    with_codec,
)


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
                # combine() takes the median over passes, which may be a float
                bounded["overlap"] = None if f.get("overlap") is None else int(f["overlap"])
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
