"""A run folder belongs to one run; no file shared between runs; records written to survive a crash."""

import datetime
import json
import multiprocessing
import os
import socket
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_cocod._errors import ConfigError
from lightning_cocod._files import atomic_write
from lightning_cocod.app.files import CLAIM, claim_run
from tests.app.test_train import TINY, run_app
from tests.helpers.app import preflight


def _clock_config(out_root: Path, resume=None):
    # A clock whose format has no field: every read gives the same "second", as two runs started
    # within one second see.
    return OmegaConf.create(
        {
            "out_root": str(out_root),
            "name": "n",
            "run_id": "${launcher.run_id}",
            "launcher": {"run_id": "${now:same-second}"},
            "checkpoint": {"resume": resume},
            "hydra": {"run": {"dir": "${out_root}/${name}/${run_id}"}, "overrides": {"hydra": []}},
        }
    )


def _claim_in_a_process(out_root: str, answers) -> None:
    from hydra.core.utils import setup_globals

    setup_globals()  # the ${now:} resolver, as Hydra has it
    cfg = _clock_config(Path(out_root))
    claim_run(cfg, multirun=False)
    answers.put((cfg.run_id, cfg.hydra.run.dir))  # pinned in the config Hydra runs


def test_runs_of_the_same_second_get_folders_of_their_own(tmp_path):
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    for _ in range(3):  # one after another: each claim outlives its process
        process = ctx.Process(target=_claim_in_a_process, args=(str(tmp_path), answers))
        process.start()
        process.join(30)
        assert process.exitcode == 0
    pinned = [answers.get(timeout=5) for _ in range(3)]
    assert pinned == [(n, f"{tmp_path}/n/{n}") for n in ("same-second", "same-second-2", "same-second-3")]
    for run_id in ("same-second", "same-second-2", "same-second-3"):
        assert json.loads((tmp_path / "n" / run_id / CLAIM).read_text())["pid"] > 0


def _hold(folder: str, started, stop) -> None:
    from lightning_cocod.app.files import claim

    claim(Path(folder), continuing=False, key="run_id")
    started.set()
    stop.wait(30)


def test_a_folder_in_use_is_refused_even_to_a_resume_and_free_once_its_run_has_ended(tmp_path):
    from lightning_cocod.app.files import claim

    ctx = multiprocessing.get_context("fork")
    started, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path / "run"), started, stop))
    holder.start()
    try:
        assert started.wait(30)
        with pytest.raises(
            ConfigError, match=r"^run_id: .*/run is in use by a run still going \(started .* by pid "
        ):
            claim(tmp_path / "run", continuing=True, key="run_id")
    finally:
        stop.set()
        holder.join(30)
    with pytest.raises(
        ConfigError,
        match=r"^run_id: .*/run belongs to another run \(started .* by pid \d+ on .*\); accepted: another run_id, "
        r"or checkpoint.resume=last \(or auto\) to continue that run$",
    ):
        claim(tmp_path / "run", continuing=False, key="run_id")
    claim(tmp_path / "run", continuing=True, key="run_id")  # a resume of the run that ended
    assert json.loads((tmp_path / "run" / CLAIM).read_text())["pid"] == os.getpid()


def test_a_folder_made_before_claims_keeps_its_records(tmp_path):
    from lightning_cocod.app.files import claim

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"belongs to another run \(it holds run.json\)"):
        claim(tmp_path / "old", continuing=False, key="run_id")
    assert not (tmp_path / "old" / CLAIM).exists()  # refused: nothing left behind


@pytest.mark.parametrize("key", ["name", "run_id", "group"])
@pytest.mark.parametrize("value", [".", ".."])
def test_names_cannot_leave_the_output_root(key, value, tmp_path):
    with pytest.raises(
        ConfigError, match=rf"^{key}='\.+' is invalid; accepted: a name of letters.* other than \. and \.\."
    ):
        preflight(["experiment=smoke", f"out_root={tmp_path}", f"{key}={value}"])


def test_atomic_write_reaches_the_disk_before_the_rename_and_keeps_the_old_file_on_failure(
    tmp_path, monkeypatch
):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))
    )
    path = tmp_path / "sub" / "run.json"
    atomic_write(path, "old")
    assert path.read_text() == "old"
    assert synced[0].startswith(str(path.parent / ".run.json.")) and synced[1] == str(path.parent)
    synced.clear()
    atomic_write(path, "line", durable=False)
    assert synced == [] and path.read_text() == "line"

    class Full(OSError):
        pass

    def full(fd):
        raise Full("no space left")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(Full):
        atomic_write(path, "new")
    assert path.read_text() == "line" and os.listdir(path.parent) == ["run.json"]


def test_a_damaged_record_under_resume_auto_is_named(tmp_path):
    folder = tmp_path / "out" / "smoke" / "r"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("")
    done = run_app(
        tmp_path, "experiment=smoke", f"out_root={tmp_path / 'out'}", "run_id=r", "checkpoint.resume=auto"
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"cocod-train: error: {folder / 'run.json'} is not a run record (Expecting value: line 1 column 1 "
        "(char 0)), so checkpoint.resume=auto cannot tell whether that run finished; move it aside to "
        "continue the run from its newest checkpoint"
    )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_second_run_with_the_same_id_is_refused_and_damaged_files_of_others_cost_nothing(tmp_path):
    out = tmp_path / "out"
    # What a crash mid-write could leave of files other runs wrote: a group ledger of the version
    # before this one, and another run's record.
    (out / "groups").mkdir(parents=True)
    (out / "groups" / "smoke.json").write_text('{"smoke/a": {"id": ')
    (out / "smoke" / "broken").mkdir(parents=True)
    (out / "smoke" / "broken" / "run.json").write_text('{"id": "smoke/broken", "method": ')
    common = ["experiment=smoke", f"out_root={out}", "logger=none", *TINY, "max_epochs=1"]
    first = run_app(tmp_path, *common, "run_id=exp1", "tau=2", "seed=1")
    assert first.returncode == 0, first.stderr[-3000:]
    folder = out / "smoke" / "exp1"
    rank0 = (folder / "workers" / "rank0.stderr").read_text()
    assert (
        f"passed over {out / 'smoke' / 'broken' / 'run.json'} in search of this run's S-SGD baseline" in rank0
    )
    record = json.loads((folder / "run.json").read_text())
    assert (record["tau"], record["seed"], record["speedup_vs_ssgd"]) == (2, 1, None)
    kept = {
        p: p.read_bytes() for p in [folder / "run.json", folder / "resolved.yaml", *folder.glob(".hydra/*")]
    }

    second = run_app(tmp_path, *common, "run_id=exp1", "tau=8", "seed=2")
    assert second.returncode == 2
    claimed = json.loads((folder / CLAIM).read_text())
    started = datetime.datetime.fromtimestamp(claimed["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    assert second.stderr.strip().splitlines() == [
        f"cocod-train: error: run_id: {folder} belongs to another run (started {started} by pid "
        f"{claimed['pid']} on {socket.gethostname()}); accepted: another run_id, or checkpoint.resume=last "
        "(or auto) to continue that run"
    ]
    assert {p: p.read_bytes() for p in kept} == kept

    # The same run continued is its own folder's run: allowed.
    again = run_app(tmp_path, *common, "run_id=exp1", "tau=2", "seed=1", "checkpoint.resume=auto")
    assert again.returncode == 0 and ": finished already (" in again.stdout + again.stderr


def test_an_eval_set_the_workers_cannot_split_evenly_is_refused_before_any_worker_starts(tmp_path):
    # smoke on synthetic data: 2 workers, eval batches of 2 x 32 samples.
    with pytest.raises(ConfigError) as info:
        preflight(["experiment=smoke", "data=synthetic", f"out_root={tmp_path}", "data.num_eval_samples=1"])
    assert str(info.value) == (
        "data.num_eval_samples=1 is invalid; accepted: a count every one of the 2 workers can split into the "
        "same number of eval batches of at most 64 samples, none empty (e.g. 2)"
    )
    # Batches of one: 3 samples give rank 0 one batch and rank 1 two.
    with pytest.raises(ConfigError, match=r"^data.num_eval_samples=3 is invalid; .* \(e.g. 4\)$"):
        preflight(
            [
                "experiment=smoke",
                "data=synthetic",
                f"out_root={tmp_path}",
                "data.num_eval_samples=3",
                "data.eval_batch_size=1",
            ]
        )
    assert preflight(
        [
            "experiment=smoke",
            "data=synthetic",
            f"out_root={tmp_path}",
            "data.num_eval_samples=4",
            "data.eval_batch_size=1",
        ]
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only mount needs root (root writes through mode bits)")
@pytest.mark.timeout(120)
def test_a_read_only_checkpoint_folder_is_refused_before_any_worker_starts(tmp_path):
    checkpoints = tmp_path / "out" / "smoke" / "r1" / "checkpoints"
    checkpoints.mkdir(parents=True)
    overrides = ["experiment=smoke", f"out_root={tmp_path / 'out'}", "run_id=r1", *TINY]
    command = " ".join(["python", "-m", "lightning_cocod.app.train", *overrides])
    # A private mount namespace, in which the folder is a read-only bind mount of itself.
    script = f"mount --bind {checkpoints} {checkpoints} && mount -o remount,bind,ro {checkpoints} && exec {command}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"cocod-train: error: cannot write in {checkpoints} (Read-only file system), where this run writes its "
        "checkpoints; accepted: a folder this user can write (another run_id, or out_root=...)"
    ]
    assert not (checkpoints.parent / "workers").exists()  # no worker started


# -- no file of a run is written through a link planted in its place -------------------------------


@pytest.mark.timeout(300)  # bounds a hang; torch's first import alone can take a minute on a loaded machine
def test_no_file_the_package_writes_in_a_run_folder_goes_through_a_planted_link(tmp_path):
    import torch
    from pytorch_lightning.plugins.io import TorchCheckpointIO

    from lightning_cocod._files import open_to_write
    from lightning_cocod.app.files import claim
    from lightning_cocod.app.runs import JOB_CONFIG, JOB_IDENTITY, write_finished, write_start
    from lightning_cocod.rounds.checkpoint import _temporary, atomic_save, verify_checkpoint

    victim = tmp_path / "someone-elses.txt"
    victim.write_text("theirs")

    def plant(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(victim)

    run = tmp_path / "run"
    # The claim: a resume takes an existing claim over; a link in its place is no claim of a run.
    plant(run / CLAIM)
    for continuing in (True, False):
        with pytest.raises(ConfigError) as err:
            claim(run, continuing=continuing, key="run_id")
        assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"run_id: {run} belongs to another run")
    with pytest.raises(
        ConfigError,
        match=rf"^run_id: cannot claim {run}: {run / CLAIM} is a symbolic link, not a file of its own; accepted: ",
    ):
        claim(run, continuing=True, key="run_id")
    # The records and the workers' inputs, planted under their names and their temporaries' names.
    names = [JOB_CONFIG, JOB_IDENTITY, "resolved.yaml", "run.json"]
    for name in names:
        plant(run / name)
        plant((run / name).with_name(f".{Path(name).name}.{os.getpid()}.tmp"))
    identity = {"version": "0.0", "git_commit": "unknown"}
    write_start(run, {"seed": 1}, identity)
    write_finished(run, {"seed": 1}, {**identity, "test_acc": 0.5})
    for name in names:
        assert not (run / name).is_symlink() and (run / name).stat().st_size > 0
    assert json.loads((run / "run.json").read_text())["test_acc"] == 0.5
    # A checkpoint, under its name and its temporary's.
    checkpoint = run / "checkpoints" / "last.ckpt"
    plant(checkpoint)
    plant(_temporary(checkpoint))
    atomic_save(TorchCheckpointIO(), {"w": torch.ones(3), "global_step": 2}, checkpoint)
    assert not checkpoint.is_symlink()
    verify_checkpoint(checkpoint)
    # A worker's log: a link is refused, a FIFO too (a writer would wait for a reader).
    plant(run / "logs" / "rank0.stdout")
    with pytest.raises(OSError, match=r"rank0.stdout is a symbolic link, not a file of its own$"):
        open_to_write(run / "logs" / "rank0.stdout")
    os.mkfifo(run / "logs" / "rank1.stdout")
    with pytest.raises(OSError, match=r"rank1.stdout is not a regular file$"):
        open_to_write(run / "logs" / "rank1.stdout")
    assert victim.read_text() == "theirs"


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_a_claim_is_named_not_read_for_ever(tmp_path):
    from lightning_cocod.app.files import claim

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / CLAIM)
    with pytest.raises(ConfigError, match=r"belongs to another run"):
        claim(tmp_path / "run", continuing=False, key="run_id")
    with pytest.raises(ConfigError, match=rf"{CLAIM} is not a regular file; accepted: another run_id"):
        claim(tmp_path / "run", continuing=True, key="run_id")


def test_a_sweep_of_many_overrides_gets_job_folders_a_file_system_can_name(tmp_path):
    """A tuned outer round's dozen overrides named its job folder past 255 bytes, and the run
    failed at its first file: the name is cut, kept apart from its neighbours by a digest."""
    from lightning_cocod.app.preflight import fitting_dirname

    warmup = "{_target_:torch.optim.lr_scheduler.LinearLR,_partial_:true,start_factor:0.25,total_iters:3}"
    long_overrides = [
        "strategy=diloco", "tau=2", "strategy.overlap=1", "strategy.compression=int8",
        "strategy.outer_optimizer.lr=1.0", "strategy.outer_optimizer.momentum=0.8",
        f"strategy.outer_scheduler={warmup}", "strategy.error_feedback=true", "seed=0,1",
    ]  # fmt: skip
    common = ["-m", "experiment=smoke", *TINY, "logger=none", f"out_root={tmp_path}", "run_id=long"]
    done = run_app(tmp_path, *common, *long_overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    folders = sorted(p for p in (tmp_path / "smoke" / "long").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(len(p.name.encode()) <= 255 for p in folders)
    assert all((p / "run.json").is_file() for p in folders)
    seeds = {json.loads((p / "run.json").read_text())["seed"] for p in folders}
    assert seeds == {0, 1}
    # Short names stay as Hydra makes them; long ones differ wherever their overrides do.
    assert fitting_dirname("seed=0,tau=2") == "seed=0,tau=2"
    a, b = fitting_dirname("x" * 300 + "a"), fitting_dirname("x" * 300 + "b")
    assert a != b and len(a) == len(b) == 200
