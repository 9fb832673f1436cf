"""``on_nonfinite="skip"`` on 2 gloo processes, step by step against a reference: the update that
would carry the NaN is dropped on every rank, the bad rank takes the healthy rank's model and
restarts its optimizer (momentum would carry the NaN on), and training goes on as before."""

import pytest
import torch

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy
from tests.helpers import toy
from tests.reliability.test_failures import PoisonRank1
from tests.strategies.test_against_reference import WORLD, fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]
STEPS, TAU, POISON_AFTER = 16, 4, 6  # NaN put into rank 1's weights after optimizer step 6


def reference(method: str):
    """Per-step weights of each rank and the final weights, with rank 1's ``weight[0, 0]`` set to
    NaN after step POISON_AFTER and the skip policy applied at the next round end that sees it:
    Local-SGD at its next average; CoCoD when the round whose snapshot holds the NaN finishes (the
    round finishing first merges only rank 1's own NaN into rank 1)."""
    w = toy._Workers(WORLD, STEPS)
    trajectory, snaps = [], None
    for step in range(STEPS):
        if step % TAU == 0:
            snaps = w.snapshot()
        w.grads(step)
        for opt in w.opts:
            opt.step()
        if step + 1 == POISON_AFTER:
            with torch.no_grad():
                w.models[1].weight[0, 0] = float("nan")
        if (step + 1) % TAU == 0:
            seen = snaps if method == "cocod" else w.snapshot()
            if any(torch.isnan(t).any() for rank in seen for t in rank):
                with torch.no_grad():  # skip: the update is dropped everywhere, rank 1 restarts
                    for bad, good in zip(w.params(1), w.params(0)):
                        bad.copy_(good)
                w.opts[1].state.clear()
            elif method == "cocod":
                with torch.no_grad():
                    for k in range(len(snaps[0])):
                        avg = sum(snaps[r][k] for r in range(WORLD)) / WORLD
                        for r in range(WORLD):
                            p = w.params(r)[k]
                            p.copy_(avg + (p - snaps[r][k]))
            else:
                w.average()
        trajectory.append(w.state())
    w.average()
    return trajectory, w.state()


@pytest.mark.parametrize(
    "method, strategy_cls",
    [("cocod", CoCoDStrategy), ("local_sgd", LocalSGDStrategy)],
    ids=["cocod", "local_sgd"],
)
def test_skip_drops_the_update_and_restarts_the_bad_rank_from_the_healthy_one(tmp_path, method, strategy_cls):
    ranks = fit(
        strategy_cls(tau=TAU, on_nonfinite="skip", start_method="fork"),
        tmp_path,
        steps=STEPS,
        callbacks=[PoisonRank1(POISON_AFTER)],
    )
    trajectory, final = reference(method)
    # Without the optimizer restart rank 1's momentum would stay NaN; without the skip the NaN
    # would have reached rank 0: the reference is finite from the recovery on, on both ranks.
    assert all(torch.isfinite(torch.tensor(step[r])).all() for step in trajectory[-4:] for r in range(WORLD))
    for r, record in enumerate(ranks):
        got = torch.tensor(record["trajectory"], dtype=torch.float64)
        want = torch.tensor([step[r] for step in trajectory], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, equal_nan=True)
        torch.testing.assert_close(torch.tensor(record["final"]), torch.tensor(final[r]), rtol=0, atol=1e-6)
    assert torch.isnan(torch.tensor(ranks[1]["trajectory"][POISON_AFTER])).any()  # it really went bad
