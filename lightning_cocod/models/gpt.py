"""A small decoder-only transformer (nanoGPT's design) and the LightningModule that trains it."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lightning_cocod._options import is_int as _is_int
from lightning_cocod._options import require as _require
from lightning_cocod.models.classifier import ClassifierModule


class Block(nn.Module):
    """Pre-norm: attention and MLP read a normalised copy and add to an untouched residual stream."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.drop = nn.Dropout(dropout)

    def attention(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        heads = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in self.qkv(x).split(c, 2))
        q, k, v = heads
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """Token and learned position embeddings, ``n_layer`` pre-norm blocks of causal self-attention,
    a final LayerNorm and an output layer tied to the token embedding. ``(B, T)`` ids in,
    ``(B, T, vocab_size)`` logits out; position ``t`` sees ids ``0..t`` only."""

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 96,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("block_size", block_size),
            ("n_layer", n_layer),
            ("n_head", n_head),
            ("n_embd", n_embd),
        ):
            _require(_is_int(value) and value >= 1, "GPT", name, value, "an int >= 1")
        _require(n_embd % n_head == 0, "GPT", "n_embd", n_embd, f"a multiple of n_head ({n_head})")
        ok = isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0 <= dropout < 1
        _require(ok, "GPT", "dropout", dropout, "a number in [0, 1)")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix reads and writes the tokens
        self.apply(self._init)
        # GPT-2's scaling: each block adds two projections to the residual stream, so their initial
        # variance shrinks with depth to keep the stream's variance from growing with n_layer.
        for block in self.blocks:
            for proj in (block.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"GPT: a sequence of {t} tokens is longer than block_size={self.block_size}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class GPTModule(ClassifierModule):
    """Next-token cross-entropy for ``GPT`` (built from the sizes given; the defaults make 0.46 M
    parameters at 27 characters), trained with ``optimizer`` (default: AdamW with nanoGPT's betas
    0.9 and 0.95) at ``lr``, with a linear warm-up then cosine decay per step: the ClassifierModule's
    optimizer construction and schedule. Weight decay applies to matrices only (the embeddings, tied
    to the output, and the linear layers), not to LayerNorms and biases.

    Batches are ``(x, y)`` of ``(B, T)`` token ids, ``y`` the next token at each position. Logged:
    ``train/loss``, ``val/loss``, ``val/ppl`` (``exp`` of the token-weighted mean loss over every
    rank's shard), ``val/acc`` (next-token top-1 accuracy, what the app's timelines read) and the
    same for ``test/``. ``lr`` is per ``base_batch_size`` sequences, scaled with the global batch
    when ``scale_lr``.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 96,
        dropout: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        warmup_epochs: float = 0.0,
        max_epochs: int | None = None,
        scale_lr: bool = False,
        base_batch_size: int = 32,
        global_batch_size: int | None = None,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
    ) -> None:
        net = GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        super().__init__(
            net,
            num_classes=vocab_size,
            lr=lr,
            momentum=0.0,
            weight_decay=weight_decay,
            no_decay_bn_bias=True,
            warmup_epochs=warmup_epochs,
            schedule="cosine",
            max_epochs=max_epochs,
            scale_lr=scale_lr,
            base_batch_size=base_batch_size,
            global_batch_size=global_batch_size,
            optimizer=optimizer or partial(torch.optim.AdamW, betas=(0.9, 0.95)),
        )
        # Token-weighted mean loss, gathered over the ranks: what the perplexity is the exp of.
        self.val_nll, self.test_nll = MeanMetric(), MeanMetric()

    def forward(self, x: Tensor) -> Tensor:
        # Classes on dim 1, as cross_entropy and the accuracy metrics expect of (B, C, T) inputs.
        return self.net(x).transpose(1, 2)

    def _eval_step(self, stage: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        nll, acc = getattr(self, f"{stage}_nll"), getattr(self, f"{stage}_acc")
        nll.update(loss, weight=y.numel())
        acc.update(logits, y)
        self.log(f"{stage}/loss", nll, on_epoch=True, prog_bar=True, batch_size=len(y))
        self.log(f"{stage}/acc", acc, on_epoch=True, prog_bar=True, batch_size=len(y))

    def _log_ppl(self, stage: str) -> None:
        # compute() gathers over the ranks (every rank calls it here) and is cached for the
        # logging of the loss that follows.
        self.log(f"{stage}/ppl", torch.exp(getattr(self, f"{stage}_nll").compute()))

    def on_validation_epoch_end(self) -> None:
        self._log_ppl("val")

    def on_test_epoch_end(self) -> None:
        self._log_ppl("test")
