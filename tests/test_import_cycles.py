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
