"""CoCoD-SGD in a nanoGPT-style training script: a small GPT with AdamW, warm-up and cosine decay,
on 2 CPU worker processes started by torchrun:

    torchrun --nproc-per-node=2 examples/gpt_loop_example.py    # 200 steps of a 0.1 M-parameter GPT

The three lines marked ``# lightning_cocod`` are all it adds to the same script training each
worker on its own shard (without them, it is that script: tests/loop/test_examples.py runs both).
The text is character-level Markov text generated from a seed, so it needs no download and the
best achievable loss is known. AdamW's moments stay on each worker, which shrinks the workers' mean
step to about 1/sqrt(N) of S-SGD's: the outer step ``progress=sqrt(N)`` restores it, and holds at
tau=1 only (docs/language-model.md, "AdamW's state and the merge"), the recommended settings for AdamW.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightning_cocod.data.markov import MarkovSource
from lightning_cocod.loop import CoCoD  # lightning_cocod
from lightning_cocod.models.gpt import GPT

STEPS, BATCH, BLOCK, LR, WARMUP = 200, 16, 32, 3e-3, 20


def lr_at(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    return LR * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def main() -> None:
    dist.init_process_group("gloo")  # torchrun says where the other workers are
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    source = MarkovSource(vocab_size=27, order=3, seed=1234)
    # Every worker draws its own blocks from the source: shards of an endless corpus.
    train = torch.from_numpy(source.sample_blocks(STEPS * BATCH, BLOCK + 1, seed=[1, rank]))
    val = torch.from_numpy(source.sample_blocks(256, BLOCK + 1, seed=[2]))
    torch.manual_seed(0)  # the same initial weights on every worker
    model = GPT(vocab_size=27, block_size=BLOCK, n_layer=2, n_head=2, n_embd=64)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))
    cocod = CoCoD(model, optimizer, tau=1, progress=math.sqrt(world)).start()  # lightning_cocod
    for step, batch in enumerate(train.split(BATCH)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and (step + 1) % 50 == 0:
            print(f"step {step + 1}: train loss {loss.item():.3f} (worker 0's batch)")
    cocod.close()  # lightning_cocod: the pending round merged, every worker's model the average
    with torch.no_grad():
        val_loss = F.cross_entropy(model(val[:, :-1]).transpose(1, 2), val[:, 1:]).item()
    if rank == 0:
        bounds = f"unigram {source.unigram_loss:.4f}, optimum {source.optimum(BLOCK):.4f}"
        print(f"final: val loss {val_loss:.4f} ({bounds})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
