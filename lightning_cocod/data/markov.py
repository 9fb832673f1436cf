"""Character-level text from a seeded Markov source whose best achievable loss is known exactly.

Why a procedural source rather than a corpus: it needs no download and is the same on every machine
(numpy's seeded PCG64 generator), and, unlike any corpus, it states its own optimum. The source is an
order-``k`` Markov chain over ``vocab_size`` characters whose transition rows are drawn as a
hierarchical Dirichlet process, the generative model behind hierarchical Pitman-Yor language models
(Teh 2006): the distribution after a context is a Dirichlet draw centred on the distribution after
the same context without its oldest character, down to the unigram distribution, itself a draw
around the uniform one. So, as in text, every further character of context is worth something (by
default: unigram 2.290 nats, given one character 1.697, two 1.371, three 1.230, the entropy rate),
and a model's loss falls in stages rather than at once. Which is what makes it a fair test of an
optimizer: a method that harms optimization stops at a higher stage, and how far any run is from
the best possible is exact, not estimated. (What it does not test: long-range structure; three
characters of context are all there is to learn, which a 64-character block holds many times.)

Each block of ``block_size + 1`` characters is an independent stretch of the stationary chain, so
the best expected next-character loss at position ``t`` of a block is ``H(X_{t+1} | X_{<=t})``:
``H_{t+1}`` for ``t + 1 < k`` and the entropy rate ``H_k`` after that. ``optimum`` is their mean
over the block's positions, the validation loss of the true source itself. ``unigram_loss`` (``H_0``)
is the cross-entropy of the unigram distribution: the loss of a model that ignores the context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from lightning_cocod.data.base import InMemoryDataModule, is_int, require

# Characters for the token ids, most of them letters, so that samples print as text-like strings.
ALPHABET = " etaoinshrdlcumwfgypbvkjxqz0123456789.,;:!?'-()ETAOINSHRDLCUMWFGYPBVKJXQZ"
_MAX_POWER = 22  # 2^23 > 8e6: no vocab_size (>= 2) has a table within the bound past order 21
# The stationary distribution: converged when a step moves it by less than _TOLERANCE (L1). A step
# costs V^(k+1) multiply-adds: a chain that would need more than _MAX_WORK of them (a fraction of a
# second on one core) is refused, judged every _WINDOW steps, rather than iterated for minutes.
_TOLERANCE, _MAX_WORK, _WINDOW = 1e-13, 200_000_000, 50


class MarkovSource:
    """The order-``order`` chain over ``vocab_size`` symbols, drawn from ``seed``.

    A context is the index ``c_1 V^{k-1} + ... + c_k`` of its symbols, oldest first; ``transitions``
    is ``(V^k, V)``. ``concentration`` is the Dirichlet's total mass around its parent row: smaller
    values make each context more decisive (a lower entropy rate, larger steps between orders).
    Small enough ones (1e-3) can draw a chain that mixes too slowly for its stationary distribution
    to be computed: refused naming ``concentration``, in a fraction of a second (``_stationary``).
    """

    def __init__(
        self, vocab_size: int = 27, order: int = 3, concentration: float = 8.0, seed: int = 0
    ) -> None:
        owner = "MarkovSource"
        require(
            is_int(vocab_size) and 2 <= vocab_size <= len(ALPHABET),
            owner,
            "vocab_size",
            vocab_size,
            f"an int from 2 to {len(ALPHABET)}",
        )
        require(is_int(order) and 1 <= order, owner, "order", order, "an int >= 1")
        # V^k rows of V float64s: past ~64 MB the tables, not the network, would be the problem.
        # Bounded first by 2^(order+1) <= 8e6 (V >= 2): order=10**8 would make V^(order+1) a Python
        # integer of millions of digits, computed for minutes before it could be compared.
        require(
            order + 1 <= _MAX_POWER and vocab_size ** (order + 1) <= 8_000_000,
            owner,
            "order",
            order,
            f"an order with vocab_size^(order+1) <= 8e6 ({vocab_size}^{order + 1} is more)",
        )
        ok = isinstance(concentration, (int, float)) and not isinstance(concentration, bool)
        # inf makes every Dirichlet draw inf, and its rows NaN: finite, or no distribution at all.
        ok = ok and math.isfinite(concentration) and concentration > 0
        require(ok, owner, "concentration", concentration, "a positive number (finite)")
        require(is_int(seed) and seed >= 0, owner, "seed", seed, "an integer >= 0")
        self.vocab_size, self.order, self.seed = vocab_size, order, seed
        self.concentration = float(concentration)
        rng = np.random.default_rng([seed, 0])
        rows = np.full((1, vocab_size), 1.0 / vocab_size)
        for j in range(order + 1):  # j = 0: the unigram distribution, a draw around the uniform one
            parent = rows[np.arange(vocab_size**j) % len(rows)]  # the context minus its oldest symbol
            draws = rng.standard_gamma(self.concentration * parent)
            # A tiny shape can underflow to 0: a floor keeps every row a distribution and the chain
            # irreducible, without changing any probability that matters.
            draws = np.maximum(draws, 1e-300)
            rows = draws / draws.sum(axis=1, keepdims=True)
        self.transitions = rows
        self.stationary = self._stationary()
        self.conditional_entropies = self._conditional_entropies()

    def _stationary(self) -> np.ndarray:
        """The chain's stationary distribution over contexts, by power iteration.

        The plain iteration first: it is what the sources were always computed with, so the data
        of every one it settles within the budget (the defaults, conf/'s, the tests') stays bit for
        bit what it was. It never settles on a chain that is (nearly) periodic, as concentrations
        of a few units and below can draw for some seeds: then the lazy chain (P + I) / 2, which has
        the same stationary distribution and is aperiodic. A chain that mixes too slowly even so
        (concentration 1e-3 draws nearly closed cycles of contexts, mixing over millions of steps)
        is refused naming the concentration as soon as the rate over the last _WINDOW steps says
        that the budget will not do: in a fraction of a second, not after a minute.
        """
        v, k = self.vocab_size, self.order
        max_steps = max(_MAX_WORK // v ** (k + 1), 2 * _WINDOW)
        pi = np.full(v**k, 1.0 / v**k)
        lazy, since = False, (0, math.inf)  # the step and the gap at the start of this window
        for step in range(max_steps):
            # Context (c_1..c_k) and next symbol x lead to context (c_2..c_k, x): summing over c_1.
            nxt = (pi[:, None] * self.transitions).reshape(v, v ** (k - 1) * v).sum(axis=0)
            if lazy:
                nxt = (nxt + pi) / 2
            gap = np.abs(nxt - pi).sum()
            if gap < _TOLERANCE:
                return nxt / nxt.sum()
            if step - since[0] == _WINDOW:
                rate = (gap / since[1]) ** (1 / _WINDOW)  # per step, over the window
                needed = math.log(_TOLERANCE / gap) / math.log(rate) if rate < 1 else math.inf
                if needed > max_steps - step:
                    if lazy:
                        break
                    lazy = True
                since = (step, gap)
            elif step == 0:
                since = (0, gap)
            pi = nxt
        raise ValueError(  # require's one line: the argument that chose this chain
            f"MarkovSource: concentration={self.concentration!r} is invalid; accepted: one whose chain "
            f"mixes within {max_steps} steps, e.g. the default 8.0 (with vocab_size={v}, order={k}, "
            f"seed={self.seed} this one's does not)"
        )

    def _conditional_entropies(self) -> list[float]:
        """``H_j = H(X | j previous symbols)`` in nats under stationarity, for j = 0..order."""
        v, k = self.vocab_size, self.order
        joint = (self.stationary[:, None] * self.transitions).reshape(-1)  # (k+1)-grams, oldest first
        out = []
        for j in range(k + 1):
            grams = joint.reshape(v ** (k - j), -1).sum(axis=0)  # the last j+1 symbols
            contexts = grams.reshape(-1, v).sum(axis=1)
            out.append(_entropy(grams) - _entropy(contexts))
        return out

    @property
    def entropy_rate(self) -> float:
        return self.conditional_entropies[-1]

    @property
    def unigram_loss(self) -> float:
        return self.conditional_entropies[0]

    def optimum(self, block_size: int) -> float:
        """The expected loss of the source itself over a block's ``block_size`` predictions."""
        h = self.conditional_entropies
        return sum(h[min(t + 1, self.order)] for t in range(block_size)) / block_size

    def sample_blocks(self, num_blocks: int, length: int, seed: Sequence[int] | int) -> np.ndarray:
        """``(num_blocks, length)`` int64: independent stretches of the stationary chain."""
        v, k = self.vocab_size, self.order
        require(length >= k, "MarkovSource", "length", length, f"at least the order ({k})")
        rng = np.random.default_rng(seed)
        # searchsorted on cumulative sums rather than rng.choice: the same draws on every numpy.
        context = np.searchsorted(np.cumsum(self.stationary), rng.random(num_blocks) * self.stationary.sum())
        context = np.minimum(context, v**k - 1)
        out = np.empty((num_blocks, length), dtype=np.int64)
        for i in range(k):
            out[:, i] = context // v ** (k - 1 - i) % v
        cumulative = np.cumsum(self.transitions, axis=1)
        for t in range(k, length):
            rows = cumulative[context]
            nxt = (rows < rng.random(num_blocks)[:, None] * rows[:, -1:]).sum(axis=1)
            out[:, t] = np.minimum(nxt, v - 1)
            context = context % v ** (k - 1) * v + out[:, t]
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(ALPHABET[int(i)] for i in ids)


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


class MarkovTextDataModule(InMemoryDataModule):
    """Blocks of ``MarkovSource`` text: ``x`` the first ``block_size`` characters, ``y`` the next one
    at each position, both ``(block_size,)`` int64; rank-sharded like the other datamodules.

    ``source_seed`` fixes the source and with it the data (train, validation and test blocks are
    drawn from three independent streams of it); ``seed`` fixes only the order of the training
    batches. Generating the default 16,384 training blocks takes well under a second: nothing is
    cached or downloaded. ``unigram_loss``, ``optimum`` and ``entropy_rate`` are in nats.
    """

    def __init__(
        self,
        vocab_size: int = 27,
        order: int = 3,
        concentration: float = 8.0,
        block_size: int = 64,
        num_train_blocks: int = 16_384,
        num_val_blocks: int = 1024,
        num_test_blocks: int = 1024,
        batch_size: int = 32,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        seed: int = 0,
        source_seed: int = 1234,
    ) -> None:
        owner = "MarkovTextDataModule"
        # order's own check before block_size is compared with it: order="3" or None would fail the
        # comparison with a TypeError naming neither.
        require(is_int(order) and 1 <= order, owner, "order", order, "an int >= 1")
        require(
            is_int(block_size) and block_size >= order,
            owner,
            "block_size",
            block_size,
            f"an int >= order ({order})",
        )
        for name, value in (
            ("num_train_blocks", num_train_blocks),
            ("num_val_blocks", num_val_blocks),
            ("num_test_blocks", num_test_blocks),
        ):
            require(is_int(value) and value >= 1, owner, name, value, "an int >= 1")
        super().__init__(batch_size, per_rank_batch_sizes, eval_batch_size, seed)
        self.source = MarkovSource(vocab_size, order, concentration, source_seed)
        self.vocab_size, self.block_size, self.source_seed = vocab_size, block_size, source_seed
        self.num_train_samples = num_train_blocks
        self.num_eval_samples = num_val_blocks  # the app checks that every rank gets eval batches
        self.num_test_blocks = num_test_blocks
        self.unigram_loss = self.source.unigram_loss
        self.entropy_rate = self.source.entropy_rate
        self.optimum = self.source.optimum(block_size)

    def _blocks(self, num_blocks: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = self.source.sample_blocks(num_blocks, self.block_size + 1, [self.source_seed, split])
        blocks = torch.from_numpy(drawn)
        return blocks[:, :-1].contiguous(), blocks[:, 1:].contiguous()

    def setup(self, stage: str | None = None) -> None:
        if self.train_tensors is not None:
            return
        self.train_tensors = self._blocks(self.num_train_samples, 1)
        self.eval_tensors = self._blocks(self.num_eval_samples, 2)
        self.test_tensors = self._blocks(self.num_test_blocks, 3)

    def describe(self) -> str:
        return (
            f"Markov text: {self.vocab_size} characters, order {self.source.order}; per character: unigram "
            f"{self.unigram_loss:.4f} nats, entropy rate {self.entropy_rate:.4f}, optimum over a block of "
            f"{self.block_size} {self.optimum:.4f} (perplexities {math.exp(self.unigram_loss):.3f} and "
            f"{math.exp(self.optimum):.3f})"
        )
