"""The one table of methods: every tool (app, benchmark, demo, plan, report) and the strategy
registry read it. Adding a method, or a variant of one, is one entry here plus its class.

Importing this module imports no torch and no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str  # the registry name (``Trainer(strategy=name)``) and the config option (strategy=name)
    label: str  # how tables and plots call it
    periodic: bool  # has a period ``tau``; the others ignore it
    adaptive: bool  # takes tau="auto" (the period re-chosen every round from measured times)
    mixin: str  # "module:Class" of its logic over no Lightning class (_namespaces builds the classes)
    description: str

    @property
    def strategy_class(self) -> str:
        """The class name in ``lightning_cocod`` / ``lightning_cocod.lightning``: CoCoDStrategy."""
        return self.mixin.rpartition(":")[2].removesuffix("Method") + "Strategy"

    def describe(self, tau: int | str | None = None, overlap: int | None = None) -> str:
        """The label, with the period for a method that has one: "CoCoD-SGD tau=4", and an
        overlap given for a method that takes one: "DiLoCo tau=8 overlap 1"."""
        text = f"{self.label} tau={tau}" if self.periodic and tau is not None else self.label
        return text + (f" overlap {overlap}" if overlap is not None and self.name in OVERLAPPED else "")


# In the order tables list them: the baseline first.
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "ssgd",
            "S-SGD",
            False,
            False,
            "lightning_cocod.strategies.ssgd:SSGDMethod",
            "S-SGD: Lightning's DDPStrategy (gradient all-reduce every step)",
        ),
        Method(
            "pipe_sgd",
            "Pipe-SGD",
            False,
            False,
            "lightning_cocod.strategies.pipe_sgd:PipeSGDMethod",
            "Pipe-SGD: gradient all-reduce overlapped with the next step, applied one step stale",
        ),
        Method(
            "local_sgd",
            "Local-SGD",
            True,
            False,
            "lightning_cocod.strategies.local_sgd:LocalSGDMethod",
            "Local-SGD: blocking model average every tau optimizer steps",
        ),
        Method(
            "cocod",
            "CoCoD-SGD",
            True,
            True,
            "lightning_cocod.strategies.cocod:CoCoDMethod",
            "CoCoD-SGD: all-reduce of the round-start model overlapped with tau local steps",
        ),
        Method(
            "diloco",
            "DiLoCo",
            True,
            False,
            "lightning_cocod.strategies.diloco:DiLoCoMethod",
            "DiLoCo: every tau optimizer steps an outer Nesterov step on the mean pseudo-gradient",
        ),
    )
}
PERIODIC = tuple(name for name, m in METHODS.items() if m.periodic)
ADAPTIVE = tuple(name for name, m in METHODS.items() if m.adaptive)
# The methods whose round takes ``overlap`` d (the steps its all-reduce runs alongside, 0 to tau:
# ``core.outer``), with their strategies' defaults; None is the whole period, the paper's round.
OVERLAPPED: dict[str, int | None] = {"cocod": None, "diloco": 0}


def overlap_in_force(name: str, tau: int, overlap: int | None = None) -> int:
    """d of a round of ``name`` with period ``tau``: ``overlap``, else the method's default."""
    d = OVERLAPPED[name] if overlap is None else overlap
    return tau if d is None else d


def method(name: str) -> Method:
    """The entry of ``name``; ValueError naming the accepted ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"method {name!r} is not one of {', '.join(METHODS)}") from None


def method_of_class(class_name: str) -> str | None:
    """The method a strategy class stands for (Lightning's own DDPStrategy is S-SGD), or None;
    ``class_name`` may be a config's dotted ``_target_``."""
    class_name = class_name.rpartition(".")[2]
    if class_name == "DDPStrategy":
        return "ssgd"
    return next((m.name for m in METHODS.values() if m.strategy_class == class_name), None)


def label(name: str, tau: int | str | None = None, overlap: int | None = None) -> str:
    """``describe`` for a name that may not be a method (a tool's own rows): the name itself."""
    return METHODS[name].describe(tau, overlap) if name in METHODS else name
