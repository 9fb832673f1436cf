"""A scheduler's SIGTERM to cocod-train itself, with real workers, then the same job requeued with
``checkpoint.resume=auto``, twice: the first stop checkpoints and exits 75 with the command that
resumes; the requeue continues from that checkpoint to the end and writes the record; a further
requeue of the finished job leaves its record as it is."""

import json
import signal

import pytest
import torch

from tests.test_train_app import _signal_rank_one, run_app

STEPS_PER_EPOCH = 64  # 4096 samples, 32 per rank x 2 ranks


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_sigterm_to_the_app_then_requeues_with_resume_auto_finish_the_job_once(tmp_path):
    common = ["experiment=smoke", "data=synthetic", "logger=none", f"out_root={tmp_path / 'out'}", "run_id=q1"]
    common += ["data.num_samples=4096", "data.num_eval_samples=64", "model.net.width=8", "step_time_warmup=1"]
    folder = tmp_path / "out" / "smoke" / "q1"
    code, console, errors = _signal_rank_one(
        tmp_path, folder, r"step ([3-9]|\d\d+)/", signal.SIGTERM, *common, "max_epochs=50",
        "progress_every_s=0.5", "checkpoint.resume=auto", app_itself=True,
    )
    assert code == 75, (console + errors)[-3000:]
    last = folder / "checkpoints" / "last.ckpt"
    line = next(x for x in console.splitlines() if " preempted; " in x)
    assert line.startswith(f"cocod-tau4-w2-s0: preempted; checkpoint {last}; resume with: cocod-train ")
    assert not (folder / "run.json").exists()  # not finished, so not recorded as if it were
    saved = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    epochs = saved // STEPS_PER_EPOCH + 1  # the requeue trains to the end of the epoch it stopped in

    requeued = run_app(tmp_path, *common, f"max_epochs={epochs}", "checkpoint.resume=auto")
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    record = json.loads((folder / "run.json").read_text())
    assert record["resumed_from"] == str(last)
    assert record["steps"] == STEPS_PER_EPOCH * epochs
    assert record["steps_trained"] == STEPS_PER_EPOCH * epochs - saved  # continued, not restarted

    before = (folder / "run.json").read_bytes()
    again = run_app(tmp_path, *common, f"max_epochs={epochs}", "checkpoint.resume=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finished already" in again.stdout + again.stderr
    assert (folder / "run.json").read_bytes() == before
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == STEPS_PER_EPOCH * epochs
