"""Lightning callbacks of the package: step timing, accuracy against time, checkpoints, the
progress line, and heterogeneous workers (proportional batches, simulated slowdowns)."""

from lightning_cocod.callbacks.hetero import ProportionalSampling, SimulatedSlowdown, check_slowdowns
from lightning_cocod.callbacks.metrics import (
    AccuracyTimeline,
    PeriodicCheckpoint,
    ProgressLine,
    StepTimer,
)
from lightning_cocod.figures import steady_step_seconds  # where app/fit.py still looks for it

__all__ = [
    "AccuracyTimeline",
    "PeriodicCheckpoint",
    "ProgressLine",
    "ProportionalSampling",
    "SimulatedSlowdown",
    "StepTimer",
    "check_slowdowns",
    "steady_step_seconds",
]
