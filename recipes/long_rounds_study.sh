#!/usr/bin/env bash
# The long-rounds study: periods of 8 steps with an outer optimizer, against S-SGD, with AdamW.
#
# The GPT of the language-model study (conf/experiment/gpt.yaml: 0.46 M parameters, AdamW lr 2e-3,
# warm-up then cosine decay over 4 epochs, batch 32 per worker, validated four times an epoch),
# every worker in a network namespace of its own behind a 25 Mbit/s link each way: slow enough that
# S-SGD, which sends its gradients every step, spends most of each step waiting on the link (about
# 3x the compute-only step time at 4 workers on a 2-core machine), so a method that hides its
# communication has room to be 2.5x faster. Rows:
#   S-SGD (Lightning's DDP), and S-SGD with DDP's bf16 gradient hook;
#   Local-SGD at tau 8;
#   DiLoCo at tau 8: an outer Nesterov SGD (lr 0.7, momentum 0.9) on the mean pseudo-gradient,
#   the round blocking (overlap 0), fp32;
#   the overlapped outer round: the same, its int8 all-reduce launched 1 step before the round
#   ends and running alongside that step (overlap 1);
#   CoCoD-SGD at its defaults (tau="auto", at most 2; the paper's merge), and with int8 rounds and
#   an outer step at every round (progress=2 at tau=1: the language-model study's best);
# at 4 workers (WORKERS=8 for 8), seeds 0 1 2, S-SGD first. cocod-report's target is S-SGD's final
# validation loss plus 0.01 nats; its table gives each row's final loss and time to that target.
#
#   sudo recipes/long_rounds_study.sh [extra overrides...]   (OUT_ROOT=outputs, RUN_ID=<date>)
#   SEEDS=0 recipes/long_rounds_study.sh                     # one seed first; then, to add seeds:
#   SEEDS=1,2 GROUP=long-<first RUN_ID> recipes/long_rounds_study.sh
#   ROWS=ssgd,diloco recipes/long_rounds_study.sh            # some rows only
# recipes/long_rounds_tuned.sh runs S-SGD and the outer round each at its own tuned learning rates.
#
# Root shapes the links (network namespaces); without it every run is unshaped and says so.
# DRY_RUN=1 prints the commands.
WORKERS=${WORKERS:-4}
RATE=${RATE:-25mbit}
source "$(dirname "$0")/shaped_study.sh"
EXPERIMENT=gpt
# The study's own group: targets and speedups are over its own S-SGD runs;
# GROUP=<an earlier run's group> adds seeds or rows to it.
GROUP=${GROUP:-long-$RUN_ID}
BASE_SWEEPS=(
  "ssgd|strategy=ssgd"
  "hook|strategy=ssgd strategy.comm_hook=bf16"
  "local|strategy=local_sgd tau=8"
)
COCOD_SWEEPS=(
  "diloco|strategy=diloco tau=8"
  "overlap|strategy=diloco tau=8 strategy.overlap=1 strategy.compression=int8"
  "cocod|strategy=cocod"
  "progress|strategy=cocod strategy.compression=int8 strategy.progress=2.0 tau=1"
)
shaped_study "$@"
