"""A peer that stays alive but stops talking (a hung data loader, a stuck filesystem) ends the
run on the other ranks with WorkerLostError once the collective timeout passes, the cause being
the timeout (not a lost connection: the stalled process is still there)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.test_failures import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def test_a_stalled_peer_ends_the_run_by_the_timeout(tmp_path):
    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests._launch_workers.stalling_worker", str(tmp_path), "5", "4"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        code = procs[0].wait(timeout=200)  # a guard against a hang, not a measurement
        stalled_alive = procs[1].poll() is None
        err = procs[0].stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert (tmp_path / "stalled").read_text() == "5"
    assert stalled_alive  # the peer never died: only the timeout can have ended rank 0
    assert code != 0
    lost = [line for line in err.splitlines() if "WorkerLostError" in line]
    assert lost, err[-2000:]
    # gloo's cause names a timeout ("Application timeout caused pair closure", or "Timed out"
    # in other versions), where a dead peer's names a closed connection.
    cause = lost[-1].partition("failed")[2].partition("A worker died or stalled")[0]
    assert "rank 0" in lost[-1] and ("timeout" in cause or "Timed out" in cause), lost[-1]
    assert "by peer" not in cause
