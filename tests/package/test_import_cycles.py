"""The package's modules import one another without a cycle, at module level or inside functions.

A cycle through an import inside a function still runs at import time somewhere, and two modules
that need each other are one idea split in two: either order of loading can break. The graph is
read from the source (no module is imported): every ``import`` and ``from ... import`` statement,
wherever it stands, resolved to the package module that defines the name. A package's ``__init__``
counts as a module of its own: importing ``a.b.c`` is an edge to ``a.b.c``, not to ``a.b``'s
``__init__`` (which imports its modules to re-export them), and a name that a package loads on
first use (its ``_LAZY`` table, PEP 562) is an edge to the module that table names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_cocod

ROOT = Path(lightning_cocod.__file__).resolve().parent
PACKAGE = ROOT.name


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lazy_table(tree: ast.Module) -> dict[str, str]:
    """A package's ``_LAZY = {"Name": "module", ...}``: the names it loads on first use."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and isinstance(
            node.value, ast.Dict
        ):
            return {
                ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(node.value.keys, node.value.values)
            }
    return {}


def import_graph() -> dict[str, set[str]]:
    trees = {module_name(p): ast.parse(p.read_text(), str(p)) for p in ROOT.rglob("*.py")}
    lazy = {name: lazy_table(tree) for name, tree in trees.items()}

    def resolve(module: str, name: str | None) -> str | None:
        if name is not None and f"{module}.{name}" in trees:  # from a.b import c: the module a.b.c
            return f"{module}.{name}"
        if name is not None and name in lazy.get(module, {}):
            return lazy[module][name]
        return module if module in trees else None

    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        is_package = (ROOT.parent / name.replace(".", "/") / "__init__.py").is_file()
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {resolve(alias.name, None) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 more
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                edges |= {resolve(base, alias.name) for alias in node.names}
        graph[name] = {e for e in edges if e is not None and e != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_imports_no_module_that_imports_it_back():
    graph = import_graph()
    # The walker sees an import inside a function (fit_run imports the agreement check there) and
    # a name the package loads on first use (Preempted), and finds a cycle where there is one.
    assert "lightning_cocod.app.agreement" in graph["lightning_cocod.app.fit"]
    assert "lightning_cocod.strategies.reliability" in graph["lightning_cocod.app.train"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# The package's layers, lowest first (docs/organisation.md draws them): a module imports only from
# its own layer or one below. ``core`` is the averaging rules and the communicator; ``rounds`` what a
# round does, with no Lightning; the front-ends run the rounds (the Trainer's strategies, the loop API
# and the Fabric strategies over it) or are Lightning pieces of their own (callbacks, data, models);
# the entry points are where users import the classes from; the app and the tools use all of it.
LAYERS = {
    "foundation": {
        "_errors",
        "_files",
        "_lazy",
        "_moved",
        "_options",
        "_namespaces",
        "_registration",
        "exit_codes",
    }
    | {"figures", "methods"},
    "core": {"core"},
    "rounds": {"rounds"},
    "front-ends": {"loop", "fabric_strategy", "strategies", "callbacks", "data", "models"},
    "entry points": {"", "pl", "lightning", "fabric", "trainer"},
    "app and tools": {"app", "tools", "launch"},
}


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of a module, by its first name under the package ("" for the
    package's own ``__init__``)."""
    first = module.removeprefix(PACKAGE).removeprefix(".").split(".")[0]
    return next(i for i, members in enumerate(LAYERS.values()) if first in members)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    names = list(LAYERS)
    return sorted(
        f"{a} ({names[layer_of(a)]}) imports {b} ({names[layer_of(b)]})"
        for a, imported in graph.items()
        for b in imported
        if layer_of(b) > layer_of(a)
    )


def test_no_module_imports_from_a_layer_above_its_own():
    graph = import_graph()
    assert all(layer_of(m) >= 0 for m in graph)  # every module has a layer (StopIteration otherwise)
    # The walk finds an upward import where there is one.
    assert upward_imports({f"{PACKAGE}.core.flat": {f"{PACKAGE}.rounds.base"}}) == [
        f"{PACKAGE}.core.flat (core) imports {PACKAGE}.rounds.base (rounds)"
    ]
    assert upward_imports(graph) == []


def test_the_loop_api_and_the_fabric_strategies_import_nothing_of_the_trainer_strategies():
    graph = import_graph()
    beside = {f"{PACKAGE}.loop", f"{PACKAGE}.fabric_strategy"}
    for module in beside:
        assert not {m for m in graph[module] if m.startswith(f"{PACKAGE}.strategies")}, module
    # The Fabric strategies run the loop API's classes; the loop knows nothing of Fabric, and the
    # Trainer strategies nothing of either.
    assert f"{PACKAGE}.loop" in graph[f"{PACKAGE}.fabric_strategy"]
    assert f"{PACKAGE}.fabric_strategy" not in graph[f"{PACKAGE}.loop"]
    strategies = [m for m in graph if m.startswith(f"{PACKAGE}.strategies")]
    assert strategies and not any(graph[m] & beside for m in strategies)
    # The rounds import none of the front-ends.
    rounds = [m for m in graph if m.startswith(f"{PACKAGE}.rounds")]
    assert len(rounds) >= 8 and all(layer_of(b) <= layer_of(m) for m in rounds for b in graph[m])
