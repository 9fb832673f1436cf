"""The compression study (scripts/compression_study.sh): its control strategy sends raw snapshots,
its table reads each run's codec from what the run was built with and judges the compressed rows
against fp32 CoCoD, and the whole recipe runs through the app in miniature."""

import json
import os
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

import compression_control
import compression_table


def _started(strategy):
    rounds = strategy.rounds
    cpu = torch.device("cpu")
    # Rounds.start builds the compressed mean over this communicator; nothing is sent here.
    comm = types.SimpleNamespace(rank=0, world_size=2, device=cpu)
    rounds.attach(torch.nn.Linear(3, 2), comm, rank=0, world_size=2, device=cpu, codec_comm=comm)
    rounds.start()
    # What the rounds send through: the round keeps the communicator it was built with.
    assert rounds.round.comm is rounds.compressed
    return rounds.compressed


def test_the_control_sends_raw_snapshots_and_the_package_sends_deltas():
    import lightning_cocod

    control = _started(compression_control.CoCoDStrategy(tau=2, compression="int8"))
    assert (control.delta, control.codec.name, control.error_feedback) == (False, "int8", True)
    assert _started(lightning_cocod.CoCoDStrategy(tau=2, compression="int8")).delta is True
    # The app tells the method by class name: the control must be filed as CoCoD-SGD.
    from lightning_cocod.methods import method_of_class

    assert method_of_class("compression_control.CoCoDStrategy") == "cocod"


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_every_round_of_the_control_encodes_the_raw_weights(tmp_path):
    """One gloo rank, int8 without error feedback: a round's error is int8's on what it encodes.
    Weights of size 1 moving by 1e-4 a round: raw, about 1/254 of the weights; deltas, of the
    progress. Rounds 2 and 3 are where a reference that kept the last mean would send deltas."""
    import torch.distributed as dist

    from lightning_cocod.core.comm import TorchDistCommunicator
    from lightning_cocod.core.compress import CompressedMean, make_codec

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        comm = TorchDistCommunicator(None, torch.device("cpu"))
        means = {
            "raw": CompressedMean(comm, make_codec("int8"), error_feedback=False, delta=False),
            "delta": CompressedMean(comm, make_codec("int8"), error_feedback=False),
        }
        x = torch.randn(5000, generator=torch.Generator().manual_seed(0))
        errors = {name: [] for name in means}
        for _ in range(3):
            x = x + 1e-4 * torch.randn(5000, generator=torch.Generator().manual_seed(1))
            for name, mean in means.items():
                bucket = x.clone()
                mean.start_mean([bucket]).wait()
                errors[name].append((bucket - x).abs().max().item())
        bound = x.abs().max().item() / 127  # int8 rounds to half a step of max|block| / 127, twice
        assert all(bound / 20 < e <= bound for e in errors["raw"]), (errors, bound)
        assert errors["delta"][0] == 0  # its first round: the exact fp32 mean
        assert all(e < 1e-5 for e in errors["delta"]), errors
    finally:
        dist.destroy_process_group()


def test_the_control_refuses_no_codec():
    with pytest.raises(ValueError, match="compression=None is invalid; accepted: 'bf16' or 'int8'"):
        compression_control.CoCoDStrategy(tau=2)


def _run(root: Path, name: str, strategy: dict, method: str, seed: int, acc: float) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    record = {
        "id": name,
        "group": "g",
        "method": method,
        "tau": 2 if method == "cocod" else None,
        "progress": 1.0 if method == "cocod" else None,
        "workers": 4,
        "seed": seed,
        "condition": {},
        "condition_id": "c0",
        "link": "unshaped",
        "test_acc": acc,
        "steady_step_seconds": 0.01,
        "finished_at": 1.0,
        "timeline": [{"seconds": 1.0, "accuracy": acc}],
    }
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "resolved.yaml").write_text(json.dumps({"strategy": strategy}))  # YAML reads JSON


def test_the_table_judges_each_codec_against_fp32_cocod(tmp_path, capsys):
    cocod = {"_target_": "lightning_cocod.CoCoDStrategy", "tau": 2}
    variants = {
        "fp32": (cocod, "cocod", [0.96, 0.95, 0.97]),  # 96.00 ± 1.00: the tolerance is 1.00, not 0.5
        "bf16": ({**cocod, "compression": "bf16"}, "cocod", [0.965, 0.955, 0.96]),  # 96.00: +0.00
        "int8": (
            {**cocod, "compression": "int8"},
            "cocod",
            [0.957, 0.947, 0.952],
        ),  # 95.20: -0.80, outside 0.5 alone
        "raw": (
            {**cocod, "_target_": "compression_control.CoCoDStrategy", "compression": "int8"},
            "cocod",
            [0.90, 0.80, 0.85],  # 85.00: -11.00
        ),
        "powersgd": (
            {"_target_": "lightning_cocod.SSGDStrategy", "comm_hook": "powersgd"},
            "ssgd",
            [0.9, 0.9, 0.9],
        ),
        "ssgd": ({"_target_": "lightning_cocod.SSGDStrategy", "comm_hook": None}, "ssgd", [0.95, 0.96, 0.97]),
    }
    for name, (strategy, method, accuracies) in variants.items():
        for seed, acc in enumerate(accuracies):
            _run(tmp_path / "runs", f"{name}-s{seed}", strategy, method, seed, acc)
    _run(tmp_path / "runs", "other-group", cocod, "cocod", 0, 0.1)
    (tmp_path / "runs" / "other-group" / "run.json").write_text(
        (tmp_path / "runs" / "other-group" / "run.json").read_text().replace('"group": "g"', '"group": "h"')
    )
    out = tmp_path / "table" / "study.md"
    assert compression_table.main([str(tmp_path / "runs"), "--group", "g", "--out", str(out)]) == 0
    rows = [
        line.split("|")[1:-1]
        for line in out.read_text().splitlines()
        if line.startswith("| ") and "method" not in line
    ]
    cells = [(r[0].strip(), r[4].strip(), r[6].strip()) for r in rows]
    assert cells == [
        ("CoCoD-SGD fp32", "96.00 ± 1.00 (n=3)", "–"),
        ("CoCoD-SGD bf16 (error feedback)", "96.00 ± 0.50 (n=3)", "+0.00 (within ±1.00)"),
        ("CoCoD-SGD int8 (error feedback)", "95.20 ± 0.50 (n=3)", "-0.80 (within ±1.00)"),
        (
            "CoCoD-SGD int8, raw snapshots (error feedback): control",
            "85.00 ± 5.00 (n=3)",
            "-11.00 (outside ±1.00)",
        ),
        ("S-SGD + DDP PowerSGD (rank 1)", "90.00 ± 0.00 (n=3)", "–"),
        ("S-SGD", "96.00 ± 1.00 (n=3)", "–"),
    ]
    assert rows[3][5].strip() == "90.00 / 80.00 / 85.00"  # each seed's, in seed order
    assert "# g: 18 run(s)" in out.read_text()
    assert (out.parent / "study_accuracy_vs_time.png").read_bytes().startswith(b"\x89PNG")
    assert capsys.readouterr().out == out.read_text()


def test_the_table_says_when_there_is_nothing_to_read(tmp_path, capsys):
    assert compression_table.main([str(tmp_path), "--group", "g"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"error: no finished runs under {tmp_path} in group 'g' (no readable run.json)"
    )


# 600 signals, 32 per rank x 2 ranks: 6 optimizer steps per epoch, 2 epochs (as test_study_recipe).
MINIATURE = [
    "data.num_samples=600",
    "max_epochs=2",
    "model.warmup_epochs=0",
    "model.milestones=[1,1.5]",
    "step_time_warmup=2",
    "checkpoint.every_n_epochs=0",
    "progress_every_s=0",
]


def test_every_sweep_of_the_study_passes_the_apps_checks(tmp_path):
    """The script's commands (``DRY_RUN=1`` prints them) are sweeps the app accepts, with the rows
    the table expects: each composed and checked as cocod-train does before its first job. (The
    study itself, 18 runs in 21 minutes, is the script's to run: docs/accuracy/compression-study.md.)"""
    from tests.helpers.app import preflight

    env = {
        **os.environ,
        "DRY_RUN": "1",
        "RUN_ID": "mini",
        "OUT_ROOT": str(tmp_path / "out"),
        "WORKERS": "2",
        "SEEDS": "0",
    }
    done = subprocess.run(
        ["bash", str(SCRIPTS / "compression_study.sh"), *MINIATURE],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sweeps = [shlex.split(line) for line in done.stdout.splitlines() if "lightning_cocod.app.train" in line]
    assert len(sweeps) == 3
    seen = set()
    for command in sweeps:
        overrides = command[command.index("--multirun") + 1 :]
        for cfg in preflight(["-m", *overrides]):
            target = cfg.strategy._target_.rpartition(".")[2]
            seen.add((cfg.strategy._target_, cfg.strategy.get("compression"), cfg.strategy.get("comm_hook")))
            assert target in ("CoCoDStrategy", "SSGDStrategy") and cfg.launcher.devices == 2
    assert seen == {
        ("lightning_cocod.CoCoDStrategy", None, None),
        ("lightning_cocod.CoCoDStrategy", "bf16", None),
        ("lightning_cocod.CoCoDStrategy", "int8", None),
        ("compression_control.CoCoDStrategy", "int8", None),
        ("lightning_cocod.SSGDStrategy", None, None),
        ("lightning_cocod.SSGDStrategy", None, "powersgd"),
    }
