#!/usr/bin/env bash
# The language-model study: time to a validation accuracy, and final loss against the known optimum,
# for S-SGD and the local methods on a transformer trained with AdamW.
#
# A ~0.46 M-parameter GPT (4 layers, width 96) on character-level Markov text (16,384 blocks of 64
# characters, generated, no download; unigram loss 2.29 nats, optimum 1.24), CPU workers of batch 32,
# AdamW lr 2e-3 (betas 0.9, 0.95, weight decay 0.1 on matrices), 0.1-epoch warm-up then cosine decay
# over 4 epochs: the same for every method (conf/experiment/gpt.yaml). Each job runs its workers on
# this machine over the loopback (gloo), one job after another:
#   methods: S-SGD, S-SGD with bf16 gradients (comm_hook=bf16), Local-SGD and CoCoD-SGD (fp32, bf16,
#            int8 rounds) at tau=$TAU, at 4 and 8 workers, seeds 0 1 2 (S-SGD once per worker
#            count and seed: it has no period);
#   auto:    CoCoD-SGD fp32, bf16 and int8 with tau=auto (its default bounds).
# Then cocod-report writes the table (test accuracy mean ± std over seeds, steady step time,
# speedup vs S-SGD) and the plots (accuracy against wall time; final accuracy against tau).
# Every run's record (run.json) has its validation timeline; metrics.csv has val/loss and val/ppl.
#
#   recipes/gpt_study.sh [extra overrides...]       (OUT_ROOT=outputs, RUN_ID=<date>)
#   WORKERS=4 SEEDS=0 recipes/gpt_study.sh target_accuracy=0.5    # a smaller pass, with a target
#
# DRY_RUN=1 prints the commands.
set -euo pipefail
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
OUT_ROOT=${OUT_ROOT:-outputs}
SEEDS=${SEEDS:-0,1,2}
WORKERS=${WORKERS:-4,8}
TAU=${TAU:-4}
GROUP=gpt-$RUN_ID  # the study's own group: its speedups are over its own S-SGD runs
run() { if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "$@"; printf '\n'; else "$@"; fi; }
common=(experiment=gpt out_root="$OUT_ROOT" group="$GROUP" launcher.devices="$WORKERS" seed="$SEEDS")
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-methods" "$@" \
  strategy=ssgd,local_sgd,cocod tau="$TAU"
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-bf16-grads" "$@" strategy=ssgd strategy.comm_hook=bf16
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-compressed" "$@" \
  strategy=cocod tau="$TAU" strategy.compression=bf16,int8
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-auto" "$@" \
  strategy=cocod tau=auto strategy.compression=null,bf16,int8
run cocod-report "$OUT_ROOT/gpt" --group "$GROUP" --out "$OUT_ROOT/gpt/$RUN_ID-report"
