"""The loop API (``lightning_cocod.loop``) as a mixin over a Fabric namespace's DDPStrategy, with no
Lightning imported here: ``lightning_cocod.fabric`` (``lightning_fabric``) and
``lightning_cocod.lightning`` (``lightning.fabric``) build their classes with ``_namespaces.install``.
It sits beside ``loop`` (whose classes it runs) and below nothing of ``strategies``.
Each is Fabric's DDPStrategy without the DDP wrapper: the process set-up and launchers are
Fabric's, every step is the loop object's.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.optim import Optimizer
from typing_extensions import override

from lightning_cocod._options import invalid
from lightning_cocod.loop import LOOPS
from lightning_cocod.methods import METHODS
from lightning_cocod.rounds.base import broadcast_from_rank_zero
from lightning_cocod.rounds.checkpoint import STATE_KEY, atomic_save, gather_to_rank_zero, read_checkpoint
from lightning_cocod.rounds.options import PASSED_ON, check_weight, parse_timeout
from lightning_cocod.rounds.options import start_method as check_start_method

log = logging.getLogger(__name__)

# Fabric's DDPStrategy options we pass on; the others are the algorithm's (the loop class's).
_PASSED_ON = (*PASSED_ON, "precision")


class _NothingToSkip:
    """Nothing is synchronised in backward (rounds average models, after optimizer steps), so
    ``fabric.no_backward_sync`` during gradient accumulation has nothing to skip."""

    def no_backward_sync(self, module: Any, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class _Read:
    """Hands Fabric's loading a checkpoint that ``read_checkpoint`` has read and checked."""

    def __init__(self, checkpoint: dict[str, Any]) -> None:
        self.checkpoint = checkpoint

    def load_checkpoint(self, path: Any, weights_only: Any = None) -> dict[str, Any]:
        return self.checkpoint


class FabricRounds:
    """Mixed in before a Fabric DDPStrategy class (see ``install``); ``loop_class`` is the algorithm."""

    loop_class: ClassVar[type]

    def __init__(self, *, timeout: Any = None, start_method: str = "popen", **options: Any) -> None:
        name = type(self).__name__
        passed = {k: options.pop(k) for k in _PASSED_ON if k in options}
        weight = options.pop("weight", None)
        # The options are checked now, as the Trainer strategies check theirs, not when the
        # processes have started (a bogus start method, backend or weight failed only there).
        check_start_method(name, start_method)
        backend = passed.get("process_group_backend")
        backends = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
        if backend is not None and backend not in backends:
            accepted = f"None (gloo on CPU, nccl on GPU) or one of {', '.join(backends)}"
            raise invalid(name, "process_group_backend", backend, accepted)
        check_weight(name, weight)
        # The rounds are built now, as the loop object will build them, so that a bad option is
        # refused here; they are the loop's once fabric.setup has the model.
        self._rounds = self.loop_class.rounds_class(name, **options)
        self._weight = weight
        super().__init__(timeout=parse_timeout(name, timeout), start_method=start_method, **passed)
        self._backward_sync_control = _NothingToSkip()
        self._module: torch.nn.Module | None = None
        self.loop: Any = None  # the loop object, once fabric.setup has the model and its optimizer
        self._loaded: dict[str, Any] | None = None  # this rank's loop state, from a fabric.load before set-up

    @override
    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        broadcast_from_rank_zero(module)  # no DistributedDataParallel wrapper
        self._module = module
        return module

    @override
    def setup_optimizer(self, optimizer: Any) -> Any:
        # fabric.setup(model, optimizer) comes here after setup_module, as fabric.setup_optimizers does.
        name = type(self).__name__
        if self.loop is not None:
            raise ValueError(
                f"{name} supports exactly one optimizer: a round counts the steps of one optimizer"
            )
        if self._module is None:
            raise ValueError(
                f"{name}: set up the model before its optimizer, e.g. fabric.setup(model, optimizer)"
            )
        loop = self.loop_class.around(
            self._rounds, self._module, optimizer, timeout=self._timeout, weight=self._weight
        )
        if self._loaded is not None:
            loop.load_state_dict(self._loaded)
        self.loop = loop.__enter__()
        return optimizer

    @override
    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: Any = None
    ) -> None:
        """As Fabric saves, through ``atomic_save``: whole or absent, with its integrity record."""
        if self.loop is not None:
            # A synchronisation point, as the loop's state_dict() is: the weights saved are the
            # run's, but each rank's optimizer state (momentum stays local) and its part of the
            # rounds are its own, gathered into rank 0's file.
            optimizers = {
                k: self.get_optimizer_state(o) for k, o in state.items() if isinstance(o, Optimizer)
            }
            for key, keep in (filter or {}).items():  # fabric.save's filter applies to each rank's copy too
                if key in optimizers:
                    optimizers[key] = {n: v for n, v in optimizers[key].items() if keep(n, v)}
            mine = {"loop": self.loop.state_dict(), "optimizers": optimizers}
            ranks = gather_to_rank_zero(mine, self.world_size)
            if ranks:  # rank 0's own, not its copy: the file holds rank 0's optimizer tensors once
                ranks[0] = mine
            state = {**state, STATE_KEY: {"world_size": self.world_size, "ranks": ranks}}
        state = self._convert_stateful_objects_in_state(state, filter=filter or {})  # Fabric's own conversion
        if self.is_global_zero:
            atomic_save(self.checkpoint_io, state, path, storage_options)

    @override
    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: Any = None
    ) -> Any:
        """As Fabric loads, from the file read as data and checked whole (``read_checkpoint``, on
        every rank), and nothing loaded when the file is refused (another world size included)."""
        checkpoint = read_checkpoint(
            path,
            lambda as_data: self.checkpoint_io.load_checkpoint(path, weights_only=as_data),
            trust=weights_only is False,
            warn_unverified=self.global_rank == 0,
        )
        if not isinstance(state, dict) or not state:  # the whole file, or a raw state dict: nothing of ours
            return self._load_read(path, checkpoint, state, strict)
        saved = checkpoint.pop(STATE_KEY, None)
        count = saved.get("world_size") if isinstance(saved, dict) else None
        if saved is not None and count != self.world_size:  # refused before anything is loaded
            raise ValueError(
                f"{type(self).__name__}: {path} was saved by {count} ranks, this run has {self.world_size}: each "
                "rank's optimizer and round state is its own; resume on as many ranks"
            )
        # The round in flight started from the weights being replaced: the loop is left (a
        # synchronisation point, before they are) and entered again from the loaded ones.
        entered = self.loop is not None and self.loop.entered
        if entered:
            # Taken while entered (a synchronisation point): closing lets go of the compressed
            # rounds' per-rank state, which a file of no loop state, or a refused one, leaves as it was.
            kept = self.loop.state_dict()
            self.loop.close()
            self.loop.load_state_dict(kept)
        try:
            remainder = self._load_read(path, checkpoint, state, strict)
            self._restore_own(path, state, saved)
        finally:  # loaded or refused (alike on every rank), the loop runs on from the weights the model holds
            if entered:
                self.loop.__enter__()
        return remainder

    def _restore_own(self, path: Any, state: dict[str, Any], saved: dict[str, Any] | None) -> None:
        """This rank's optimizer states and loop state, from what ``save_checkpoint`` gathered."""
        if saved is None:
            if self.global_rank == 0:
                log.warning(
                    f"{path} holds no rank's own state (a plain Fabric file): every rank takes rank 0's optimizer "
                    "state, and the rounds start afresh from the loaded weights"
                )
            return
        mine = saved["ranks"][self.global_rank]
        for key, obj in state.items():
            if isinstance(obj, Optimizer) and key in mine["optimizers"]:
                obj.load_state_dict(mine["optimizers"][key])
        if self.loop is None:
            self._loaded = mine["loop"]
        else:
            self.loop.load_state_dict(mine["loop"])

    def _load_read(self, path: Any, checkpoint: dict[str, Any], state: Any, strict: bool) -> Any:
        """Fabric's own restoring of ``state``, from ``checkpoint`` already read and checked."""
        io = self.checkpoint_io
        self.checkpoint_io = _Read(checkpoint)
        try:
            return super().load_checkpoint(path, state, strict=strict)
        finally:
            self.checkpoint_io = io

    @override
    def teardown(self) -> None:
        if self.loop is not None:
            self.loop.close()
        super().teardown()


FABRIC_REGISTRY = "STRATEGY_REGISTRY"  # Fabric's registry, in its ``strategies`` package
IN_A_LOOP = ", in a Fabric loop"  # what the registry's descriptions add to the method's


def fabric_mixins() -> dict[str, tuple[str, type, dict[str, Any]]]:
    """For ``_namespaces.install``: one class per loop class, named after the method's strategy."""
    return {
        name: (
            METHODS[name].strategy_class.replace("Strategy", "FabricStrategy"),
            FabricRounds,
            {"__doc__": loop.__doc__, "loop_class": loop},
        )
        for name, loop in LOOPS.items()
    }
