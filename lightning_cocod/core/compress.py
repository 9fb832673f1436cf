"""Compressed rounds: send one round of progress in bf16 or int8 instead of the model in fp32.

Every rank holds the last compressed round's result ``A``, bit-identical on all ranks. A round
sends ``d_i = x_i - A`` (plus what quantization dropped last time: error feedback) rather than
``x_i``: the same mean up to ``A`` (``sum_j p_j x_j = A + sum_j p_j d_j``), but values of one
round's size, which quantize well where the raw weights would not. The sum is reduced in fp32 in
two collectives that carry only encoded bytes:

    all-to-all:  rank c receives every rank's encoded chunk c, decodes them and sums them in
                 fp32 in rank order (plus its own error feedback for the chunk), encodes the sum;
    all-gather:  every rank receives every encoded sum and decodes them,

so every rank decodes the same bytes into the same new ``A``, and each rank sends and receives
``2 (N - 1) / N`` of the encoded model, as a ring all-reduce does of the fp32 one. The first round
(no ``A`` yet) is an exact fp32 mean. Where a mean is not needed bit-identical, nothing changes:
the rounds see a Communicator like any other.

The exchange runs on a thread of its own, so the caller keeps stepping while it is in flight
(on CUDA its kernels go to a side stream, and the caller's stream waits for it at ``wait``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_cocod.core.comm import Handle, failures_named

SLICE = 1 << 17  # elements the codec works on at a time (see ``_slices``)
INT8_BLOCK = (
    2048  # elements sharing one fp32 scale: 0.2% of the payload, and an outlier spoils only its block
)
# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Bf16Codec:
    """bfloat16: fp32's range with an 8-bit mantissa, two bytes an element."""

    name = "bf16"
    quantum = 2  # chunks are whole multiples of this many elements, so every payload stays aligned

    def payload_bytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, values: Tensor, out: Tensor, factor: float = 1.0) -> Tensor:
        """Write ``factor * values`` encoded into ``out`` (uint8); returns ``values`` as the
        receivers will see them, over ``factor`` (what the sender's error feedback keeps)."""
        scaled = values * factor if factor != 1.0 else values
        encoded = out.view(torch.bfloat16)
        encoded.copy_(scaled)
        decoded = encoded.float()
        return decoded.div_(factor) if factor != 1.0 else decoded

    def decode(self, payload: Tensor, numel: int) -> Tensor:
        return payload.view(torch.bfloat16).float()

    def decode_add(self, payload: Tensor, into: Tensor) -> None:
        """``into += decode(payload)`` in one pass."""
        into += payload.view(torch.bfloat16)


class Int8Codec:
    """One int8 per element and one fp32 scale (the block's largest magnitude / 127) per block."""

    name = "int8"

    def __init__(self, block: int = INT8_BLOCK) -> None:
        if block < 1 or block % 4:
            raise ValueError(f"Int8Codec: block={block!r} is invalid; accepted: a positive multiple of 4")
        self.block = block
        self.quantum = block

    def payload_bytes(self, numel: int) -> int:
        return numel + 4 * math.ceil(numel / self.block)

    def encode(self, values: Tensor, out: Tensor, factor: float = 1.0) -> Tensor:
        """See ``Bf16Codec.encode``; ``factor`` goes into the scales, so it costs no pass."""
        blocks = values.view(-1, self.block)  # slices are whole blocks (``quantum``)
        largest = blocks.abs().amax(dim=1)  # torch.aminmax, which writes no copy, measured 10x slower
        scales = largest / 127.0
        # A block of (nearly) zeros: its values all go to the error feedback, never to 1/0.
        inverse = torch.where(largest > 1e-30, 127.0 / largest, torch.zeros_like(largest))
        codes = blocks * inverse[:, None]
        codes.round_()  # |codes| <= 127: the largest magnitude of each block maps to 127
        n_blocks = blocks.shape[0]
        # Scales first: the payload's start stays 4-byte aligned for their fp32 view.
        out[: 4 * n_blocks].view(torch.float32).copy_(scales * factor)
        out[4 * n_blocks :].view(torch.int8).copy_(codes.view(-1))
        return codes.mul_(scales[:, None]).view(-1)

    def _scales_and_codes(self, payload: Tensor, numel: int) -> tuple[Tensor, Tensor]:
        """The payload's scales (one per block) and its codes as floats, one row per block: a float
        copy, since addcmul_ with int8 codes promotes element by element (5x slower)."""
        n_blocks = numel // self.block
        scales = payload[: 4 * n_blocks].view(torch.float32)
        return scales, payload[4 * n_blocks :].view(torch.int8).float().view(n_blocks, self.block)

    def decode(self, payload: Tensor, numel: int) -> Tensor:
        scales, codes = self._scales_and_codes(payload, numel)
        return codes.mul_(scales[:, None]).view(-1)

    def decode_add(self, payload: Tensor, into: Tensor) -> None:
        """``into += decode(payload)``: one pass fewer than decoding first."""
        scales, codes = self._scales_and_codes(payload, into.numel())
        into.view(codes.shape).addcmul_(codes, scales[:, None])


CODECS = {"bf16": Bf16Codec, "int8": Int8Codec}


def make_codec(name: str | None) -> Bf16Codec | Int8Codec | None:
    """The codec called ``name`` (None: no compression); a one-line error for any other name."""
    if name is None:
        return None
    if name not in CODECS:
        accepted = ", ".join(["None", *CODECS])
        raise ValueError(f"compression={name!r} is invalid; accepted: {accepted}")
    return CODECS[name]()


class _ThreadHandle:
    """A round run by the exchange thread; its figures are the thread's own clock readings."""

    def __init__(self, future: Future, launched_at: float, done_event: Any) -> None:
        self._future = future
        self._done_event = done_event  # CUDA: the side stream's end of the round
        self.launched_at = launched_at
        self.blocked_seconds = 0.0
        self._waited = False

    def wait(self) -> None:
        start = time.perf_counter()
        with failures_named():
            self._future.result()
        if self._done_event is not None:
            torch.cuda.current_stream().wait_event(self._done_event)
        self.blocked_seconds = time.perf_counter() - start
        self._waited = True

    def figures_ready(self) -> bool:
        return self._waited

    @property
    def _figures(self) -> dict[str, float]:
        return self._future.result()

    @property
    def comm_seconds(self) -> float:
        return self._figures["completed_at"] - self.launched_at

    @property
    def exposed_seconds(self) -> float:
        return self.blocked_seconds

    @property
    def codec_seconds(self) -> float:
        return self._figures["codec_seconds"]

    @property
    def bytes_sent(self) -> int:
        return int(self._figures["bytes_sent"])

    @property
    def bytes_received(self) -> int:
        return int(self._figures["bytes_received"])


class _ExactHandle:
    """The exact fp32 mean of a round without ``A``: the inner communicator's handle, whose bytes
    are a ring all-reduce's, and which sets ``A`` once it has landed."""

    def __init__(self, inner: Handle, owner: CompressedMean, buckets: Sequence[Tensor]) -> None:
        self._inner, self._owner, self._buckets = inner, owner, list(buckets)

    def wait(self) -> None:
        self._inner.wait()
        self._owner.reference = [b.detach().float().clone() for b in self._buckets]

    def figures_ready(self) -> bool:
        return self._inner.figures_ready()

    @property
    def launched_at(self) -> float:
        return self._inner.launched_at

    @property
    def blocked_seconds(self) -> float:
        return self._inner.blocked_seconds

    @property
    def comm_seconds(self) -> float:
        return self._inner.comm_seconds

    @property
    def exposed_seconds(self) -> float:
        return self._inner.exposed_seconds

    @property
    def bytes_sent(self) -> int:
        return self._inner.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self._inner.bytes_received

    @property
    def codec_seconds(self) -> float:
        return self._inner.codec_seconds


class CompressedMean:
    """A Communicator whose ``start_mean`` sends encoded deltas from ``A`` (see the module).

    ``comm`` is a TorchDistCommunicator (its process group carries the two collectives);
    ``error_feedback`` keeps what encoding dropped and sends it with the next round;
    ``delta=False`` encodes the raw values instead (against a zero reference): a control that
    shows why the delta matters, not a user option.

    State (``state_dict``): ``A``, the sender's residuals, and the residuals of the chunk this
    rank sums. ``A`` is the same on every rank; the residuals are this rank's own.
    """

    def __init__(
        self, comm: Any, codec: Bf16Codec | Int8Codec, error_feedback: bool = True, delta: bool = True
    ) -> None:
        self.comm, self.codec = comm, codec
        self.rank, self.world_size = comm.rank, comm.world_size
        self.error_feedback, self.delta = error_feedback, delta
        self.reference: list[Tensor] | None = None  # A, one fp32 tensor per bucket
        self.residuals: list[Tensor] | None = None  # what this rank's encoding dropped, in units of d
        self.sum_residuals: list[Tensor] | None = None  # what encoding this rank's chunk of the sum dropped
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cocod-compressed-mean")
        self._side = torch.cuda.Stream(comm.device) if comm.device.type == "cuda" else None
        self._staged = comm.device.type == "cuda" and dist.get_backend(comm.group) == "gloo"

    def start_mean(self, buckets: Sequence[Tensor], weight: float | None = None) -> Handle:
        share = 1.0 / self.world_size if weight is None else float(weight)
        if self.delta and self.reference is None:
            return _ExactHandle(self.comm.start_mean(buckets, weight), self, buckets)
        if self.reference is None:  # the raw-values control: the reference stays zero
            self.reference = [torch.zeros(b.shape, dtype=torch.float32, device=b.device) for b in buckets]
        launched_at = time.perf_counter()
        done_event = None
        if self._side is not None:
            # The buckets were packed on the caller's stream: the side stream reads them after.
            self._side.wait_stream(torch.cuda.current_stream())
            done_event = torch.cuda.Event()
        future = self._thread.submit(self._round, list(buckets), share, done_event)
        return _ThreadHandle(future, launched_at, done_event)

    def _round(self, buckets: list[Tensor], share: float, done_event: Any) -> dict[str, float]:
        if self._side is None:
            return self._exchange(buckets, share)
        # This thread's current device is cuda:0 until told: the side stream's device, explicitly.
        with torch.cuda.device(self._side.device), torch.cuda.stream(self._side):
            figures = self._exchange(buckets, share)
            done_event.record(self._side)
            self._side.synchronize()  # this thread's clock then reads the device's completion
        figures["completed_at"] = time.perf_counter()
        return figures

    def _padded(self, numel: int) -> int:
        chunk = math.ceil(numel / self.world_size / self.codec.quantum) * self.codec.quantum
        return chunk * self.world_size

    def _exchange(self, buckets: list[Tensor], share: float) -> dict[str, float]:
        figures = {"codec_seconds": 0.0, "bytes_sent": 0.0, "bytes_received": 0.0}
        if not self.delta:  # the raw-values control: every round against zero, not the last mean
            for reference in self.reference or ():
                reference.zero_()
        if self.residuals is None or self.sum_residuals is None:
            self.residuals = [torch.zeros(self._padded(b.numel()), device=b.device) for b in buckets]
            self.sum_residuals = [r.new_zeros(r.numel() // self.world_size) for r in self.residuals]
        for index, bucket in enumerate(buckets):
            self._exchange_bucket(bucket, index, share, figures)
        figures["completed_at"] = time.perf_counter()
        return figures

    def _slices(self, chunk: int) -> list[tuple[int, int]]:
        """(start, end) of the slices of a chunk: every pass over a slice stays in the cache (one
        pass per op over the whole model measured 7x slower), and all ranks cut alike."""
        size = max(self.codec.quantum, SLICE // self.codec.quantum * self.codec.quantum)
        return [(start, min(start + size, chunk)) for start in range(0, chunk, size)]

    def _exchange_bucket(self, bucket: Tensor, index: int, share: float, figures: dict[str, float]) -> None:
        assert self.reference is not None and self.residuals is not None and self.sum_residuals is not None
        codec, world, n = self.codec, self.world_size, bucket.numel()
        reference, residual, sum_residual = (
            self.reference[index],
            self.residuals[index],
            self.sum_residuals[index],
        )
        chunk = residual.numel() // world
        slices = self._slices(chunk)
        offsets = [0]  # where each slice's payload starts within a chunk's payload
        for start, end in slices:
            offsets.append(offsets[-1] + codec.payload_bytes(end - start))
        size = offsets[-1]
        values = bucket.view(-1)

        clock = time.perf_counter()
        send = torch.empty(size * world, dtype=torch.uint8, device=bucket.device)
        for c in range(world):
            for (start, end), at in zip(slices, offsets):
                lo, hi = c * chunk + start, c * chunk + end
                # d_i, with what the last round dropped; past the model's end only the padding.
                if hi <= n:
                    delta = torch.sub(values[lo:hi], reference[lo:hi])
                else:
                    delta = torch.zeros(hi - lo, device=bucket.device)
                    if lo < n:
                        delta[: n - lo] = values[lo:n] - reference[lo:n]
                if self.error_feedback:
                    delta += residual[lo:hi]
                out = send[c * size + at : c * size + at + codec.payload_bytes(hi - lo)]
                sent = codec.encode(delta, out, factor=share)
                if self.error_feedback:
                    torch.sub(delta, sent, out=residual[lo:hi])
        figures["codec_seconds"] += time.perf_counter() - clock

        received = self._collective(dist.all_to_all_single, send, send.numel())

        clock = time.perf_counter()
        mine = torch.empty(size, dtype=torch.uint8, device=bucket.device)
        for (start, end), at in zip(slices, offsets):
            width = codec.payload_bytes(end - start)
            # The same order of additions on every rank.
            total = (
                sum_residual[start:end].clone()
                if self.error_feedback
                else received.new_zeros(end - start, dtype=torch.float32)
            )
            for j in range(world):
                codec.decode_add(received[j * size + at : j * size + at + width], total)
            sent = codec.encode(total, mine[at : at + width])
            if self.error_feedback:
                torch.sub(total, sent, out=sum_residual[start:end])
        figures["codec_seconds"] += time.perf_counter() - clock

        gathered = self._collective(_ALL_GATHER, mine, size * world)

        clock = time.perf_counter()
        for c in range(world):
            for (start, end), at in zip(slices, offsets):
                lo, top = c * chunk + start, min(c * chunk + end, n)
                if lo >= n:
                    continue
                payload = gathered[c * size + at : c * size + at + codec.payload_bytes(end - start)]
                if top - lo == end - start:
                    codec.decode_add(payload, reference[lo:top])
                else:  # the model's last slice: its padding is dropped
                    reference[lo:top] += codec.decode(payload, end - start)[: top - lo]
                values[lo:top] = reference[lo:top]
        figures["codec_seconds"] += time.perf_counter() - clock
        figures["bytes_sent"] += 2 * (world - 1) * size
        figures["bytes_received"] += 2 * (world - 1) * size

    def _collective(self, collective: Any, payload: Tensor, out_numel: int) -> Tensor:
        """Run ``collective(out, payload)`` on the group; gloo takes CUDA payloads through the host."""
        wire = payload.cpu() if self._staged else payload
        out = torch.empty(out_numel, dtype=torch.uint8, device=wire.device)
        with failures_named():
            collective(out, wire, group=self.comm.group)
        return out.to(payload.device) if self._staged else out

    def state_dict(self) -> dict[str, Any]:
        def saved(tensors: list[Tensor] | None) -> list[Tensor] | None:
            return None if tensors is None else [t.detach().cpu().clone() for t in tensors]

        return {
            "codec": self.codec.name,
            "reference": saved(self.reference),
            "residuals": saved(self.residuals),
            "sum_residuals": saved(self.sum_residuals),
        }

    def load_state_dict(self, state: dict[str, Any], buckets: Sequence[Tensor]) -> None:
        """Resume from ``state_dict()`` of a run whose rounds sent ``buckets`` (their sizes): a
        state of another model or world size would otherwise fail at the first round's exchange,
        where it reads as a network error."""
        if not isinstance(state, dict) or state.get("codec") != self.codec.name:
            codec = state.get("codec") if isinstance(state, dict) else None
            raise ValueError(
                f"compression state for codec {codec!r} cannot resume a run with "
                f"compression={self.codec.name!r}; accepted: the codec the run was saved with"
            )
        sizes = [b.numel() for b in buckets]
        padded = [self._padded(n) for n in sizes]
        expected = {
            "reference": sizes,
            "residuals": padded,
            "sum_residuals": [n // self.world_size for n in padded],
        }
        for key, numels in expected.items():
            tensors = state.get(key)
            if tensors is None:
                continue
            fits = (
                isinstance(tensors, list)
                and len(tensors) == len(numels)
                and all(
                    isinstance(t, Tensor) and t.dtype == torch.float32 and tuple(t.shape) == (n,)
                    for t, n in zip(tensors, numels)
                )
            )
            if not fits:
                raise ValueError(
                    f"compression state's {key} does not fit this run: accepted: {len(numels)} float32 tensors of "
                    f"{', '.join(map(str, numels))} elements (this model's buckets on {self.world_size} ranks)"
                )
        device = self.comm.device

        def loaded(tensors: list[Tensor] | None) -> list[Tensor] | None:
            return None if tensors is None else [t.to(device).clone() for t in tensors]

        self.reference = loaded(state["reference"])
        self.residuals = loaded(state["residuals"])
        self.sum_residuals = loaded(state["sum_residuals"])

    def broadcast(self, buckets: Sequence[Tensor], src: int) -> None:
        self.comm.broadcast(buckets, src)

    def reset(self) -> None:
        """Forget ``A`` and the residuals (they took in non-finite values): the next round is exact."""
        self.reference = self.residuals = self.sum_residuals = None

    def close(self) -> None:
        """Stop the exchange thread; the process group is the inner communicator's, left as it is."""
        self._thread.shutdown(wait=True)

    def destroy(self) -> None:
        self.close()
