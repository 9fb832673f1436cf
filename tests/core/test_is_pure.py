"""lightning_cocod.core must not depend on Lightning: checked statically and by importing it
in a fresh interpreter where any Lightning import fails."""

import ast
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parents[2] / "lightning_cocod" / "core"
FORBIDDEN = ("pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics")


def test_core_sources_import_no_lightning():
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_core_imports_and_runs_with_lightning_blocked():
    # The package __init__ registers the strategies (and so imports Lightning): stand in an
    # empty parent package to import the core on its own.
    script = f"""
import importlib.abc, sys, types
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {FORBIDDEN!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
pkg = types.ModuleType("lightning_cocod"); pkg.__path__ = [{str(CORE.parent)!r}]
sys.modules["lightning_cocod"] = pkg
import torch
from lightning_cocod.core import CoCoDRound, FlatBuffer
flat = FlatBuffer([torch.ones(3)])
print("ok", flat.nbytes)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 12"
