"""Screen merge rules for CoCoD-SGD in one process: N simulated workers on MNIST-1D, no network.

The accuracy study (recipes/mnist1d_study.sh) runs the package's strategies through the app, a
minute or so per run; this simulation runs the same data, network and schedule as N models in one
process, seconds per run, to compare rules the package does not offer. Each rule is written out
here on its own, as a reference independent of the strategies:

  ssgd        one model, the mean gradient of the N workers' batches every step
  local       every tau steps every worker takes the average of the live models
  cocod       at a round's start snap_i = x_i and avg = mean_j snap_j; after tau steps
              x_i <- avg + progress (x_i - snap_i)        (progress 1: the paper's rule);
              momentum=1: each momentum buffer merged by the same rule, from its own snapshot
  correction  x_i <- x_i + alpha (avg - snap_i)            (keeps the mean; alpha 1 is cocod)
  pull        x_i <- (1 - a) x_i + a avg                  (Overlap Local SGD, Wang et al. 2020)

Momentum stays local to each worker, as in the strategies. Test accuracy is the average model's.

    python scripts/merge_rules.py --workers 4 --rules ssgd local cocod cocod:progress=0.5 pull:a=0.6
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lightning_cocod.data.mnist1d import MNIST1DDataModule
from lightning_cocod.models import MNIST1DCNN
from lightning_cocod.models.schedule import lr_factor

RULES = ("ssgd", "local", "cocod", "correction", "pull")
DEFAULTS = {"cocod": {"progress": 1.0, "momentum": 0.0}, "correction": {"alpha": 0.5}, "pull": {"a": 0.6}}


def parse_rule(text: str) -> tuple[str, dict[str, float]]:
    """'cocod:progress=0.5' -> ("cocod", {"progress": 0.5})."""
    name, *options = text.split(":")
    if name not in RULES:
        raise argparse.ArgumentTypeError(f"rule {name!r} is none of {', '.join(RULES)}")
    params = dict(DEFAULTS.get(name, {}))
    for option in options:
        key, _, value = option.partition("=")
        if key not in params:
            raise argparse.ArgumentTypeError(f"{name} takes {', '.join(params) or 'no options'}, not {key!r}")
        params[key] = float(value)
    return name, params


@torch.no_grad()
def _merge(rule: str, params: dict[str, float], live: list[list[torch.Tensor]], snaps, average) -> None:
    for worker, tensors in enumerate(live):
        for k, x in enumerate(tensors):
            if rule == "cocod":
                x.copy_(average[k] + params["progress"] * (x - snaps[worker][k]))
            elif rule == "correction":
                x.add_(average[k] - snaps[worker][k], alpha=params["alpha"])
            elif rule == "pull":
                x.mul_(1 - params["a"]).add_(average[k], alpha=params["a"])


def simulate(rule: str, params: dict[str, float], data, workers: int, tau: int, seed: int, args) -> float:
    (x_train, y_train), (x_test, y_test) = data
    torch.manual_seed(seed)
    base = MNIST1DCNN(channels=args.channels)
    models = [MNIST1DCNN(channels=args.channels) for _ in range(1 if rule == "ssgd" else workers)]
    for m in models:
        m.load_state_dict(base.state_dict())
    lr = args.lr * workers  # per 32 samples, scaled with the global batch of `workers` x 32
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4) for m in models]
    live = [[p.detach() for p in m.parameters()] for m in models]
    per_step = workers * 32
    steps_per_epoch = len(x_train) // per_step
    total = steps_per_epoch * args.epochs
    factor = {
        "schedule": "step",
        "warmup_steps": round(args.warmup * steps_per_epoch),
        "total_steps": total,
        "milestone_steps": [round(0.5 * total), round(0.75 * total)],
    }
    order = torch.Generator().manual_seed(seed)
    snaps, average, step = None, None, 0
    for _ in range(args.epochs):
        permutation = torch.randperm(len(x_train), generator=order)
        for batch in range(steps_per_epoch):
            index = permutation[batch * per_step : (batch + 1) * per_step]
            for opt in opts:
                for group in opt.param_groups:
                    group["lr"] = lr * lr_factor(step, **factor)
            if rule in ("cocod", "correction", "pull") and step % tau == 0:
                snaps = [[t.clone() for t in tensors] for tensors in live]
                average = [torch.stack([s[k] for s in snaps]).mean(0) for k in range(len(snaps[0]))]
                # SGD makes its momentum buffers at the first step: the first round has none to merge.
                buffers = None
                if params.get("momentum") and step > 0:
                    buffers = [
                        [o.state[p]["momentum_buffer"] for p in m.parameters()] for m, o in zip(models, opts)
                    ]
                buffer_snaps = buffers and [[b.clone() for b in mine] for mine in buffers]
                buffer_average = buffers and [torch.stack(k).mean(0) for k in zip(*buffer_snaps)]
            for worker, (model, opt) in enumerate(zip(models, opts)):
                mine = index if rule == "ssgd" else index[worker * 32 : (worker + 1) * 32]
                opt.zero_grad()
                F.cross_entropy(model(x_train[mine]), y_train[mine]).backward()
                opt.step()
            step += 1
            if step % tau == 0 and rule == "local":
                average = [torch.stack([t[k] for t in live]).mean(0) for k in range(len(live[0]))]
                with torch.no_grad():
                    for tensors in live:
                        for x, a in zip(tensors, average):
                            x.copy_(a)
            elif step % tau == 0 and rule != "ssgd":
                _merge(rule, params, live, snaps, average)
                if buffers:
                    _merge(rule, params, buffers, buffer_snaps, buffer_average)
    with torch.no_grad():
        evaluated = MNIST1DCNN(channels=args.channels)
        for p, *copies in zip(evaluated.parameters(), *(m.parameters() for m in models)):
            p.copy_(torch.stack(copies).mean(0))
        return 100 * (evaluated(x_test).argmax(1) == y_test).float().mean().item()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", type=parse_rule, default=[parse_rule(r) for r in RULES])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=0.025, help="per 32 samples (default: the study's)")
    parser.add_argument("--warmup", type=float, default=2.0, help="epochs of linear warm-up")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--channels", type=int, default=32, help="the 1-D CNN's width (the study's: 32)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dm = MNIST1DDataModule()  # the study's data: 8,000 training and 2,000 test signals
    dm.setup()
    data = ((dm.train_tensors[0], dm.train_tensors[1]), (dm.test_tensors[0], dm.test_tensors[1]))
    print(
        f"workers {args.workers}, tau {args.tau}, lr {args.lr} per 32 samples, warm-up {args.warmup}, "
        f"{args.epochs} epochs, seeds {args.seeds}"
    )
    print("| rule | test accuracy (%): mean ± std | seeds |\n|---|---|---|")
    for rule, params in args.rules:
        started = time.perf_counter()
        accs = [simulate(rule, params, data, args.workers, args.tau, seed, args) for seed in args.seeds]
        label = rule + "".join(f" {k}={v:g}" for k, v in params.items())
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(
            f"| {label} | {statistics.fmean(accs):.2f} ± {spread:.2f} (n={len(accs)}) | "
            f"{', '.join(f'{a:.2f}' for a in accs)} |  ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
