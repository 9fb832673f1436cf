"""The codecs against formulas written out here, and the compressed mean on 2 and 4 gloo ranks:
after every round the new average is bit-identical on all ranks, close to the exact mean, and it
keeps the mean exactly up to what the residuals hold (error feedback loses nothing)."""

import math

import pytest
import torch
import torch.distributed as dist

from lightning_cocod.core.comm import ring_bytes
from lightning_cocod.core.compress import SLICE, Bf16Codec, CompressedMean, Int8Codec, make_codec
from tests.helpers.gloo_ranks import results, run_ranks

pytestmark = pytest.mark.timeout(180)


def test_bf16_is_a_cast():
    x = torch.randn(1000) * 3
    payload = torch.empty(2000, dtype=torch.uint8)
    kept = Bf16Codec().encode(x, payload)
    assert torch.equal(Bf16Codec().decode(payload, 1000), x.to(torch.bfloat16).to(torch.float32))
    assert torch.equal(kept, x.to(torch.bfloat16).to(torch.float32))
    # A factor scales what is sent; what is kept is over the factor again.
    kept = Bf16Codec().encode(x, payload, factor=0.25)
    assert torch.equal(Bf16Codec().decode(payload, 1000), (x * 0.25).to(torch.bfloat16).float())
    assert torch.allclose(kept, x, rtol=2**-8)


def test_int8_against_the_block_formula():
    block = 8
    x = torch.tensor([0.5, -1.0, 0.25, 0.0, 0.1, -0.2, 0.3, 0.04] + [0.0] * 8 + [1e-3] * 8)
    codec = Int8Codec(block)
    assert codec.payload_bytes(24) == 24 + 4 * 3
    payload = torch.empty(codec.payload_bytes(24), dtype=torch.uint8)
    kept = codec.encode(x, payload, factor=0.5)
    decoded = codec.decode(payload, 24) / 0.5
    assert torch.allclose(kept, decoded)
    for b in range(3):
        part = x[b * block : (b + 1) * block]
        scale = part.abs().max().item() / 127
        expected = [0.0 if scale == 0 else round(v / scale) * scale for v in part.tolist()]
        assert decoded[b * block : (b + 1) * block].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # Every element within half a step of its block's scale.
    scales = x.view(3, block).abs().amax(dim=1) / 127
    assert bool(((decoded - x).abs().view(3, block) <= scales[:, None] / 2 + 1e-9).all())


def test_codec_names():
    assert make_codec(None) is None
    assert isinstance(make_codec("int8"), Int8Codec)
    with pytest.raises(ValueError, match="compression='fp8' is invalid; accepted: None, bf16, int8"):
        make_codec("fp8")
    with pytest.raises(ValueError, match="block=6"):
        Int8Codec(6)


def test_ring_bytes():
    assert ring_bytes(1000, 2) == 1000
    assert ring_bytes(1000, 4) == 1500


class _Comm:
    """The part of TorchDistCommunicator that CompressedMean uses, on the default group."""

    def __init__(self) -> None:
        self.group = dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cpu")

    def start_mean(self, buckets, weight=None):
        from lightning_cocod.core.comm import TorchDistCommunicator

        return TorchDistCommunicator(None, self.device).start_mean(buckets, weight)

    def broadcast(self, buckets, src):
        raise AssertionError("not used")

    def destroy(self):
        pass


def _gathered(tensor: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def _ranks_body(rank: int, world: int, codec_name: str, weights, n: int) -> None:
    codec = make_codec(codec_name)
    mean = CompressedMean(_Comm(), codec)
    weight = None if weights is None else weights[rank]
    shares = [1 / world] * world if weights is None else weights
    x = torch.randn(n, generator=torch.Generator().manual_seed(1234))  # one start, as after a broadcast
    gen = torch.Generator().manual_seed(rank)
    for round_ in range(6):
        x = x + 0.01 * torch.randn(n, generator=gen)  # one round of progress
        everyone = _gathered(x.clone())
        exact = sum(s * xi for s, xi in zip(shares, everyone))
        before = _residual_total(mean, shares, n)
        bucket = x.clone()
        handle = mean.start_mean([bucket], weight)
        handle.wait()
        # Bit-identical on every rank, as the reference A is.
        for other in _gathered(bucket):
            assert torch.equal(other, bucket), f"round {round_}: ranks differ"
        assert torch.equal(mean.reference[0], bucket)
        if round_ == 0:
            assert torch.allclose(bucket, exact, atol=1e-6)  # the first round is the exact mean
            continue
        # Close to the exact mean: within a few percent of how far the ranks are apart.
        spread = max((xi - exact).abs().max().item() for xi in everyone)
        assert (bucket - exact).abs().max().item() < 0.05 * spread
        # Error feedback: A_new = mean + (residuals before - residuals after), to rounding.
        after = _residual_total(mean, shares, n)
        assert torch.allclose(bucket, exact + before - after, atol=1e-5), round_
        chunk_bytes = codec.payload_bytes(mean.residuals[0].numel() // world)
        assert handle.bytes_sent == handle.bytes_received == 2 * (world - 1) * chunk_bytes
        assert handle.codec_seconds > 0 and handle.comm_seconds >= handle.codec_seconds


def _residual_total(mean: CompressedMean, shares: list[float], n: int) -> torch.Tensor:
    """sum_j p_j r_j + the residuals of the sums, over the whole (unpadded) vector."""
    if mean.residuals is None:
        return torch.zeros(n)
    senders = sum(s * r for s, r in zip(shares, _gathered(mean.residuals[0] * 1.0)))
    own = torch.cat(_gathered(mean.sum_residuals[0].clone()))
    return (senders + own)[:n]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "world, codec, weights, n",
    # Sizes that are no multiple of the chunks (padding), and one of several slices per chunk.
    [
        (2, "int8", None, 5000),
        (2, "bf16", None, 5000),
        (4, "int8", None, 3 * SLICE * 4 + 4097),
        (4, "bf16", [0.1, 0.2, 0.3, 0.4], 5000),
    ],
)
def test_compressed_mean_on_gloo(world, codec, weights, n, tmp_path):
    results(run_ranks(_ranks_body, tmp_path, world, codec, weights, n, world=world, timeout=150))


def test_bytes_against_fp32():
    """The ratio the issue asks for, from the payload sizes: int8 >= 3.5x, bf16 >= 1.9x fewer."""
    numel, world = 11_000_000, 4  # ResNet18-sized
    for codec, least in ((Int8Codec(), 3.5), (Bf16Codec(), 1.9)):
        chunk = math.ceil(numel / world / codec.quantum) * codec.quantum
        compressed = 2 * (world - 1) * codec.payload_bytes(chunk)
        assert ring_bytes(4 * numel, world) / compressed >= least


def _raw_body(rank: int) -> None:
    modes = {
        "raw": CompressedMean(_Comm(), Int8Codec(), delta=False),
        "delta": CompressedMean(_Comm(), Int8Codec()),
    }
    x = 3 * torch.randn(2048, generator=torch.Generator().manual_seed(0))  # one start; a block's max near 10
    gen = torch.Generator().manual_seed(rank)
    for round_ in range(4):
        x = x + 1e-3 * torch.randn(2048, generator=gen)
        exact = sum(_gathered(x.clone())) / 2
        errors_by_mode = {}
        for name, mean in modes.items():
            bucket = x.clone()
            mean.start_mean([bucket]).wait()
            errors_by_mode[name] = (bucket - exact).abs().max().item()
        if round_ == 0:
            continue  # the delta mode's first round is exact
        # Raw weights, every round: an int8 step of the weights' scale (max / 127), not of the
        # rounds' progress, which is what the delta mode's error stays within.
        largest = exact.abs().max().item()
        assert largest / 127 / 8 < errors_by_mode["raw"] <= largest / 127, (round_, errors_by_mode)
        assert errors_by_mode["delta"] < 1e-4, (round_, errors_by_mode)


@pytest.mark.distributed
def test_the_raw_control_encodes_the_weights_every_round(tmp_path):
    """``delta=False`` (the study's control): the reference is zero at every round, so what is
    sent is the raw weights, whose int8 error is a block's largest weight over 254, every round."""
    results(run_ranks(_raw_body, tmp_path, timeout=150))
