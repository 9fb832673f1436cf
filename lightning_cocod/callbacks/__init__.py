"""Lightning callbacks of the package: step timing, accuracy against time, checkpoints, the
progress line, and heterogeneous workers (proportional batches, simulated slowdowns)."""

from lightning_cocod.callbacks.hetero import ProportionalSampling, SimulatedSlowdown, check_slowdowns
from lightning_cocod.callbacks.metrics import AccuracyTimeline, PeriodicCheckpoint, ProgressLine, StepTimer

__all__ = [
    "AccuracyTimeline",
    "PeriodicCheckpoint",
    "ProgressLine",
    "ProportionalSampling",
    "SimulatedSlowdown",
    "StepTimer",
    "check_slowdowns",
]
