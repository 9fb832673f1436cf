"""Shared by the demo and the benchmark: run one method's workers with a progress line, and
turn their step times into steady-state figures."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from lightning_cocod.callbacks import steady_step_seconds
from lightning_cocod.launch import launch_workers
from lightning_cocod.tools.plan import markdown_table  # there so that cocod-plan imports no Lightning

__all__ = ["label", "markdown_table", "new_axes", "run_method", "save_plot", "steady_step_seconds"]

METHOD_LABELS = {
    "bound": "compute only (bound)",
    "ssgd": "S-SGD (Lightning DDP)",
    "local_sgd": "Local-SGD",
    "pipe_sgd": "Pipe-SGD",
    "cocod": "CoCoD-SGD",
}


def label(method: str, tau: int | None = None) -> str:
    text = METHOD_LABELS.get(method, method)
    return f"{text} tau={tau}" if method in ("local_sgd", "cocod") and tau else text


class Progress:
    """One status line per method: redrawn in place on a terminal, every few seconds otherwise."""

    def __init__(self, title: str, path: Path, total: str) -> None:
        self.title, self.path, self.total = title, path, total
        self.started = time.monotonic()
        self.last_print = 0.0
        self.tty = sys.stdout.isatty()

    def _line(self) -> str:
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return f"{self.title}: starting workers ({time.monotonic() - self.started:4.0f} s)"
        acc = f"  test acc {state['accuracy']:.3f}" if "accuracy" in state else ""
        return (
            f"{self.title}: step {state['step']}{self.total}  epoch {state['epoch']}{acc}"
            f"  ({time.monotonic() - self.started:4.0f} s)"
        )

    def tick(self) -> None:
        now = time.monotonic()
        if self.tty:
            print("\r" + self._line().ljust(100), end="", flush=True)
        elif now - self.last_print >= 5.0:
            print(self._line(), flush=True)
        else:
            return
        self.last_print = now

    def done(self, text: str) -> None:
        print(("\r" if self.tty else "") + f"{self.title}: {text}".ljust(100), flush=True)


def run_method(
    spec: dict[str, Any],
    workers: int,
    rate: str | None,
    out_dir: Path,
    total: str = "",
    timeout_s: float = 1800,
    suffix: str = "",
    topology: str = "loopback",
    latency: str | None = None,
) -> list[dict[str, Any]]:
    """Run ``spec`` on ``workers`` ranks over links shaped to ``rate`` (one shared loopback, or
    with ``topology="pernode"`` a link per worker); returns each rank's result. ``suffix`` tells
    apart the folders of repeated runs of one method."""
    name = f"{spec['method']}" + (f"-tau{spec['tau']}" if spec["method"] in ("local_sgd", "cocod") else "")
    name += "-ps" if spec.get("proportional") else ""
    run_dir = out_dir / f"{name}-{rate or 'unshaped'}{suffix}"
    run_dir.mkdir(parents=True, exist_ok=True)
    progress_path = run_dir / "progress.json"
    progress_path.unlink(missing_ok=True)
    spec = {**spec, "progress_path": str(progress_path)}
    title = label(spec["method"], spec.get("tau")) + (" +PS" if spec.get("proportional") else "")
    progress = Progress(f"{title:<30} @ {rate or 'unshaped'}", progress_path, total)
    results = launch_workers(
        "lightning_cocod.tools.worker",
        workers,
        rate,
        [json.dumps(spec)],
        timeout_s=timeout_s,
        output_dir=run_dir,
        name_prefix="cocod-cmp",
        on_tick=progress.tick,
        topology=topology,
        latency=latency,
    )
    (run_dir / "results.json").write_text(json.dumps(results))
    progress.done(f"done in {time.monotonic() - progress.started:.0f} s")
    return results


def new_axes() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def save_plot(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
