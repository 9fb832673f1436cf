"""S-SGD with torch's DDP compression hooks, the baselines for compressed CoCoD rounds: the bf16
hook's trajectory is the reference S-SGD with the mean gradient reduced in bf16 (and not the fp32
one), and each named hook is the one DDP runs."""

import pytest
import torch

from lightning_cocod import SSGDStrategy
from tests.helpers import toy
from tests.strategies.test_against_reference import STEPS, WORLD, assert_matches, fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def test_a_hook_of_another_name_is_refused():
    with pytest.raises(ValueError, match="comm_hook='int8' is invalid; accepted: None, bf16, fp16, powersgd"):
        SSGDStrategy(comm_hook="int8")
    with pytest.raises(ValueError, match="powersgd_rank=0 is invalid"):
        SSGDStrategy(comm_hook="powersgd", powersgd_rank=0)


def _bf16_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    """torch's bf16_compress_hook: each rank's gradient in bf16 over the world size, summed in bf16."""
    total = None
    for g in grads:
        part = g.to(torch.bfloat16).div_(len(grads))
        total = part if total is None else total + part
    return total.to(grads[0].dtype)


def test_bf16_hook_reduces_the_gradients_in_bf16(tmp_path):
    ranks = fit(SSGDStrategy(comm_hook="bf16", start_method="fork"), tmp_path)
    expected = toy.reference_ssgd(WORLD, STEPS, mean=_bf16_mean)
    assert (
        max(abs(a - b) for a, b in zip(expected[1][0], toy.reference_ssgd(WORLD, STEPS)[1][0])) > 1e-6
    )  # bf16 changes the numbers: the test tells the two apart
    assert_matches(ranks, *expected)


class HookNamed(toy.ToyRegression):
    def on_train_end(self) -> None:
        self.hook_name = self.trainer.strategy.model._get_ddp_logging_data().get("comm_hook")
        (self.out_dir_path / f"hook{self.global_rank}.txt").write_text(str(self.hook_name))


@pytest.mark.parametrize(
    "name, hook",
    [("powersgd", "powerSGD_hook"), ("fp16", "fp16_compress_hook"), ("bf16", "bf16_hook_on_gloo")],
)
def test_the_named_hook_is_the_one_ddp_runs(tmp_path, name, hook):
    module = HookNamed(STEPS, str(tmp_path))
    module.out_dir_path = tmp_path
    fit(SSGDStrategy(comm_hook=name, start_method="fork"), tmp_path, module=module)
    for rank in range(WORLD):
        assert hook in (tmp_path / f"hook{rank}.txt").read_text()
