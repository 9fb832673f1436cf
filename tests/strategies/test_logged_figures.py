"""The round figures a logger receives (comm/*) on 2 gloo processes, checked against the rounds
the strategy recorded: every logged value is the figure of the last round finished by that step,
the running hidden share is recomputed here from the rounds, comm/tau is the period in force and
comm/overlap the steps the round's all-reduce ran alongside."""

import json
from pathlib import Path

import pytest
from pytorch_lightning.loggers import Logger

from lightning_cocod import CoCoDStrategy, DiLoCoStrategy, LocalSGDStrategy
from tests.strategies.test_against_reference import fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class RecordingLogger(Logger):
    """Keeps what it is given and writes it at the end of fit (it lives in the rank's process)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.rows = path, []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append({"step": step, **{k: float(v) for k, v in metrics.items() if k.startswith("comm/")}})

    def finalize(self, status: str) -> None:
        if self.rows:  # rank 0's logger is the one the strategy writes to
            self.path.write_text(json.dumps(self.rows))


@pytest.mark.parametrize(
    "strategy, tau, overlap",
    [
        (lambda: CoCoDStrategy(tau=2, start_method="fork"), 2, 2),
        (lambda: LocalSGDStrategy(tau=3, start_method="fork"), 3, None),
        (lambda: DiLoCoStrategy(tau=3, overlap=1, start_method="fork"), 3, 1),
    ],
    ids=["cocod", "local_sgd", "diloco-overlap-1"],
)
def test_logged_round_figures_are_the_recorded_rounds(tmp_path, strategy, tau, overlap):
    path = tmp_path / "logged.json"
    ranks = fit(strategy(), tmp_path, logger=RecordingLogger(path), log_every_n_steps=1)
    rounds = ranks[0]["rounds"]  # [launch_step, finish_step] per round
    waits = ranks[0]["waits"]  # [exposed_seconds, comm_seconds] per round
    rows = [r for r in json.loads(path.read_text()) if "comm/round_seconds" in r]
    finished_in_fit = [k for k, (_, finish) in enumerate(rounds) if finish < toy_steps(ranks)]
    # One row per round that finished before the last step began (the merge at the end of fit
    # has no later step to be logged at).
    assert len(rows) == len(finished_in_fit) >= 2
    for row in rows:
        k = max(i for i, (_, finish) in enumerate(rounds) if finish <= row["step"])
        exposed, comm = waits[k]
        assert row["comm/exposed_seconds"] == pytest.approx(exposed, rel=1e-9, abs=1e-12)
        assert row["comm/round_seconds"] == pytest.approx(comm, rel=1e-9, abs=1e-12)
        assert row["comm/hidden_fraction"] == pytest.approx(min(1.0, max(0.0, 1 - exposed / comm)), abs=1e-9)
        # Blocking or waited before the next launch: the rounds never overlap, so the busy time
        # of the link is the plain sum of their durations.
        total_exposed = sum(w[0] for w in waits[: k + 1])
        total_comm = sum(w[1] for w in waits[: k + 1])
        assert row["comm/hidden_fraction_total"] == pytest.approx(
            min(1.0, max(0.0, 1 - total_exposed / total_comm)), abs=1e-6
        )
        assert row["comm/tau"] == tau
        assert row.get("comm/overlap") == overlap
        assert row["comm/payload_bytes"] == (4 * 2 + 2) * 8  # Linear(4, 2) in float64


def toy_steps(ranks) -> int:
    return len(ranks[0]["trajectory"])
