"""What each communication round cost, and how much of it was hidden behind compute."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RoundRecord:
    launch_step: int  # optimizer steps completed when the collective was launched
    finish_step: int  # optimizer steps completed when it was waited on
    comm_seconds: float  # launch to completion
    exposed_seconds: float  # time blocked waiting for it
    nbytes: int  # the round's payload before any encoding (each rank's flat buffer), not what was sent
    launched_at: float = 0.0  # time.perf_counter() at launch
    bytes_sent: int = 0  # what this rank put on the wire (a ring all-reduce: 2 (N - 1) / N of nbytes)
    bytes_received: int = 0
    codec_seconds: float = 0.0  # encoding and decoding a compressed round (part of comm_seconds)

    @property
    def completed_at(self) -> float:
        return self.launched_at + self.comm_seconds

    @property
    def hidden_fraction(self) -> float:
        return _hidden(self.exposed_seconds, self.comm_seconds)


def _hidden(exposed_seconds: float, comm_seconds: float) -> float:
    """The share of the communication time that compute covered (all of it when there was none)."""
    return 1.0 if comm_seconds <= 0.0 else min(1.0, max(0.0, 1.0 - exposed_seconds / comm_seconds))


@dataclass
class CommStats:
    """Per-round records plus running totals; benchmarks read it as ``strategy.comm_stats``."""

    rounds: list[RoundRecord] = field(default_factory=list)

    def add(self, record: RoundRecord) -> None:
        self.rounds.append(record)

    # A user reading ``trainer.strategy.comm_stats`` expects its rounds: ``list(...)``, ``len(...)``.
    def __iter__(self):
        return iter(self.rounds)

    def __len__(self) -> int:
        return len(self.rounds)

    @property
    def comm_seconds(self) -> float:
        """Time the link was busy with our collectives: the union of their launch-to-completion
        intervals, so pipelined collectives queued behind each other are not counted twice."""
        busy, end = 0.0, float("-inf")
        for r in sorted(self.rounds, key=lambda r: r.launched_at):
            start = max(r.launched_at, end)
            if r.completed_at > start:
                busy += r.completed_at - start
            end = max(end, r.completed_at)
        return busy

    @property
    def exposed_seconds(self) -> float:
        return sum(r.exposed_seconds for r in self.rounds)

    @property
    def nbytes(self) -> int:
        """The rounds' payloads before encoding; what went on the wire is ``summary()["bytes_sent"]``."""
        return sum(r.nbytes for r in self.rounds)

    @property
    def hidden_fraction(self) -> float:
        return _hidden(self.exposed_seconds, self.comm_seconds)

    def summary(self) -> dict[str, float]:
        return {
            "rounds": len(self.rounds),
            "comm_seconds": self.comm_seconds,
            "exposed_seconds": self.exposed_seconds,
            # No bare "bytes": a compressed round's payload is not what it sent.
            "payload_bytes": self.nbytes,
            "bytes_sent": sum(r.bytes_sent for r in self.rounds),
            "bytes_received": sum(r.bytes_received for r in self.rounds),
            "codec_seconds": sum(r.codec_seconds for r in self.rounds),
            "hidden_fraction": self.hidden_fraction,
        }

    def to_json(self) -> dict:
        return {"summary": self.summary(), "rounds": [asdict(r) for r in self.rounds]}

    @classmethod
    def from_json(cls, data: dict) -> CommStats:
        return cls([RoundRecord(**r) for r in data["rounds"]])
