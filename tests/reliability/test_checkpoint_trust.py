"""What a checkpoint is trusted with: it loads as data (a pickle that would run code is refused
on the app's path and on the Trainer's), it carries its own integrity record (an altered tensor is
refused with nothing beside the file), resume picks the checkpoint that got furthest whatever the
file times say, and Lightning's HPC checkpoints find their own files. In-process, one worker; the
app's refusal in a subprocess of its own."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lightning_cocod import CheckpointError, CoCoDStrategy
from lightning_cocod._errors import ConfigError
from lightning_cocod.app.files import newest_checkpoint, resume_checkpoint
from lightning_cocod.rounds.checkpoint import (
    DIGEST_SUFFIX,
    INTEGRITY_KEY,
    TRUST_ENV,
    atomic_save,
    file_digest,
    verify_checkpoint,
)
from tests.helpers.checkpoints import flip_byte_inside
from tests.helpers.toy import ToyRegression

ROOT = Path(__file__).resolve().parents[2]


class RunsCode:
    """Unpickled, writes ``marker``: what a checkpoint of unknown origin can do to a careless loader."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def trainer(root: Path, max_steps: int, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        strategy=CoCoDStrategy(tau=2),
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


def trained_checkpoint(tmp_path: Path, name: str = "trained.ckpt") -> Path:
    """A checkpoint our strategy wrote after 4 steps of the toy model."""
    fitted = trainer(tmp_path / "first", max_steps=4)
    fitted.fit(ToyRegression(steps=8, out_dir=str(tmp_path / "first")))
    path = tmp_path / name
    fitted.save_checkpoint(path, weights_only=False)
    return path


def with_code(source: Path, target: Path, marker: Path) -> Path:
    """``source`` with an entry added whose unpickling writes ``marker``: a legacy file of
    ours, with no integrity record (a record would name the added entry)."""
    checkpoint = torch.load(source, weights_only=True)
    checkpoint.pop(INTEGRITY_KEY, None)
    checkpoint["payload"] = RunsCode(marker)
    torch.save(checkpoint, target)
    return target


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# -- checkpoints are data, never code --------------------------------------------------------------


def test_a_checkpoint_whose_pickle_runs_code_is_refused_by_the_trainer_and_never_run(tmp_path):
    marker = tmp_path / "marker"
    evil = with_code(trained_checkpoint(tmp_path), tmp_path / "evil.ckpt", marker)
    with pytest.raises(CheckpointError) as err:
        trainer(tmp_path / "second", max_steps=6).fit(
            ToyRegression(steps=8, out_dir=str(tmp_path / "second")), ckpt_path=evil
        )
    assert one_line(err) == (
        f"rank 0: checkpoint {evil} is not plain data: loading it would call exec; refused, as checkpoints load "
        f"as data only (if you trust this file and what it runs, name it in {TRUST_ENV})"
    )
    assert not marker.exists()


def test_a_file_the_user_trusts_loads_with_its_code_on_either_opt_in(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    evil = with_code(trained_checkpoint(tmp_path), tmp_path / "evil.ckpt", marker)
    # Lightning's own opt-in, written by hand for this one call:
    resumed = trainer(tmp_path / "second", max_steps=6)
    resumed.fit(ToyRegression(steps=8, out_dir=str(tmp_path / "second")), ckpt_path=evil, weights_only=False)
    assert marker.read_text() == "ran" and resumed.global_step == 6
    marker.unlink()
    # ... and the file named in the environment, which reaches the app and every worker:
    monkeypatch.setenv(TRUST_ENV, os.pathsep.join([str(tmp_path / "other.ckpt"), str(evil)]))
    verify_checkpoint(evil)
    assert marker.read_text() == "ran"


@pytest.mark.timeout(120)
def test_the_app_refuses_a_checkpoint_whose_pickle_runs_code_before_anything_starts(tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(3)}, "global_step": 3, "payload": RunsCode(marker)}, evil)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_cocod.app.train",
            "experiment=smoke",
            "logger=none",
            f"out_root={tmp_path / 'out'}",
            f"checkpoint.resume={evil}",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "WANDB_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"cocod-train: error: checkpoint.resume='{evil}' is invalid; accepted: null, last, auto, or a whole checkpoint "
        f"file (checkpoint {evil} is not plain data: loading it would call exec; refused, as checkpoints load as "
        f"data only (if you trust this file and what it runs, name it in {TRUST_ENV}))"
    ]
    assert not marker.exists() and not (tmp_path / "out").exists()


# -- integrity travels with the file ---------------------------------------------------------------


def test_one_flipped_byte_inside_a_tensor_is_refused_without_any_file_beside_it(tmp_path):
    path = tmp_path / "copied.ckpt"
    weights = torch.linspace(-1.0, 1.0, 1000)
    atomic_save(TorchCheckpointIO(), {"weights": weights, "global_step": 7}, path)
    Path(f"{path}{DIGEST_SUFFIX}").unlink(missing_ok=True)  # copied without anything beside it
    flip_byte_inside(path, weights)
    assert not torch.equal(torch.load(path, weights_only=True)["weights"], weights)  # torch does not notice
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    assert one_line(err) == (
        f"checkpoint {path} is damaged: its entry 'weights' does not match the SHA-256 recorded when it was "
        "written; resume from another checkpoint"
    )


def test_the_trainer_refuses_a_checkpoint_with_an_altered_weight(tmp_path):
    path = trained_checkpoint(tmp_path)
    flip_byte_inside(path, torch.load(path, weights_only=True)["state_dict"]["net.weight"])
    with pytest.raises(CheckpointError) as err:
        trainer(tmp_path / "second", max_steps=6).fit(
            ToyRegression(steps=8, out_dir=str(tmp_path / "second")), ckpt_path=path
        )
    assert one_line(err) == (
        f"rank 0: checkpoint {path} is damaged: its entry 'state_dict' does not match the SHA-256 recorded when "
        "it was written; resume from another checkpoint"
    )


def test_an_entry_added_or_removed_after_the_save_is_named(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_save(TorchCheckpointIO(), {"weights": torch.ones(3), "global_step": 7}, path)
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "extra": 1}, path)
    with pytest.raises(
        CheckpointError, match="it has an entry 'extra' that was not there when it was written"
    ):
        verify_checkpoint(path)
    del saved["global_step"]
    torch.save(saved, path)
    with pytest.raises(CheckpointError, match="its entry 'global_step' is missing"):
        verify_checkpoint(path)


def test_a_damaged_record_or_a_file_that_holds_no_checkpoint_is_named(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_save(TorchCheckpointIO(), {"weights": torch.ones(3)}, path)
    torch.save({**torch.load(path, weights_only=True), INTEGRITY_KEY: {"sha256": {"weights": "0"}}}, path)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    assert (
        one_line(err) == f"checkpoint {path} is damaged: its integrity record ({INTEGRITY_KEY}) is unreadable"
    )
    torch.save(torch.ones(3), path)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    assert one_line(err) == f"checkpoint {path} holds a Tensor, not a checkpoint"


@pytest.mark.parametrize("content", ["", "\n", "not-a-digest\n", "abc123\n"])
def test_a_damaged_checksum_file_of_an_older_version_is_named_as_such(tmp_path, content):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.ones(3)}, path)  # an older version's checkpoint: no record inside
    Path(f"{path}{DIGEST_SUFFIX}").write_text(content)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    assert one_line(err) == (
        f"checksum file {path}{DIGEST_SUFFIX} is damaged (it holds no SHA-256 digest), so checkpoint {path} cannot "
        "be checked against it: delete the checksum file to load the checkpoint unchecked, or resume from another checkpoint"
    )


def test_an_older_versions_checksum_file_still_checks_its_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.ones(3)}, path)
    Path(f"{path}{DIGEST_SUFFIX}").write_text(file_digest(path) + "\n")
    verify_checkpoint(path)
    torch.save({"w": torch.zeros(3)}, path)
    with pytest.raises(
        CheckpointError, match=f"checkpoint {path} does not match its checksum in last.ckpt.sha256"
    ):
        verify_checkpoint(path)


# -- resume picks the checkpoint that got furthest -------------------------------------------------


def saved_at_step(path: Path, step: int) -> None:
    atomic_save(
        TorchCheckpointIO(), {"global_step": step, "state_dict": {"w": torch.full((10,), float(step))}}, path
    )


def test_resume_continues_the_highest_step_whatever_the_file_times(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    saved_at_step(folder / "last.ckpt", 32)
    saved_at_step(folder / "last-v1.ckpt", 16)
    os.utime(folder / "last.ckpt", (1, 1))  # as a cp without -p or a sync tool leaves it
    (folder / "last-v1.ckpt").touch()
    assert newest_checkpoint(tmp_path) == folder / "last.ckpt"
    for resume in ("last", "auto"):
        cfg = OmegaConf.create({"checkpoint": {"resume": resume}})
        assert resume_checkpoint(cfg, tmp_path) == str(folder / "last.ckpt")


def test_on_the_same_step_the_later_version_wins_and_unreadable_files_come_last(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    saved_at_step(folder / "last-v2.ckpt", 16)
    saved_at_step(folder / "last.ckpt", 16)
    (folder / "last-v3.ckpt").write_bytes(b"half a checkpoint")
    assert newest_checkpoint(tmp_path) == folder / "last-v2.ckpt"
    for readable in ("last.ckpt", "last-v2.ckpt"):
        (folder / readable).unlink()
    assert (
        newest_checkpoint(tmp_path) == folder / "last-v3.ckpt"
    )  # the only one: chosen, to be refused by name
    cfg = OmegaConf.create({"checkpoint": {"resume": "last"}})
    with pytest.raises(ValueError, match=f"checkpoint {folder / 'last-v3.ckpt'} cannot be read"):
        resume_checkpoint(cfg, tmp_path)


# -- Lightning's HPC checkpoints -------------------------------------------------------------------


def test_lightnings_hpc_save_and_resume_find_their_own_files(tmp_path):
    root = tmp_path / "hpc"
    first = trainer(root, max_steps=4)
    first.fit(ToyRegression(steps=8, out_dir=str(tmp_path / "first")))
    connector = first._checkpoint_connector
    for expected in ("hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt"):
        path = connector.hpc_save_path(root)  # what Lightning's SLURM handler saves to
        assert Path(path).name == expected
        first.save_checkpoint(path, weights_only=False)
    assert sorted(p.name for p in root.iterdir()) == ["hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt"]

    resumed = trainer(root, max_steps=6)
    model = ToyRegression(steps=8, out_dir=str(tmp_path / "second"))
    resumed.fit(model, ckpt_path="hpc")
    assert resumed.ckpt_path == str(root / "hpc_ckpt_2.ckpt") and resumed.global_step == 6


# -- a file whose object graph no digest can walk --------------------------------------------------


def _with_record(path: Path, content: dict) -> Path:
    """``content`` saved with a record of well-formed digests: the check walks its entries in order."""
    torch.save({**content, INTEGRITY_KEY: {"sha256": {k: "0" * 64 for k in content}}}, path)
    return path


@pytest.mark.timeout(60)
def test_a_graph_of_shared_references_is_refused_at_once_not_walked_forever(tmp_path):
    shared: list = []
    for _ in range(40):  # a few hundred bytes of pickle, 2**40 paths to the innermost list
        shared = [shared, shared]
    path = _with_record(
        tmp_path / "bomb.ckpt", {"hyper_parameters": shared, "state_dict": {"w": torch.ones(2)}}
    )
    assert path.stat().st_size < 10_000
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    assert re.fullmatch(
        rf"checkpoint {re.escape(str(path))} is no checkpoint of ours or Lightning's: its \d+ containers are reached "
        r"by 2\.2e\+12 paths \(objects shared over and over\); refused",
        one_line(err),
    )
    # the app's check before any worker starts says the same, as a config error
    with pytest.raises(ConfigError, match=r"containers are reached by 2\.2e\+12 paths"):
        resume_checkpoint(OmegaConf.create({"checkpoint": {"resume": str(path)}}), tmp_path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("record", [True, False])
def test_a_list_that_contains_itself_or_nests_too_deep_is_refused_in_one_line(tmp_path, record):
    looped: list = [1]
    looped.append(looped)
    deep: list = []
    for _ in range(150):
        deep = [deep]
    save = _with_record if record else lambda p, c: (torch.save(c, p), p)[1]
    for value, problem in (
        (looped, "it contains itself (a list inside its own content)"),
        (deep, "it is nested more than 100 containers deep"),
    ):
        path = save(tmp_path / "odd.ckpt", {"hyper_parameters": {"x": value}, "state_dict": {}})
        with pytest.raises(CheckpointError) as err:
            verify_checkpoint(path)
        assert (
            one_line(err) == f"checkpoint {path} is no checkpoint of ours or Lightning's: {problem}; refused"
        )
        with pytest.raises(ConfigError, match="contains itself|nested more than"):
            resume_checkpoint(OmegaConf.create({"checkpoint": {"resume": str(path)}}), tmp_path)


def test_a_checkpoint_that_shares_a_few_objects_still_saves_and_verifies(tmp_path):
    groups = [{"lr": 0.1, "params": [0, 1]}]
    path = tmp_path / "shared.ckpt"
    atomic_save(TorchCheckpointIO(), {"a": groups, "b": groups, "w": torch.arange(4.0)}, path)
    verify_checkpoint(path)


class RunsShell:
    """Unpickled, runs a shell command that writes ``marker``: os.system, whose module torch blocks."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_calling_os_system_is_refused_in_the_packages_words(tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(3)}, "payload": RunsShell(marker)}, evil)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(evil)
    assert one_line(err) == (
        f"checkpoint {evil} is not plain data: loading it would call posix.system; refused, as checkpoints load "
        f"as data only (if you trust this file and what it runs, name it in {TRUST_ENV})"
    )
    with pytest.raises(ConfigError, match="loading it would call posix.system"):
        resume_checkpoint(OmegaConf.create({"checkpoint": {"resume": str(evil)}}), tmp_path)
    assert not marker.exists()
