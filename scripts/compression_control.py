"""The compression study's control: CoCoD-SGD whose rounds send int8-encoded raw weights (against
a zero reference) instead of the deltas from the last average. It shows what the delta buys; it is
not a user option, so it lives here and not in the package.

    cocod-train experiment=mnist1d strategy._target_=compression_control.CoCoDStrategy \
        strategy.compression=int8       (with this folder on PYTHONPATH)

The class keeps the name CoCoDStrategy because the app tells a run's method by its strategy's class
name (``methods.method_of_class``) and refuses names it does not know: the records then file it as
CoCoD-SGD at its tau, which it is, and the study tells it apart by its ``_target_``.
"""

from __future__ import annotations

from typing import Any

import lightning_cocod
from lightning_cocod.rounds.cocod import CoCoDRounds


class RawSnapshotRounds(CoCoDRounds):
    """CoCoD's rounds through ``CompressedMean(delta=False)``: every round encodes the raw weights,
    against a zero reference, instead of the deltas from the last average."""

    def build(self) -> None:
        # Here and not after start(): build() hands ``round_comm`` to the round, which keeps it.
        if self.compressed is not None:  # None on one worker or without a codec: nothing to change
            self.compressed.delta = False
        super().build()


class CoCoDStrategy(lightning_cocod.CoCoDStrategy):
    """``lightning_cocod.CoCoDStrategy`` with ``RawSnapshotRounds``; a codec is required, since
    without one there is nothing raw to send."""

    rounds_class = RawSnapshotRounds

    def __init__(self, *args: Any, compression: str | None = None, **kwargs: Any) -> None:
        if compression is None:
            raise ValueError(
                "compression_control.CoCoDStrategy: compression=None is invalid; accepted: 'bf16' or 'int8' "
                "(the control encodes raw weights)"
            )
        super().__init__(*args, compression=compression, **kwargs)
