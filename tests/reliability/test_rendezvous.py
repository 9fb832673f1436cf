"""A single-node run listens on loopback only (its store and gloo's connections)."""

import json
import os

import pytest
import pytorch_lightning as pl

from lightning_cocod import CoCoDStrategy
from tests.strategies.test_against_reference import fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def listening_addresses(pid: int) -> list[str]:
    """Local addresses of this process's listening TCP sockets, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    found.append(local.split(":")[0])
    return found


class RecordListeners(pl.Callback):
    def __init__(self, out_dir):
        self.out_dir = out_dir

    def on_train_start(self, trainer, pl_module):
        path = self.out_dir / f"listen{trainer.global_rank}.json"
        path.write_text(json.dumps(listening_addresses(os.getpid())))


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc writes them


def test_single_node_run_listens_on_loopback_only(tmp_path):
    fit(CoCoDStrategy(tau=2, start_method="fork"), tmp_path, steps=4, callbacks=[RecordListeners(tmp_path)])
    listeners = [json.loads((tmp_path / f"listen{r}.json").read_text()) for r in range(2)]
    assert listeners[0], "rank 0 hosts the store: it must listen somewhere"
    for addresses in listeners:
        assert set(addresses) <= LOOPBACK, addresses


def test_under_torchruns_agent_store_a_loopback_run_still_keeps_gloo_on_loopback(monkeypatch):
    # Two torchrun agents on one machine (--master-addr=127.0.0.1): the agent hosts the store and
    # torch's env:// set-up runs, but gloo must still not listen where the hostname resolves.
    from datetime import timedelta

    import torch

    from lightning_cocod.strategies.rendezvous import init_default_group

    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert not init_default_group("127.0.0.1", 29500, 1, 2, "gloo", timedelta(seconds=5), torch.device("cpu"))
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    # A multi-node run (a routable MASTER_ADDR) is left to choose its interface.
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert not init_default_group("192.0.2.7", 29500, 1, 2, "gloo", timedelta(seconds=5), torch.device("cpu"))
    assert "GLOO_SOCKET_IFNAME" not in os.environ
