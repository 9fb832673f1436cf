"""The pure-tensor core against hand-computed values and the algorithm's invariants."""

import copy
import math

import pytest
import torch

from lightning_cocod.core import CoCoDRound, FlatBuffer, GradientPipeline, average_blocking, has_nonfinite
from tests.helpers.fake_comm import FakeCluster


def test_flat_buffer_views_alias_one_bucket_per_dtype():
    a, b, c = torch.arange(6.0).view(2, 3), torch.tensor([7.0]), torch.tensor([1, 2], dtype=torch.float64)
    flat = FlatBuffer([a, b, c])
    assert [v.shape for v in flat.views] == [a.shape, b.shape, c.shape]
    assert [v.dtype for v in flat.views] == [torch.float32, torch.float32, torch.float64]
    assert len(flat.buckets) == 2 and flat.nbytes == 7 * 4 + 2 * 8
    flat.pack([a, b, c])
    assert flat.buckets[0].tolist() == [0, 1, 2, 3, 4, 5, 7]
    flat.buckets[0].mul_(2)  # a write to the bucket is a write through every view
    out = [torch.zeros_like(t) for t in (a, b, c)]
    flat.unpack(out)
    assert out[0].tolist() == [[0, 2, 4], [6, 8, 10]] and out[1].item() == 14 and out[2].tolist() == [1, 2]


def test_flat_buffer_swap_exchanges_contents():
    x = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    flat = FlatBuffer(x)
    flat.pack([torch.tensor([9.0, 8.0]), torch.tensor([[7.0]])])
    flat.swap(x)
    assert x[0].tolist() == [9, 8] and x[1].item() == 7
    assert flat.buckets[0].tolist() == [1, 2, 3]


def test_cocod_round_hand_computed():
    cluster = FakeCluster(2)
    xs = [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 4.0])]]
    rounds = [CoCoDRound(x, comm) for x, comm in zip(xs, cluster.comms)]
    for r in rounds:
        r.begin()
    xs[0][0] += torch.tensor([1.0, 0.0])  # local progress during the round
    xs[1][0] += torch.tensor([0.0, 2.0])
    for r in rounds:
        r.finish()
    # avg of snapshots = [2, 3]; each adds its own progress
    assert xs[0][0].tolist() == [3.0, 3.0]
    assert xs[1][0].tolist() == [2.0, 5.0]


@pytest.mark.parametrize(
    "progress, expected",
    [
        # avg of snapshots = [2, 3]; each adds half of its own progress
        (0.5, ([2.5, 3.0], [2.0, 4.0])),
        # an outer step: each adds twice its own progress, so the mean moves by twice [0.5, 1]
        (2.0, ([4.0, 3.0], [2.0, 7.0])),
    ],
)
def test_cocod_round_scaling_the_progress_hand_computed(progress, expected):
    cluster = FakeCluster(2)
    xs = [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 4.0])]]
    rounds = [CoCoDRound(x, comm, progress=progress) for x, comm in zip(xs, cluster.comms)]
    for r in rounds:
        r.begin()
    xs[0][0] += torch.tensor([1.0, 0.0])
    xs[1][0] += torch.tensor([0.0, 2.0])
    for r in rounds:
        r.finish()
    assert (xs[0][0].tolist(), xs[1][0].tolist()) == expected


@pytest.mark.parametrize("progress", [0, -0.5, math.inf, math.nan, True, "half"])
def test_progress_that_is_no_positive_number_is_refused(progress):
    with pytest.raises(
        ValueError, match="progress=.* is invalid; accepted: a positive number \\(1: the paper's merge"
    ):
        CoCoDRound([torch.zeros(2)], FakeCluster(1).comms[0], progress=progress)


def _simulate(world, rounds, tau, lr=0.1, seed=0, weights=None, progress=1.0):
    """Workers with a linear model and their own SGD-momentum, rounds through the core."""
    torch.manual_seed(seed)
    base = torch.nn.Linear(4, 2).double()
    models = [copy.deepcopy(base) for _ in range(world)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in models]
    cluster = FakeCluster(world)
    tensors = [[p.detach() for p in m.parameters()] for m in models]
    cocod = [
        CoCoDRound(t, c, None if weights is None else weights[i], progress=progress)
        for i, (t, c) in enumerate(zip(tensors, cluster.comms))
    ]
    history = []
    for _ in range(rounds):
        for r in cocod:
            r.begin()
        snaps = [[t.clone() for t in ts] for ts in tensors]
        for _ in range(tau):
            for m, o in zip(models, opts):
                x = torch.randn(8, 4, dtype=torch.float64)
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), x[:, :2] * 3).backward()
                o.step()
        before = [[t.clone() for t in ts] for ts in tensors]
        for r in cocod:
            r.finish()
        history.append((snaps, before, [[t.clone() for t in ts] for ts in tensors]))
    return history


@pytest.mark.parametrize("world", [2, 3])
def test_merge_preserves_mean_and_differences(world):
    for snaps, before, after in _simulate(world, rounds=3, tau=3):
        for k in range(len(before[0])):
            mean_before = sum(b[k] for b in before) / world
            mean_after = sum(a[k] for a in after) / world
            torch.testing.assert_close(mean_after, mean_before, rtol=0, atol=1e-12)
            deltas = [before[i][k] - snaps[i][k] for i in range(world)]
            for i in range(world):
                for j in range(world):
                    torch.testing.assert_close(
                        after[i][k] - after[j][k], deltas[i] - deltas[j], rtol=0, atol=1e-12
                    )


@pytest.mark.parametrize("weights", [None, [0.7, 0.3]])
def test_partial_progress_shrinks_differences_and_moves_the_mean_by_that_share(weights):
    # x_i <- avg + lambda D_i: differences become lambda (D_i - D_j), the (weighted) mean moves
    # from the snapshots' by lambda times the (weighted) mean progress.
    lam, world = 0.4, 2
    p = weights or [1 / world] * world
    for snaps, before, after in _simulate(world, rounds=3, tau=2, weights=weights, progress=lam):
        for k in range(len(before[0])):
            deltas = [before[i][k] - snaps[i][k] for i in range(world)]
            torch.testing.assert_close(
                after[0][k] - after[1][k], lam * (deltas[0] - deltas[1]), rtol=0, atol=1e-12
            )
            mean_snap = sum(pi * s[k] for pi, s in zip(p, snaps))
            mean_delta = sum(pi * d for pi, d in zip(p, deltas))
            mean_after = sum(pi * a[k] for pi, a in zip(p, after))
            torch.testing.assert_close(mean_after, mean_snap + lam * mean_delta, rtol=0, atol=1e-12)


def test_weighted_merge_preserves_weighted_mean():
    p = [0.7, 0.3]
    for snaps, before, after in _simulate(2, rounds=2, tau=2, weights=p):
        for k in range(len(before[0])):
            wb = sum(pi * b[k] for pi, b in zip(p, before))
            wa = sum(pi * a[k] for pi, a in zip(p, after))
            torch.testing.assert_close(wa, wb, rtol=0, atol=1e-12)
            expected_avg = sum(pi * s[k] for pi, s in zip(p, snaps))
            torch.testing.assert_close(
                after[0][k], expected_avg + before[0][k] - snaps[0][k], rtol=0, atol=1e-12
            )


def test_zero_lr_round_gives_the_average():
    # Workers at different points, no progress during the round: the merge lands on their mean.
    cluster = FakeCluster(3)
    xs = [[torch.tensor([float(i), 10.0 * i])] for i in range(3)]
    rs = [CoCoDRound(x, c) for x, c in zip(xs, cluster.comms)]
    for r in rs:
        r.begin()
    for r in rs:
        r.finish()
    for x in xs:
        torch.testing.assert_close(x[0], torch.tensor([1.0, 10.0]))


def test_one_worker_is_plain_sgd_bit_for_bit():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    rnd = CoCoDRound([p.detach() for p in model.parameters()], FakeCluster(1).comms[0])
    data = [torch.randn(16, 5) for _ in range(12)]
    for step, x in enumerate(data):
        if not rnd.pending:
            rnd.begin()
        for m, o in ((model, opt), (twin, opt_twin)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
        if (step + 1) % 4 == 0:
            rnd.finish()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_all_equal_progress_coincides_with_local_sgd():
    cluster, local = FakeCluster(2), FakeCluster(2)
    xs = [[torch.tensor([1.0, -1.0])], [torch.tensor([5.0, 3.0])]]
    ys = [[x[0].clone()] for x in xs]
    rs = [CoCoDRound(x, c) for x, c in zip(xs, cluster.comms)]
    for r in rs:
        r.begin()
    for x, y in zip(xs, ys):  # the same progress D on every worker
        x[0] += torch.tensor([0.5, 0.25])
        y[0] += torch.tensor([0.5, 0.25])
    for r in rs:
        r.finish()
    # Local-SGD on the same models: average the live models
    scratch = [FlatBuffer(y) for y in ys]
    for s, y in zip(scratch, ys):
        s.pack(y)
    handles = [c.start_mean(s.buckets) for s, c in zip(scratch, local.comms)]
    for h, s, y in zip(handles, scratch, ys):
        h.wait()
        s.unpack(y)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x[0], y[0])


def test_average_blocking_weighted():
    cluster = FakeCluster(2)
    xs = [[torch.tensor([2.0])], [torch.tensor([6.0])]]
    # blocking average needs both launched before either waits: drive rank 1's launch first.
    s1 = FlatBuffer(xs[1])
    s1.pack(xs[1])
    h1 = cluster.comms[1].start_mean(s1.buckets, 0.25)
    average_blocking(xs[0], FlatBuffer(xs[0]), cluster.comms[0], 0.75)
    h1.wait()
    s1.unpack(xs[1])
    assert xs[0][0].item() == 3.0 and xs[1][0].item() == 3.0


def test_round_misuse_is_an_error():
    r = CoCoDRound([torch.zeros(2)], FakeCluster(1).comms[0])
    with pytest.raises(RuntimeError, match="no round pending"):
        r.finish()
    r.begin()
    with pytest.raises(RuntimeError, match="still pending"):
        r.begin()


def test_gradient_pipeline_applies_previous_mean_gradient():
    cluster = FakeCluster(2)
    params = [[torch.zeros(2, requires_grad=True)] for _ in range(2)]
    pipes = [GradientPipeline(p, c) for p, c in zip(params, cluster.comms)]
    grads = {1: ([1.0, 2.0], [3.0, 6.0]), 2: ([10.0, 0.0], [0.0, 10.0]), 3: ([0.0, 0.0], [4.0, 4.0])}
    seen = []
    for step in (1, 2, 3):
        for rank in range(2):
            params[rank][0].grad = torch.tensor(grads[step][rank])
            pipes[rank].exchange()
        seen.append([None if p[0].grad is None else p[0].grad.tolist() for p in params])
    assert seen[0] == [None, None]  # first step: nothing to apply yet
    assert seen[1] == [[2.0, 4.0], [2.0, 4.0]]  # mean of step 1
    assert seen[2] == [[5.0, 5.0], [5.0, 5.0]]  # mean of step 2
    # the all-reduce launched at step t is waited on at step t+1
    waits = [(e, r, i) for e, r, i in cluster.log if e == "wait"]
    assert [i for _, _, i in waits] == [0, 0, 1, 1]
    for pipe in pipes:
        pipe.drain()


def test_comm_stats_counts_overlapping_collectives_once():
    from lightning_cocod.core import CommStats, RoundRecord

    stats = CommStats()
    # (launch, comm, exposed): the second is queued behind the first, the third stands alone
    for launch, comm, exposed in ((0.0, 1.0, 0.1), (0.5, 1.5, 0.2), (3.0, 1.0, 0.0)):
        stats.add(RoundRecord(0, 1, comm, exposed, 8, launch))
    assert stats.comm_seconds == 3.0  # [0, 2] and [3, 4]
    assert abs(stats.exposed_seconds - 0.3) < 1e-12
    assert abs(stats.hidden_fraction - 0.9) < 1e-12
    assert stats.nbytes == 24 and stats.rounds[1].hidden_fraction == 1 - 0.2 / 1.5
    # Read as a collection, it is its rounds in order.
    assert len(stats) == 3 and [r.launched_at for r in stats] == [0.0, 0.5, 3.0]


def test_comm_stats_summary_tells_the_bytes_sent_from_the_payload():
    from lightning_cocod.core import CommStats, RoundRecord

    stats = CommStats()
    # An int8 run: its first round is exact fp32, the next sends about a quarter of its payload.
    stats.add(RoundRecord(0, 4, 1.0, 0.0, 400, 0.0, bytes_sent=400, bytes_received=400))
    stats.add(RoundRecord(4, 8, 1.0, 0.0, 400, 2.0, bytes_sent=101, bytes_received=101, codec_seconds=0.01))
    summary = stats.summary()
    assert "bytes" not in summary  # a bare "bytes" was the payload, read as what was sent
    assert (summary["bytes_sent"], summary["bytes_received"], summary["payload_bytes"]) == (501, 501, 800)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_has_nonfinite_agrees_with_an_elementwise_check(dtype):
    finfo = torch.finfo(dtype)
    cases = {
        "finite": torch.linspace(-3, 3, 1000),
        "nan": torch.tensor([1.0, float("nan"), 2.0]),
        "inf": torch.tensor([1.0, float("inf")]),
        "-inf": torch.tensor([float("-inf"), 0.0]),
        "inf and -inf (sum is nan)": torch.tensor([float("inf"), float("-inf")]),
        # Finite values whose sum overflows: must not be reported as non-finite.
        "overflowing sum": torch.full((8,), finfo.max, dtype=dtype),
        "empty": torch.empty(0),
    }
    for name, values in cases.items():
        buckets = [torch.zeros(3, dtype=dtype), values.to(dtype), torch.arange(4)]  # an integer bucket too
        expected = not all(bool(torch.isfinite(b).all()) for b in buckets)
        assert has_nonfinite(buckets) == expected, name
