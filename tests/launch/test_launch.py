import importlib
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lightning_cocod.launch import (
    RESULT_ENV,
    WorkerFailed,
    WorkersPreempted,
    WorkersTimedOut,
    format_rate,
    launch_workers,
    netns,
    parse_rate,
    rank_and_world_size,
    shaped_namespace,
    write_result,
)
from lightning_cocod.launch.cluster import transfer_times
from tests.helpers.launchers import (
    has_left_our_network,
    namespaces_with,
    processes_with,
    signal_once_started,
    unique_prefix,
)

HELPERS = Path(__file__).resolve().parents[1] / "_launch_workers"
REPO = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces and tc need root; the unshaped fallback is tested apart"
)


# --- rates ---------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text, bps",
    [
        ("100mbit", 100_000_000),
        ("300mbit", 300_000_000),
        ("1gbit", 1_000_000_000),
        ("10gbit", 10_000_000_000),
        ("500kbit", 500_000),
        ("2.5gbit", 2_500_000_000),
        (" 300MBIT ", 300_000_000),
        ("none", None),
        ("unshaped", None),
        (None, None),
    ],
)
def test_parse_rate_reads_tc_forms_exactly(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["3 mbps", "300mbps", "fast", "mbit", "0mbit", "-5mbit", "1.0001kbit", ""])
def test_parse_rate_rejects_other_strings_naming_the_value(text):
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(text) in message
    assert "kbit, mbit or gbit" in message and "none" in message
    assert "\n" not in message


@pytest.mark.timeout(10)
def test_format_rate_round_trips():
    for text in ["500kbit", "8mbit", "300mbit", "1gbit", "1.5gbit", "10gbit"]:
        assert format_rate(parse_rate(text)) == text
    assert format_rate(None) == "unshaped"


@pytest.mark.timeout(10)
def test_burst_covers_one_tick_at_high_rates():
    assert netns.burst_bytes(parse_rate("100mbit")) == 256 * 1024
    ten_gbit_bytes = 10_000_000_000 // 8
    assert netns.burst_bytes(parse_rate("10gbit")) >= ten_gbit_bytes / 250


# --- the namespace -------------------------------------------------------------------------------


@needs_root
@pytest.mark.timeout(10)
def test_namespace_has_tbf_on_lo_and_is_deleted_after():
    prefix = unique_prefix()
    with shaped_namespace("300mbit", name_prefix=prefix) as link:
        assert link.shaped and link.rate == 300_000_000 and link.reason is None
        assert namespaces_with(prefix) == [link.name]
        qdisc = subprocess.run(
            ["ip", "netns", "exec", link.name, "tc", "qdisc", "show", "dev", "lo"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "tbf" in qdisc and "300Mbit" in qdisc
        assert link.wrap(["echo", "hi"]) == ["ip", "netns", "exec", link.name, "echo", "hi"]
        # The workers' view: lo is up, and it is the only interface.
        links = subprocess.run(
            link.wrap(["ip", "-o", "link"]), check=True, capture_output=True, text=True
        ).stdout
        assert len(links.splitlines()) == 1 and "lo:" in links and "UP" in links
    assert namespaces_with(prefix) == []


@needs_root
@pytest.mark.timeout(10)
def test_namespace_and_its_processes_are_gone_after_an_exception():
    prefix = unique_prefix()
    token = uuid.uuid4().hex
    with pytest.raises(KeyError), shaped_namespace("100mbit", name_prefix=prefix) as link:
        sleeper = subprocess.Popen(link.wrap([sys.executable, "-c", "import time; time.sleep(30)", token]))
        while not has_left_our_network(sleeper.pid):  # (the test's timeout guards against a hang)
            assert sleeper.poll() is None, "the sleeper ended before it was seen"
            time.sleep(0.05)
        assert processes_with(token)
        raise KeyError("inside the block")
    assert namespaces_with(prefix) == []
    assert processes_with(token) == []
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


@needs_root
@pytest.mark.timeout(10)
def test_namespace_of_a_dead_launcher_is_reclaimed_and_a_live_one_kept():
    """A SIGKILLed launcher runs no cleanup; the next run with the prefix removes what it left."""
    prefix = unique_prefix()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"{prefix}-{dead.pid}-abc123", f"{prefix}-{os.getpid()}-abc123"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with shaped_namespace("100mbit", name_prefix=prefix) as link:
            assert sorted(namespaces_with(prefix)) == sorted([live, link.name])
    finally:
        subprocess.run(["ip", "netns", "del", live], check=True)
        subprocess.run(["ip", "netns", "del", stale], check=False, capture_output=True)
    assert namespaces_with(prefix) == []


@pytest.mark.timeout(10)
def test_without_root_runs_unshaped_and_says_so(monkeypatch, capfd):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with shaped_namespace("300mbit") as link:
        assert not link.shaped and link.name is None and link.rate is None
        assert "root" in link.reason
        assert link.wrap(["echo"]) == ["echo"]
    warning = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warning) == 1 and "UNSHAPED" in warning[0] and "300mbit" in warning[0]


@needs_root
@pytest.mark.timeout(10)
def test_failing_ip_falls_back_with_a_warning(monkeypatch, capfd):
    monkeypatch.setattr(netns, "IP", "false")
    with shaped_namespace("300mbit") as link:
        assert not link.shaped and "could not create" in link.reason
    assert "UNSHAPED" in capfd.readouterr().err


@pytest.mark.timeout(10)
def test_no_rate_is_unshaped_without_a_warning(capfd):
    with shaped_namespace(None) as link:
        assert not link.shaped
    assert "WARNING" not in capfd.readouterr().err


@needs_root
@pytest.mark.timeout(20)
def test_shaped_loopback_limits_the_transfer_rate():
    """1 MB at 8 mbit/s: ~0.75 s once the 256 KiB burst is spent; a plain loopback takes ms."""

    def seconds(rate):  # from rank 0 to rank 1 of the link, until the last byte arrived
        with shaped_namespace(rate, name_prefix=unique_prefix()) as link:
            ((start, end),) = transfer_times(link, [(0, 1)], 1_000_000, timeout_s=10)
        return end - start

    plain, shaped = seconds(None), seconds("8mbit")
    print(f"1 MB over loopback: unshaped {plain:.3f} s, shaped to 8mbit {shaped:.3f} s")
    # No machine beats the shaper: 1 MB at 8 mbit/s takes at least ~0.75 s past the burst.
    assert shaped > 0.5
    # The unshaped loopback runs at many Gbit/s: the same transfer, measured here under the same
    # load, takes well under half the shaped one (a loopback shaped too would take as long).
    assert plain < shaped / 2


# --- launching workers ---------------------------------------------------------------------------


@needs_root
@pytest.mark.timeout(30)
def test_two_workers_all_reduce_inside_the_namespace(tmp_path):
    prefix = unique_prefix()
    results = launch_workers(
        str(HELPERS / "allreduce_worker.py"),
        2,
        "300mbit",
        timeout_s=25,
        output_dir=tmp_path,
        name_prefix=prefix,
    )
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["local_rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 and r["sum"] == [3.0] * 4 for r in results)
    # Both ranks shared one namespace, and it was not ours.
    assert results[0]["net_ns"] == results[1]["net_ns"] != os.readlink("/proc/self/ns/net")
    assert (tmp_path / "rank0.stderr").exists() and (tmp_path / "rank1.stdout").exists()
    assert namespaces_with(prefix) == []


@pytest.mark.timeout(30)
def test_function_target_runs_unshaped_without_root_and_says_so(monkeypatch, capfd):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    monkeypatch.syspath_prepend(str(HELPERS))
    allreduce_rank = importlib.import_module("allreduce_worker").allreduce_rank
    results = launch_workers(allreduce_rank, 2, "100mbit", args=["tag"], timeout_s=25)
    assert [r["sum"] for r in results] == [[3.0] * 4, [3.0] * 4]
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["net_ns"] == os.readlink("/proc/self/ns/net")
    warnings = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "UNSHAPED" in warnings[0]


@pytest.mark.timeout(30)
def test_failing_worker_is_named_and_nothing_is_left(tmp_path):
    prefix = unique_prefix()
    token = uuid.uuid4().hex
    rate = "300mbit" if os.geteuid() == 0 else None
    with pytest.raises(WorkerFailed) as info:
        # By module name this time, found through PYTHONPATH.
        launch_workers(
            "failing_worker",
            2,
            rate,
            args=[token],
            timeout_s=25,
            output_dir=tmp_path,
            env={"PYTHONPATH": str(HELPERS)},
            name_prefix=prefix,
            grace_s=2,
        )
    error = info.value
    assert isinstance(error, RuntimeError)
    assert error.rank == 1 and error.returncode == 1
    assert str(error).startswith("rank 1 exited with code 1")
    assert "boom" in str(error) and "ValueError" in error.stderr_tail
    # Survives the trip out of a subprocess (e.g. a sweep runner) with its fields.
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.rank, copy.returncode, str(copy)) == (1, 1, str(error))
    assert namespaces_with(prefix) == []
    assert processes_with(token) == []


@pytest.mark.timeout(20)
def test_worker_that_writes_no_result_is_a_failure(tmp_path):
    # `python -m site` prints sys.path and exits 0 without writing a result.
    with pytest.raises(WorkerFailed, match="rank 0 exited 0 but left no readable result"):
        launch_workers("site", 1, None, timeout_s=15, output_dir=tmp_path)


@pytest.mark.timeout(10)
def test_write_result_uses_the_launcher_path(tmp_path, monkeypatch):
    target = tmp_path / "rank3.result.json"
    monkeypatch.setenv(RESULT_ENV, str(target))
    write_result({"loss": [1.5, 0.25], "rank": 3})
    assert json.loads(target.read_text()) == {"loss": [1.5, 0.25], "rank": 3}
    assert list(tmp_path.iterdir()) == [target]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 1)),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (3, 4)),  # launch_workers, torchrun
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),  # srun
        (
            {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "9"},
            (1, 2),
        ),  # torchrun in a job
    ],
)
def test_rank_and_world_size_read_what_the_launcher_set(env, expected):
    assert rank_and_world_size(env) == expected


@pytest.mark.timeout(30)
def test_timeout_kills_every_worker(tmp_path):
    prefix = unique_prefix()
    rate = "300mbit" if os.geteuid() == 0 else None
    with pytest.raises(WorkersTimedOut) as info:  # (the test's own timeout guards against a hang)
        launch_workers(
            str(HELPERS / "sleeping_worker.py"),
            2,
            rate,
            args=[tmp_path],
            timeout_s=3,
            output_dir=tmp_path,
            name_prefix=prefix,
            grace_s=1,
        )
    assert "did not finish within 3 s" in str(info.value) and info.value.running_ranks == [0, 1]
    assert sorted(p.name for p in tmp_path.glob("started.*")) == ["started.0", "started.1"]
    assert processes_with(str(tmp_path)) == []
    assert namespaces_with(prefix) == []


def _launch_sleepers(prefix: str, marker_dir: str) -> None:
    # Ctrl-C as in a terminal: a suite started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    launch_workers(
        str(HELPERS / "sleeping_worker.py"),
        2,
        "100mbit",
        args=[marker_dir],
        timeout_s=60,
        output_dir=Path(marker_dir, "logs"),
        name_prefix=prefix,
    )


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signalled_launcher_removes_namespace_and_workers(tmp_path, sig):
    prefix = unique_prefix()

    def running() -> None:
        assert len(namespaces_with(prefix)) == 1
        assert len(processes_with(str(tmp_path))) == 2

    exitcode = signal_once_started(
        _launch_sleepers, (prefix, str(tmp_path)), tmp_path, 2, sig, while_running=running
    )
    # Died of an exception that ran the cleanup (SIGTERM: exit 143), not of the signal itself,
    # nor killed here because the cleanup outlasted the wait.
    assert exitcode not in (0, -sig, -signal.SIGKILL), exitcode
    if sig == signal.SIGTERM:
        assert exitcode == 128 + signal.SIGTERM
    assert namespaces_with(prefix) == []
    assert processes_with(str(tmp_path)) == []


def test_ranks_that_stop_together_on_preemption_are_a_preempted_run(tmp_path):
    # Rank 0 leaves first (exit 75); rank 1 follows 0.3 s later and is not killed meanwhile.
    with pytest.raises(WorkersPreempted, match="all 2 ranks stopped at one step"):
        launch_workers(
            str(HELPERS / "preemptible_worker.py"),
            2,
            None,
            args=[tmp_path, 0.2],
            timeout_s=30,
            output_dir=tmp_path,
            grace_s=1,
        )
    assert processes_with(str(tmp_path)) == []


def test_a_rank_that_fails_while_the_others_stop_is_a_failure_not_a_preemption(tmp_path):
    with pytest.raises(WorkerFailed, match="rank 1 exited with code 3") as info:
        launch_workers(
            str(HELPERS / "preemptible_worker.py"),
            2,
            None,
            args=[tmp_path, 0.2, "rank1-fails"],
            timeout_s=30,
            output_dir=tmp_path,
            grace_s=1,
        )
    assert not isinstance(info.value, WorkersPreempted) and info.value.rank == 1


def _launch_preemptible(marker_dir: str) -> None:
    try:
        launch_workers(
            str(HELPERS / "preemptible_worker.py"),
            2,
            None,
            args=[marker_dir],
            timeout_s=60,
            output_dir=Path(marker_dir, "logs"),
        )
    except WorkersPreempted:
        sys.exit(75)


@pytest.mark.timeout(30)
def test_sigterm_to_the_launcher_gives_the_workers_time_to_stop_together(tmp_path):
    exitcode = signal_once_started(_launch_preemptible, (str(tmp_path),), tmp_path, 2, signal.SIGTERM)
    assert exitcode == 75  # the workers got the signal and left with 75; nothing was killed
    assert processes_with(str(tmp_path)) == []


def _launch_preemptible_by_hand(marker_dir: str, mode: str) -> None:
    # Ctrl-C as in a terminal: a suite started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results = launch_workers(
            str(HELPERS / "preemptible_worker.py"),
            2,
            None,
            args=[marker_dir, "never", mode],
            timeout_s=60,
            output_dir=Path(marker_dir, "logs"),
        )
    except WorkersPreempted as stopped:
        sys.exit(130 if stopped.interrupted else 75)
    Path(marker_dir, "results.json").write_text(json.dumps(results))


@pytest.mark.timeout(30)
def test_ctrl_c_to_the_launcher_stops_the_workers_as_a_preemption_and_says_it_was_an_interrupt(tmp_path):
    exitcode = signal_once_started(
        _launch_preemptible_by_hand, (str(tmp_path), "stops"), tmp_path, 2, signal.SIGINT
    )
    assert exitcode == 130  # WorkersPreempted(interrupted=True): the workers left with 75, not killed
    assert processes_with(str(tmp_path)) == []


def _launch_signalled_while_starting(marker_dir: str, sig: int) -> None:
    # The signal comes once both workers are up (handlers installed, `started.*` written) but
    # while the launcher is still inside its start-up, signals held: the moment a loaded machine
    # can give any launch. It is sent from within the start-up so that no timing decides it.
    real_popen = subprocess.Popen
    spawned = []

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        spawned.append(proc)
        if len(spawned) == 2:
            while len(list(Path(marker_dir).glob("started.*"))) < 2:  # (the test's timeout: a hang)
                time.sleep(0.05)
            os.kill(os.getpid(), sig)
        return proc

    subprocess.Popen = popen  # in this forked launcher only
    _launch_preemptible_by_hand(marker_dir, "stops")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_the_launcher_starts_the_workers_still_stops_them_together(tmp_path, sig, code):
    launcher = multiprocessing.get_context("fork").Process(
        target=_launch_signalled_while_starting, args=(str(tmp_path), sig)
    )
    launcher.start()
    try:
        launcher.join(timeout=45)
    finally:
        launcher.kill()
        launcher.join()
    # Not 143 / a KeyboardInterrupt traceback: the held signal was raised where it stops the workers.
    assert launcher.exitcode == code
    assert processes_with(str(tmp_path)) == []


@pytest.mark.timeout(30)
def test_a_stop_that_comes_as_the_workers_finish_keeps_their_results(tmp_path):
    exitcode = signal_once_started(
        _launch_preemptible_by_hand, (str(tmp_path), "finishes"), tmp_path, 2, signal.SIGTERM
    )
    assert exitcode == 0
    assert json.loads((tmp_path / "results.json").read_text()) == [{"rank": 0}, {"rank": 1}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shadow", ["the clone's folder", "a module"])
def test_workers_never_import_from_the_current_folder(tmp_path, shadow):
    # The README's layout: `git clone ... lightning_cocod`, then commands run from the folder that
    # holds the clone; or a lightning_cocod.py of the user's lying there.
    marker = tmp_path / "imported-from-cwd"
    if shadow == "a module":
        (tmp_path / "lightning_cocod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    else:
        (tmp_path / "lightning_cocod").mkdir()
        (tmp_path / "lightning_cocod" / "README.md").write_text("a clone, not the package\n")
    # run_name's module needs the package itself (its version), not a folder of the same name.
    results = launch_workers(
        "lightning_cocod.app.identity:run_name", 2, None, args=["cocod", 4, 2, 0], timeout_s=50, cwd=tmp_path
    )
    assert results == ["cocod-tau4-w2-s0", "cocod-tau4-w2-s0"]
    # A module target (python -m), here one that runs and writes no result.
    with pytest.raises(WorkerFailed, match="rank 0 exited 0 but left no readable result"):
        launch_workers(
            "lightning_cocod.launch.netns", 1, None, timeout_s=15, output_dir=tmp_path / "logs", cwd=tmp_path
        )
    assert not marker.exists()


class _Counters:
    """The kernel's OOM-kill counters as ``launch_workers`` reads them: ``after`` from the second read on."""

    def __init__(self, before, after):
        self.reads, self.before, self.after = 0, before, after

    def __call__(self):
        self.reads += 1
        return self.before if self.reads == 1 else self.after


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        (
            {"/cg/memory.events": 4},
            {"/cg/memory.events": 5},
            "rank 0 was killed by SIGKILL, probably out of memory (the kernel's OOM killer killed 1 process(es) of "
            "this run's memory cgroup since the workers started); logs in ",
        ),
        ({"/cg/memory.events": 4}, {"/cg/memory.events": 4}, "rank 0 was killed by SIGKILL; logs in "),
        (None, None, "rank 0 was killed by SIGKILL; logs in "),  # no counter readable: nothing is claimed
    ],
    ids=["oom-killer-struck", "it-did-not", "unreadable"],
)
def test_a_rank_killed_by_sigkill_is_said_to_be_out_of_memory_when_the_kernel_says_so(
    tmp_path, before, after, said
):
    counters = _Counters(before, after)
    with pytest.raises(WorkerFailed) as info:
        launch_workers(
            str(HELPERS / "killed_worker.py"),
            2,
            None,
            args=["60"],
            timeout_s=100,
            output_dir=tmp_path,
            grace_s=2,
            read_oom_kills=counters,
        )
    assert str(info.value).startswith(said) and info.value.rank == 0
    assert counters.reads >= 2  # read when the workers started, and when the rank died


def test_the_oom_kill_counters_are_read_from_this_process_cgroups():
    from lightning_cocod.launch.workers import oom_kill_counts

    counts = oom_kill_counts()
    if counts is None:
        pytest.skip("no memory cgroup counter readable on this machine")
    assert all(isinstance(n, int) and n >= 0 for n in counts.values())
    assert all(path.endswith(("memory.events", "memory.oom_control")) for path in counts)
