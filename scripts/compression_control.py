"""The compression study's control: CoCoD-SGD whose rounds send int8-encoded raw weights (against
a zero reference) instead of the deltas from the last average. It shows what the delta buys; it is
not a user option, so it lives here and not in the package.

    cocod-train experiment=mnist1d strategy._target_=compression_control.CoCoDStrategy \
        +strategy.compression=int8       (with this folder on PYTHONPATH)

The class keeps the name CoCoDStrategy because the app tells a run's method by its strategy's class
name (``methods.method_of_class``) and refuses names it does not know: the records then file it as
CoCoD-SGD at its tau, which it is, and the study tells it apart by its ``_target_``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor

import lightning_cocod
from lightning_cocod.core.averaging import DEFAULT_PROGRESS
from lightning_cocod.core.compress import CompressedMean
from lightning_cocod.strategies.cocod import CoCoDMethod, CoCoDRounds


class RawSnapshotMean(CompressedMean):
    """``CompressedMean(delta=False)`` whose reference stays zero, so that every round encodes the
    raw weights. The package's ``delta=False`` starts from a zero reference but, as the delta mode
    does, adds each round's mean into it: from the second round on it sends deltas again, and a
    study with it matched int8 with deltas to the last digit on all three seeds. This zeroes the
    reference where the exchange thread is about to read it, so rounds never see a stale one."""

    def __init__(self, comm: Any, codec: Any, error_feedback: bool = True) -> None:
        super().__init__(comm, codec, error_feedback, delta=False)

    def _exchange(self, buckets: list[Tensor], share: float) -> dict[str, float]:
        for reference in self.reference or ():
            reference.zero_()
        return super()._exchange(buckets, share)


class RawSnapshotRounds(CoCoDRounds):
    """CoCoD's rounds through ``RawSnapshotMean``."""

    def build(self) -> None:
        # Here and not after start(): build() hands ``round_comm`` to the round, which keeps it.
        if self.compressed is not None:  # None on one worker or without a codec: nothing to swap
            self.compressed = RawSnapshotMean(self.comm, self.codec, self.error_feedback)
        super().build()


class CoCoDStrategy(lightning_cocod.CoCoDStrategy):
    """``lightning_cocod.CoCoDStrategy`` with ``RawSnapshotRounds``; a codec is required, since
    without one there is nothing raw to send."""

    def __init__(
        self,
        tau: int | str = 4,
        tau_min: int | None = None,
        tau_max: int | None = None,
        progress: float = DEFAULT_PROGRESS,
        compression: str | None = None,
        error_feedback: bool = True,
        **kwargs: Any,
    ) -> None:
        if compression is None:
            raise ValueError(
                "compression_control.CoCoDStrategy: compression=None is invalid; accepted: 'bf16' or 'int8' "
                "(the control encodes raw weights)"
            )
        rounds = partial(
            RawSnapshotRounds, tau=tau, tau_min=tau_min, tau_max=tau_max, progress=progress,
            compression=compression, error_feedback=error_feedback,
        )
        # CoCoDMethod.__init__ only builds its rounds' factory: this one replaces it.
        super(CoCoDMethod, self).__init__(rounds, **kwargs)
