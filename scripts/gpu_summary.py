"""Summary of one ``scripts/gpu_check.sh`` run, against the targets of issue 14.

    python scripts/gpu_summary.py WORK_DIR > summary.md

Reads what the check left in WORK_DIR (tests.xml, steptime.json, bench/); a stage that did not
run or failed is reported as such, never guessed. The per-step analysis splits every rank's step
times after the warm-up into steps that ended a round (they hold the merge) and the others, so
a gap to the bound shows whether it sits at round boundaries.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

WARMUP = 30  # the check's --warmup
OUTER_TESTS = "test_cuda_outer"  # the module whose tests the summary counts apart


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tests_line(work: Path) -> str:
    try:
        suite = ET.parse(work / "tests.xml").getroot()
    except (OSError, ET.ParseError):
        return "- GPU tests: **did not finish** (see tests.log)"
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    # A skip is not a failure (the NCCL test needs two GPUs): it is listed with its reason.
    verdict = "pass" if counts["failures"] + counts["errors"] == 0 else "**FAIL**"
    verdict = verdict if passed or verdict != "pass" else "**nothing ran**"
    lines = [
        f"- GPU tests: {passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
        f"{counts['skipped']} skipped: {verdict}"
    ]
    outer = [case for case in suite.iter("testcase") if OUTER_TESTS in (case.get("classname") or "")]
    outer_passed = sum(all(case.find(k) is None for k in ("failure", "error", "skipped")) for case in outer)
    # The outer round's CUDA tests, apart: its GPU path had no other check before them.
    lines.append(
        f"  - outer round on CUDA ({OUTER_TESTS}.py): {outer_passed} of {len(outer)} passed"
        if outer
        else f"  - outer round on CUDA ({OUTER_TESTS}.py): **not collected**"
    )
    for case in suite.iter("testcase"):
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                why = (
                    (found.get("message") or "").strip().splitlines()[0][:160] if found.get("message") else ""
                )
                lines.append(f"  - {kind}: {case.get('name')}: {why}")
    return "\n".join(lines)


def steptime_lines(figures: dict | None) -> list[str]:
    if figures is None:
        return ["- Product vs bare loop: **did not finish** (see steptime.log)"]
    ratio = figures["ratio"]
    lines = [
        f"- Product vs bare loop ({figures['args']['model']}, batch {figures['args']['batch_size']}, "
        f"{figures['args']['precision']}): {1000 * figures['bare_seconds']:.2f} ms vs "
        f"{1000 * figures['product_seconds']:.2f} ms = **{ratio:.2f}x** (target <= 1.25x: "
        f"{'met' if ratio <= 1.25 else 'missed'})"
    ]
    report = figures.get("sync_report") or {}
    if report:
        lines.append(f"  - host syncs per product step: {report['syncs_per_step']:.1f}")
        lines += [f"    - {count} x {line}" for line, count in report["by_line"].items()]
    alone = figures.get("allreduce")
    if alone:
        lines.append(
            f"- All-reduce alone ({alone['bytes'] / 1e6:.1f} MB, {alone['placement']['backend']}): "
            f"{1000 * alone['median_seconds']:.1f} ms (median)"
        )
    return lines


def round_split(results: list[dict]) -> str:
    """Mean step time after the warm-up, at steps that ended a round and at the others, per rank."""
    parts = []
    for result in results:
        ends, finishes = result["step_ends"], {finish for _, finish, *_ in result.get("rounds", [])}
        durations = [(k + 1, ends[k] - ends[k - 1]) for k in range(max(1, WARMUP), len(ends))]
        boundary = [d for step, d in durations if step in finishes]
        other = [d for step, d in durations if step not in finishes]
        mean = lambda xs: f"{1000 * statistics.mean(xs):.1f}" if xs else "n/a"
        parts.append(f"rank {result['rank']}: {mean(boundary)} ms at round ends, {mean(other)} ms otherwise")
    return "; ".join(parts)


def bench_lines(work: Path, alone: dict | None) -> list[str]:
    figures = load(work / "bench" / "bench.json")
    if figures is None:
        return ["- Benchmark: **did not finish** (see bench.log)"]
    if "workers" in figures:  # one entry per worker count; the check runs one
        figures = next(iter(figures["workers"].values()))
    bound = figures["bound"]["step_seconds"]
    lines = [f"- Benchmark, 2 ranks: bound {1000 * bound:.1f} ms/step"]
    for name, by_rate in figures["methods"].items():
        for f in by_rate.values():
            hidden = (
                f"{100 * f['hidden_fraction']:.0f}% hidden" if f.get("hidden_fraction") is not None else ""
            )
            lines.append(
                f"  - {name}: {1000 * f['step_seconds']:.1f} ms = **{f['vs_bound']:.2f}x** the bound {hidden}"
            )
            if "auto" in name:
                met = "met" if f["vs_bound"] <= 1.10 else "missed"
                lines.append(f"    - target <= 1.10x: {met}; periods: {f.get('tau_history')}")
                if f.get("hidden_fraction") is not None:
                    lines.append(
                        f"    - comm hidden >= 95%: {'met' if f['hidden_fraction'] >= 0.95 else 'missed'}"
                    )
            if name.startswith("S-SGD"):
                lines.append(f"    - S-SGD over 2x: {'yes' if f['vs_bound'] > 2 else 'no'}")
    for run in sorted((work / "bench").rglob("results.json")):
        results = load(run)
        if not results or not results[0].get("rounds"):
            continue
        lines.append(f"  - {run.parent.name}: {round_split(results)}")
        comm = [c for r in results for _, _, c, _ in r["rounds"][1:]]  # the first round pays set-up
        if comm and alone and "auto" in run.parent.name:
            median, ref = statistics.median(comm), alone["median_seconds"]
            met = "met" if abs(median / ref - 1) <= 0.25 else "missed"
            lines.append(
                f"    - comm_seconds per round {1000 * median:.1f} ms (median) vs the all-reduce alone "
                f"{1000 * ref:.1f} ms: {median / ref:.2f}x (target within 25%: {met})"
            )
    runs = [
        r for r in map(load, (work / "bench").rglob("results.json")) if r and r[0].get("method") != "bound"
    ]
    placement = runs[0][0].get("placement") if runs else None
    if placement:
        lines.insert(1, f"  - placement: {placement}")
    return lines


def main(work_dir: str) -> None:
    work = Path(work_dir)
    steptime = load(work / "steptime.json")
    environment = (
        (work / "environment.txt").read_text().strip() if (work / "environment.txt").is_file() else "?"
    )
    print("# GPU check\n")
    print("```\n" + environment + "\n```\n")
    lines = [
        tests_line(work),
        *steptime_lines(steptime),
        *bench_lines(work, (steptime or {}).get("allreduce")),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
