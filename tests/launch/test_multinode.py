"""Multi-node launches through the engines users run: two torchrun agents on this machine (CPU,
gloo), and the environment a SLURM job derives its ranks, addresses and run id from."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lightning_cocod.app.fit import threads_per_rank
from lightning_cocod.app.preflight import config_dir

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_two_torchrun_agents_run_the_smoke_experiment_on_cpu(tmp_path):
    port, agents = free_port(), []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for node in (0, 1):
        agents.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    f"--node-rank={node}",
                    "--master-addr=127.0.0.1",
                    f"--master-port={port}",
                    "-m",
                    "lightning_cocod.app.train",
                    "launcher=torchrun",
                    "experiment=smoke",
                    "run_id=two-agents",
                    f"out_root={tmp_path}",
                    "launcher.threads_per_worker=1",  # both agents share 2 cores here
                ],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [agent.communicate(timeout=220)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    record = json.loads((tmp_path / "smoke" / "two-agents" / "run.json").read_text())
    measured = record["condition"]["measured"]
    # smoke: the digits' 1,437 training images, 32 per rank x 2 ranks, 2 epochs of 22 steps; it learns.
    assert record["workers"] == 2 and record["test_acc"] > 0.5 and record["steps"] == 44
    # The launcher picked what this machine has: the CPU and gloo, one thread per rank as asked.
    assert measured["accelerator"] == "cpu" and measured["threads"] == 1 and measured["world_size"] == 2
    # ... and given to the OpenMP runtime before torch loaded, as OMP_NUM_THREADS=1 would have
    # (torchrun sets nothing for one process per node).
    assert "OMP_NUM_THREADS" not in env and record["omp_num_threads"] == "1"
    assert record["condition"]["config"]["launcher"]["name"] == "torchrun"


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("key", "rank0", "rank1", "named"),
    # The mechanism end to end, on the model's structure (a digest of its shapes); what else is
    # compared (seed, tau, batch, steps, method) is checked without processes in app/test_agreement.py.
    [("model.net.width", 8, 16, "model")],
)
def test_ranks_that_disagree_on_the_config_are_all_stopped_in_one_line_naming_it(
    tmp_path, key, rank0, rank1, named
):
    port, agents = free_port(), []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for node, value in ((0, rank0), (1, rank1)):
        agents.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    f"--node-rank={node}",
                    "--master-addr=127.0.0.1",
                    f"--master-port={port}",
                    "-m",
                    "lightning_cocod.app.train",
                    "launcher=torchrun",
                    "experiment=smoke",
                    "run_id=differ",
                    f"out_root={tmp_path / f'node{node}'}",
                    "launcher.threads_per_worker=1",
                    "strategy.timeout=60",
                    f"{key}={value}",
                ],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [agent.communicate(timeout=220) for agent in agents]
    assert [agent.returncode for agent in agents] == [1, 1], outputs
    for out, err in outputs:
        said = [line for line in err.splitlines() if line.startswith("cocod-train: error: ")]
        # torchrun adds its own report of the failed agent; ours is one line, with no traceback.
        assert len(said) == 1 and err.count("ConfigMismatch") == 1, err[-3000:]
        assert f"ConfigMismatch: rank 1 disagrees with rank 0 on {named}" in said[0]
        if named != "model":
            assert f"{named}: {rank0!r} on rank 0, {rank1!r} on rank 1" in said[0]
    assert not list(tmp_path.rglob("run.json"))


SLURM_TASK_3 = {  # task 3 of a 2-node x 2-task job, on the second node
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_CPUS_PER_TASK": "6",
}


def test_a_slurm_task_derives_its_rank_address_and_run_id(monkeypatch):
    for key in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "TORCHELASTIC_", "MASTER_", "LOCAL_", "RANK", "WORLD"))
    ]:
        monkeypatch.delenv(key)
    for key, value in SLURM_TASK_3.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="train"):
        cfg = compose("train", ["launcher=slurm", "experiment=smoke"])
    assert (cfg.launcher.devices, cfg.launcher.num_nodes, cfg.run_id) == (2, 2, "4242")
    assert threads_per_rank(cfg.launcher, os.environ) == 6  # SLURM_CPUS_PER_TASK
    from pytorch_lightning.plugins.environments import SLURMEnvironment

    env = SLURMEnvironment()
    assert env.detect()
    assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()) == (3, 1, 1, 4)
    assert (env.main_address, env.main_port) == ("gpu07", 29500)  # the first node of the list


def test_threads_per_rank_never_oversubscribes_a_node(monkeypatch):
    with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="train"):
        cfg = compose("train", ["launcher=torchrun", "experiment=smoke", "run_id=x"])
    cores = os.cpu_count() or 1
    assert threads_per_rank(cfg.launcher, {"LOCAL_WORLD_SIZE": "1"}) == cores
    assert threads_per_rank(cfg.launcher, {"LOCAL_WORLD_SIZE": str(2 * cores)}) == 1
    assert threads_per_rank(cfg.launcher, {"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "1"}) == 3


@pytest.mark.parametrize(("srun_exit", "requeued"), [(75, True), (0, False), (1, False)])
def test_the_sbatch_script_requeues_a_job_stopped_with_a_checkpoint(tmp_path, srun_exit, requeued):
    # srun and scontrol stand-ins that write down how they were called.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, code in (("srun", srun_exit), ("scontrol", 0)):
        (bin_dir / tool).write_text(
            f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{tmp_path}/{tool}.args"\nexit {code}\n'
        )
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "slurm.sbatch"), "-m", "experiment=smoke", "tau=2,4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == srun_exit, proc.stderr
    # The app's own parser: --multirun first, then the launcher, auto-resume, and the user's overrides
    # (after it, so checkpoint.resume=null from the user wins).
    assert (tmp_path / "srun.args").read_text().split() == [
        "python",
        "-m",
        "lightning_cocod.app.train",
        "--multirun",
        "launcher=slurm",
        "checkpoint.resume=auto",
        "experiment=smoke",
        "tau=2,4",
    ]
    scontrol = tmp_path / "scontrol.args"
    assert (scontrol.read_text().split() == ["requeue", "4242"]) if requeued else not scontrol.exists()
