"""The algorithm core: flat buffers, the communicator and the update rules, with no Lightning.

tests/core/test_is_pure.py enforces that nothing here imports Lightning, so the rules can be
used from any training loop and tested in milliseconds with a fake communicator. The names
below load on first use, so that a torch-free module of the core (``adapt``, used by
``cocod-plan``) can be imported without torch.
"""

from __future__ import annotations

from lightning_cocod._lazy import lazy_attributes

_LAZY = {
    "CoCoDRound": "lightning_cocod.core.averaging",
    "FiniteCheck": "lightning_cocod.core.averaging",
    "GradientPipeline": "lightning_cocod.core.averaging",
    "average_blocking": "lightning_cocod.core.averaging",
    "has_nonfinite": "lightning_cocod.core.averaging",
    "CompressedMean": "lightning_cocod.core.compress",
    "CommunicationError": "lightning_cocod.core.comm",
    "Communicator": "lightning_cocod.core.comm",
    "Handle": "lightning_cocod.core.comm",
    "TorchDistCommunicator": "lightning_cocod.core.comm",
    "FlatBuffer": "lightning_cocod.core.flat",
    "OuterRound": "lightning_cocod.core.outer",
    "CommStats": "lightning_cocod.core.stats",
    "RoundRecord": "lightning_cocod.core.stats",
}
__all__ = [
    "CoCoDRound",
    "CommStats",
    "CommunicationError",
    "Communicator",
    "CompressedMean",
    "FiniteCheck",
    "FlatBuffer",
    "GradientPipeline",
    "Handle",
    "OuterRound",
    "RoundRecord",
    "TorchDistCommunicator",
    "average_blocking",
    "has_nonfinite",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
