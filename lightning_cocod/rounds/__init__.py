"""What a round does, with no Lightning: the layer between ``core`` (the averaging rules, the
communicator) and the front-ends (the Trainer strategies, the loop API, the Fabric strategies).

``Rounds`` (``base``) is the step template, the consistency points, the per-rank state and the
figures; ``CoCoDRounds`` (with ``DiLoCoRounds``, its generalized round's DiLoCo defaults), ``LocalSGDRounds`` and ``PipeSGDRounds`` are the algorithms;
``AutoPeriod`` (``auto``) is ``tau="auto"``; ``health``, ``period``, ``options`` and ``checkpoint``
are what they share.
"""

from lightning_cocod.rounds.auto import AutoPeriod
from lightning_cocod.rounds.base import Rounds
from lightning_cocod.rounds.cocod import CoCoDRounds, DiLoCoRounds
from lightning_cocod.rounds.health import NonFiniteError
from lightning_cocod.rounds.local_sgd import LocalSGDRounds
from lightning_cocod.rounds.pipe_sgd import PipeSGDRounds

__all__ = [
    "AutoPeriod",
    "CoCoDRounds",
    "DiLoCoRounds",
    "LocalSGDRounds",
    "NonFiniteError",
    "PipeSGDRounds",
    "Rounds",
]
