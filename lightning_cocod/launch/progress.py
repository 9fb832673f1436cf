"""The launching process's side of the progress line: the cpu/gpu launchers send the ranks'
output to files, so rank 0 writes its line (``callbacks.ProgressLine``) to a file that this
relays to the console every few seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


class ProgressRelay:
    """Called about twice a second (``launch_workers``'s ``on_tick``); shows the line rank 0 last
    wrote when it is new and ``every_s`` has passed, and says the workers are starting until then."""

    def __init__(self, path: Path, title: str, every_s: float, show: Callable[[str], None]) -> None:
        self.path, self.title, self.every_s, self.show = path, title, every_s, show
        self.started = self.shown = time.monotonic()
        self.last: str | None = None
        path.unlink(missing_ok=True)  # a resumed run's folder holds the previous run's last line

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.shown < self.every_s:
            return
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = f"{self.title}: starting the workers ({now - self.started:.0f} s)"
        if text and text != self.last:
            self.show(text)
            self.last, self.shown = text, now
