"""NaN/Inf on any worker is caught before it reaches another worker's average.

Every rank learns which ranks went bad at the same point (a flag per rank, summed by an
all-reduce), then all raise ``NonFiniteError``, or with ``on_nonfinite="skip"`` the pending update
is dropped and the bad workers restart from a healthy worker's model. ``on_nonfinite="allow"``
does what DDPStrategy does: the values are averaged and saved as they are. The checks are methods
of ``Rounds`` (``base``).
"""

# What a round does with NaN/Inf on a worker: stop every rank, drop the update and restart the bad
# workers from a healthy one, or average and save them as DDPStrategy does.
ON_NONFINITE = ("raise", "skip", "allow")


class NonFiniteError(FloatingPointError):
    """A worker's model or gradients hold NaN or Inf; raised on every rank alike."""
