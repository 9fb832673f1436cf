#!/usr/bin/env bash
# The language-model study: time to S-SGD's validation loss on shaped links, with AdamW.
#
# Every method trains the same GPT on the same per-worker links (conf/experiment/gpt.yaml: a
# 0.46 M-parameter GPT, 4 layers of width 96, on character-level Markov text with a known optimum,
# CPU workers of batch 32, AdamW lr 2e-3, warm-up then cosine decay over 4 epochs, validated four
# times an epoch; 100 Mbit/s per worker, each worker in a network namespace of its own):
#   S-SGD (Lightning's DDP), and S-SGD with DDP's bf16 gradient hook;
#   Local-SGD at tau 4 and 8;
#   CoCoD-SGD in fp32, bf16 and int8 rounds at the package's default tau="auto" (at most
#   tau_max=2), and int8 at tau=8 (what a longer period costs with AdamW);
# at 4 and 8 workers, seeds 0 1 2, each worker count a sweep of its own (S-SGD first in each).
# The runs are judged by validation loss (judged_by=loss): cocod-report's target is S-SGD's final
# validation loss plus 0.01 nats, and its plot is the loss against wall time.
#
#   sudo recipes/gpt_study.sh [extra overrides...]      (OUT_ROOT=outputs, RUN_ID=<date>)
#   WORKERS=4 SEEDS=0 recipes/gpt_study.sh               # a smaller pass
#
# Root shapes the links (network namespaces); without it every run is unshaped and says so.
# DRY_RUN=1 prints the commands.
source "$(dirname "$0")/shaped_study.sh"
EXPERIMENT=gpt
# The study's own group: targets and speedups are over its own S-SGD runs;
# GROUP=<an earlier run's group> adds seeds or rows to it.
GROUP=${GROUP:-gpt-$RUN_ID}
COCOD_SWEEPS=(
  "cocod|strategy=cocod strategy.compression=null,bf16,int8"
  "long|strategy=cocod strategy.compression=int8 tau=8"
)
shaped_study "$@"
