"""Code of the user's own that the app runs: a LightningModule of either Lightning namespace.

``pytorch_lightning`` and ``lightning.pytorch`` (the unified ``lightning`` package) are two class
hierarchies: a Trainer of one refuses a module, a strategy or a logger of the other. The run takes
the namespace of the module it trains (``namespace_of``) and builds everything around it in that
namespace: the Trainer, the strategy (``lightning_cocod.lightning`` holds the ``lightning.pytorch``
classes), the logger, and the package's callbacks and data modules, which are written once, for
``pytorch_lightning`` (``in_namespace``).
"""

from __future__ import annotations

import importlib
import inspect
import shlex
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_cocod._errors import ConfigError, bad
from lightning_cocod.methods import METHODS, method_of_class

NAMESPACES = ("pytorch_lightning", "lightning.pytorch")
# The hooks the app calls on a module (fit.fit_run: fit with validation, then test), and what for.
APP_HOOKS = {
    "training_step": "fit trains with it",
    "configure_optimizers": "fit builds the optimizer with it",
    "validation_step": "it logs val/acc after every epoch, read by the progress line, the accuracy timeline "
    "and target_accuracy",
    "test_step": "after fit the app tests the model with it and records the test/acc it logs as the run's "
    "test accuracy",
}
# Where a Lightning class path of each namespace starts (CSVLogger, DDPStrategy, ...).
_PREFIXES = {"pytorch_lightning": "pytorch_lightning.", "lightning.pytorch": "lightning.pytorch."}
# The base classes a Trainer tells apart by isinstance (checkpoints) or by its is_overridden
# (data modules), most specific first.
_BASES = ("callbacks.Checkpoint", "callbacks.Callback", "LightningDataModule")
_twins: dict[tuple[type, str], type] = {}


def namespace_of(model: Any) -> str | None:
    """The namespace whose LightningModule ``model`` is, or None. Only a namespace already imported
    can be the module's (importing ``lightning`` to find out would cost seconds for nothing)."""
    for namespace in NAMESPACES:
        package = sys.modules.get(namespace)
        if package is not None and isinstance(model, package.LightningModule):
            return namespace
    return None


def check_module(target: str, model: Any) -> None:
    """A module the app cannot run to the end (fit with validation, then test) is refused before
    any worker trains it: one of neither namespace, or one missing a hook the app calls."""
    namespace = namespace_of(model)
    if namespace is None:
        kind = f"{type(model).__module__}.{type(model).__qualname__}"
        accepted = (
            "a LightningModule of pytorch_lightning or of lightning.pytorch (the lightning package); "
            f"it built a {kind}, which neither Trainer can fit: subclass pytorch_lightning.LightningModule "
            "or lightning.LightningModule"
        )
        raise bad("model._target_", target, accepted)
    helpers = importlib.import_module(f"{namespace}.utilities.model_helpers")
    for hook, use in APP_HOOKS.items():
        if not helpers.is_overridden(hook, model):
            accepted = f"a LightningModule with {', '.join(APP_HOOKS)}; {type(model).__name__} has no {hook}"
            raise bad("model._target_", target, f"{accepted}, which the app needs: {use}")


def node_in(node: Any, namespace: str) -> Any:
    """A strategy's or logger's config with its class taken from ``namespace`` (same options): the
    package's strategies from ``lightning_cocod.lightning`` or the top level, Lightning's own
    classes (DDPStrategy, CSVLogger, ...) from the other package. Other nodes as they are."""
    from lightning_cocod._namespaces import HOMES

    if not isinstance(node, DictConfig) or "_target_" not in node:
        return node
    target = str(node._target_)
    method = method_of_class(target)
    if target.startswith("lightning_cocod.") and method is not None:
        home = HOMES[namespace]
        importlib.import_module(home)  # defines the namespace's classes
        return _retarget(node, f"{home}.{METHODS[method].strategy_class}")
    for other, prefix in _PREFIXES.items():
        if other != namespace and target.startswith(prefix):
            return _retarget(node, _PREFIXES[namespace] + target.removeprefix(prefix))
    return node


def _retarget(node: DictConfig, target: str) -> DictConfig:
    copy = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    with open_dict(copy):
        copy._target_ = target
    return copy


def in_namespace(obj: Any, namespace: str) -> Any:
    """``obj`` (a callback or data module of the other namespace) made an instance of ``namespace``'s
    base class too, so that its Trainer recognises it: a class deriving from both, same behaviour
    (the hooks are called by name, and the two namespaces' hooks have the same signatures)."""
    for other in NAMESPACES:
        package = sys.modules.get(other)
        if other == namespace or package is None:
            continue
        for base in _BASES:
            theirs, ours = _base(other, base), _base(namespace, base)
            if isinstance(obj, theirs) and not isinstance(obj, ours):
                cls = type(obj)
                if (cls, namespace) not in _twins:
                    attributes = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
                    _twins[cls, namespace] = type(cls.__name__, (cls, ours), attributes)
                obj.__class__ = _twins[cls, namespace]  # the checkpoint's state_key (qualname) is kept
                return obj
    return obj


def _base(namespace: str, path: str) -> type:
    module, _, name = f"{namespace}.{path}".rpartition(".")
    return getattr(importlib.import_module(module), name)


# A data module of the user's own.
#
# The data group (data=digits, ...) describes the data (``dataset``: the classes and channels the
# package's models are built for) and holds the app's own figures (data.batch_size: the global batch
# of the run's name and record, data.seed), next to the keys of the group's module. A module of the
# user's own, in place of the group's (``data._target_=mymod.MyData``), is built from those keys
# its ``__init__`` names, any subset or none: what it does not name is the group's, not the user's.
# A key the user sets on the command line is the user's, and must be one the module names.

PACKAGE = "lightning_cocod."
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}  # not arguments


def own_data(node: Any) -> bool:
    """Whether ``node`` builds a data module of the user's own (not one of the package's)."""
    return isinstance(node, DictConfig) and not str(node.get("_target_", PACKAGE)).startswith(PACKAGE)


def arguments_of(build: Any) -> set[str] | None:
    """The arguments ``build`` (a class or function) names; None when it takes ``**kwargs`` (anything)."""
    params = inspect.signature(build).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return set(params) - {"self"}


def named_keys(target: str) -> set[str] | None:
    """``arguments_of`` the class or function a ``_target_`` names."""
    from hydra.utils import get_object

    return arguments_of(get_object(target))


def data_node(node: Any) -> Any:
    """The config a data module is built from: for one of the user's own, the keys it names."""
    if not own_data(node):
        return node
    named = named_keys(str(node._target_))
    if named is None:
        return node
    plain = OmegaConf.to_container(node, resolve=True)
    assert isinstance(plain, dict)
    return OmegaConf.create({k: v for k, v in plain.items() if k in named | HYDRA_KEYS})


def _given(overrides: list[str]) -> list[tuple[str, str]]:
    """(override, key) of the command line's overrides that set a key, ``+``/``++`` ones included."""
    found = []
    for override in overrides:
        key, eq, _ = override.lstrip("+").partition("=")
        if eq and not override.startswith("~"):
            found.append((override, key))
    return found


def check_own_data(cfg: DictConfig) -> None:
    """Before the job's checks (which read the data group's keys): the data group is there, and
    what the command line sets of a module of the user's own is what it takes."""
    overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
    if OmegaConf.is_missing(cfg, "dataset") and "~data" in overrides:
        own = [o for o in overrides if o.startswith("+data._target_=")]
        keep = [o.removeprefix("+") if o in own else o for o in overrides if o != "~data"]
        raise ConfigError(
            "~data drops the data group, which describes the data (dataset) and gives the run its "
            "data.batch_size; a module of your own goes in its place without it: "
            + shlex.join(["cocod-train", *keep, *([] if own else ["data._target_=mymod.MyData"])])
        )
    if not own_data(cfg.get("data")):
        return
    try:
        named = named_keys(str(cfg.data._target_))
    except Exception:  # noqa: BLE001 - an import failure is the job's checks' to say
        return
    if named is None:
        return
    for override, key in _given(overrides):
        section, _, name = key.partition(".")
        # batch_size is the run's too (its record's global batch): set for a module that has its own.
        taken = named | HYDRA_KEYS | {"batch_size"}
        if section == "data" and name and "." not in name and name not in taken:
            module = str(cfg.data._target_).rpartition(".")[2]
            takes = ", ".join(sorted(named)) or "no arguments"
            raise ConfigError(
                f"unknown key 'data.{name}' ({override}); {module} takes: {takes}, and a module of your own "
                "gets only the data keys it names"
            )


def check_own_batch(cfg: DictConfig, data: Any) -> None:
    """A module of the user's own that takes no batch_size has its own: the run's record (the
    global batch, samples per second) reads data.batch_size, which must then be the module's."""
    if not own_data(cfg.data):
        return
    named = named_keys(str(cfg.data._target_))
    if named is None or "batch_size" in named:
        return
    own = getattr(data, "batch_size", None)
    if isinstance(own, int) and not isinstance(own, bool) and own != cfg.data.batch_size:
        module = type(data).__name__
        accepted = (
            f"{own}, the batch_size of {module}, which takes none from the app (the run's record reads its "
            f"global batch from data.batch_size): data.batch_size={own}"
        )
        raise bad("data.batch_size", cfg.data.batch_size, accepted)


def adding_hint(key: str, parent: Any) -> str:
    """What to say of ``+KEY=...`` for a key that struct mode refused: the command, when the class
    that node builds takes that argument (the Trainer for trainer.*); that it takes no such argument
    otherwise. The schema's own sections (hetero, checkpoint, launcher, the top level) take no key
    of one's own: nothing is said."""
    section, _, name = key.rpartition(".")
    if section == "trainer":
        target, named = "pytorch_lightning.Trainer", _trainer_arguments()
    elif isinstance(parent, DictConfig) and "_target_" in parent:
        from hydra.utils import get_object

        target = str(parent._target_)
        try:
            named = _passed_on(get_object(target))
        except Exception:  # noqa: BLE001 - an import failure is the job's checks' to say
            return ""
    else:
        return ""
    if named is None:
        return ""  # takes anything: whether it takes this is its own to say, once built
    if name in named:
        return f" (+{key}=... adds it: {target.rpartition('.')[2]} takes {name})"
    return f"; {target.rpartition('.')[2]} takes no {name} either"


def _trainer_arguments() -> set[str] | None:
    import pytorch_lightning as pl

    return arguments_of(pl.Trainer.__init__)


def _passed_on(cls: Any) -> set[str] | None:
    """The arguments a class takes, following ``**kwargs`` up its bases' ``__init__`` (the
    strategies pass theirs on to Lightning's DDPStrategy); None when they stay open to the end."""
    if not isinstance(cls, type):
        return arguments_of(cls)
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None
