"""Isolation between tests that run training in the pytest process itself, and a private temp
folder for the whole session: torch's spawn leaves a ``pytorch-errorfile-*.pickle`` in the temp
folder for every process it starts, and pytest keeps its own ``pytest-of-<user>`` there."""

import os
import shutil
import tempfile

import pytest
import torch.distributed as dist

_SESSION_TMP: str | None = None


def pytest_configure(config):
    global _SESSION_TMP
    if _SESSION_TMP is not None:
        return
    _SESSION_TMP = tempfile.mkdtemp(prefix="cocod-tests-")
    # tempfile reads TMPDIR once and caches it; subprocesses read the variable.
    os.environ["TMPDIR"] = tempfile.tempdir = _SESSION_TMP


def pytest_collection_modifyitems(config, items):
    # The long tests first, so that under xdist (-n 2) they start while the short ones can still
    # fill the other worker, instead of one of them running alone at the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionfinish(session, exitstatus):
    global _SESSION_TMP
    if _SESSION_TMP is not None:
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)
        _SESSION_TMP = None


@pytest.fixture(autouse=True)
def _isolated_process_group_and_wandb(monkeypatch):
    # A single-device fit in this process leaves a world-1 process group behind; a later test's
    # forked workers would inherit it and skip their own rendezvous. It also leaves LOCAL_RANK,
    # MASTER_PORT & co. in os.environ, which would make a later test's subprocess Trainer believe
    # its processes were started for it: the environment is restored after every test.
    environ = dict(os.environ)
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "disabled"))
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(environ)
