"""``import lightning_cocod`` registers the loop's methods in Fabric's strategy registry, in both
``lightning_fabric`` and ``lightning.fabric``, imported before or after it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)

CHECK = """
import json
{imports}
import lightning_fabric, lightning.fabric
found = {{}}
for package in (lightning_fabric, lightning.fabric):
    registry = package.strategies.STRATEGY_REGISTRY
    chosen = package.Fabric(strategy="local_sgd_fork", accelerator="cpu", devices=2).strategy
    found[package.__name__] = {{
        "names": sorted(n for n in registry if n.split("_")[0] in ("cocod", "local", "pipe")),
        "chosen": f"{{type(chosen).__module__}}.{{type(chosen).__name__}}",
        "is_theirs": isinstance(chosen, package.strategies.DDPStrategy),
        "loop": chosen.loop_class.__name__, "options": {{**chosen._rounds.options(), "weight": chosen._weight}},
    }}
print(json.dumps(found))
"""


@pytest.mark.parametrize(
    "imports",
    ["import lightning_cocod", "import lightning_fabric, lightning.fabric\nimport lightning_cocod"],
    ids=["fabric imported after", "fabric imported before"],
)
def test_both_fabric_namespaces_know_our_methods(imports):
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(imports=imports)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    names = sorted(
        f"{method}{suffix}"
        for method in ("cocod", "local_sgd", "pipe_sgd")
        for suffix in ("", "_fork", "_notebook", "_spawn")
    )
    homes = {"lightning_fabric": "lightning_cocod.fabric", "lightning.fabric": "lightning_cocod.lightning"}
    for package, home in homes.items():
        assert found[package] == {
            "names": names,
            "chosen": f"{home}.LocalSGDFabricStrategy",
            "is_theirs": True,
            "loop": "LocalSGD",
            "options": {"tau": 4, "average_buffers": True, "weight": None},
        }


def test_a_fabric_strategy_refuses_bad_options_at_once():
    from lightning_cocod.fabric import CoCoDFabricStrategy

    with pytest.raises(
        ValueError,
        match=r"^CoCoDFabricStrategy: tau='x' is invalid; accepted: a positive integer \(optimizer steps per round\) or \"auto\"$",
    ):
        CoCoDFabricStrategy(tau="x")
    with pytest.raises(ValueError, match=r"^CoCoDFabricStrategy: timeout=-1 is invalid"):
        CoCoDFabricStrategy(timeout=-1)
    strategy = CoCoDFabricStrategy(tau=8, progress=0.5)
    # The rounds built to check the options are the loop's, once fabric.setup has the model.
    assert strategy._weight is None
    assert strategy._rounds.options() == {"tau": 8, "progress": 0.5, "average_buffers": True}
