"""The algorithm core: flat buffers, the communicator and the update rules, with no Lightning.

tests/test_core_is_pure.py enforces that nothing here imports Lightning, so the rules can be
used from any training loop and tested in milliseconds with a fake communicator.
"""

from lightning_cocod.core.averaging import (
    CoCoDRound,
    FiniteCheck,
    GradientPipeline,
    average_blocking,
    has_nonfinite,
)
from lightning_cocod.core.comm import CommunicationError, Communicator, Handle, TorchDistCommunicator
from lightning_cocod.core.flat import FlatBuffer
from lightning_cocod.core.stats import CommStats, RoundRecord

__all__ = [
    "CoCoDRound",
    "CommStats",
    "CommunicationError",
    "Communicator",
    "FiniteCheck",
    "FlatBuffer",
    "GradientPipeline",
    "Handle",
    "RoundRecord",
    "TorchDistCommunicator",
    "average_blocking",
    "has_nonfinite",
]
