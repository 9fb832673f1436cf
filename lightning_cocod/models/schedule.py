"""Learning-rate factors per optimizer step: linear warm-up, then cosine or step decay.

Pure functions of the step index so that ``LambdaLR`` can use them and tests can check them by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SCHEDULES = ("cosine", "step", "none")


def lr_factor(
    step: int,
    *,
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    milestone_steps: Sequence[int] = (),
    gamma: float = 0.1,
) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (0-based).

    Warm-up ramps as (step + 1) / warmup_steps so that the first step already moves the weights
    (a factor of 0 would waste it). Cosine decays from 1 at the end of warm-up to 0 at
    ``total_steps``; step decay multiplies by ``gamma`` at each milestone reached, counted from step 0
    so milestones keep their meaning as absolute epochs.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "step":
        return gamma ** sum(1 for m in milestone_steps if step >= m)
    if schedule == "none":
        return 1.0
    raise ValueError(f"schedule={schedule!r} is not supported; accepted: {', '.join(SCHEDULES)}")
