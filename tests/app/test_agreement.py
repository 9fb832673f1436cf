"""What the ranks of one run must agree on (checked end to end by tests/launch/test_multinode.py, two
torchrun agents with different seeds or model widths): every setting that changes what a rank
computes is compared, a node's own paths and waits are not, and the first difference is named."""

import pytest
from hydra import compose, initialize_config_dir

from lightning_cocod.app.agreement import disagreement, must_agree
from lightning_cocod.app.preflight import config_dir


def values(*overrides: str) -> dict:
    with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="train"):
        return must_agree(compose("train", ["experiment=smoke", "run_id=r", *overrides]))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("tau=8", "strategy.tau"),
        ("data.batch_size=16", "data.batch_size"),
        ("max_steps=7", "max_steps"),
        ("max_epochs=3", "max_epochs"),
        ("seed=1", "seed"),
        ("strategy=local_sgd", "strategy._target_"),
    ],
)
def test_every_setting_that_changes_the_computation_is_compared_and_named(override, key):
    problem = disagreement([values(), values(override)])
    assert problem is not None and problem.startswith(f"rank 1 disagrees with rank 0 on {key}: "), problem


def test_a_nodes_own_data_folder_and_timeout_may_differ():
    local = ("data=cifar10", "data.root=/elsewhere", "strategy.timeout=99")
    assert disagreement([values("data=cifar10"), values(*local)]) is None
