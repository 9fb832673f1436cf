"""Timeouts, checkpoint files, request flags, resumed bounds and the rendezvous deadline; one
process each (the rendezvous cases run in a subprocess of their own)."""

import logging
import os
import random
import re
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lightning_cocod import CheckpointError, CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy, SSGDStrategy
from lightning_cocod.core.control import RequestFlags
from lightning_cocod.rounds.checkpoint import (
    DIGEST_SUFFIX,
    _temporary,
    atomic_save,
    file_digest,
    remove_stale_temporaries,
    verify_checkpoint,
)
from tests.helpers.fake_comm import FakeCluster

ROOT = Path(__file__).resolve().parents[2]
ALL = [CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy, SSGDStrategy]


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize(("given", "seconds"), [(30, 30.0), (2.5, 2.5), (timedelta(minutes=2), 120.0)])
def test_timeout_takes_seconds_or_a_timedelta(cls, given, seconds):
    assert cls(timeout=given)._timeout == timedelta(seconds=seconds)


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize(
    "bad", [0, -5, timedelta(0), timedelta(seconds=-1), float("nan"), float("inf"), "30", True]
)
def test_a_bad_timeout_is_one_line_naming_what_is_accepted(cls, bad):
    with pytest.raises(ValueError) as err:
        cls(timeout=bad)
    assert str(err.value) == (
        f"{cls.__name__}: timeout={bad!r} is invalid; accepted: a positive number of seconds or a datetime.timedelta"
    )


def test_auto_bounds_of_zero_are_refused_not_rounded_up():
    with pytest.raises(ValueError, match="tau_min=0 is invalid; accepted: a positive integer"):
        CoCoDStrategy(tau="auto", tau_min=0)
    with pytest.raises(ValueError, match="tau_max=0 is invalid; accepted: a positive integer"):
        CoCoDStrategy(tau="auto", tau_max=0)


def test_resuming_auto_keeps_this_fits_bounds_and_the_measurements():
    saved = CoCoDStrategy(tau="auto", tau_max=64)
    saved.rounds.auto.period.update(
        comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001
    )  # asks for tau 24
    state = {
        **saved.rounds.state(),
        "steps": 40,
        "tau": saved.rounds.auto.period.tau,
        "tau_history": [(0, 4), (8, 24)],
    }
    assert state["tau"] == 24
    resumed = CoCoDStrategy(tau="auto", tau_min=8, tau_max=8)
    resumed.rounds.load_state(state)
    assert (resumed.rounds.auto.period.tau_min, resumed.rounds.auto.period.tau_max) == (8, 8)
    assert resumed.tau == 8 and resumed.rounds.auto.period.tau == 8
    assert resumed.tau_history == [(0, 4), (8, 24), (40, 8)]
    assert resumed.rounds.auto.period.comm_seconds == 2.0 and resumed.rounds.auto.period.step_seconds == 0.1
    # the next round's rule still runs within this fit's bounds
    assert resumed.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 8


# -- checkpoint files ------------------------------------------------------------------------------


def save(path, value=1.0):
    atomic_save(TorchCheckpointIO(), {"weights": torch.full((1000,), value)}, path)


def test_a_saved_checkpoint_verifies_and_nothing_lies_beside_it(tmp_path):
    path = tmp_path / "last.ckpt"
    save(path)
    verify_checkpoint(path)
    save(path, 2.0)  # rewritten in place
    verify_checkpoint(path)
    assert torch.load(path, weights_only=True)["weights"][0] == 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "flipped":
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flipped", "truncated", "empty"])
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_the_file(tmp_path, how):
    path = tmp_path / "last.ckpt"
    save(path)
    corrupt(path, how)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message


@pytest.mark.parametrize(
    "content",
    [b"", b"not a checkpoint at all", random.Random(0).randbytes(4096)],
    ids=["empty", "text", "noise"],
)
def test_a_file_that_is_no_checkpoint_is_refused_in_one_line(tmp_path, content):
    path = tmp_path / "foreign.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=str(path)) as err:
        verify_checkpoint(path)
    assert "\n" not in str(err.value)


def test_a_plain_checkpoint_loads_with_a_warning_that_nothing_vouches_for_it(tmp_path, caplog):
    path = tmp_path / "lightning.ckpt"
    torch.save({"w": torch.ones(3)}, path)  # no record inside, no checksum beside it
    with caplog.at_level(logging.WARNING, logger="lightning_cocod.rounds.checkpoint"):
        verify_checkpoint(path)
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {path} carries no integrity record (written by Lightning itself or by an older "
        "lightning_cocod): it loaded, but nothing shows that its content is what was saved"
    ]


def test_saving_over_an_older_versions_checkpoint_drops_its_checksum_file(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.ones(3)}, path)
    Path(f"{path}{DIGEST_SUFFIX}").write_text(file_digest(path) + "\n")
    verify_checkpoint(path)
    save(path, 3.0)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    verify_checkpoint(path)


def test_the_file_reaches_the_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save(tmp_path / "last.ckpt")
    (renamed,) = [e for e in events if e[0] == "replace"]
    assert renamed[2] == str(tmp_path / "last.ckpt")
    at = events.index(renamed)
    assert ("fsync", renamed[1]) in events[:at]  # the bytes of the temporary file
    assert ("fsync", str(tmp_path)) in events[at:]  # the folder entry of the rename


def test_a_last_link_is_checked_as_the_file_it_points_to(tmp_path):
    best = tmp_path / "epoch=3.ckpt"
    save(best)
    link = tmp_path / "last.ckpt"
    link.symlink_to(best.name)
    verify_checkpoint(link)
    corrupt(best, "flipped")
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {best} ")):
        verify_checkpoint(link)


def test_an_asynchronous_checkpoint_plugin_still_leaves_a_whole_verified_file(tmp_path):
    from pytorch_lightning.plugins.io import AsyncCheckpointIO

    plugin = AsyncCheckpointIO(TorchCheckpointIO())
    try:
        atomic_save(plugin, {"weights": torch.ones(10)}, tmp_path / "last.ckpt")
        verify_checkpoint(tmp_path / "last.ckpt")
    finally:
        plugin.teardown()


def temporary_of(path, pid):
    """The temporary name a writer of ``path`` with process id ``pid`` on this host uses."""
    mine = _temporary(path)
    return mine.with_name(f"{mine.name.rsplit('-', 1)[0]}-{pid}")


def test_temporaries_of_dead_writers_on_this_host_are_removed(tmp_path):
    path = tmp_path / "last.ckpt"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    stale = temporary_of(path, dead.pid)
    stale_older = tmp_path / f"last.ckpt.tmp-{host}-{dead.pid}"  # an earlier version's names
    stale_older_digest = tmp_path / f"last.ckpt{DIGEST_SUFFIX}.tmp-{host}-{dead.pid}"
    live = tmp_path / f"last.ckpt.tmp-{host}-{os.getppid()}"  # a process that runs
    elsewhere = tmp_path / f"last.ckpt.tmp-another-host-{dead.pid}"
    unrelated = temporary_of(tmp_path / "other.ckpt", dead.pid)
    for p in (stale, stale_older, stale_older_digest, live, elsewhere, unrelated):
        p.write_bytes(b"partial")
    assert sorted(remove_stale_temporaries(path)) == sorted([stale, stale_older, stale_older_digest])
    save(path)  # a save cleans up too, and leaves nothing of its own
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["last.ckpt", live.name, elsewhere.name, unrelated.name]
    )


# -- request flags ---------------------------------------------------------------------------------


def test_request_flags_are_summed_over_ranks_and_arrive_lag_steps_late():
    cluster = FakeCluster(3)
    flags = [RequestFlags(comm, width=2) for comm in cluster.comms]
    raised = {(1, 2): [1.0, 0.0], (4, 0): [0.0, 1.0], (4, 2): [0.0, 1.0]}  # (step, rank) -> flags
    seen: dict[int, list[tuple[int, list[float]]]] = {r: [] for r in range(3)}
    for step in range(1, 9):
        for rank, pipeline in enumerate(flags):
            pipeline.push(step, raised.get((step, rank), [0.0, 0.0]))
        for rank, pipeline in enumerate(flags):
            due = pipeline.due(step, lag=3)
            if due is not None and due.any():
                seen[rank].append((step, due.tolist()))
    assert seen[0] == seen[1] == seen[2] == [(4, [1.0, 0.0]), (7, [0.0, 2.0])]
    assert all(p.pending == 3 for p in flags)
    for rank, pipeline in enumerate(flags):
        assert pipeline.drain().tolist() == [0.0, 0.0] and pipeline.pending == 0


# -- rendezvous deadline ---------------------------------------------------------------------------

MEET = """
import sys, threading, time, datetime, torch
from lightning_cocod.strategies.rendezvous import init_default_group
timeout = {timeout}
done = threading.Event()
late = []
def watch():  # a reference deadline, 1.5 timeouts from the call, on this process's own clock
    if not done.wait(1.5 * timeout):
        late.append(True)
        print("LATE: no answer 1.5 timeouts after the call", flush=True)
threading.Thread(target=watch, daemon=True).start()
started = time.monotonic()
try:
    init_default_group("127.0.0.1", {port}, {rank}, 2, "gloo", datetime.timedelta(seconds=timeout), torch.device("cpu"))
except Exception as err:
    done.set()
    print(f"{{time.monotonic() - started:.2f}} {{type(err).__name__}}: {{err}}", flush=True)
    sys.exit(1)
done.set()
print("met")
"""


def meet_alone(rank, port, timeout=4):
    code = MEET.format(port=port, rank=rank, timeout=timeout)
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_the_rendezvous_gives_up_within_the_timeout_on_every_path():
    with socket.socket() as foreign:  # another program holds the port: it accepts and never answers
        foreign.bind(("127.0.0.1", 0))
        foreign.listen(8)
        port, alone = foreign.getsockname()[1], free_port()
        started = {  # side by side: each measures its own time from its first rendezvous call
            "foreign, rank 1": meet_alone(1, port),
            "foreign, rank 0": meet_alone(0, port),
            "nobody, rank 0": meet_alone(0, alone),
            "nobody, rank 1": meet_alone(1, alone + 1 if alone < 65535 else alone - 1),
        }
        runs = {
            case: subprocess.CompletedProcess(p.args, p.wait(timeout=60), *p.communicate())
            for case, p in started.items()
        }
    for case, proc in runs.items():
        assert proc.returncode == 1, (case, proc.returncode, proc.stderr[-2000:])  # an error, not an abort
        # The error came before the process's own reference deadline (1.5 timeouts from the call,
        # same clock, same load): an order of events, not a wall-clock limit.
        assert "LATE" not in proc.stdout, (case, proc.stdout)
        seconds, message = proc.stdout.strip().split(" ", 1)
        if case != "foreign, rank 0":  # that one fails at once: the port is taken
            # Waited for the others (a lower bound: no machine is faster than the clock), less the
            # slack the store keeps before the deadline (0.1 timeouts).
            assert float(seconds) >= 0.9 * 4 - 0.05, (case, seconds)
        assert message.startswith("RendezvousError: rank "), (case, message)
        assert "\n" not in message
    assert (
        "cannot listen on 127.0.0.1" in runs["foreign, rank 0"].stdout
        and "Address already in use" in runs["foreign, rank 0"].stdout
    )
    assert "within 0:00:04" in runs["foreign, rank 1"].stdout


def test_a_torchrun_restart_over_the_shared_store_is_refused_with_the_fix(monkeypatch):
    from lightning_cocod import RendezvousError
    from lightning_cocod.strategies.rendezvous import init_default_group

    meet = lambda: init_default_group(
        "127.0.0.1", free_port(), 1, 2, "gloo", timedelta(seconds=5), torch.device("cpu")
    )
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert meet() is False  # the first attempt: torch's own env:// set-up, over the agent's store
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with pytest.raises(
        RendezvousError,
        match=r"rank 1: torchrun restarted the workers \(restart 2\).*TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
    ):
        meet()
